"""The error rate a promotion look really carries (issue 12): zero-effect comparisons, run the
way the loop runs them, counted against the rate the look states.

A challenger of no effect is compared with an incumbent of the same true rate, with
``tuner.night.compare.compare`` itself: three depths, ``--runs`` runs per depth per batch, the
incumbent measured on two boots of twice the runs, the challenger on one earlier boot plus the
boot under test, whose runs grow batch by batch while the comparison is undecided, up to
``tuner.night.judging.EXTEND_CAP`` batches, stopping as soon as it is decided (the loop's extender). Every
test of the growing boot could promote. Per cell: how often a zero-effect challenger is
promoted, against the look's stated rate, with each test run at
  - the look's whole rate (``peeks=1``: only the last test charged, the loop before the split),
  - the rate split over the boot's tests (``look_alpha(..., peeks=EXTEND_CAP)``, the loop since),
for a challenger as noisy as the incumbent and one twice as noisy (a noisy lever).

Since comparisons are blocked in time (issue 19) the boot under test is open (no incumbent boot
after it yet): its tests promote nothing; they still stop its runs once decided, and the look
that brackets it (an incumbent boot after it) reads those runs. The last cells run that: the
growing boot's tests at the rate split over them (an efficacy stop at an interim look), then the
bracketing look's one test, on one more incumbent boot, at its whole rate (a bracket tests once
and stops nothing) or split as the loop does (``Judging._bracket``).

  .venv/bin/python bench/false_promotions.py [--trials 20000] [--alpha 0.001] [--runs 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import random
import time

from simbench import emit

from tuner.night.compare import Side, compare, look_alpha
from tuner.night.judging import EXTEND_CAP

DEPTHS = ("512", "4096", "16384")
SIGMA = 0.03          # relative sigma of one run's decode rate (the small-effect landscapes' noise)


def _boot(rng: random.Random, sigma: float, runs: int) -> dict[str, list[float]]:
    return {d: [rng.gauss(0.0, sigma) for _ in range(runs)] for d in DEPTHS}


def promoted(rng: random.Random, alpha: float, sigma_c: float, runs: int, peeks: int) -> bool:
    """One zero-effect challenger on its second boot: is it promoted?"""
    inc = Side(tuple(_boot(rng, SIGMA, 2 * runs) for _ in range(2)))
    first = _boot(rng, sigma_c, runs)
    cur = _boot(rng, sigma_c, runs)
    a = look_alpha(alpha, 1, 1) / peeks        # planned=1, k=1: the look's whole share is alpha/2
    for batch in range(1, EXTEND_CAP + 1):
        c = compare(Side((first, cur)), inc, alpha=a)
        if c.verdict != "undecided" or batch == EXTEND_CAP:
            return c.verdict == "better"
        for d in DEPTHS:
            cur[d] += [rng.gauss(0.0, sigma_c) for _ in range(runs)]
    return False


def bracketed(rng: random.Random, alpha: float, sigma_c: float, runs: int, peeks: int) -> bool:
    """One zero-effect challenger on its second boot, its runs grown and stopped by open tests
    (which cannot promote), then bracketed by an incumbent boot and tested once at the look's rate
    over ``peeks``: is it promoted?"""
    boots = [_boot(rng, SIGMA, 2 * runs) for _ in range(2)]
    first = _boot(rng, sigma_c, runs)
    cur = _boot(rng, sigma_c, runs)
    a = look_alpha(alpha, 1, 1)
    for batch in range(1, EXTEND_CAP + 1):
        c = compare(Side((first, cur)), Side(tuple(boots)), alpha=a / EXTEND_CAP)
        if c.verdict != "undecided" or batch == EXTEND_CAP:
            break
        for d in DEPTHS:
            cur[d] += [rng.gauss(0.0, sigma_c) for _ in range(runs)]
    boots.append(_boot(rng, SIGMA, 2 * runs))
    return compare(Side((first, cur)), Side(tuple(boots)), alpha=a / peeks).verdict == "better"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--alpha", type=float, default=0.001, help="the night's family rate given to the one look")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t0 = time.time()
    stated = look_alpha(args.alpha, 1, 1)
    lines = [f"command: .venv/bin/python bench/false_promotions.py --trials {args.trials} --alpha {args.alpha:g} "
             f"--runs {args.runs}", "",
             f"one look at a stated error rate of {stated:.2g}; {len(DEPTHS)} depths x {args.runs} runs per batch, "
             f"up to {EXTEND_CAP} batches on the boot under test; {args.trials:,} zero-effect challengers per cell",
             "", "| challenger noise | tests charged | promoted | observed rate | observed / stated |",
             "|---|---|---|---|---|"]

    def rows(trial, seed: str, cells) -> None:
        """One row per challenger noise and (peeks, label): how often ``trial`` promoted."""
        for sigma_c in (SIGMA, 2 * SIGMA):
            for peeks, label in cells:
                rng = random.Random(f"{seed}:{sigma_c}:{peeks}")
                hits = sum(trial(rng, args.alpha, sigma_c, args.runs, peeks) for _ in range(args.trials))
                rate = hits / args.trials
                lines.append(f"| {sigma_c:.0%} (incumbent {SIGMA:.0%}) | {label} | {hits} | {rate:.2e} | "
                             f"{rate / stated:.2f} |")

    rows(promoted, "false-promotions",
         ((1, "last test only (before)"), (EXTEND_CAP, f"every test: rate / {EXTEND_CAP}")))
    lines += ["", "The boot under test open (blocked comparisons): its tests at the rate / "
              f"{EXTEND_CAP} stop its runs, then the bracketing look tests once", "",
              "| challenger noise | the bracketing test | promoted | observed rate | observed / stated |",
              "|---|---|---|---|---|"]
    rows(bracketed, "false-promotions:bracketed",
         ((EXTEND_CAP, f"rate / {EXTEND_CAP} (the loop)"), (1, "the look's whole rate")))
    lines += ["", f"wall time of this benchmark: {time.time() - t0:.0f} s"]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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

The last table is about the runs a test reads: two boots of a zero-effect challenger, each
between two of the incumbent's (the loop's blocked test), tested once at the look's rate, on the
runs as drawn or on measurement records through each boot's own trims (warm-up, disturbed runs:
``compare._split_runs``), as the loop cuts them or with one cut undone; the same draws in every
row of a noise. A cut that takes chance-low runs for warm-up, or a noisy shape's honest runs for
disturbed ones, makes the test promote more often than its runs as drawn would.

  .venv/bin/python bench/false_promotions.py [--trials 20000] [--alpha 0.001] [--runs 3] [--trim-trials 5000] [--out FILE]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from simbench import emit

from arms import steady
from tuner.night.blocks import Boot, Spread, compare_blocked
from tuner.night.compare import Side, compare, look_alpha
from tuner.night.judging import EXTEND_CAP

DEPTHS = ("512", "4096", "16384")
SIGMA = 0.03          # relative sigma of one run's decode rate (the small-effect landscapes' noise)
NOISY = 0.40          # a lever whose runs never settle (small-gather's HSA_ENABLE_SDMA 0)


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


def _records(b: dict[str, list[float]]) -> dict:
    """A boot's log rates as its measurement record."""
    return {"depths": {d: {"runs": [{"valid": True, "decode_tok_s": 30.0 * math.exp(x)} for x in xs]}
                       for d, xs in b.items()}}


TRIMS = {"the runs as drawn (no trim)": None,
         "the loop's trims": {},
         "a run cut as disturbed at x3 alone": {"DISTURBED_Z": 0.0},
         "no run cut as warm-up": {"WARM_Z": math.inf}}


def calibration(rng: random.Random, trials: int, alpha: float, sigma_c: float, runs: int, trims: dict | None):
    """(promoted, the effects' spread over the trials / the root mean square of the standard errors
    the tests stated) of ``trials`` blocked tests (``blocks.compare_blocked``, the loop's) of a
    zero-effect challenger's two boots, each between two of the incumbent's, on a box whose boots
    agree to their runs' noise: each boot's runs as drawn (``trims`` None), or as its measurement
    record through its own trims (``compare._split_runs``) with ``trims``' constants of
    ``arms.steady`` changed."""
    saved = {k: getattr(steady, k) for k in trims or {}}
    for k, v in (trims or {}).items():
        setattr(steady, k, v)

    def boot(t: int, sigma: float, n: int) -> Boot:
        b = _boot(rng, sigma, n)
        return Boot(t, t, b) if trims is None else Boot.of(t, t, _records(b))
    try:      # incumbent boots at 0, 2, 4, the challenger's at 1, 3: closed blocks
        cs = [compare_blocked([boot(t, sigma_c, runs) for t in (1, 3)], [boot(t, SIGMA, 2 * runs) for t in (0, 2, 4)],
                              spread=Spread(0.0, 100), alpha=alpha) for _ in range(trials)]
    finally:
        for k, v in saved.items():
            setattr(steady, k, v)
    off = statistics.pstdev(math.log1p(c.effect) for c in cs) / math.sqrt(statistics.fmean(c.se ** 2 for c in cs))
    return sum(c.verdict == "better" for c in cs), off


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--alpha", type=float, default=0.001, help="the night's family rate given to the one look")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trim-trials", type=int, default=5000, help="trials per row of the last table (its tests parse records)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t0 = time.time()
    stated = look_alpha(args.alpha, 1, 1)
    lines = [f"command: .venv/bin/python bench/false_promotions.py --trials {args.trials} --alpha {args.alpha:g} "
             f"--runs {args.runs} --trim-trials {args.trim_trials}", "",
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
    lines += ["", "What a boot's own trims do to a test: two boots of a zero-effect challenger, each between two of "
              "the incumbent's (the loop's blocked test), tested once at the look's rate; the same draws in every row "
              "of a noise", "",
              "| challenger noise | the runs | promoted | observed / stated | effects' spread / stated se |",
              "|---|---|---|---|---|"]
    for sigma_c in (2 * SIGMA, NOISY):
        for label, trims in TRIMS.items():       # the same draws in every row of a noise
            hits, off = calibration(random.Random(f"false-promotions:trims:{sigma_c}"), args.trim_trials, stated,
                                    sigma_c, args.runs, trims)
            lines.append(f"| {sigma_c:.0%} (incumbent {SIGMA:.0%}) | {label} | {hits} | "
                         f"{hits / args.trim_trials / stated:.2f} | {off:.3f} |")
    lines += ["", f"wall time of this benchmark: {time.time() - t0:.0f} s"]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

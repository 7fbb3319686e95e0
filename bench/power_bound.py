"""What any honest night could confirm on a box whose boots spread (issue 19): a bound, not a tuner run.

An *oracle* night knows which one-change moves win and in which order (the landscape's noise-free
best-improvement walk), so it screens nothing; it spends the night's error rate on those moves
alone (Bonferroni over them: a real night tests many more changes and must split it further),
reads each boot's variance as known (no t quantile), and confirms each move with the cheapest
blocked design that cancels a linear drift: A B A B ... A, n challenger boots between n + 1
incumbent boots, the contrast mean(B) - (each B's two neighbours averaged), whose variance is
s^2 (2n - 1/2) / n^2 for a boot's variance s^2 = boot_sigma^2 + run noise^2 / runs per boot.
It splits its boots among the moves to make "every move confirmed" as likely as it can be
(exhaustive over the allocations). A real night, which must also find the moves, can do no better.

Boots per night come from the simulated engine itself: two arms of the starting shape are booted and
measured on the landscape's SimHost with the bench's measure plan (3 depths x --runs runs), and the
night's hours are divided by the simulated time of its second arm (the first compiles) (the oracle's boots need no more runs than
that: with boot-to-boot spread, more runs per boot buy next to nothing).

  .venv/bin/python bench/power_bound.py [--landscape small-gather] [--hours 8] [--error-rate 0.01]
                                        [--runs 3] [--out bench/results/power_bound.md]
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from statistics import NormalDist

import small_effects as se
from simbench import arm_runner, emit, measure_arm

from tuner.night.power import contrast_var

_N = NormalDist()
SIGMAS = (0.0, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05)


def confirm_p(effect: float, n: int, s2: float, z: float) -> float:
    """The chance ``n`` blocks confirm a true log effect ``effect`` at one-sided quantile ``z``."""
    return _N.cdf(effect / math.sqrt(contrast_var(n, s2)) - z)


def best_split(effects: list[float], boots: int, s2: float, z: float, cap: int = 80) -> tuple[float, list[int]]:
    """(the largest chance that every move is confirmed, the blocks per move) within ``boots`` boots:
    sum over moves of 2n + 1 (the last incumbent boot of one move is not shared with the next:
    the new incumbent is the challenger). Exact: a dynamic programme over the moves and the boots."""
    best: dict[int, tuple[float, list[int]]] = {0: (1.0, [])}        # boots used -> (chance, blocks)
    for e in effects:
        nxt: dict[int, tuple[float, list[int]]] = {}
        for used, (p, ns) in best.items():
            for n in range(1, cap + 1):
                b = used + 2 * n + 1
                if b > boots:
                    break
                q = p * confirm_p(e, n, s2, z)
                if q > nxt.get(b, (-1.0,))[0]:
                    nxt[b] = (q, ns + [n])
        best = nxt
    return max(best.values(), default=(0.0, [0] * len(effects)))


def boots_for(effects: list[float], target: float, s2: float, z: float, limit: int = 400) -> int | None:
    """The fewest boots with which the oracle confirms every move with chance ``target``."""
    lo = 2 * len(effects) + len(effects)
    for b in range(lo, limit + 1):
        if best_split(effects, b, s2, z)[0] >= target:
            return b
    return None


def moves(t: se.Truth) -> list[tuple[str, float]]:
    """The landscape's noise-free best-improvement walk from the start: (change, log effect) per move."""
    shape, cur, out = t.start, t.obj(t.start), []
    while True:
        scored = [(t.obj(s), s) for s in t.neighbours(shape)]
        o, s = max(((o, s) for o, s in scored if o is not None), key=lambda x: x[0])
        if o <= cur * (1 + 1e-9):
            return out
        name = next(n for n in t.levers if s.value_of(n) != shape.value_of(n))
        out.append((f"{name} {s.value_of(name)}", math.log(o / cur)))
        cur, shape = o, s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--landscape", default="small-gather")
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--error-rate", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--target", type=float, default=0.9, help="nights that must confirm every move (18/20)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    name = args.landscape
    se.MEASURE["runs"] = args.runs          # the campaign below measures with it
    camp, host = se.campaign(Path(tempfile.mkdtemp()), name, "bound", 0, se.CAMPAIGNS[name]["levers"])
    t = se.Truth(name, camp.baseline)
    walk = moves(t)
    effects = [e for _, e in walk]
    runner = arm_runner(camp, host)
    measure_arm(runner, 1, camp.baseline)          # the night's first boot compiles: later ones load its cache
    t0 = host.now()
    measure_arm(runner, 2, camp.baseline)
    arm_s = host.now() - t0
    boots = int(args.hours * 3600 // arm_s)
    others = sum(1 for s in t.neighbours(t.start) if t.obj(s) is not None) - len(walk)   # each worth one look
    noise = float(t.land.get("noise_sigma", 0.0))
    per_run = noise ** 2 / (args.runs * len(se.MEASURE["depths"]))
    z = _N.inv_cdf(1 - args.error_rate / len(effects))
    cmd = (f"command: .venv/bin/python bench/power_bound.py --landscape {name} --hours {args.hours:g} "
           f"--error-rate {args.error_rate:g} --runs {args.runs} --target {args.target:g}")
    lines = [cmd, "",
             f"Landscape `{name}`: the one-change optimum is {len(walk)} moves away: "
             + ", ".join(f"{c} ({math.expm1(e):+.1%})" for c, e in walk) + ".",
             f"One arm (boot + {len(se.MEASURE['depths'])} depths x {args.runs} runs) takes {arm_s / 60:.1f} simulated "
             f"min: **{boots} boots** in {args.hours:g} h. Request noise {noise:.0%}: a boot's mean carries "
             f"{math.sqrt(per_run):.2%} of it.",
             f"Error rate {args.error_rate:g} split over the {len(effects)} true moves only: z = {z:.2f} per move.", "",
             f"The start has {others} other neighbours that boot: a night that does not know the moves spends at "
             f"least one boot on each, leaving {boots - others} for the moves.", "",
             f"| boot_sigma | P(every move confirmed) with {boots} boots | blocks per move | with {boots - others} "
             f"boots | boots for P >= {args.target:g} | hours for P >= {args.target:g} |",
             "|---|---|---|---|---|---|"]
    for sigma in SIGMAS:
        s2 = sigma ** 2 + per_run
        p, ns = best_split(effects, boots, s2, z)
        need = boots_for(effects, args.target, s2, z)
        hours = f"{need * arm_s / 3600:.1f}" if need else "> 40"
        p2, _ = best_split(effects, boots - others, s2, z)
        lines.append(f"| {sigma:.1%} | {p:.2f} | {', '.join(map(str, ns))} | {p2:.2f} | {need or '> 400'} | {hours} |")
    lines += ["", "An upper bound for any night of the tuner: it knows the moves (no screening of the other "
              "neighbours, no wrong turns), spends the error rate on them alone and needs no boots to learn the "
              "spread. Where this bound is below the target, no procedure that keeps the night's error rate can "
              "reach it in the hours given."]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

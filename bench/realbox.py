"""Nights on a box that is not stationary (issue 19): the held-out small-effect landscape with one
real-box term at a time, and all of them at once, against its stationary truth.

For each condition, N nights (seeds) of 8 simulated hours with the levers as listed: how many end
within --within of the stationary one-change optimum, their median hours to get there, and the
false promotions (a move to a shape that is not truly better on the stationary landscape).

  .venv/bin/python bench/realbox.py [--seeds 4] [--hours 8] [--within 0.03] [--out bench/results/realbox.md]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import small_effects as se
from simbench import emit

CONDITIONS = {
    "stationary": "",
    "(a) drift +2 %/h": "drift_per_hour: 0.02",
    "(b) drift -2 %/h": "drift_per_hour: -0.02",
    "(c) -5 % step at hour 3": "drift_step: {at_hours: 3, factor: 0.95}",
    "(d) boot_sigma 2 %": "boot_sigma: 0.02",
    "(e) cold start 0.7 + 3-request warm-up": "cold_start: {factor: 0.7, boots: 1}\nwarmup: {requests: 3, factor: 0.8}",
    "(f) all of them": "drift_per_hour: 0.02\ndrift_step: {at_hours: 3, factor: 0.95}\nboot_sigma: 0.02\n"
                       "cold_start: {factor: 0.7, boots: 1}\nwarmup: {requests: 3, factor: 0.8}",
}
NAME = "small-gather"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--within", type=float, default=0.03)
    ap.add_argument("--only", default=None, help="comma-separated condition prefixes, e.g. '(a),(e)'")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    stationary = se.LANDSCAPES
    camp, _ = se.campaign(Path(tempfile.mkdtemp()), NAME, "truth", 0, se.CAMPAIGNS[NAME]["levers"])
    truth = se.Truth(NAME, camp.baseline)                # judged against the stationary box
    lines = [f"command: .venv/bin/python bench/realbox.py --seeds {args.seeds} --hours {args.hours:g} "
             f"--within {args.within:g}" + (f" --only '{args.only}'" if args.only else ""), "",
             f"Landscape `{NAME}` plus one real-box term (simengine/realbox.py); levers as listed; judged against "
             "the stationary landscape's noise-free truth.", "",
             f"| condition | nights within {args.within:.0%} at {args.hours:g} h | median h to get there "
             "| median final / optimum | false promotions |", "|---|---|---|---|---|"]
    for cond, extra in CONDITIONS.items():
        if args.only and not any(cond.startswith(p) for p in args.only.split(",")):
            continue
        land = Path(tempfile.mkdtemp(prefix="realbox-"))
        (land / f"{NAME}.yaml").write_text((stationary / f"{NAME}.yaml").read_text() + "\n" + extra + "\n")
        se.LANDSCAPES = land
        rs = [se.run_tuner(Path(tempfile.mkdtemp()), NAME, seed, truth, args.hours, args.hours, args.within, False)
              for seed in range(args.seeds)]
        se.LANDSCAPES = stationary
        hit = [r["reached_h"] for r in rs if r["reached_h"] is not None]
        lines.append(f"| {cond} | {len(hit)}/{len(rs)} | {statistics.median(hit):.1f} | "
                     f"{statistics.median(r['final'] for r in rs):.3f} | {sum(r['false'] for r in rs)} |"
                     if hit else f"| {cond} | 0/{len(rs)} | – | {statistics.median(r['final'] for r in rs):.3f} "
                     f"| {sum(r['false'] for r in rs)} |")
        print(lines[-1], flush=True)
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

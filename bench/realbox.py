"""Nights on a box that is not stationary (issue 19): the held-out small-effect landscape with one
real-box term at a time, and all of them at once, against its stationary truth.

For each condition, N nights (seeds) of 8 simulated hours with the levers as listed: how many end
within --within of the stationary one-change optimum, their median hours to get there, and the
false promotions (a move to a shape that is not truly better on the stationary landscape).

  .venv/bin/python bench/realbox.py [--seeds 20] [--hours 8] [--within 0.03] [--jobs 2] [--out bench/results/realbox.md]
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
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
    "(g) boot_sigma 1 %": "boot_sigma: 0.01",
    "(h) boot_sigma 5 % (the real llama-server box's)": "boot_sigma: 0.05",
    "(f) all of them": "drift_per_hour: 0.02\ndrift_step: {at_hours: 3, factor: 0.95}\nboot_sigma: 0.02\n"
                       "cold_start: {factor: 0.7, boots: 1}\nwarmup: {requests: 3, factor: 0.8}",
}
NAME = "small-gather"


_CTX: dict = {}


def _night(job: tuple[str, int, bool]) -> tuple[str, int, bool, dict]:
    """One night of one condition (a worker process: the landscape folder is per condition)."""
    cond, seed, shuffle = job
    logging.disable(logging.WARNING)
    se.LANDSCAPES = _CTX["lands"][cond]
    r = se.run_tuner(Path(tempfile.mkdtemp()), NAME, seed, _CTX["truth"], _CTX["hours"], _CTX["hours"],
                     _CTX["within"], shuffle)
    return cond, seed, shuffle, r


def _cell(rs: list[dict]) -> str:
    hit = [r["reached_h"] for r in rs if r["reached_h"] is not None]
    med = f"{statistics.median(hit):.1f}" if hit else "–"
    return f"{len(hit)}/{len(rs)} | {med} | {statistics.median(r['final'] for r in rs):.3f} | {sum(r['false'] for r in rs)}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--within", type=float, default=0.03)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated condition prefixes, e.g. '(a),(e)'")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    stationary = se.LANDSCAPES
    camp, _ = se.campaign(Path(tempfile.mkdtemp()), NAME, "truth", 0, se.CAMPAIGNS[NAME]["levers"])
    conds = {c: x for c, x in CONDITIONS.items()
             if not args.only or any(c.startswith(p) for p in args.only.split(","))}
    lands = {}
    for cond, extra in conds.items():
        land = Path(tempfile.mkdtemp(prefix="realbox-"))
        (land / f"{NAME}.yaml").write_text((stationary / f"{NAME}.yaml").read_text() + "\n" + extra + "\n")
        lands[cond] = land
    _CTX.update(lands=lands, truth=se.Truth(NAME, camp.baseline), hours=args.hours, within=args.within)
    jobs = [(c, seed, sh) for c in conds for seed in range(args.seeds) for sh in (False, True)]
    t0 = time.time()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        done = pool.map(_night, jobs, chunksize=1)
    res: dict = {}
    for cond, seed, sh, r in done:
        res.setdefault(cond, {}).setdefault(sh, []).append((seed, r))
    cmd = (f"command: .venv/bin/python bench/realbox.py --seeds {args.seeds} --hours {args.hours:g} "
           f"--within {args.within:g} --jobs {args.jobs}" + (f" --only '{args.only}'" if args.only else ""))
    lines = [cmd, "", f"Landscape `{NAME}` plus one real-box term (simengine/realbox.py); {args.seeds} nights per "
             "condition with the levers as listed and again shuffled (seeded); judged against the stationary "
             "landscape's noise-free truth. A false promotion: a move to a shape not truly better.", "",
             f"| condition | listed: within {args.within:.0%} at {args.hours:g} h | median h | median final | false "
             f"| shuffled: within {args.within:.0%} | median h | median final | false |",
             "|---|---|---|---|---|---|---|---|---|"]
    false_rows = []
    for cond in conds:
        a = [r for _, r in sorted(res[cond][False], key=lambda x: x[0])]
        b = [r for _, r in sorted(res[cond][True], key=lambda x: x[0])]
        lines.append(f"| {cond} | {_cell(a)} | {_cell(b)} |")
        for sh in (False, True):
            for seed, r in sorted(res[cond][sh], key=lambda x: x[0]):
                if r["false"] or r["reached_h"] is None:
                    false_rows.append(f"| {cond} | {'shuffled' if sh else 'listed'} | {seed} | {r['final']:.3f} | "
                                      f"{r['moves']} | {r['false']} | {r['arms']} | {r['reason']} |")
    total = sum(r["false"] for c in res.values() for rs in c.values() for _, r in rs)
    lines += ["", f"False promotions over all {len(jobs)} nights: **{total}**. "
              f"Wall time {time.time() - t0:.0f} s.", "",
              "Nights that missed the optimum or promoted falsely:", "",
              "| condition | order | seed | final / optimum | moves | false | arms | end |", "|---|---|---|---|---|---|---|---|",
              *false_rows]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Several boxes, one campaign (issue 23): simulated hours to within 3 % of the one-change optimum
with 1, 2 and 4 simulated boxes sharing one campaign through a real PostgreSQL (a private server,
host/pgserver.py), each box's rates off by a factor drawn in [0.97, 1.03], and the false
promotions (a move to a shape that is not truly better on the landscape's noise-free truth).

Each night is ``tuner.night.simfleet.run_fleet``: the boxes under one virtual time, taking the
shared record in the order of their clocks; the budget is --hours of it. A night that never gets
within 3 % counts as --hours in the ratio's median (a lower bound on its time).

  .venv/bin/python bench/fleet.py [--seeds 20] [--hours 8] [--boxes 1,2,4] [--jobs 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import random
import statistics
import tempfile
import time
from pathlib import Path

import small_effects as se
from simbench import emit, truth, write_campaign

from arms.shape import Shape
from host.pgserver import PgServer
from host.simhost import EPOCH
from tuner.night.readback import why_damaged
from tuner.night.simfleet import run_fleet

_CTX: dict = {}
# seed 002's landscape (the default one) with examples/sim-campaign.yaml's levers: its large moves
# (+47 % and more) next to the small-effect landscapes' +3 to +8 %
se.CAMPAIGNS.setdefault("seed-002", {
    "args": se.START, "env": se.START_ENV,
    "levers": {"expert-prefetch": ["absent", 1, 2],
               "speculative-config": ["absent", {"method": "mtp", "num_speculative_tokens": 3},
                                      {"method": "mtp", "num_speculative_tokens": 6},
                                      {"method": "ngram", "num_speculative_tokens": 4}],
               "env.R4D_LRU_GATHER_CHUNKS": [8, 16, 32, 64],
               "env.R4D_LRU_GATHER_LANES": [16, 32, 64, 128],
               "env.R4D_LRU_UVA_TOKENS": ["absent", 2048, 8192],
               "max-num-batched-tokens": [512, 1024, 4096, 8192],
               "max-num-seqs": [2, 3, 4, 6],
               "gpu-memory-utilization": [0.95, 0.98, 0.99],
               "kv-cache-dtype": {"values": ["auto", "fp8"], "numerics": "changing"},
               "expert-precise-memory": ["absent", True],
               "env.CLAV_TUNABLEOP_WITH_OFFLOAD": {"values": ["absent", 1], "numerics": "changing"}}})


def factors(seed: int, n: int) -> dict[str, float]:
    """Box name -> rate factor: one box is its own reference (1.0); more are drawn in ±3 %."""
    if n == 1:
        return {"box0": 1.0}
    rng = random.Random(7919 * seed + n)
    return {f"box{i}": round(rng.uniform(0.97, 1.03), 4) for i in range(n)}


def shared_records(url: str, campaign: str) -> list[dict]:
    import psycopg2

    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT line FROM tuner_records WHERE campaign = %s ORDER BY seq", (campaign,))
        return [why_damaged(line.encode())[1] for (line,) in cur.fetchall()]


def night_hours(t: float) -> float:
    """A journal time of a simulated night (the simulated host's clock) as hours into the night."""
    return (t - EPOCH.timestamp()) / 3600


def night(job: tuple[str, int, int]) -> tuple[str, int, int, dict]:
    """One night's result: (landscape, seed, boxes, what the table counts)."""
    return (*job, night_records(job)[0])


def night_records(job: tuple[str, int, int]) -> tuple[dict, list[dict]]:
    """One night of ``job`` (landscape, seed, boxes): what the table counts, and the shared records."""
    name, seed, n = job
    logging.disable(logging.WARNING)
    t, hours, within, url = _CTX["truths"][name], _CTX["hours"], _CTX["within"], _CTX["url"]
    spec = se.CAMPAIGNS[name]
    tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
    cname = f"{name}-s{seed}-b{n}"        # its containers' names seed their noise: the same per seed and box count
    path = write_campaign(tmp, cname, args=spec["args"], env=spec["env"], levers=spec["levers"], measure=se.MEASURE)
    out = {"reached_h": None}

    def on_arm(box, st, end):
        if out["reached_h"] is None and (t.obj(st.incumbent) or 0.0) >= t.optimum * (1 - within) and end.get("t"):
            out["reached_h"] = night_hours(end["t"])

    boxes = factors(seed, n)
    runs = run_fleet(path, url, boxes, landscape=se.LANDSCAPES / f"{name}.yaml", seed=seed, hours=hours,
                     on_arm=on_arm)
    errors = [f"{b}: {r.error}" for b, r in runs.items() if r.error is not None]
    recs = shared_records(url, cname)
    prev, false = t.obj(t.start), 0
    inc = t.start
    for m in (r for r in recs if r["op"] == "incumbent"):
        inc = Shape.from_dict(m["shape"])
        tr = truth(t.land, inc)
        false += tr.objective is None or tr.objective <= prev * (1 + 1e-9)
        prev = tr.objective or 0.0
    arms = sum(r["op"] == "arm_start" for r in recs)
    return {**out, "arms": arms, "false": false, "errors": errors, "boxes": boxes,
            "final": (t.obj(inc) or 0.0) / t.optimum}, recs


def nights(fn, names: list[str], seeds: int, counts: list[int], *, hours: float, within: float, jobs: int) -> list:
    """``fn((landscape, seed, boxes))`` for every night, ``jobs`` at a time, under one private
    PostgreSQL server (``_CTX`` holds the landscapes' truths, the budget and the server's URL)."""
    logging.disable(logging.WARNING)
    truths = {}
    for name in names:
        camp, _ = se.campaign(Path(tempfile.mkdtemp()), name, "truth", 0, se.CAMPAIGNS[name]["levers"])
        truths[name] = se.Truth(name, camp.baseline)
    with PgServer(Path(tempfile.mkdtemp(prefix="fleet-pg-", dir="/tmp"))) as pg:
        _CTX.update(truths=truths, hours=hours, within=within, url=pg.url)
        work = [(name, seed, n) for name in names for seed in range(seeds) for n in counts]
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(fn, work, chunksize=1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--within", type=float, default=0.03)
    ap.add_argument("--boxes", default="1,2,4")
    ap.add_argument("--landscapes", default="seed-002,small-gather,small-spec,small-memory")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None, help="write each night's result here too")
    args = ap.parse_args()
    names = args.landscapes.split(",")
    counts = [int(x) for x in args.boxes.split(",")]
    t0 = time.time()
    done = nights(night, names, args.seeds, counts, hours=args.hours, within=args.within, jobs=args.jobs)
    res = {(name, seed, n): r for name, seed, n, r in done}
    if args.json:
        Path(args.json).write_text(json.dumps([{"landscape": name, "seed": seed, **r, "box_count": n}
                                               for name, seed, n, r in done], indent=1, default=str))
    lines = [f"# Several boxes, one campaign: {args.seeds} nights per cell, {args.hours:g} simulated hours", "",
             f"Command: `.venv/bin/python bench/fleet.py --seeds {args.seeds} --hours {args.hours:g} --boxes "
             f"{args.boxes} --landscapes {args.landscapes} --jobs {args.jobs}` ({time.time() - t0:.0f} s wall). Box offsets: one box 1.0; "
             "more boxes each x U(0.97, 1.03). Hours to within "
             f"{args.within:.0%} of the one-change optimum (median over the nights that got there); the ratio: "
             f"the median over seeds of (hours with N boxes) / (hours with 1), a night that never got there "
             f"counted at {args.hours:g} h.", "",
             "| landscape | boxes | within 3 % | median hours | ratio to 1 box | arms (median) | final (median) "
             "| false promotions | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        for n in counts:
            rs = [res[(name, s, n)] for s in range(args.seeds)]
            hit = [r["reached_h"] for r in rs if r["reached_h"] is not None]
            ratios = [((res[(name, s, n)]["reached_h"] or args.hours) / (res[(name, s, 1)]["reached_h"] or args.hours))
                      for s in range(args.seeds)] if 1 in counts else []
            lines.append(f"| {name} | {n} | {len(hit)}/{len(rs)} | {statistics.median(hit) if hit else float('nan'):.2f} "
                         f"| {statistics.median(ratios) if ratios else float('nan'):.2f} "
                         f"| {statistics.median(r['arms'] for r in rs):.0f} "
                         f"| {statistics.median(r['final'] for r in rs):.3f} | {sum(r['false'] for r in rs)} "
                         f"| {sum(len(r['errors']) for r in rs)} |")
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One night instead of three (issue 8): seed 002's campaign in simulated time.

The campaign is examples/one-night.yaml: the 2026-09-29 shape (32k window, bf16 KV in a 2 GiB
pool, MTP4, prefetch on, gather 8x16) with the capacity contract as the campaign's constraint
(two 200,704-token contexts: max concurrency >= 1.99x) and every lever of the three nights, the
compile cache mounted. Per seed (the
landscape's noise seed), run
  - the tuner (CampaignLoop on a SimHost: confirmations, rechecks, pruning, the journal),
  - an exhaustive one-change sweep (measure every neighbour of the incumbent, move to the best
    if it beats the incumbent beyond 2 % or gets closer to the constraint, repeat),
  - a random search over whole shapes (uniform over the lever values),
all on the same budget of simulated hours, and report simulated hours and arms to a shape
"E or better": one that boots, does not corrupt, meets the constraint, and decodes (true,
noise-free decode geomean) within the measurement resolution of shape E or above it.

  .venv/bin/python bench/one_night.py [--seeds 20] [--hours 48] [--within 0.03] [--jobs 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import random
import tempfile
import time
from pathlib import Path

import yaml
from simbench import (PROFILE, REPO, Truth, emit, arm_runner, lever_values, measure_arm, sim_campaign, truth,
                      write_campaign)

from arms.shape import ABSENT, Shape
from simengine.cli import known_flags
from simengine.landscape import load_landscape
from tuner.night.loop import CampaignLoop
from tuner.night.state import State, replay
from tuner.night.verdict import Constraints, Score

EXAMPLE = REPO / "examples" / "one-night.yaml"      # the campaign: start shape, levers, constraint, measure
_RAW = yaml.safe_load(EXAMPLE.read_text())
START_ARGS, START_ENV = _RAW["baseline"]["args"], _RAW["baseline"]["env"]
LEVERS, CONSTRAINTS, MEASURE = _RAW["levers"], _RAW["constraints"], _RAW["measure"]
SHAPE_E = {"expert-prefetch": ABSENT, "speculative-config": ABSENT, "env.R4D_LRU_GATHER_CHUNKS": 32,
           "env.R4D_LRU_GATHER_LANES": 64, "max-num-batched-tokens": 1024, "expert-precise-memory": True,
           "max-num-seqs": 3, "max-model-len": 200704, "kv-cache-dtype": "fp8",
           "kv-cache-memory-bytes": 3150000000}


def with_changes(shape: Shape, changes: dict) -> Shape:
    for name, v in changes.items():
        shape = shape.with_change(name, v)
    return shape


class Judge:
    """The landscape's truth: is a shape E-or-better, is a move a false promotion."""

    def __init__(self, land, constraints: Constraints, base: Shape, within: float):
        self.land, self.constraints, self.within = land, constraints, within
        self.e = truth(land, with_changes(base, SHAPE_E), constraints)
        assert self.e.feasible, "shape E must meet the constraint in the default landscape"

    def of(self, shape: Shape) -> Truth:
        return truth(self.land, shape, self.constraints)

    def reached(self, shape: Shape) -> bool:
        t = self.of(shape)
        return t.feasible and t.objective >= self.e.objective * (1 - self.within)


def run_tuner(tmp: Path, seed: int, judge: Judge, hours: float, shuffle: bool = False) -> dict:
    """One night of the tuner; ``shuffle``: the operator listed the levers in a random order."""
    levers = dict(LEVERS)
    if shuffle:
        names = list(levers)
        random.Random(1000 + seed).shuffle(names)
        levers = {n: LEVERS[n] for n in names}
    name = f"tuner{seed}{'-shuffled' if shuffle else ''}"
    camp, host = sim_campaign(write_campaign(tmp, name, args=START_ARGS, env=START_ENV, levers=levers,
                                             measure=MEASURE, constraints=CONSTRAINTS), seed)
    out = {"reached_h": None, "reached_arms": None}

    def on_arm(st: State, end: dict) -> None:
        if out["reached_h"] is None and judge.reached(st.incumbent):
            out["reached_h"], out["reached_arms"] = host.now() / 3600, len(st.arms)

    loop = CampaignLoop(camp, host, PROFILE, deadline=host.now() + hours * 3600, on_arm=on_arm)
    summary = loop.run()
    st = replay(loop.journal.records, camp.baseline)
    prev, false, corrupt = judge.of(camp.baseline), 0, 0
    for m in st.moves:
        t = judge.of(Shape.from_dict(m["shape"]))
        corrupt += t.corrupt
        false += t.key() <= prev.key() or not t.boots or t.corrupt
        prev = t
    ends = [a.end or {} for a in st.arms.values()]
    final = judge.of(st.incumbent)
    return {**out, "arms": summary.arms, "hours": host.now() / 3600, "moves": len(st.moves),
            "boot_failures": sum(str(e.get("verdict", "")).startswith("boot-failed") for e in ends),
            "confirmations": sum(a.kind == "confirm" for a in st.arms.values()),
            "false_promotions": false, "corrupt_promotions": corrupt,
            "final_vs_e": final.objective / judge.e.objective if final.feasible else None}


def _better(a: Score, b: Score) -> bool:
    """The plain sweep's rule: feasible first, then less violation, then +2 % objective."""
    if a.feasible != b.feasible:
        return a.feasible
    if not a.feasible and abs(a.violation - b.violation) > 1e-6:
        return a.violation < b.violation
    return a.objective > b.objective * 1.02


def run_sweep(tmp: Path, seed: int, judge: Judge, hours: float) -> dict:
    camp, host = sim_campaign(write_campaign(tmp, f"sweep{seed}", args=START_ARGS, env=START_ENV, levers=LEVERS,
                                             measure=MEASURE, constraints=CONSTRAINTS), seed)
    runner, end = arm_runner(camp, host), hours * 3600
    inc, n, fails = camp.baseline, 0, 0
    inc_score = measure_arm(runner, n, inc)
    n += 1
    while host.now() < end:
        results = []
        for name, spec in LEVERS.items():
            for v in lever_values(spec):
                if inc.value_of(name) == v or host.now() >= end:
                    continue
                s = inc.with_change(name, v)
                sc = measure_arm(runner, n, s)
                n += 1
                fails += sc is None
                if sc is not None:
                    results.append((sc, s))
        if not results:
            break
        top_score, top = max(results, key=lambda x: x[0].key())
        if not _better(top_score, inc_score):
            break
        inc, inc_score = top, top_score
        if judge.reached(inc):
            return {"reached_h": host.now() / 3600, "reached_arms": n, "arms": n, "boot_failures": fails,
                    "hours": host.now() / 3600}
    return {"reached_h": None, "reached_arms": None, "arms": n, "boot_failures": fails, "hours": host.now() / 3600}


def run_random(tmp: Path, seed: int, judge: Judge, hours: float) -> dict:
    camp, host = sim_campaign(write_campaign(tmp, f"random{seed}", args=START_ARGS, env=START_ENV, levers=LEVERS,
                                             measure=MEASURE, constraints=CONSTRAINTS), seed)
    runner, end, rng = arm_runner(camp, host), hours * 3600, random.Random(seed)
    best, n, fails = None, 0, 0
    while host.now() < end:
        s = with_changes(camp.baseline, {k: rng.choice(lever_values(v)) for k, v in LEVERS.items()})
        sc = measure_arm(runner, n, s)
        n += 1
        fails += sc is None
        if sc is not None and (best is None or _better(sc, best)):
            best = sc
            if judge.reached(s):
                return {"reached_h": host.now() / 3600, "reached_arms": n, "arms": n, "boot_failures": fails,
                    "hours": host.now() / 3600}
    return {"reached_h": None, "reached_arms": None, "arms": n, "boot_failures": fails, "hours": host.now() / 3600}


_CTX: dict = {}       # what every seed shares; set before the worker processes fork


def run_seed(seed: int) -> tuple[dict, dict, dict, dict]:
    tmp, judge, hours = _CTX["tmp"], _CTX["judge"], _CTX["hours"]
    t, sh = run_tuner(tmp, seed, judge, hours), run_tuner(tmp, seed, judge, hours, shuffle=True)
    e = r = {"reached_h": None, "reached_arms": None, "arms": 0, "boot_failures": 0, "hours": 0.0}
    if not _CTX["skip"]:
        e, r = run_sweep(tmp, seed, judge, hours), run_random(tmp, seed, judge, hours)
    return t, sh, e, r


def h(x) -> str:
    return "not reached" if x is None else f"{x:.1f} h"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--hours", type=float, default=24.0, help="simulated budget of every method")
    ap.add_argument("--within", type=float, default=0.03)
    ap.add_argument("--skip-baselines", action="store_true", help="the tuner only")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run in this many processes (results do not depend on it)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="bench-night-"))
    land = load_landscape(None, known_flags(__import__("simbench").PARSER))
    base, _ = sim_campaign(write_campaign(tmp, "probe", args=START_ARGS, env=START_ENV, levers=LEVERS,
                                          measure=MEASURE, constraints=CONSTRAINTS), 0)
    judge = Judge(land, Constraints.from_mapping(CONSTRAINTS, "bench"), base.baseline, args.within)
    start = judge.of(base.baseline)
    cmd = (f".venv/bin/python bench/one_night.py --seeds {args.seeds} --hours {args.hours:g} --within {args.within:g}"
           + (" --skip-baselines" if args.skip_baselines else "") + f" --jobs {args.jobs}")
    lines = [f"command: {cmd}", "",
             f"start: the 2026-09-29 shape, true decode geomean {start.objective:.2f} tok/s, constraint violation "
             f"{start.violation:.2f} (32k window: cannot hold one 200,704-token context)",
             f"shape E: true decode geomean {judge.e.objective:.2f} tok/s, meets max concurrency >= 1.99x at 200,704 "
             f"tokens; 'E or better' = feasible and within {args.within:.0%} of E or above (the noise resolution)",
             f"budget: {args.hours:g} simulated hours per method and seed; lever space "
             f"{sum(len(lever_values(v)) - 1 for v in LEVERS.values())} one-change neighbours per shape", "",
             "| seed | tuner: to E-or-better | arms | boots failed | confirmations | moves | false promotions "
             "| final vs E | levers shuffled: to E-or-better | arms | final vs E | sweep: to E-or-better | sweep arms "
             "| random: to E-or-better | random arms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    _CTX.update(tmp=tmp, judge=judge, hours=args.hours, skip=args.skip_baselines)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:     # seeds are independent
        results = pool.imap(run_seed, range(args.seeds))
        for seed in range(args.seeds):
            t, sh, e, r = next(results)
            rows.append((t, sh, e, r))
            fv, fs = (("n/a" if x["final_vs_e"] is None else f"{x['final_vs_e']:.3f}") for x in (t, sh))
            lines.append(f"| {seed} | {h(t['reached_h'])} | {t['reached_arms'] or t['arms']} | {t['boot_failures']} | "
                         f"{t['confirmations']} | {t['moves']} | {t['false_promotions']} | {fv} | {h(sh['reached_h'])} | "
                         f"{sh['reached_arms'] or sh['arms']} | {fs} | {h(e['reached_h'])} | {e['reached_arms'] or e['arms']} | "
                         f"{h(r['reached_h'])} | {r['reached_arms'] or r['arms']} |")
            print(lines[-1], flush=True)
            if args.out:       # the rows so far: a run stopped early keeps the seeds it finished
                Path(args.out).write_text("\n".join(lines + ["", f"(in progress: {seed + 1} of {args.seeds} seeds)"]) + "\n")

    names = ["tuner", "tuner, levers listed in a shuffled order", "exhaustive one-change sweep", "random search"]
    cols = range(len(names))
    reached = [sum(row[i]["reached_h"] is not None for row in rows) for i in cols]

    def outcome(r: dict, key: str) -> tuple[float, str, float]:
        """(sort key, text, value): reached; ran out of the budget (a lower bound, '>='); or
        stopped short of E ('never': converged, or the sweep found no better neighbour)."""
        if r["reached_h"] is not None:
            v = r[key]
            return v, f"{v:.1f}" if key == "reached_h" else f"{v:g}", v
        if r["hours"] < args.hours - 0.01:
            return float("inf"), "never", float("inf")
        v = args.hours if key == "reached_h" else r["arms"]
        return 1e6 + v, f">={v:.1f}" if key == "reached_h" else f">={v:g}", v

    def med_worst(i: int, key: str) -> tuple[tuple, tuple]:
        xs = sorted((outcome(row[i], key) for row in rows), key=lambda x: x[0])
        lo, hi = xs[(len(xs) - 1) // 2], xs[len(xs) // 2]
        if lo[0] < 1e6 and hi[0] < 1e6:                  # both reached: the usual median
            v = (lo[2] + hi[2]) / 2
            med = (v, f"{v:.1f}" if key == "reached_h" else f"{v:g}", v)
        else:
            med = hi                                     # a bound or 'never': the conservative middle
        return med, xs[-1]

    lines += ["", f"not reached: '>=' the method ran out of its {args.hours:g} simulated hours (a lower bound); "
                  "'never' it stopped short of E (converged, or the sweep found no better neighbour).",
              "", "| method | reached | median hours | worst hours | median arms | worst arms |", "|---|---|---|---|---|---|"]
    meds = []
    for i, name in enumerate(names):
        (mh, wh), (ma, wa) = med_worst(i, "reached_h"), med_worst(i, "reached_arms")
        meds.append((mh, ma))
        lines.append(f"| {name} | {reached[i]}/{len(rows)} | {mh[1]} | {wh[1]} | {ma[1]} | {wa[1]} |")

    def ratio(i: int, j: int, k: int) -> str:
        a, b = meds[i][k], meds[j][k]
        if args.skip_baselines or a[0] >= 1e6 or b[0] == float("inf"):
            return "n/a"
        return f"{'<=' if b[0] >= 1e6 else ''}{a[2] / b[2]:.2f}"

    lines += ["", f"arms ratio (median): tuner/exhaustive {ratio(0, 2, 1)}, tuner/random {ratio(0, 3, 1)}; "
                  f"hours ratio (median): tuner/exhaustive {ratio(0, 2, 0)}, tuner/random {ratio(0, 3, 0)}",
              f"false promotions (tuner, both lever orders): {sum(row[i]['false_promotions'] for row in rows for i in (0, 1))} "
              f"in {2 * len(rows)} nights; promotions of the corrupt TunableOp arm: "
              f"{sum(row[i]['corrupt_promotions'] for row in rows for i in (0, 1))}",
              f"wall time of this benchmark: {time.time() - t0:.0f} s"]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

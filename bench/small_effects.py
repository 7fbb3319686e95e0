"""Small effects (issue 12): nights on landscapes whose winning moves are worth +3 to +5 %.

Each landscape in simengine/landscapes/small-*.yaml comes with a campaign here (start shape and
levers, in the order an operator might list them). Per landscape and noise seed, run
  - the tuner with the levers as listed, and again in a shuffled order (CampaignLoop on a SimHost,
    the budget in simulated hours),
  - an exhaustive one-change sweep (measure every neighbour of the incumbent, move to the best if
    it beats the incumbent by 2 %, repeat) on the first --sweep-seeds seeds,
and report, against the landscape's noise-free truth: the one-change optimum (a noise-free
best-improvement walk from the start), the incumbent's true objective at --at hours (and at the
end), hours to within --within of the optimum, false promotions (a move that is not truly better),
corrupt promotions, promotions of the noisy zero-effect levers, and how each night ended.

  .venv/bin/python bench/small_effects.py [--seeds 20] [--hours 8] [--at 8] [--jobs 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import random
import statistics
import tempfile
import time
from pathlib import Path

from simbench import PARSER, PROFILE, REPO, emit, lever_values, sim_campaign, truth, write_campaign

from arms.shape import Shape
from simengine.cli import known_flags
from simengine.landscape import load_landscape
from tuner.night.loop import CampaignLoop
from tuner.night.state import State, replay

LANDSCAPES = REPO / "simengine" / "landscapes"
START = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
         "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4, "enable-prefix-caching": True,
         "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
START_ENV = {"R4D_LRU_GATHER_CHUNKS": 8, "R4D_LRU_GATHER_LANES": 16}
CORRUPT = {"values": ["absent", 1], "numerics": "changing"}
NOISY = ["env.GPU_MAX_HW_QUEUES", "env.HSA_ENABLE_SDMA"]      # zero effect: any promotion is false
CAMPAIGNS = {
    "small-gather": {
        "args": START, "env": START_ENV,
        "levers": {"expert-prefetch": [1, "absent", 2],
                   "env.GPU_MAX_HW_QUEUES": ["absent", 2, 4],
                   "env.R4D_LRU_GATHER_LANES": [16, 32, 64],
                   "env.R4D_LRU_GATHER_CHUNKS": [8, 64, 32, 16],       # the larger value is listed first
                   "env.HSA_ENABLE_SDMA": ["absent", 0],
                   "max-num-seqs": [4, 2, 3, 6],
                   "gpu-memory-utilization": [0.98, 0.95, 0.99],
                   "env.CLAV_TUNABLEOP_WITH_OFFLOAD": CORRUPT,
                   "max-num-batched-tokens": [1024, 2048, 4096, 8192]}},
    "small-spec": {
        "args": START, "env": START_ENV,
        "levers": {"env.GPU_MAX_HW_QUEUES": ["absent", 2, 4],
                   "max-num-batched-tokens": [1024, 8192, 4096, 2048],
                   "speculative-config": ["absent", {"method": "mtp", "num_speculative_tokens": 3},
                                          {"method": "mtp", "num_speculative_tokens": 4},
                                          {"method": "mtp", "num_speculative_tokens": 6}],
                   "env.R4D_LRU_UVA_TOKENS": ["absent", 2048, 8192],
                   "env.CLAV_TUNABLEOP_WITH_OFFLOAD": CORRUPT,
                   "env.HSA_ENABLE_SDMA": ["absent", 0],
                   "max-num-seqs": [4, 6],
                   "kv-cache-dtype": {"values": ["absent", "fp8"], "numerics": "changing"},
                   "expert-precise-memory": ["absent", True]}},
    "small-memory": {
        "args": {**START, "gpu-memory-utilization": 0.95}, "env": START_ENV,
        "levers": {"env.HSA_ENABLE_SDMA": ["absent", 0],
                   "max-num-seqs": [4, 2, 3],
                   "env.GPU_MAX_HW_QUEUES": ["absent", 2, 4],
                   "max-num-batched-tokens": [1024, 2048, 4096],
                   "env.CLAV_TUNABLEOP_WITH_OFFLOAD": CORRUPT,
                   "gpu-memory-utilization": [0.95, 0.97, 0.98, 0.99],
                   "expert-precise-memory": ["absent", True],
                   "expert-prefetch": ["absent", 1, 2]}},
}
MEASURE = {"depths": [166, 1087, 4064], "runs": 3, "warm_tokens": 64, "max_tokens": 256}


class Truth:
    def __init__(self, name: str, base: Shape):
        self.land = load_landscape(str(LANDSCAPES / f"{name}.yaml"), known_flags(PARSER))
        self.levers = CAMPAIGNS[name]["levers"]
        self.start = base
        self.optimum_shape, self.optimum = self._walk(base)

    def obj(self, shape: Shape) -> float | None:
        return truth(self.land, shape).objective

    def neighbours(self, shape: Shape):
        for name, spec in self.levers.items():
            for v in lever_values(spec):
                if shape.value_of(name) != v:
                    yield shape.with_change(name, v)

    def _walk(self, shape: Shape) -> tuple[Shape, float]:
        """The one-change optimum: noise-free best-improvement moves until none improves."""
        cur = self.obj(shape)
        while True:
            scored = [(self.obj(s), s) for s in self.neighbours(shape)]
            top = max(((o, s) for o, s in scored if o is not None), key=lambda x: x[0])
            if top[0] <= cur * (1 + 1e-9):
                return shape, cur
            cur, shape = top


def campaign(tmp: Path, name: str, tag: str, seed: int, levers: dict):
    spec = CAMPAIGNS[name]
    path = write_campaign(tmp, f"{name}-{tag}{seed}", args=spec["args"], env=spec["env"], levers=levers,
                          measure=MEASURE, compile_cache=True)
    return sim_campaign(path, seed, LANDSCAPES / f"{name}.yaml")


def run_tuner(tmp: Path, name: str, seed: int, t: Truth, hours: float, at: float, within: float,
              shuffle: bool) -> dict:
    levers = dict(CAMPAIGNS[name]["levers"])
    if shuffle:
        names = list(levers)
        random.Random(1000 + seed).shuffle(names)
        levers = {n: levers[n] for n in names}
    camp, host = campaign(tmp, name, "shuffled" if shuffle else "listed", seed, levers)
    out = {"reached_h": None, "at": None}

    def on_arm(st: State, end: dict) -> None:
        o = t.obj(st.incumbent) or 0.0
        if out["reached_h"] is None and o >= t.optimum * (1 - within):
            out["reached_h"] = host.now() / 3600
        if host.now() <= at * 3600:
            out["at"] = o / t.optimum

    loop = CampaignLoop(camp, host, PROFILE, deadline=host.now() + hours * 3600, on_arm=on_arm)
    summary = loop.run()
    st = replay(loop.journal.records, camp.baseline)
    prev, false, corrupt, noisy = t.obj(camp.baseline), 0, 0, 0
    for m in st.moves:
        s = Shape.from_dict(m["shape"])
        tr = truth(t.land, s)
        corrupt += tr.corrupt
        false += tr.objective is None or tr.objective <= prev * (1 + 1e-9)
        noisy += bool(m.get("change")) and m["change"][0] in NOISY
        prev = tr.objective or 0.0
    return {**out, "arms": summary.arms, "hours": host.now() / 3600, "moves": len(st.moves),
            "false": false, "corrupt": corrupt, "noisy": noisy, "reason": summary.reason,
            "final": (t.obj(st.incumbent) or 0.0) / t.optimum,
            "at": out["at"] if out["at"] is not None else (t.obj(camp.baseline) or 0) / t.optimum}


def run_sweep(tmp: Path, name: str, seed: int, t: Truth, hours: float, within: float) -> dict:
    from simbench import arm_runner, measure_arm

    camp, host = campaign(tmp, name, "sweep", seed, CAMPAIGNS[name]["levers"])
    runner, end = arm_runner(camp, host), hours * 3600
    inc, n = camp.baseline, 0
    inc_sc = measure_arm(runner, n, inc)
    n += 1
    reached = None
    while host.now() < end:
        results = []
        for s in t.neighbours(inc):
            if host.now() >= end:
                break
            sc = measure_arm(runner, n, s)
            n += 1
            if sc is not None:
                results.append((sc.objective, s))
        if not results:
            break
        top = max(results, key=lambda x: x[0])
        if top[0] <= inc_sc.objective * 1.02:
            break
        inc, inc_sc = top[1], type(inc_sc)(True, 0.0, top[0])
        if reached is None and (t.obj(inc) or 0) >= t.optimum * (1 - within):
            reached = host.now() / 3600
    return {"reached_h": reached, "arms": n, "hours": host.now() / 3600, "final": (t.obj(inc) or 0) / t.optimum}


_CTX: dict = {}


def run_job(job: tuple[str, int]) -> tuple[str, int, dict, dict, dict | None]:
    name, seed = job
    c = _CTX
    t = c["truths"][name]
    a = run_tuner(c["tmp"], name, seed, t, c["hours"], c["at"], c["within"], shuffle=False)
    b = run_tuner(c["tmp"], name, seed, t, c["hours"], c["at"], c["within"], shuffle=True)
    s = run_sweep(c["tmp"], name, seed, t, c["sweep_hours"], c["within"]) if seed < c["sweep_seeds"] else None
    return name, seed, a, b, s


def h(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--hours", type=float, default=8.0, help="the tuner's simulated budget")
    ap.add_argument("--at", type=float, default=8.0, help="judge the incumbent at this simulated hour")
    ap.add_argument("--within", type=float, default=0.03)
    ap.add_argument("--sweep-seeds", type=int, default=5, help="run the exhaustive sweep on the first N seeds")
    ap.add_argument("--sweep-hours", type=float, default=24.0)
    ap.add_argument("--landscapes", default=",".join(CAMPAIGNS))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="bench-small-"))
    names = args.landscapes.split(",")
    truths = {}
    for name in names:
        camp, _ = campaign(tmp, name, "probe", 0, CAMPAIGNS[name]["levers"])
        truths[name] = Truth(name, camp.baseline)
    _CTX.update(tmp=tmp, truths=truths, hours=args.hours, at=args.at, within=args.within,
                sweep_seeds=args.sweep_seeds, sweep_hours=args.sweep_hours)
    cmd = (f".venv/bin/python bench/small_effects.py --seeds {args.seeds} --first-seed {args.first_seed} --hours {args.hours:g} --at {args.at:g} "
           f"--within {args.within:g} --sweep-seeds {args.sweep_seeds} --sweep-hours {args.sweep_hours:g} "
           f"--landscapes {args.landscapes} --jobs {args.jobs}")
    jobs = [(n, s) for s in range(args.first_seed, args.first_seed + args.seeds) for n in names]
    res: dict[str, list] = {n: [] for n in names}
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for name, seed, a, b, s in pool.imap(run_job, jobs):
            res[name].append((seed, a, b, s))
            print(name, seed, a, b, s, flush=True)
            if args.out:       # the table so far: a run stopped early keeps the seeds it finished
                Path(args.out).write_text("\n".join(table(cmd, names, truths, res, args, t0, partial=True)) + "\n")
    emit(table(cmd, names, truths, res, args, t0), args.out)
    return 0


def table(cmd: str, names: list[str], truths: dict, res: dict, args, t0: float, partial: bool = False) -> list[str]:
    done = {n: len(res[n]) for n in names}
    lines = [f"command: {cmd}", ""]
    if partial:
        lines += [f"(in progress: seeds finished {', '.join(f'{n} {k}' for n, k in done.items())})", ""]
    for name in names:
        if not res[name]:
            continue
        t = truths[name]
        rows = sorted(res[name], key=lambda r: r[0])
        start = (t.obj(t.start) or 0) / t.optimum
        lines += [f"## {name}", "",
                  f"one-change optimum: true decode geomean {t.optimum:.2f} tok/s (start {start:.3f} of it); "
                  f"'within' = {args.within:.0%}; tuner budget {args.hours:g} simulated h, judged at {args.at:g} h", "",
                  "| seed | listed: at %gh | reached (h) | arms | moves | false | corrupt | noisy lever | end "
                  "| shuffled: at %gh | reached (h) | arms | moves | false | corrupt | noisy lever | end "
                  "| sweep: reached (h) | arms | final |" % (args.at, args.at),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for seed, a, b, s in rows:
            cells = [str(seed)]
            for x in (a, b):
                cells += [f"{x['at']:.3f}", h(x["reached_h"]), str(x["arms"]), str(x["moves"]), str(x["false"]),
                          str(x["corrupt"]), str(x["noisy"]), x["reason"][:40]]
            cells += [h(s["reached_h"]), str(s["arms"]), f"{s['final']:.3f}"] if s else ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for label, i in (("listed", 1), ("shuffled", 2)):
            xs = [r[i] for r in rows]
            ok = sum(x["at"] >= 1 - args.within for x in xs)
            reached = [x["reached_h"] for x in xs if x["reached_h"] is not None]
            lines.append(f"- {label}: {ok}/{len(xs)} nights within {args.within:.0%} of the optimum at {args.at:g} h; "
                         f"median at {args.at:g} h {statistics.median(x['at'] for x in xs):.3f}; median hours to "
                         f"within {statistics.median(reached) if reached else float('nan'):.1f} "
                         f"({len(reached)} reached); false promotions {sum(x['false'] for x in xs)}, corrupt "
                         f"{sum(x['corrupt'] for x in xs)}, noisy-lever promotions {sum(x['noisy'] for x in xs)}")
        sw = [r[3] for r in rows if r[3] is not None]
        if sw:
            rr = [x["reached_h"] for x in sw if x["reached_h"] is not None]
            lines.append(f"- exhaustive sweep ({len(sw)} seeds, {args.sweep_hours:g} h): reached {len(rr)}/{len(sw)}, "
                         f"median hours {statistics.median(rr) if rr else float('nan'):.1f}, median arms "
                         f"{statistics.median(x['arms'] for x in sw):g}")
        lines.append("")
    lines.append(f"wall time of this benchmark: {time.time() - t0:.0f} s")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())

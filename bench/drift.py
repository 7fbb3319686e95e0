"""Drift (issue 12): a slow rise of every shape's rate over the night must not read as an effect.

small-gather-drift is small-gather with every shape's decode rate rising 2 % per simulated hour
(simengine/landscapes/small-gather-drift.yaml). Per seed, the tuner runs one 8-hour night twice
on it (levers as listed): with the drift correction (CampaignLoop.drift_correction, off by
default: the incumbent re-measured between challengers, one slope per hour fitted to every
shape's repeated boots, each boot moved to a common time; tuner/night/compare.py) and without it
(each side's boots pooled as if measured at once, the default). A promotion is false when the
move is not truly better on the drift-free landscape.

  .venv/bin/python bench/drift.py [--seeds 5] [--hours 8] [--jobs 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import tempfile
import time
from pathlib import Path

import small_effects as se
from simbench import PROFILE, emit, sim_campaign, truth, write_campaign

from arms.shape import Shape
from tuner.night.loop import CampaignLoop
from tuner.night.state import replay

LANDSCAPE = se.LANDSCAPES / "small-gather-drift.yaml"
_CTX: dict = {}


def night(seed: int, correct: bool) -> dict:
    tmp, t, hours = _CTX["tmp"], _CTX["truth"], _CTX["hours"]
    spec = se.CAMPAIGNS["small-gather"]
    path = write_campaign(tmp, f"drift-{'on' if correct else 'off'}{seed}", args=spec["args"], env=spec["env"],
                          levers=spec["levers"], measure=se.MEASURE, compile_cache=True)
    camp, host = sim_campaign(path, seed, LANDSCAPE)
    loop = CampaignLoop(camp, host, PROFILE, deadline=host.now() + hours * 3600)
    loop.drift_correction = correct
    summary = loop.run()
    st = replay(loop.journal.records, camp.baseline)
    prev, false, moves, drifts = t.obj(camp.baseline), [], [], []
    for m in st.moves:
        tr = truth(t.land, Shape.from_dict(m["shape"]))
        ok = tr.objective is not None and tr.objective > prev * (1 + 1e-9)
        ch = m.get("change") or ["?", None]
        eff = (m.get("comparison") or {}).get("effect")
        moves.append(f"{ch[0]}={ch[1]}" + ("" if eff is None else f" {eff:+.1%}") + ("" if ok else " FALSE"))
        false += [] if ok else [moves[-1]]
        prev = tr.objective or 0.0
    for r in st.comparisons:
        d = (r.get("comparison") or {}).get("drift_per_h")
        if d is not None:
            drifts.append(d)
    return {"false": len(false), "moves": moves, "final": (t.obj(st.incumbent) or 0.0) / t.optimum,
            "arms": summary.arms, "drift": drifts[-1] if drifts else None, "corrected": len(drifts)}


def job(seed: int):
    return seed, night(seed, True), night(seed, False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="bench-drift-"))
    camp, _ = se.campaign(tmp, "small-gather", "probe", 0, se.CAMPAIGNS["small-gather"]["levers"])
    _CTX.update(tmp=tmp, truth=se.Truth("small-gather", camp.baseline), hours=args.hours)
    lines = [f"command: .venv/bin/python bench/drift.py --seeds {args.seeds} --hours {args.hours:g} --jobs {args.jobs}", "",
             "landscape: small-gather-drift (small-gather, every shape's rate rising 2 % per simulated hour); "
             f"tuner budget {args.hours:g} simulated h, levers as listed; 'final' = the incumbent's true "
             "objective / the one-change optimum (drift-free)", "",
             "| seed | corrected: false | final | arms | drift seen (/h) | comparisons corrected | moves "
             "| uncorrected: false | final | arms | moves |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for seed, a, b in pool.imap(job, range(args.seeds)):
            rows.append((seed, a, b))
            print(seed, a, b, flush=True)
    for seed, a, b in sorted(rows):
        lines.append(f"| {seed} | {a['false']} | {a['final']:.3f} | {a['arms']} | "
                     f"{'-' if a['drift'] is None else format(a['drift'], '+.2%')} | {a['corrected']} | "
                     f"{'; '.join(a['moves'])} | {b['false']} | {b['final']:.3f} | {b['arms']} | {'; '.join(b['moves'])} |")
    lines += ["", f"- corrected: false promotions {sum(r[1]['false'] for r in rows)} in {len(rows)} nights, nights with one "
              f"{sum(r[1]['false'] > 0 for r in rows)}; within 3 % of the optimum {sum(r[1]['final'] >= 0.97 for r in rows)}/{len(rows)}",
              f"- uncorrected: false promotions {sum(r[2]['false'] for r in rows)} in {len(rows)} nights, nights with one "
              f"{sum(r[2]['false'] > 0 for r in rows)}; within 3 % of the optimum {sum(r[2]['final'] >= 0.97 for r in rows)}/{len(rows)}",
              "", f"wall time of this benchmark: {time.time() - t0:.0f} s"]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

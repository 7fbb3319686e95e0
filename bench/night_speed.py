"""Wall and CPU time of simulated nights, and a fingerprint of what each night decided.

One tuner night per (landscape, seed) from bench/small_effects.py (levers as listed), with
its arms and end, and a SHA-256 over every arm's change, verdict and measured objective
(rounded to 1e-6), all arms and the first 50: the same fingerprint before and after a speed
change means the night decided and measured the same things.

  .venv/bin/python bench/night_speed.py [--landscapes small-gather] [--seeds 1] [--hours 8]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import resource
import tempfile
import time
from pathlib import Path

import small_effects as se
from simbench import emit

from tuner.night.loop import CampaignLoop


def night(tmp: Path, name: str, seed: int, hours: float) -> dict:
    camp, host = se.campaign(tmp, name, "speed", seed, se.CAMPAIGNS[name]["levers"])
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
    loop = CampaignLoop(camp, host, se.PROFILE, deadline=host.now() + hours * 3600)
    summary = loop.run()
    wall, cpu = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_utime - c0
    seen = []
    for r in loop.journal.records:
        if r.get("op") == "arm_end":
            obj = (r.get("score") or {}).get("objective")
            seen.append([r.get("arm"), r.get("change"), r.get("verdict"),
                         None if obj is None else round(obj, 6)])
    return {"wall": wall, "cpu": cpu, "arms": summary.arms, "hours": host.now() / 3600,
            "reason": summary.reason, "fingerprint": _fp(seen), "first": _fp(seen[:FIRST])}


FIRST = 50      # the first arms' fingerprint: a shifted clock may fit one arm more or less by the deadline


def _fp(seen: list) -> str:
    return hashlib.sha256(json.dumps(seen, sort_keys=True, default=str).encode()).hexdigest()[:12]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--landscapes", default="small-gather")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="bench-speed-"))
    lines = [f"command: .venv/bin/python bench/night_speed.py --landscapes {args.landscapes} "
             f"--seeds {args.seeds} --hours {args.hours:g}", "",
             f"| landscape | seed | wall s | cpu s | arms | simulated h | end | fingerprint: all arms | first {FIRST} arms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in args.landscapes.split(","):
        for seed in range(args.seeds):
            r = night(tmp, name, seed, args.hours)
            lines.append(f"| {name} | {seed} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['arms']} | {r['hours']:.2f} "
                         f"| {r['reason'][:30]} | {r['fingerprint']} | {r['first']} |")
            print(lines[-1], flush=True)
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Seed 001's shape through arms.sweep on the simulated engine's HTTP server, in real time: the
tolerances tests/test_sweep.py asserted until a loaded machine broke them (issue 20: the knee
read 8 with a core busy). A closed-loop sweep at concurrency 1, 2, 4, 8, 16 against max_num_seqs
4 and batch_efficiency 0.85; per load level (N background processes each spinning a core) and
round:

  req/s grows to the limit: x1.3 from 1 to 2, x1.2 from 2 to 4
  past it flat: req/s at 8 and 16 within 12 % of 4's, TPOT p95 within 20 %
  TTFT p95 explodes: x3 from 4 to 8, x1.5 from 8 to 16
  the knee and the goodput level at 4, 100 % in SLO at 4, under 50 % at 16

  .venv/bin/python bench/sweep_shape.py [--rounds 3] [--busy 0,1] [--out bench/results/sweep_shape.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for p in (REPO, REPO / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from simbench import emit  # noqa: E402
from arms.measure import VLLM_API  # noqa: E402
from arms.prompts import PromptCache  # noqa: E402
from arms.sweep import run_sweep  # noqa: E402
from prefill_timing import burners, stop  # noqa: E402
from tests.conftest import serving  # noqa: E402
from tests.test_sweep import SEED_001, SEED_001_PLAN  # noqa: E402

SIM_API = dataclasses.replace(VLLM_API, name="simengine", ignores_eos=True)


def checks(by: dict) -> list[str]:
    """The tolerances that fail, as text."""
    want = {
        "req/s x1.3 from 1 to 2": by[2].req_s > 1.3 * by[1].req_s,
        "req/s x1.2 from 2 to 4": by[4].req_s > 1.2 * by[2].req_s,
        **{f"req/s at {c} within 12 % of 4's": abs(by[c].req_s / by[4].req_s - 1) <= 0.12 for c in (8, 16)},
        **{f"TPOT p95 at {c} within 20 % of 4's": abs(by[c].tpot_p95_s / by[4].tpot_p95_s - 1) <= 0.2
           for c in (8, 16)},
        "TTFT p95 x3 from 4 to 8": by[8].ttft_p95_s > 3 * by[4].ttft_p95_s,
        "TTFT p95 x1.5 from 8 to 16": by[16].ttft_p95_s > 1.5 * by[8].ttft_p95_s,
        "100 % in SLO at 4, under 50 % at 16": by[4].slo_pct == 100.0 and by[16].slo_pct < 50,
    }
    return [k for k, ok in want.items() if not ok]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", default="0,1")
    ap.add_argument("--out")
    ns = ap.parse_args()
    rows, fails, loads = [], [], []
    for busy in (int(x) for x in ns.busy.split(",")):
        load = burners(busy, 1800)
        try:
            time.sleep(1 if busy else 0)
            for k in range(ns.rounds):
                with serving(SEED_001) as url:
                    r = run_sweep(url, SIM_API, SEED_001_PLAN, prompts=PromptCache())
                by = {x.concurrency: x for x in r.levels}
                bad = checks(by)
                if r.knee != 4 or r.goodput_level != 4:
                    bad.append(f"knee {r.knee}, goodput level {r.goodput_level} (want 4, 4)")
                fails += [f"busy {busy} round {k + 1}: {b}" for b in bad]
                rows.append(f"| {busy} | {k + 1} | " + " | ".join(f"{by[c].req_s:.1f}" for c in (1, 2, 4, 8, 16))
                            + f" | {by[4].ttft_p95_s * 1e3:.0f} / {by[8].ttft_p95_s * 1e3:.0f} / "
                            f"{by[16].ttft_p95_s * 1e3:.0f} | {r.knee} | {r.goodput_level} | {len(bad)} |")
            loads.append(f"busy {busy}: load average {os.getloadavg()[0]:.1f}")
        finally:
            stop(load)
    out = [f"Command: .venv/bin/python {' '.join(['bench/sweep_shape.py', *sys.argv[1:]])}", "",
           f"{os.cpu_count()} cores shared with other work ({'; '.join(loads)} at the end of each level).", "",
           "| busy cores | round | req/s @1 | @2 | @4 | @8 | @16 | TTFT p95 ms @4 / @8 / @16 | knee | goodput level "
           "| tolerances missed |", "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
           "\n".join(fails) if fails else "all tolerances held"]
    emit(out, ns.out)
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The daemon's own cost during a real campaign on podman with the simulated engine.

Runs `tuner run` as a subprocess on a short campaign (boots scaled so one takes ~9 s, decode at
4x the landscape's rates, 3 depths x 2 runs of 256 tokens) and reports, from the journal and a
psutil sampler on the daemon process:
  - overhead per arm = arm wall time - boot time - measurement time, as a share of the arm;
  - the daemon's peak RSS;
  - the daemon's CPU while arms are being measured (CPU seconds / wall seconds).

  CONTAINER_HOST=unix:///.../podman.sock .venv/bin/python bench/campaign_overhead.py [--arms 5]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", type=int, default=5)
    ap.add_argument("--time-scale", type=float, default=0.02)
    ap.add_argument("--decode-scale", type=float, default=4.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    camp = yaml.safe_load((REPO / "examples" / "sim-campaign.yaml").read_text())
    camp["name"] = "bench-overhead"
    camp["baseline"]["env"].update({"SIMENGINE_TIME_SCALE": args.time_scale, "SIMENGINE_DECODE_SCALE": args.decode_scale})
    camp["baseline"]["compile_cache"] = str(tmp / "cache")
    camp["journal"] = str(tmp / "journal")
    camp["measure"] = {"depths": [166, 1087, 4064], "runs": 2, "warm_tokens": 64, "max_tokens": 256}
    camp["budget"] = {"max_arms": args.arms}
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump(camp))
    p = subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", str(path), "--quiet"], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = psutil.Process(p.pid)
    peak_rss, samples = 0, []
    while p.poll() is None:
        try:
            peak_rss = max(peak_rss, proc.memory_info().rss)
            samples.append((time.time(), proc.cpu_times().user + proc.cpu_times().system))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.25)
    recs = [json.loads(line) for line in (tmp / "journal" / "bench-overhead" / "journal.jsonl").read_text().splitlines()]
    ends = [r for r in recs if r["op"] == "arm_end"]
    starts = {r["arm"]: r["t"] for r in recs if r["op"] == "arm_start"}
    rows = []
    measure_windows = []
    for e in ends:
        boot = (e.get("boot") or {}).get("boot_s", 0.0)
        meas = e.get("measure_s", 0.0)
        arm = e.get("arm_s", 0.0)
        wall = e["t"] - starts[e["arm"]]           # journal start -> journal end, tuner bookkeeping included
        rows.append((e["arm"], e["kind"], e.get("verdict"), wall, boot, meas, wall - boot - meas))
        if meas:
            measure_windows.append((e["t"] - meas - (wall - arm), e["t"] - (wall - arm)))
    cpu_in = wall_in = 0.0
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if any(a <= t0 and t1 <= b for a, b in measure_windows):
            cpu_in += c1 - c0
            wall_in += t1 - t0
    print(f"command: CONTAINER_HOST=... .venv/bin/python bench/campaign_overhead.py --arms {args.arms} "
          f"--time-scale {args.time_scale} --decode-scale {args.decode_scale}")
    print("| arm | kind | verdict | arm wall s | boot s | measure s | tuner overhead s | overhead share |")
    print("|---|---|---|---|---|---|---|---|")
    tot_wall = tot_over = 0.0
    for n, kind, verdict, wall, boot, meas, over in rows:
        tot_wall += wall
        tot_over += over
        print(f"| {n} | {kind} | {verdict} | {wall:.2f} | {boot:.2f} | {meas:.2f} | {over:.2f} | {over / wall:.1%} |")
    print(f"\ntotal: overhead {tot_over:.2f} s of {tot_wall:.1f} s = {tot_over / tot_wall:.2%} of arm wall time")
    print(f"daemon peak RSS: {peak_rss / 2**20:.1f} MiB")
    print(f"daemon CPU while measuring: {cpu_in / wall_in:.1%} of one core over {wall_in:.1f} s" if wall_in else
          "daemon CPU while measuring: no sample inside a measurement window")
    return 0


if __name__ == "__main__":
    sys.exit(main())

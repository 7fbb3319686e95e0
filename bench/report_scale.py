"""How long `tuner report` and `tuner export` take on a 10,000-arm night.

Writes a SYNTHETIC campaign journal (JSON lines with the records tuner/night/loop.py and
tuner/night/arm_runner.py write: campaign_start, arm_start, arm_end with boot report, plan,
measurement at 3 depths x 3 runs, quality, telemetry on every 10th arm, told, incumbent moves,
campaign_end; a boot.log for each failed arm) and times write_report (REPORT.md, report.html,
three PNGs) and export in each format.

  .venv/bin/python bench/report_scale.py [--arms 10000] [--repeat 3] [--out bench/results/report_scale.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from arms.shape import ABSENT, Shape, format_value  # noqa: E402

DEPTHS = (166, 1087, 4064)
IMAGE = "localhost/offload-tuner-simengine@sha256:" + "ab" * 32
LEVERS = {
    "expert-prefetch": [ABSENT, 1, 2],
    "speculative-config": [ABSENT, {"method": "mtp", "num_speculative_tokens": 3},
                           {"method": "mtp", "num_speculative_tokens": 6}],
    "env.R4D_LRU_GATHER_CHUNKS": [8, 16, 32, 64], "env.R4D_LRU_GATHER_LANES": [16, 32, 64, 128],
    "max-num-batched-tokens": [512, 1024, 4096, 8192], "max-num-seqs": [2, 3, 4, 6],
    "gpu-memory-utilization": [0.95, 0.98, 0.99], "kv-cache-dtype": ["auto", "fp8"],
}
FAILURES = {
    "oom": "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 76.00 MiB. GPU 0 has a total capacity "
           "of 31.86 GiB of which 0 bytes is free.",
    "kv-too-small": "ValueError: max_num_seqs (6) exceeds available Mamba cache blocks (5).",
    "constraint-violation": "torch.fx.experimental.symbolic_shapes.ConstraintViolationError: Constraints violated "
                            "(L['query_start_loc'].size()[0])!",
    "insufficient-memory-for-utilization": "ValueError: Free memory on device cuda:1 (31.29/31.86 GiB) on startup "
                                           "is less than desired GPU memory utilization (0.99, 31.54 GiB).",
}
BASELINE = {"image": IMAGE, "model": "/models/sim",
            "args": [["tensor-parallel-size", 2], ["max-model-len", 32768], ["gpu-memory-utilization", 0.98],
                     ["kv-cache-memory-bytes", 2147483648], ["max-num-seqs", 4], ["enable-prefix-caching", True],
                     ["speculative-config", {"method": "mtp", "num_speculative_tokens": 4}], ["expert-prefetch", 1]],
            "env": {"R4D_LRU_GATHER_CHUNKS": "8", "R4D_LRU_GATHER_LANES": "16"},
            "mounts": [{"source": "/var/cache/sim", "target": "/root/.cache", "read_only": False, "kind": "bind"}],
            "devices": [], "port": 18080, "options": {}}


def _enc(v):
    return {"__absent__": True} if v is ABSENT else v


def _boot(rng: random.Random, outcome: str, slots: int) -> dict:
    ready = outcome == "ready"
    plan = {"budget_gib": 31.22, "gpu_util": 0.98, "total_gib": 31.86, "non_expert_gib": 6.28,
            "kv_reserve_gib": 0.36, "kv_pool_gib": 2.0, "graphs_gib": rng.choice((1.93, 0.6, 1.32)),
            "graphs_count": rng.choice((21, 13)), "overhead_gib": rng.choice((7.6, 5.25)),
            "expert_cache_gib": round(slots * 2.344 / 1024, 2), "slots": slots, "slab_mib": 2.344,
            "resident_gib": 3.52, "resident_layers": 3, "resident_experts": 1536, "swap_gib": 11.54,
            "swap_slots": slots - 1536, "host_backed_gib": 52.74, "host_backed_experts": 23040}
    ev = ["Application startup complete."] if ready else [FAILURES[outcome]]
    hit = rng.random() < 0.7
    rep = {"outcome": outcome, "evidence": ev, "profile": "simengine", "exit_code": None if ready else 1,
           "oom_killed": False, "engine_version": "0.29.0.dev0+sim", "max_model_len": 32768,
           "kv_pool_tokens": 116611 if ready else None, "max_concurrency": 3.56 if ready else None,
           "max_concurrency_len": 32768 if ready else None, "available_kv_gib": 2.0, "plan": plan,
           "model_load_gib": 6.28, "model_load_s": 48.0, "compile_s": 3.97 if hit else 181.2,
           "compile_cache_hit": hit, "init_engine_s": 41.1 if hit else 217.3, "non_default_args": {}}
    return {"outcome": outcome, "boot_s": round(rng.uniform(380, 520), 3), "evidence": ev,
            "flags_not_applied": [], "report": rep}


def _measurement(rng: random.Random, level: float) -> dict:
    depths = {}
    for d in DEPTHS:
        runs = [{"decode_tok_s": level * rng.uniform(0.97, 1.03), "ttft_s": 0.1 + d / 12000, "completion_tokens": 256,
                 "prompt_tokens": d, "finish_reason": "length", "valid": True, "reason": None, "wall_s": 7.0,
                 "prefill_tok_s": 2800.0, "chunks": 90, "engine_decode_tok_s": None} for _ in range(3)]
        vals = sorted(r["decode_tok_s"] for r in runs)
        depths[str(d)] = {"median_decode_tok_s": vals[1], "mad_decode_tok_s": abs(vals[2] - vals[0]) / 2,
                          "median_ttft_s": runs[0]["ttft_s"], "median_prefill_tok_s": 2800.0,
                          "skipped_reason": None, "runs": runs}
    return {"outcome": "measured", "reason": None, "profile": "simengine", "model": "/models/sim",
            "max_tokens": 256, "ignores_eos": True, "acceptance": rng.uniform(0.4, 0.6),
            "mean_acceptance_length": 2.8, "wall_s": 60.0, "warm": None, "depths": depths}


def _telemetry(rng: random.Random) -> dict:
    pref, served = rng.randint(20000, 40000), rng.randint(7000, 14000)
    prec = served / pref
    return {"status": "ok", "reason": None, "depth": 166, "requests": 3, "valid_runs": 3,
            "findings": [f"prefetch precision {prec:.0%}: ~{0.7 * (1 - prec):.2f} GB per step wasted per rank",
                         "hit rate 82.45 % (137,084/166,262) per rank over 102 steps"],
            "report": {"summary": {"precision": prec, "prefetched": pref, "served_by_prefetch": served,
                                   "hit_rate": 0.8245}, "findings": []},
            "headroom": {"findings": ["effective gather 9.5 GB/s vs 22.7 GB/s the link delivers at slab size (42 %)"]}}


def synthesize(folder: Path, arms: int = 10000, seed: int = 2) -> Path:
    """Write journal.jsonl (and boot logs of failed arms) for a night of ``arms`` arms."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    t = 1_790_000_000.0
    seq = 0
    inc = Shape.from_dict(BASELINE)
    inc_obj, samples = 26.8, []
    lines = []

    def emit(op, **f):
        nonlocal seq
        lines.append(json.dumps({"op": op, "seq": seq, "t": round(t, 3), **f}, separators=(",", ":")))
        seq += 1

    camp = {"name": folder.name, "engine": "simengine", "objective": "decode_geomean",
            "levers": {k: [format_value(v) for v in vs] for k, vs in LEVERS.items()},
            "noise": {"recheck_every": 6, "min_effect": 0.02},
            "constraints": {"max_concurrency_at": {"tokens": 32768, "min": 2.0}}}
    emit("campaign_start", campaign_hash="0" * 16, campaign=camp, file="synthetic.yaml", baseline=BASELINE)
    pending = None                    # (probe arm, change, its gain) waiting for its confirm
    for n in range(arms):
        if n == 0:
            kind, change = "baseline", None
        elif pending is not None:
            kind, change = "confirm", pending[1]
        elif n % 50 == 0:
            kind, change = "recheck", None
        else:
            lever = rng.choice(list(LEVERS))
            values = [v for v in LEVERS[lever] if format_value(v) != format_value(inc.value_of(lever))]
            kind, change = "probe", (lever, rng.choice(values))
        shape = inc.with_change(*change) if change else inc
        emit("arm_start", arm=n, kind=kind, shape=shape.to_dict(),
             change=[change[0], _enc(change[1])] if change else None, incumbent=inc.key(), trial=n, why="synthetic")
        roll = rng.random()
        fail = kind == "probe" and roll < 0.08
        outcome = rng.choice(list(FAILURES)) if fail else "ready"
        end = {"kind": kind, "boot": _boot(rng, outcome, rng.randint(5500, 7600))}
        t += end["boot"]["boot_s"]
        if fail:
            end["verdict"] = f"boot-failed:{outcome}"
            d = folder / "arms" / f"{n:04d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "boot.log").write_text(f"(EngineCore pid=7) ERROR {FAILURES[outcome]}\n")
        else:
            win = kind == "probe" and roll > 0.9985
            if kind in ("baseline", "recheck"):
                level = inc_obj * rng.uniform(0.99, 1.01)
            elif kind == "confirm":
                level = inc_obj * pending[2] * rng.uniform(0.99, 1.01)
            else:
                level = inc_obj * (rng.uniform(1.04, 1.08) if win else rng.uniform(0.6, 0.99))
            m = _measurement(rng, level)
            obj = (m["depths"]["166"]["median_decode_tok_s"] * m["depths"]["1087"]["median_decode_tok_s"]
                   * m["depths"]["4064"]["median_decode_tok_s"]) ** (1 / 3)
            end.update(measurement=m, measure_s=round(rng.uniform(50, 90), 3),
                       quality={"ok": True, "verdict": "ok", "evidence": []},
                       score={"feasible": True, "violation": 0, "objective": obj}, violations={})
            if n % 10 == 0:
                end["telemetry"] = _telemetry(rng)
            if kind in ("baseline", "recheck"):
                end["verdict"] = kind
                samples.append(obj)
            elif kind == "probe" and roll < 0.09:
                end["verdict"] = "corrupt"
                end["quality"] = {"ok": False, "verdict": "corrupt",
                                  "evidence": ["depth 166 run 1: repetition loop (score 0.87 > 0.5)"]}
            else:
                delta = obj / inc_obj - 1
                v = "better" if delta > 0.02 else "worse" if delta < -0.02 else "parity"
                end.update(verdict=v, delta=delta, threshold=0.02)
            t += end["measure_s"]
        t += rng.uniform(5, 20)
        end.update(arm_s=round(rng.uniform(400, 700), 3), folder=str(folder / "arms" / f"{n:04d}"))
        emit("arm_end", **end, arm=n)
        emit("told", arm=n, trial=n)
        if kind == "probe" and end["verdict"] == "better":
            pending = (n, change, end["score"]["objective"] / inc_obj)
        elif kind == "confirm":
            if end["verdict"] == "better":
                new = inc.with_change(*change)
                emit("incumbent", arm=n, shape=new.to_dict(), score=end["score"],
                     samples=[end["score"]["objective"]], change=[change[0], _enc(change[1])],
                     previous=inc.key(), confirmed_arms=[pending[0], n])
                inc, inc_obj, samples = new, end["score"]["objective"], [end["score"]["objective"]]
            pending = None
    emit("campaign_end", reason=f"arm budget of {arms} reached", arms=arms, incumbent=inc.to_dict())
    path = folder / "journal.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _timed(fn, repeat: int):
    """(result of the last call, median seconds, min seconds) over ``repeat`` calls."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times), min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3, help="time each step this many times (median, min)")
    ap.add_argument("--out", help="also write the results as Markdown to this file")
    args = ap.parse_args()
    from tuner.morning.export import export
    from tuner.morning.report import write_report

    tmp = Path(tempfile.mkdtemp(prefix="report-scale-")) / "synthetic-night"
    path, gen_s, _ = _timed(lambda: synthesize(tmp, args.arms), 1)
    with open(path) as f:
        n_records = sum(1 for _ in f)
    rows = [("generate the synthetic journal", gen_s, gen_s,
             f"{path.stat().st_size / 2**20:.1f} MiB, {n_records:,} records")]
    md, med, best = _timed(lambda: write_report(tmp), args.repeat)
    rows.append(("tuner report (REPORT.md + report.html + 3 PNGs)", med, best,
                 f"REPORT.md {len(md) / 1024:.0f} KiB, report.html {(tmp / 'report.html').stat().st_size / 1024:.0f} KiB"))
    cli = [sys.executable, "-m", "tuner.cli", "report", str(tmp)]
    _, med, best = _timed(lambda: subprocess.run(cli, cwd=REPO, check=True, stdout=subprocess.DEVNULL), args.repeat)
    rows.append(("`tuner report` as a command (imports included)", med, best, "Markdown to stdout"))
    for fmt in ("csv", "jsonl", "parquet"):
        out, med, best = _timed(lambda: export(tmp, fmt), args.repeat)
        rows.append((f"tuner export --format {fmt}", med, best, f"{out.stat().st_size / 2**20:.1f} MiB"))
    text = [f"command: .venv/bin/python bench/report_scale.py --arms {args.arms} --repeat {args.repeat}", "",
            f"synthetic journal of {args.arms:,} arms ({os.cpu_count()} CPUs, Python {platform.python_version()}); "
            f"median and fastest of {args.repeat} runs; in-process unless marked as a command", "",
            "| step | median s | fastest s | output |", "|---|---|---|---|"]
    text += [f"| {name} | {m:.2f} | {b:.2f} | {what} |" for name, m, b, what in rows]
    print("\n".join(text))
    print(f"(files in {tmp})", file=sys.stderr)
    if args.out:
        Path(args.out).write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

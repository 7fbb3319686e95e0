"""Simulated-engine fidelity and cost, through podman by digest (issues 2 and 4).

Reports: image build time and size (a forced rebuild), cold and warm engine boot times, and for
three shapes of seed 002 the decode measured by the project's own measurement (usage counters,
exact-depth prompts, 3 runs of 256 tokens after a warm pass) vs the landscape's true rate, plus
the measurement wall time per arm.

  CONTAINER_HOST=unix:///.../podman.sock .venv/bin/python bench/simengine_fidelity.py
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from arms.boot import BootLimits, boot_arm
from arms.measure import MeasurePlan, measure_engine
from arms.profiles import load_profile
from arms.prompts import api_from_profile
from arms.shape import ABSENT, Shape
from host.podman_host import PodmanHost
from host.simimage import ensure_image
from simengine import planner
from simengine.cli import build_parser, known_flags, shape_values
from simengine.landscape import load_landscape

SCALE = 4.0      # decode runs 4x faster than the landscape; measured rates are divided back
ARGS = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
        "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4, "enable-prefix-caching": True,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
ENV = {"R4D_LRU_GATHER_CHUNKS": "8", "R4D_LRU_GATHER_LANES": "16", "SIMENGINE_NOISE": "0",
       "SIMENGINE_DECODE_SCALE": str(SCALE)}
SHAPES = [("09-29 incumbent (MTP4, prefetch on)", []),
          ("prefetch off", [("expert-prefetch", ABSENT)]),
          ("no spec, prefetch off, gather 32x64", [("expert-prefetch", ABSENT), ("speculative-config", ABSENT),
                                                   ("env.R4D_LRU_GATHER_CHUNKS", "32"), ("env.R4D_LRU_GATHER_LANES", "64")])]


def truth(shape: Shape) -> dict[int, float]:
    parser = build_parser()
    land = load_landscape(None, known_flags(parser))
    from arms.argv import render_argv, render_env

    ns = parser.parse_args(["serve"] + render_argv(shape))
    v = shape_values(ns, parser, render_env(shape))
    return planner.decode_rates(land, v, planner.make_plan(land, v))


def main() -> int:
    host = PodmanHost()
    t0 = time.monotonic()
    img = ensure_image(host.client, rebuild=True)
    build_s = time.monotonic() - t0
    print("command: CONTAINER_HOST=... .venv/bin/python bench/simengine_fidelity.py\n")
    print(f"image: {img.ref}\n  build {build_s:.1f} s (forced rebuild), size {img.size_bytes / 1e6:.1f} MB\n")
    profile = load_profile("simengine")
    api = api_from_profile(profile)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    (tmp / "cache").mkdir()
    base = Shape.from_mapping({"image": img.ref, "model": "/models/sim", "args": ARGS, "env": ENV,
                               "compile_cache": str(tmp / "cache"), "port": 18400})
    limits = BootLimits(timeout_s=600, hang_s=300, poll_s=0.2)
    # boot cost at 1/10 of real time: landscape seconds = measured / 0.1
    boots = []
    for label in ("cold", "warm"):
        shape = base.with_change("env.SIMENGINE_TIME_SCALE", "0.1")
        with boot_arm(host, shape, profile, campaign="bench-fidelity", arm=f"boot-{label}", folder=tmp / label,
                      limits=limits) as (res, _b):
            boots.append((label, res.boot_s, res.report.compile_s, res.report.init_engine_s))
    print("| boot | to ready (s, x0.1 time) | = real-time s | torch.compile s (real) | init engine s (real) |")
    print("|---|---|---|---|---|")
    for label, s, c, i in boots:
        print(f"| {label} | {s:.1f} | {s / 0.1:.0f} | {c / 0.1:.1f} | {i / 0.1:.1f} |")
    print()
    plan = MeasurePlan(depths=(166, 1087, 4064), runs=3, warm_tokens=64, max_tokens=256)
    print("| shape | depth | landscape tok/s | measured tok/s | error | MAD |")
    print("|---|---|---|---|---|---|")
    walls = []
    for i, (label, changes) in enumerate(SHAPES):
        shape = base.with_change("env.SIMENGINE_TIME_SCALE", "0.002")
        for lever, value in changes:
            shape = shape.with_change(lever, value)
        want = truth(shape)
        with boot_arm(host, shape, profile, campaign="bench-fidelity", arm=f"shape{i}", folder=tmp / f"s{i}",
                      limits=limits) as (res, b):
            assert res.ready, res.report.evidence
            t = time.monotonic()
            with host.http_client(b.cid, timeout=300) as http:
                m = measure_engine(b.base_url, plan, api, http=http)
            walls.append((label, time.monotonic() - t))
        for d in plan.depths:
            got = m.depths[d].median_decode_tok_s / SCALE
            w = want[d]          # the landscape rate (decode_scale is applied by the engine, not here)
            print(f"| {label} | {d} | {w:.2f} | {got:.2f} | {got / w - 1:+.2%} | {m.depths[d].mad_decode_tok_s / SCALE:.3f} |")
    print()
    print("measurement wall time per arm (3 depths x (warm + 3 runs) x 256 tokens, decode x4):")
    for label, w in walls:
        print(f"  {label}: {w:.1f} s  (= {w * SCALE:.0f} s at the landscape's real rates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

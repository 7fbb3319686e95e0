"""The simulated fork's arithmetic against seed 002's own plan lines and measured arms."""
from __future__ import annotations

import json

import pytest

from simengine import planner
from simengine.cli import build_parser, known_flags, shape_values
from simengine.landscape import load_landscape

PARSER = build_parser()
LAND = load_landscape(None, known_flags(PARSER))

# the 2026-09-29 incumbent: MTP4, prefetch on, stock 8x16 gather
BASE = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
        "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4, "enable-prefix-caching": True,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
BASE_ENV = {"R4D_LRU_GATHER_CHUNKS": "8", "R4D_LRU_GATHER_LANES": "16"}
# 2026-10-02 shape E: 3 x 200704 fp8, precise memory, no spec, no prefetch, gather 32x64
SHAPE_E = {"tensor-parallel-size": 2, "max-model-len": 200704, "gpu-memory-utilization": 0.98,
           "kv-cache-memory-bytes": 3150000000, "max-num-seqs": 3, "kv-cache-dtype": "fp8",
           "max-num-batched-tokens": 1024, "expert-precise-memory": True}
E_ENV = {"R4D_LRU_GATHER_CHUNKS": "32", "R4D_LRU_GATHER_LANES": "64", "GPU_MAX_HW_QUEUES": "2"}


def values(args: dict, env: dict | None = None) -> dict:
    argv = ["serve", "/models/sim"]
    for k, v in args.items():
        if v is None:
            continue
        if v is True:
            argv.append(f"--{k}")
        else:
            argv += [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return shape_values(PARSER.parse_args(argv), PARSER, env or {})


def change(args: dict, **kw) -> dict:
    out = dict(args)
    for k, v in kw.items():
        out[k.replace("_", "-")] = v
    return out


def test_plan_of_the_0929_incumbent_matches_the_seed_table():
    p = planner.make_plan(LAND, values(BASE, BASE_ENV))
    assert p.arena_gib == pytest.approx(15.05, abs=0.02)
    assert p.slots == pytest.approx(6574, rel=0.002)
    assert p.resident_gib == pytest.approx(3.52, abs=0.01) and p.resident_experts == 1536
    assert p.host_backed_gib == pytest.approx(52.74, abs=0.01) and p.host_backed_experts == 23040
    assert p.kv_reserve_gib == pytest.approx(0.36, abs=0.01)
    assert p.graphs_gib == pytest.approx(1.93, abs=0.01) and p.graphs_count == 21
    assert p.overhead_gib == pytest.approx(7.60)


def test_shape_d_and_e_plans_match_the_seed():
    d = planner.make_plan(LAND, values({k: v for k, v in SHAPE_E.items() if k != "expert-precise-memory"}, E_ENV))
    e = planner.make_plan(LAND, values(SHAPE_E, E_ENV))
    assert d.arena_gib == pytest.approx(14.87, abs=0.02) and d.slots == pytest.approx(6496, rel=0.002)
    assert e.arena_gib == pytest.approx(17.22, abs=0.02) and e.slots == pytest.approx(7522, rel=0.002)
    assert e.kv_reserve_gib == pytest.approx(1.91, abs=0.01)
    assert e.kv_bytes_per_token == pytest.approx(7892, rel=0.001)
    assert f"{e.max_concurrency:.2f}" == "1.99"
    assert e.runtime_gib < e.total_gib


def test_arena_is_priced_from_max_model_len_not_the_pool():
    a = planner.make_plan(LAND, values(change(BASE, max_model_len=262144, kv_cache_memory_bytes=4831838208)))
    b = planner.make_plan(LAND, values(change(BASE, max_model_len=262144, kv_cache_memory_bytes=4328521728)))
    assert a.slots == b.slots == pytest.approx(5648, rel=0.002)
    assert a.kv_tokens > b.kv_tokens


FAILS = [
    ("util-0.99", change(BASE, gpu_memory_utilization=0.99), "startup", "Free memory on device cuda:1 (31.29/31.86 GiB)"),
    ("seqs-2", change(BASE, max_num_seqs=2), "profile", "Constraints violated (L['query_start_loc'].size()[0])"),
    ("seqs-6", change(BASE, max_num_seqs=6), "kv", "exceeds available Mamba cache blocks"),
    ("3x262144-bf16", change(SHAPE_E, max_model_len=262144, kv_cache_memory_bytes=11047010304, kv_cache_dtype="auto",
                             expert_precise_memory=None), "graphs", "Tried to allocate"),
    ("2x262144-bf16", change(SHAPE_E, max_model_len=262144, kv_cache_memory_bytes=7365000000, kv_cache_dtype="auto",
                             expert_precise_memory=None), "graphs", "Tried to allocate"),
    ("262144-on-2GiB", change(BASE, max_model_len=262144), "kv", "estimated maximum model length is"),
    ("ngram", change(BASE, speculative_config={"method": "ngram", "num_speculative_tokens": 4}), "init",
     "PLE inputs were not prepared"),
]


@pytest.mark.parametrize("name,args,phase,text", FAILS, ids=[f[0] for f in FAILS])
def test_failing_shapes_fail_where_the_seed_says(name, args, phase, text):
    v = values(args, BASE_ENV)
    p = planner.make_plan(LAND, v)
    found = None
    for ph in ("startup", "plan", "profile", "kv", "graphs", "init"):
        found = planner.memory_failure(LAND, p, v, ph)
        if not found:
            for r in planner.matching_rules(LAND, v):
                if r.get("fail") is not None and planner.rule_failure(r, v).phase == ph:
                    found = planner.rule_failure(r, v)
        if found:
            break
    assert found is not None and found.phase == phase
    assert any(text in line for line in found.lines)


def rates(args, env=BASE_ENV):
    v = values(args, env)
    return planner.decode_rates(LAND, v, planner.make_plan(LAND, v))


@pytest.mark.parametrize("name,args,env,expect", [
    ("incumbent", BASE, BASE_ENV, (26.80, 25.15, 26.81)),
    ("prefetch-off", change(BASE, expert_prefetch=None), BASE_ENV, (40.57, 37.44, 37.57)),
    ("mtp3", change(BASE, speculative_config={"method": "mtp", "num_speculative_tokens": 3}), BASE_ENV, (24.47, 24.41, 24.44)),
    ("mtp6", change(BASE, speculative_config={"method": "mtp", "num_speculative_tokens": 6}), BASE_ENV, (19.07, 17.81, 13.54)),
    ("gather-16x32", BASE, {"R4D_LRU_GATHER_CHUNKS": "16", "R4D_LRU_GATHER_LANES": "32"}, (24.30, 22.77, 24.11)),
    ("gather-32x64", BASE, {"R4D_LRU_GATHER_CHUNKS": "32", "R4D_LRU_GATHER_LANES": "64"}, (26.58, 24.94, 26.34)),
    ("mnbt-8192", change(BASE, max_num_batched_tokens=8192), BASE_ENV, (29.32, 24.12, 23.65)),
    ("prefetch-2", change(BASE, expert_prefetch=2), BASE_ENV, (25.83, 25.06, 25.87)),
    ("no-spec-no-prefetch", change(BASE, expert_prefetch=None, speculative_config=None), BASE_ENV, (41.46, 41.29, 41.47)),
], ids=lambda x: x if isinstance(x, str) else "")
def test_decode_reproduces_the_seed_arm_table(name, args, env, expect):
    got = rates(args, env)
    for depth, want in zip((166, 1087, 4064), expect):
        assert got[depth] == pytest.approx(want, rel=0.035), (name, depth)


def test_gather_32x64_wins_only_once_prefetch_is_off():
    off = change(BASE, expert_prefetch=None, speculative_config=None)
    stock, wide = rates(off), rates(off, {"R4D_LRU_GATHER_CHUNKS": "32", "R4D_LRU_GATHER_LANES": "64"})
    assert wide[4064] / stock[4064] == pytest.approx(1.187, rel=0.01)
    assert wide[166] / stock[166] < wide[1087] / stock[1087]      # the win grows with depth


def test_256k_window_costs_about_ten_percent():
    off = change(BASE, expert_prefetch=None)
    long = rates(change(off, max_model_len=262144, kv_cache_memory_bytes=4831838208))
    short = rates(off)
    for d in (166, 1087, 4064):
        assert 0.88 < long[d] / short[d] < 0.94


def test_tunableop_is_corrupt_and_changes_numerics():
    v = values(BASE, {**BASE_ENV, "CLAV_TUNABLEOP_WITH_OFFLOAD": "1"})
    b = planner.build_behaviour(LAND, v, planner.make_plan(LAND, v), model="m", tp=2, profiler_dir=None,
                                with_stack=False, fault=None, noise_sigma=0.0, time_scale=1.0)
    assert b.corrupt is not None and 140 <= b.corrupt.halt_min <= b.corrupt.halt_max <= 146
    assert b.text_variant == "tunableop"


def test_telemetry_counters_follow_prefetch():
    on = values(BASE, {**BASE_ENV, "R4D_LRU_TELEMETRY": "1"})
    off = values(change(BASE, expert_prefetch=None), {**BASE_ENV, "R4D_LRU_TELEMETRY": "1"})
    mk = lambda v: planner.build_behaviour(LAND, v, planner.make_plan(LAND, v), model="m", tp=2, profiler_dir="/p",  # noqa: E731
                                           with_stack=False, fault=None, noise_sigma=0.0, time_scale=1.0)
    bon, boff = mk(on), mk(off)
    assert bon.telemetry and bon.expert_counters["swap"]["prefetched"] == 8.0
    assert "prefetched" not in boff.expert_counters["swap"]
    precision = bon.expert_counters["swap"]["served_by_prefetch"] / bon.expert_counters["swap"]["prefetched"]
    assert precision == pytest.approx(0.364, abs=0.01)

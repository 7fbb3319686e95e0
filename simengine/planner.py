"""The simulated fork's arithmetic: memory plan, boot failures, decode rate, behaviour.

Everything here is a pure function of (landscape, shape values). ``shape_values`` maps lever
names to values as the engine parsed them: ``max-num-seqs`` -> 4, ``env.R4D_LRU_GATHER_CHUNKS``
-> "32", ``speculative-config`` -> dict or None, ``speculative-config.method`` -> "mtp", and
``None`` for an absent flag or env var.

The plan follows seed 002's expert_plan.py: arena = budget - non-expert weights - KV reserve
(priced per token x max-model-len, not from the pool) - CUDA graphs (grow with max-num-seqs and
spec decode) - runtime overhead (smaller with --expert-precise-memory, larger with
max-num-batched-tokens); slots = arena / slab.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from . import realbox
from .behaviour import Behaviour, CorruptRule
from .landscape import Landscape

GIB = 1024 ** 3
MIB = 1024 ** 2


def norm(v) -> str:
    """Canonical string of a lever value, for matching landscape keys."""
    if v is None:
        return "absent"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return str(v)


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def matches(cond, value) -> bool:
    if isinstance(cond, dict):
        x = _num(value)
        for op, ref in cond.items():
            if op == "in":
                if norm(value) not in {norm(r) for r in ref}:
                    return False
            elif op == "ne":
                if norm(value) == norm(ref):
                    return False
            else:
                if x is None:
                    return False
                r = float(ref)
                if not {"lt": x < r, "le": x <= r, "gt": x > r, "ge": x >= r}[op]:
                    return False
        return True
    return norm(value) == norm(cond)


def when_matches(when: dict, values: dict) -> bool:
    return all(matches(cond, values.get(lever)) for lever, cond in when.items())


def interp(points: dict, depth: float) -> float:
    """Linear in depth between keys, flat outside; a plain number is depth-independent."""
    if not isinstance(points, dict):
        return float(points)
    xs = sorted((float(k), float(v)) for k, v in points.items())
    if depth <= xs[0][0]:
        return xs[0][1]
    for (x0, y0), (x1, y1) in zip(xs, xs[1:]):
        if depth <= x1:
            return y0 + (y1 - y0) * (depth - x0) / (x1 - x0)
    return xs[-1][1]


@dataclass(frozen=True)
class Plan:
    total_gib: float
    util: float
    budget_gib: float
    non_expert_gib: float
    kv_reserve_gib: float
    kv_pool_gib: float
    graphs_gib: float
    graphs_count: int
    overhead_gib: float
    overhead_precise: bool
    arena_gib: float
    slab_mib: float
    slots: int
    resident_layers: int
    resident_experts: int
    resident_gib: float
    swap_slots: int
    swap_gib: float
    swap_layers: int
    host_backed_experts: int
    host_backed_gib: float
    kv_bytes_per_token: float
    kv_tokens: int
    max_model_len: int
    max_concurrency: float
    runtime_gib: float          # what the device really holds once graphs are captured
    prefetch_depth: int | None = None


def spec_tokens(values: dict) -> int:
    sc = values.get("speculative-config")
    if not sc:
        return 0
    return int(sc.get("num_speculative_tokens", 0) or 0)


def make_plan(land: Landscape, values: dict) -> Plan:
    hw, mem = land["hardware"], land["memory"]
    total = float(hw["vram_gib"])
    util = float(values.get("gpu-memory-utilization") or 0.92)
    budget = util * total
    max_len = int(values.get("max-model-len") or 32768)
    seqs = int(values.get("max-num-seqs") or 4)
    mnbt = int(values.get("max-num-batched-tokens") or 1024)
    k = spec_tokens(values)
    non_expert = float(mem["non_expert_gib"])
    reserve = (max_len * float(mem["kv_reserve_bytes_per_token"]) * (1 + float(mem.get("kv_reserve_margin", 0.08)))
               + float(mem.get("kv_reserve_const_mib", 57)) * MIB) / GIB
    g = mem.get("graphs", {})
    graphs = float(g.get("base_gib", 0.4)) + float(g.get("per_seq_gib", 0.05)) * seqs
    if k:
        graphs += float(g.get("spec_base_gib", 0.31)) + float(g.get("spec_per_seq_gib", 0.255)) * seqs
    graphs_count = int(g.get("count_base", 5) + g.get("count_per_seq", 4) * seqs)
    precise = bool(values.get("expert-precise-memory"))
    per_1k = float(mem.get("overhead_per_1k_batched_tokens_gib", 0.17))
    overhead = float(mem["precise_overhead_gib"] if precise else mem["overhead_gib"]) + per_1k * (mnbt - 1024) / 1024
    arena = budget - non_expert - reserve - graphs - overhead
    slab_mib = float(mem["slab_mib"])
    slots = max(0, int(arena * 1024 / slab_mib))
    layers, res_layers = int(mem["layers"]), int(mem["resident_layers"])
    per_layer = int(mem["experts_per_layer"])
    resident_experts = res_layers * per_layer
    swap_slots = max(0, slots - resident_experts)
    swap_layers = layers - res_layers
    host_experts = swap_layers * per_layer
    dtype = str(values.get("kv-cache-dtype") or "auto")
    per_tok_attn = mem["kv_bytes_per_token"].get(dtype, mem["kv_bytes_per_token"]["auto"])
    per_tok = float(per_tok_attn) + float(mem.get("mamba_bytes_per_seq", 0)) / max_len
    pool_bytes = values.get("kv-cache-memory-bytes")
    pool_gib = float(pool_bytes) / GIB if pool_bytes else float(mem.get("default_kv_pool_gib", 2.0))
    kv_tokens = int(pool_gib * GIB / per_tok)
    activation = float(mem.get("activation_gib", 2.68)) + float(mem.get("activation_per_1k_batched_tokens_gib", 0.17)) * mnbt / 1024
    runtime = non_expert + max(arena, 0) + pool_gib + graphs + float(mem.get("non_torch_gib", 1.45)) + activation
    prefetch = values.get("expert-prefetch")
    return Plan(
        total_gib=total, util=util, budget_gib=budget, non_expert_gib=non_expert,
        kv_reserve_gib=reserve, kv_pool_gib=pool_gib, graphs_gib=graphs, graphs_count=graphs_count,
        overhead_gib=overhead, overhead_precise=precise, arena_gib=arena, slab_mib=slab_mib,
        slots=slots, resident_layers=res_layers, resident_experts=resident_experts,
        resident_gib=resident_experts * slab_mib / 1024, swap_slots=swap_slots,
        swap_gib=swap_slots * slab_mib / 1024, swap_layers=swap_layers,
        host_backed_experts=host_experts, host_backed_gib=host_experts * slab_mib / 1024,
        kv_bytes_per_token=per_tok, kv_tokens=kv_tokens, max_model_len=max_len,
        max_concurrency=kv_tokens / max_len, runtime_gib=runtime,
        prefetch_depth=int(prefetch) if prefetch else None,
    )


@dataclass(frozen=True)
class BootFailure:
    phase: str        # "startup" | "plan" | "profile" | "kv" | "graphs" | "init"
    lines: tuple[str, ...]


def memory_failure(land: Landscape, plan: Plan, values: dict, phase: str) -> BootFailure | None:
    hw = land["hardware"]
    if phase == "startup":
        free = float(hw.get("free_gib", plan.total_gib))
        if plan.budget_gib > free:
            dev = hw.get("device", "cuda:1")
            return BootFailure(phase, (
                f"ValueError: Free memory on device {dev} ({free:.2f}/{plan.total_gib:.2f} GiB) on startup is less "
                f"than desired GPU memory utilization ({plan.util}, {plan.budget_gib:.2f} GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes.",))
    if phase == "plan" and plan.arena_gib <= 0:
        return _oom(plan, needed=-plan.arena_gib + 0.5, phase=phase)
    if phase == "kv" and plan.kv_tokens < plan.max_model_len:
        need = plan.max_model_len * plan.kv_bytes_per_token / GIB
        return BootFailure(phase, (
            f"ValueError: To serve at least one request with the model's max seq len ({plan.max_model_len}), "
            f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({plan.kv_pool_gib:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{plan.kv_tokens}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.",))
    if phase == "graphs" and plan.runtime_gib > plan.total_gib:
        return _oom(plan, needed=0.07421875, phase=phase)
    return None


def _oom(plan: Plan, needed: float, phase: str) -> BootFailure:
    allocated = min(plan.runtime_gib, plan.total_gib) - 1.43
    return BootFailure(phase, (
        f"torch.OutOfMemoryError: HIP out of memory. Tried to allocate {needed * 1024:.2f} MiB. GPU 0 has a total "
        f"capacity of {plan.total_gib:.2f} GiB of which 0 bytes is free. Of the allocated memory {allocated:.2f} GiB "
        "is allocated by PyTorch, and 0.51 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",))


def rule_failure(rule: dict, values: dict, plan: Plan | None = None) -> BootFailure:
    fail = rule["fail"]
    kind = fail["kind"]
    seqs = int(values.get("max-num-seqs") or 4)
    if kind == "constraint-violation":
        width = seqs + 1
        return BootFailure("profile", (
            "torch.fx.experimental.symbolic_shapes.ConstraintViolationError: Constraints violated "
            "(L['query_start_loc'].size()[0])! For more information, run with TORCH_LOGS=\"+dynamic\".",
            f"  - Not all values of L['query_start_loc'].size()[0] = L['query_start_loc'].size()[0] in the specified "
            f"range are valid because L['query_start_loc'].size()[0] was inferred to be a constant ({width}).",
            f"You marked L['query_start_loc'].size()[0] as dynamic but your code specialized it to be a constant ({width}).",
        ))
    if kind == "mamba-blocks":
        blocks = int(fail.get("blocks", max(1, seqs - 2)))
        return BootFailure("kv", (
            f"ValueError: max_num_seqs ({seqs}) exceeds available Mamba cache blocks ({blocks}). Each decode "
            "sequence requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower "
            f"max_num_seqs to at most {blocks} or increase gpu_memory_utilization.",))
    if kind == "oom" and plan is not None:
        return _oom(plan, needed=float(fail.get("tried_gib", 0.07421875)), phase="graphs")
    if kind == "oom":
        return BootFailure("graphs", ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate "
                                      f"{float(fail.get('tried_gib', 0.07421875)) * 1024:.2f} MiB.",))
    return BootFailure(fail.get("phase", "init"), (str(fail.get("message", "RuntimeError: engine failed")),))


def matching_rules(land: Landscape, values: dict) -> list[dict]:
    return [r for r in land.get("rules", []) if when_matches(r["when"], values)]


def _factor_at(f, depth: float) -> float:
    return interp(f, depth) if isinstance(f, dict) else float(f)


def decode_rates(land: Landscape, values: dict, plan: Plan) -> dict[int, float]:
    base = land["decode"]["base"]
    effects = land.get("effects", {})
    inters = [i for i in land.get("interactions", []) if when_matches(i["when"], values)]
    mem = land["memory"]
    knee = float(mem.get("arena_knee_slots", 0) or 0)
    arena_f = 1.0
    if knee and plan.slots < knee:
        arena_f = (max(plan.slots, 1) / knee) ** float(mem.get("arena_knee_power", 1.5))
    out = {}
    for depth, rate in base.items():
        d = float(depth)
        r = float(rate) * arena_f
        for lever, table in effects.items():
            key = norm(values.get(lever))
            for val, f in table.items():
                if norm(val) == key:
                    r *= _factor_at(f, d)
        for inter in inters:
            r *= _factor_at(inter["factor"], d)
        out[int(depth)] = r * float(land.get("decode_scale", 1.0))
    return out


def acceptance(land: Landscape, values: dict) -> float:
    acc = land.get("acceptance", {})
    a = float(acc.get("default", 0.6))
    for lever, table in acc.items():
        if lever == "default" or not isinstance(table, dict):
            continue
        key = norm(values.get(lever))
        for val, v in table.items():
            if norm(val) == key:
                a = float(v)
    return a


def text_variant(land: Landscape, values: dict) -> str:
    parts = []
    for lever, table in (land.get("numerics") or {}).items():
        key = norm(values.get(lever))
        for val, name in table.items():
            if norm(val) == key:
                parts.append(str(name))
    return "+".join(sorted(parts))


def prefill(land: Landscape, values: dict) -> tuple[float, float]:
    p = land.get("prefill", {})
    tok_s = float(p.get("tok_s", 3000.0))
    for lever, table in (p.get("effects") or {}).items():
        key = norm(values.get(lever))
        for val, f in table.items():
            if norm(val) == key:
                tok_s *= float(f)
    return tok_s, float(p.get("base_ttft_s", 0.05))


def build_behaviour(land: Landscape, values: dict, plan: Plan, *, model: str, tp: int,
                    profiler_dir: str | None, with_stack: bool, fault: str | None,
                    noise_sigma: float, time_scale: float, noise_seed: int = 0,
                    stream_interval: int = 1, boot: realbox.BootTerms = realbox.BootTerms()) -> Behaviour:
    rules = matching_rules(land, values)
    corrupt = None
    for r in rules:               # a noisier shape: the widest matching rule's sigma replaces the default
        if r.get("noise_sigma") is not None:
            noise_sigma = max(noise_sigma, float(r["noise_sigma"]))
    for r in rules:
        if r.get("corrupt") is not None:
            c = r["corrupt"] or {}
            corrupt = CorruptRule(**{k: c[k] for k in ("halt_min", "halt_max", "tok_s_factor", "acceptance") if k in c})
    tel = land.get("telemetry", {})
    counters = tel.get("prefetch_on" if values.get("expert-prefetch") else "prefetch_off", {})
    k = spec_tokens(values)
    ptok, base_ttft = prefill(land, values)
    hang = float(tel.get("stop_hang_s_with_stack", 0)) * time_scale if with_stack else 0.0
    return Behaviour(
        model=model, max_model_len=plan.max_model_len, decode_tok_s=decode_rates(land, values, plan),
        noise_sigma=noise_sigma, prefill_tok_s=ptok * float(land.get("decode_scale", 1.0)),
        base_ttft_s=base_ttft, prefix_caching=values.get("enable-prefix-caching") is not False, spec_k=k, acceptance=acceptance(land, values) if k else 0.0,
        text_variant=text_variant(land, values), corrupt=corrupt,
        max_num_seqs=int(values.get("max-num-seqs") or 4),
        batch_efficiency=float((land.get("concurrency") or {}).get("batch_efficiency", 0.85)),
        telemetry=norm(values.get("env.R4D_LRU_TELEMETRY")) == "1", profiler_dir=profiler_dir,
        profiler_with_stack=with_stack, stop_profile_hang_s=hang, tp=tp,
        slab_bytes=int(round(plan.slab_mib * MIB)), resident_layers=plan.resident_layers,
        swap_layers=plan.swap_layers, expert_counters=counters, fault=fault,
        seed=int(land.get("seed", 0)), noise_seed=noise_seed, stream_interval=stream_interval,
        drift_per_h=float(land.get("drift_per_hour", 0.0)), drift_steps=realbox.steps(land.data),
        tenants=realbox.tenants(land.data),
        boot_factor=boot.rate_factor, warmup_requests=int((land.get("warmup") or {}).get("requests", 0)),
        warmup_factor=float((land.get("warmup") or {}).get("factor", 1.0)),
    )


def compile_key(values: dict, landscape_name: str) -> str:
    """The compile cache key: the arguments that change the compiled graphs."""
    relevant = {k: values.get(k) for k in ("max-num-batched-tokens", "max-num-seqs", "speculative-config",
                                           "tensor-parallel-size", "kv-cache-dtype", "max-model-len")}
    blob = json.dumps([landscape_name, relevant], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]

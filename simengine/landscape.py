"""Landscape files: the YAML that decides how the simulated engine behaves.

A landscape names the hardware and model memory figures the planner uses, the decode rate of a
reference shape, the multiplicative effect of each lever value (and of combinations), boot
costs, failure rules and corruption rules. ``load_landscape`` parses and validates it and
keeps the line of every key, so a mistake is reported as ``FILE:LINE: key 'a.b': problem``.

The format is documented in ``simengine/LANDSCAPE.md``. PyYAML is imported lazily: the image
carries its pure-Python part; with it absent, JSON landscapes still load.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import realbox

DEFAULT_LANDSCAPE = Path(__file__).parent / "landscapes" / "seed-002.yaml"

# Environment hooks the simulated fork reads (levers may be "env.NAME" for these).
ENV_HOOKS = (
    "R4D_LRU_GATHER_CHUNKS", "R4D_LRU_GATHER_LANES", "R4D_LRU_UVA_TOKENS", "R4D_LRU_TELEMETRY",
    "CLAV_TUNABLEOP_SWEEP", "CLAV_TUNABLEOP_WITH_OFFLOAD", "GPU_MAX_HW_QUEUES",
    "PYTORCH_ALLOC_CONF", "HSA_ENABLE_SDMA",
)
ABSENT = "absent"

TOP_KEYS = {
    "name": str, "description": str, "time_scale": (int, float), "decode_scale": (int, float),
    "noise_sigma": (int, float), "drift_per_hour": (int, float), "boot_sigma": (int, float), "warmup": dict,
    "cold_start": dict, "drift_step": (dict, list), "tenant": (dict, list), "seed": int, "hardware": dict, "memory": dict,
    "reference": dict, "decode": dict, "acceptance": dict, "prefill": dict, "effects": dict,
    "interactions": list, "rules": list, "boot": dict, "telemetry": dict,
    "ignored_flags": list, "numerics": dict, "concurrency": dict,
}
SECTION_KEYS = {
    "hardware": {"vram_gib", "free_gib", "device", "gpu_arch"},
    "memory": {"non_expert_gib", "slab_mib", "layers", "resident_layers", "experts_per_layer",
               "kv_reserve_bytes_per_token", "kv_reserve_margin", "kv_reserve_const_mib",
               "kv_bytes_per_token", "mamba_bytes_per_seq", "graphs", "overhead_gib",
               "overhead_per_1k_batched_tokens_gib", "precise_overhead_gib", "precise_label",
               "non_torch_gib", "activation_gib", "activation_per_1k_batched_tokens_gib",
               "default_kv_pool_gib", "arena_knee_slots", "arena_knee_power"},
    "boot": {"load_s", "compile_s", "dynamo_s", "cache_load_s", "init_other_s", "api_s",
             "graph_capture_s"},
    "prefill": {"tok_s", "base_ttft_s", "effects"},
    "telemetry": {"prefetch_on", "prefetch_off", "stop_hang_s_with_stack"},
    "concurrency": {"batch_efficiency"},
}
RULE_KEYS = {"when", "fail", "hang", "corrupt", "boot_extra_s", "noise_sigma", "name", "note"}
FAIL_KINDS = {"constraint-violation", "mamba-blocks", "engine-init", "unsupported", "oom"}


class LandscapeError(ValueError):
    """A landscape file that cannot be used; ``str()`` is one line: FILE:LINE: key 'k': why."""


@dataclass
class Landscape:
    path: str
    data: dict
    lines: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, key):
        return self.data[key]

    def get(self, key, default=None):
        return self.data.get(key, default)

    def where(self, key_path: str) -> str:
        return f"{self.path}:{self.lines.get(key_path, 1)}"


def _construct(node, path: str, lines: dict[str, int]):
    import yaml

    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out = {}
        for knode, vnode in node.value:
            key = _scalar(knode)
            sub = f"{path}.{key}" if path else str(key)
            lines[sub] = knode.start_mark.line + 1
            out[key] = _construct(vnode, sub, lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, f"{path}[{i}]", lines) for i, v in enumerate(node.value)]
    return _scalar(node)


def _scalar(node):
    import yaml

    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _parse_text(text: str, path: str) -> tuple[dict, dict[str, int]]:
    lines: dict[str, int] = {}
    if path.endswith(".json"):
        try:
            return json.loads(text), lines
        except json.JSONDecodeError as e:
            raise LandscapeError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    try:
        import yaml
    except ImportError:  # pragma: no cover - the image and the venv both carry PyYAML
        return json.loads(text), lines
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise LandscapeError(f"{path}:{line}: not valid YAML: {problem}") from None
    if node is None:
        raise LandscapeError(f"{path}:1: the landscape is empty")
    data = _construct(node, "", lines)
    if not isinstance(data, dict):
        raise LandscapeError(f"{path}:1: a landscape is a mapping of sections, got {type(data).__name__}")
    return data, lines


def load_landscape(path: str | os.PathLike | None, known_flags: set[str]) -> Landscape:
    """Read and validate a landscape. ``known_flags`` are the engine's flag names (no dashes)."""
    p = Path(path) if path else DEFAULT_LANDSCAPE
    try:
        text = p.read_text()
    except OSError as e:
        raise LandscapeError(f"{p}:0: cannot read the landscape: {e.strerror}") from None
    data, lines = _parse_text(text, str(p))
    land = Landscape(str(p), data, lines)
    _validate(land, known_flags)
    return land


def _err(land: Landscape, key: str, why: str) -> LandscapeError:
    return LandscapeError(f"{land.where(key)}: key '{key}': {why}")


def _check_lever(land: Landscape, key: str, lever: str, known_flags: set[str]) -> None:
    if lever.startswith("env."):
        if lever[4:] not in ENV_HOOKS:
            raise _err(land, key, f"unknown env hook '{lever[4:]}' (the engine reads: {', '.join(ENV_HOOKS)})")
        return
    base = lever.split(".", 1)[0]  # speculative-config.num_speculative_tokens -> speculative-config
    if base not in known_flags:
        raise _err(land, key, f"the engine does not accept a flag --{base}")


def _check_when(land: Landscape, key: str, when, known_flags: set[str]) -> None:
    if not isinstance(when, dict) or not when:
        raise _err(land, key, "'when' must be a non-empty mapping of lever: value or {lt|le|gt|ge|ne|in: ...}")
    for lever, cond in when.items():
        _check_lever(land, f"{key}.{lever}", lever, known_flags)
        if isinstance(cond, dict):
            bad = set(cond) - {"lt", "le", "gt", "ge", "ne", "in"}
            if bad:
                raise _err(land, f"{key}.{lever}", f"unknown comparison {sorted(bad)}; use lt, le, gt, ge, ne, in")


def _check_factor(land: Landscape, key: str, f) -> None:
    vals = f.values() if isinstance(f, dict) else [f]
    for v in vals:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise _err(land, key, f"a factor must be a positive number (or depth: number), got {v!r}")


def _validate(land: Landscape, known_flags: set[str]) -> None:
    d = land.data
    for k, v in d.items():
        if k not in TOP_KEYS:
            raise _err(land, k, f"unknown section (known: {', '.join(sorted(TOP_KEYS))})")
        if not isinstance(v, TOP_KEYS[k]) or isinstance(v, bool):
            raise _err(land, k, f"expected {getattr(TOP_KEYS[k], '__name__', 'a number')}, got {type(v).__name__}")
        if k in SECTION_KEYS:
            for sk in v:
                if sk not in SECTION_KEYS[k]:
                    raise _err(land, f"{k}.{sk}", f"unknown key (known: {', '.join(sorted(SECTION_KEYS[k]))})")
    for key, why in realbox.problems(d):
        raise _err(land, key, why)
    for req in ("hardware", "memory", "reference", "decode"):
        if req not in d:
            raise _err(land, req, "missing required section")
    for lever in d["reference"]:
        _check_lever(land, f"reference.{lever}", lever, known_flags)
    base = d["decode"].get("base")
    if not isinstance(base, dict) or not base:
        raise _err(land, "decode.base", "needs decode tok/s per depth, e.g. {166: 26.8, 1087: 25.2}")
    _check_factor(land, "decode.base", base)
    for lever, values in d.get("effects", {}).items():
        _check_lever(land, f"effects.{lever}", lever, known_flags)
        if not isinstance(values, dict):
            raise _err(land, f"effects.{lever}", "expected a mapping of value: factor")
        for val, f in values.items():
            _check_factor(land, f"effects.{lever}.{val}", f)
    for i, inter in enumerate(d.get("interactions", [])):
        key = f"interactions[{i}]"
        if not isinstance(inter, dict) or "when" not in inter or "factor" not in inter:
            raise _err(land, key, "an interaction needs 'when' and 'factor'")
        _check_when(land, f"{key}.when", inter["when"], known_flags)
        _check_factor(land, f"{key}.factor", inter["factor"])
    for i, rule in enumerate(d.get("rules", [])):
        key = f"rules[{i}]"
        if not isinstance(rule, dict) or "when" not in rule:
            raise _err(land, key, "a rule needs 'when' and one of fail, hang, corrupt, boot_extra_s")
        bad = set(rule) - RULE_KEYS
        if bad:
            raise _err(land, f"{key}.{sorted(bad)[0]}", f"unknown rule key (known: {', '.join(sorted(RULE_KEYS))})")
        _check_when(land, f"{key}.when", rule["when"], known_flags)
        fail = rule.get("fail")
        if fail is not None and (not isinstance(fail, dict) or fail.get("kind") not in FAIL_KINDS):
            raise _err(land, f"{key}.fail", f"'fail' needs kind: one of {', '.join(sorted(FAIL_KINDS))}")
        ns = rule.get("noise_sigma")
        if ns is not None and (isinstance(ns, bool) or not isinstance(ns, (int, float)) or ns < 0):
            raise _err(land, f"{key}.noise_sigma", f"a relative sigma >= 0 (e.g. 0.06), not {ns!r}")
    for i, flag in enumerate(d.get("ignored_flags", [])):
        _check_lever(land, f"ignored_flags[{i}]", str(flag), known_flags)
    for lever in (d.get("prefill", {}).get("effects") or {}):
        _check_lever(land, f"prefill.effects.{lever}", lever, known_flags)

"""Engine profiles: what the tuner knows about one engine family, as data.

A profile is a YAML file in ``arms/profiles/`` (or any path). It names the readiness
endpoints, the log lines that carry the memory plan, KV pool and compile timings, and an
ORDERED list of failure signatures (most specific first). Regexes use Python ``re`` syntax;
the named groups of a ``fields`` regex say which report field or plan key they fill, so an
operator adapts a profile to their fork's log lines without code changes.

A profile may ``extends: <name>`` another one; mappings merge key by key, lists are replaced
(``failures_extra`` is prepended to the inherited ``failures``). A campaign may pass
``overrides`` in the same shape; a key set to ``null`` under ``fields`` drops that regex.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from arms.errors import ConfigError

PROFILE_DIR = Path(__file__).with_name("profiles")

# Named groups a ``fields`` regex may use, and how their text becomes a value:
# int / float (thousands separators allowed), gib / mib (a size, unit optional; "0 bytes"
# allowed), flag (True when the group took part in the match), str, range_count ("0-2" -> 3),
# mib_sum (summed over every matching line instead of first match wins), count (matching lines).
# A regex with a ``key`` group keeps one value per key: {"CPU_Mapped": 8.1, "CUDA0": 20480.0}.
REPORT_FIELDS: dict[str, str] = {
    "engine_version": "str",
    "max_model_len": "int",
    "kv_pool_tokens": "int",
    "kv_blocks": "int",
    "kv_block_size": "int",
    "max_concurrency": "float",
    "max_concurrency_len": "int",
    "available_kv_gib": "gib",
    "model_load_gib": "gib",
    "model_load_s": "float",
    "weights_load_s": "float",
    "dynamo_s": "float",
    "compile_s": "float",
    "compile_graph_s": "float",
    "compile_range": "str",
    "compile_cache_load_s": "float",
    "graph_capture_s": "float",
    "graph_gib": "gib",
    "init_engine_s": "float",
    "init_compile_s": "float",
}
PLAN_FIELDS: dict[str, str] = {
    "budget_gib": "gib", "gpu_util": "float", "total_gib": "gib", "non_expert_gib": "gib",
    "kv_reserve_gib": "gib", "kv_pool_gib": "gib",
    "graphs_gib": "gib", "graphs_count": "int",
    "overhead_gib": "gib", "overhead_precise": "flag", "overhead_note": "str",
    "expert_cache_gib": "gib", "slots": "int", "slab_mib": "mib",
    "resident_gib": "gib", "resident_layers": "range_count", "resident_experts": "int",
    "swap_gib": "gib", "swap_slots": "int", "swap_slots_per_layer": "str",
    "host_backed_gib": "gib", "host_backed_experts": "int",
    "prefetch_depth": "int", "prefetch_slots_per_layer": "int", "prefetch_slots_total": "int",
    # vLLM's AOT compile cache (0.32 CPU): saved by this boot; a saved one that failed to load, and why
    "compile_cache_saved": "flag", "compile_cache_load_error": "str",
    # llama.cpp
    "model_buffer_mib": "mib_sum", "kv_buffer_mib": "mib_sum", "compute_buffer_mib": "mib_sum",
    "kv_cells": "int", "kv_size_mib": "mib", "n_ctx": "int",
    "gpu_layers": "int", "total_layers": "int",
    # llama.cpp, per backend/device: a regex with (?P<key>...) stores {key: value} (arms/bootlog.py)
    "model_buffers_mib": "mib_sum", "kv_buffers_mib": "mib_sum", "compute_buffers_mib": "mib_sum",
    "n_ctx_seq": "int", "n_seq_max": "int", "n_slots": "int", "n_ctx_slot": "int", "kv_unified": "str",
    "tensor_overrides": "count", "flash_attn": "str", "load_mode": "str", "n_threads": "int",
    "n_threads_batch": "int", "n_batch": "int", "n_ubatch": "int", "kv_type_k": "str", "kv_type_v": "str",
    "fit_status": "str", "fit_ctx": "int", "fit_layers": "int",
}
OOM_FIELDS = {"tried_to_allocate_gib": "gib", "gpu": "int", "total_gib": "gib", "free_gib": "gib"}

# The shape of a profile file: a nested dict of allowed keys; "*" means any key.
_SCHEMA: dict[str, Any] = {
    "name": str, "family": str, "extends": str, "description": str,
    "readiness": {"health_path": str, "completion_path": str, "tokenize_path": str,
                  "tokenize_request_key": str, "tokenize_response_key": str,
                  "tokenize_extra": dict, "ready_line": str, "cache_defeat": str},
    "non_default_args": {"line": str, "style": str, "key_style": str},
    "telemetry": bool, "ignores_eos": bool, "arg_defaults": dict,
    "metrics": {"spec_decode": {"*": str}},
    "kv_block_size": int,
    "noise": {"split_before": str, "strip": list, "quiet_levels": list, "exception_line": str,
              "frame_line": str},
    "fields": {"*": str},
    "compile_cache": {"hit": str, "miss": str},
    "oom_detail": str,
    "failures": list, "failures_extra": list,
    "flags": {"*": dict},                     # lever -> spellings (arms.spellings; llama.cpp)
    "known_flags": list, "known_flags_extra": list,   # the engine's command-line flags (lever names are checked)
}
_REQUIRED = ("name", "family", "readiness.health_path", "readiness.completion_path",
             "readiness.tokenize_path", "readiness.tokenize_request_key",
             "readiness.tokenize_response_key", "readiness.ready_line")
CLASSES = frozenset({
    "oom", "insufficient-memory-for-utilization", "kv-too-small", "bad-argument",
    "constraint-violation", "compile-or-graph-failure", "model-load-failed",
    "engine-init-failed", "engine-dead", "no-gpu", "unsupported", "distributed", "host-oom-killed",
    "boot-timeout", "hang", "port-in-use", "unknown"})


@dataclass(frozen=True)
class FailureSignature:
    """One failure class and the regex that recognises its root-cause line.

    ``generic`` marks a catch-all (engine-init-failed): it wins only when no specific
    signature matched, and loses to a ready line or the caller's outcome hint."""

    cls: str
    pattern: re.Pattern
    generic: bool = False


@dataclass(frozen=True)
class EngineProfile:
    name: str
    family: str                                 # vllm | llamacpp
    source: str                                 # the YAML file(s) it came from, ' <- ' joined
    health_path: str
    completion_path: str
    tokenize_path: str
    tokenize_request_key: str                   # "prompt" (vLLM) / "content" (llama.cpp)
    tokenize_response_key: str                  # "tokens"
    tokenize_extra: Mapping[str, Any]           # extra body keys of a /tokenize request
    ready_pattern: re.Pattern
    non_default_args_pattern: re.Pattern | None  # group "args" holds the printed dict
    non_default_args_style: str                 # python-dict | none
    arg_key_style: str                          # snake_case: --max-num-seqs -> max_num_seqs
    telemetry: bool                             # expert-cache telemetry via profiler window
    ignores_eos: bool                           # engine always produces max_tokens
    arg_defaults: Mapping[str, Any]             # flag -> engine default (absent from non-default args)
    spec_decode_metrics: Mapping[str, str]      # drafts, draft_tokens, accepted_tokens, ...
    kv_block_size: int | None                   # used when the log prints blocks only
    split_pattern: re.Pattern | None            # zero-width: where one physical line holds two
    strip_patterns: tuple[re.Pattern, ...]      # prefixes/suffixes removed; group "level"
    quiet_levels: frozenset[str]                # lines at these levels never decide a failure
    exception_pattern: re.Pattern | None        # "SomeError: ..." lines (evidence context)
    frame_pattern: re.Pattern | None            # traceback frame; it and its source line are skipped
    field_patterns: tuple[tuple[str, re.Pattern], ...]
    compile_hit_pattern: re.Pattern | None
    compile_miss_pattern: re.Pattern | None
    oom_pattern: re.Pattern | None
    failures: tuple[FailureSignature, ...]
    flags: Mapping[str, Any] = field(default_factory=dict)   # arms.spellings: lever -> spellings
    known_flags: frozenset[str] = frozenset()    # known flags (no leading dash); empty: not listed
    cache_defeat: str | None = None              # how a measured run misses the prompt cache (arms.prompts)

    def __hash__(self) -> int:
        return hash((self.name, self.source))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str, overrides: Mapping[str, Any] | None = None, *,
                 overrides_source: str = "campaign overrides") -> EngineProfile:
    """Load a shipped profile by name (``vllm``) or any YAML file by path, then apply a
    campaign's ``overrides`` (same shape as the file). Raises ConfigError, one line."""
    origins: dict[str, str] = {}
    data, sources = _load_chain(name_or_path, origins, seen=())
    if overrides:
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"{overrides_source}: engine profile overrides must be a mapping, "
                              f"got {type(overrides).__name__}")
        _check_keys(overrides, _SCHEMA, overrides_source, "")
        if "extends" in overrides:
            raise ConfigError(f"{overrides_source}: key 'extends' cannot be overridden; name the profile instead")
        data = _merge(data, dict(overrides), origins, overrides_source, "")
        sources.append(overrides_source)
    return _build(data, origins, " <- ".join(reversed(sources)))


def _resolve(name_or_path: str, relative_to: Path | None) -> Path:
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text:
        path = Path(text).expanduser()
        if not path.is_absolute() and relative_to is not None and not path.exists():
            path = relative_to / path
        if not path.is_file():
            raise ConfigError(f"{path}: engine profile file not found")
        return path
    path = PROFILE_DIR / f"{text}.yaml"
    if not path.is_file():
        raise ConfigError(f"engine profile {text!r} not found; shipped profiles: "
                          f"{', '.join(available_profiles())} (or give a path to a YAML file)")
    return path


def _load_chain(name_or_path: str, origins: dict[str, str], seen: tuple[str, ...],
                relative_to: Path | None = None) -> tuple[dict, list[str]]:
    path = _resolve(name_or_path, relative_to)
    where = str(path)
    if where in seen:
        raise ConfigError(f"{where}: key 'extends' makes a cycle ({' -> '.join(seen + (where,))})")
    try:
        raw = _read_yaml(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where}:{at} not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: an engine profile must be a YAML mapping")
    _check_keys(raw, _SCHEMA, where, "")
    base: dict = {}
    sources: list[str] = []
    if raw.get("extends"):
        base, sources = _load_chain(raw["extends"], origins, seen + (where,), path.parent)
    merged = _merge(base, {k: v for k, v in raw.items() if k != "extends"}, origins, where, "")
    sources.append(where)
    return merged, sources


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_CACHE: dict[str, Any] = {}


def _read_yaml(path: Path) -> Any:
    """Parsed YAML, cached by file content; callers get a deep copy."""
    text = path.read_text(encoding="utf-8")
    if text not in _YAML_CACHE:
        _YAML_CACHE[text] = yaml.load(text, Loader=_Loader)  # noqa: S506 (a safe loader)
    return copy.deepcopy(_YAML_CACHE[text])


def _check_keys(data: Mapping, schema: Mapping, where: str, prefix: str) -> None:
    for key, value in data.items():
        path = f"{prefix}{key}"
        spec = schema.get(key, schema.get("*"))
        if spec is None:
            known = ", ".join(k for k in schema if k != "*")
            raise ConfigError(f"{where}: unknown key {path!r} in engine profile (known: {known})")
        if value is None:
            continue                      # null removes an inherited value
        if isinstance(spec, dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: key {path!r} must be a mapping, got {value!r}")
            _check_keys(value, spec, where, path + ".")
        elif spec is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{where}: key {path!r} must be an integer, got {value!r}")
        elif spec is not int and not isinstance(value, spec):
            raise ConfigError(f"{where}: key {path!r} must be a {spec.__name__}, got {value!r}")


def _merge(base: dict, top: Mapping, origins: dict[str, str], where: str, prefix: str) -> dict:
    out = dict(base)
    for key, value in top.items():
        path = f"{prefix}{key}"
        if key == "failures_extra" and not prefix:
            out["failures"] = list(value or []) + list(out.get("failures") or [])
            origins["failures"] = where
        elif key == "known_flags_extra" and not prefix:
            out["known_flags"] = list(out.get("known_flags") or []) + list(value or [])
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value, origins, where, path + ".")
        else:
            out[key] = value
            origins[path] = where
    return out


def _get(data: Mapping, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, Mapping):
            return None
        data = data.get(part)
    return data


def _compile(data: Mapping, origins: Mapping[str, str], dotted: str, *, pattern: str | None = None,
             groups: Mapping[str, str] | None = None, required: tuple[str, ...] = ()) -> re.Pattern | None:
    text = _get(data, dotted) if pattern is None else pattern
    if text is None:
        return None
    where = origins.get(dotted, origins.get(dotted.split("[")[0], "engine profile"))
    try:
        compiled = re.compile(text)
    except re.error as exc:
        raise ConfigError(f"{where}: key {dotted!r} is not a valid regex ({exc}): {text!r}") from None
    names = set(compiled.groupindex) - {"key"}
    if groups is not None and names - set(groups):
        raise ConfigError(f"{where}: key {dotted!r} uses unknown named group(s) "
                          f"{', '.join(sorted(names - set(groups)))}; see arms/profiles.py FIELDS")
    for group in required:
        if group not in names:
            raise ConfigError(f"{where}: key {dotted!r} needs a named group (?P<{group}>...)")
    return compiled


def _known_flags(data: dict) -> frozenset[str]:
    """Every flag name the engine knows (no leading dash): the ``known_flags`` list and, where
    the profile has a spelling table (``flags``), each lever name and each of its spellings."""
    names = {str(f).lstrip("-") for f in data.get("known_flags") or ()}
    for lever, spec in (data.get("flags") or {}).items():
        names.add(str(lever))
        for key in ("spell", "negative"):
            names.update(str(x).lstrip("-") for x in (spec or {}).get(key) or ())
    return frozenset(names)


def _build(data: dict, origins: Mapping[str, str], source: str) -> EngineProfile:
    for dotted in _REQUIRED:
        if _get(data, dotted) in (None, ""):
            where = source.split(" <- ")[0]
            raise ConfigError(f"{where}: missing key {dotted!r} in engine profile")
    noise = data.get("noise") or {}
    strips = []
    for i, text in enumerate(noise.get("strip") or []):
        if not isinstance(text, str):
            raise ConfigError(f"{origins.get('noise.strip', source)}: key 'noise.strip[{i}]' "
                              f"must be a regex string, got {text!r}")
        strips.append(_compile(data, origins, f"noise.strip[{i}]", pattern=text, groups={"level": ""}))
    fields = []
    for label, text in (data.get("fields") or {}).items():
        if text is not None:
            fields.append((label, _compile(data, origins, f"fields.{label}",
                                           groups={**REPORT_FIELDS, **PLAN_FIELDS})))
    failures = []
    for i, item in enumerate(data.get("failures") or []):
        where = origins.get("failures", source)
        if not isinstance(item, Mapping) or set(item) - {"class", "pattern", "generic"} \
                or "class" not in item or "pattern" not in item:
            raise ConfigError(f"{where}: key 'failures[{i}]' must be a mapping with 'class' and "
                              f"'pattern' (and optional 'generic'), got {item!r}")
        if item["class"] not in CLASSES:
            raise ConfigError(f"{where}: key 'failures[{i}].class' is {item['class']!r}, not one of "
                              f"{', '.join(sorted(CLASSES))}")
        failures.append(FailureSignature(
            item["class"], _compile(data, origins, f"failures[{i}].pattern", pattern=item["pattern"]),
            bool(item.get("generic", False))))
    readiness = data["readiness"]
    nda = data.get("non_default_args") or {}
    return EngineProfile(
        name=data["name"], family=data["family"], source=source,
        health_path=readiness["health_path"], completion_path=readiness["completion_path"],
        tokenize_path=readiness["tokenize_path"],
        tokenize_request_key=readiness["tokenize_request_key"],
        tokenize_response_key=readiness["tokenize_response_key"],
        tokenize_extra=MappingProxyType(dict(readiness.get("tokenize_extra") or {})),
        ready_pattern=_compile(data, origins, "readiness.ready_line"),
        non_default_args_pattern=_compile(data, origins, "non_default_args.line",
                                          groups={"args": ""}, required=("args",)),
        non_default_args_style=nda.get("style") or "none",
        arg_key_style=nda.get("key_style") or "snake_case",
        telemetry=bool(data.get("telemetry", False)),
        ignores_eos=bool(data.get("ignores_eos", False)),
        arg_defaults=MappingProxyType(dict(data.get("arg_defaults") or {})),
        spec_decode_metrics=MappingProxyType(dict(_get(data, "metrics.spec_decode") or {})),
        kv_block_size=data.get("kv_block_size"),
        split_pattern=_compile(data, origins, "noise.split_before"),
        strip_patterns=tuple(strips),
        quiet_levels=frozenset(str(x) for x in noise.get("quiet_levels") or ()),
        exception_pattern=_compile(data, origins, "noise.exception_line"),
        frame_pattern=_compile(data, origins, "noise.frame_line"),
        field_patterns=tuple(fields),
        compile_hit_pattern=_compile(data, origins, "compile_cache.hit"),
        compile_miss_pattern=_compile(data, origins, "compile_cache.miss"),
        oom_pattern=_compile(data, origins, "oom_detail", groups=OOM_FIELDS),
        failures=tuple(failures),
        flags=MappingProxyType(dict(data.get("flags") or {})),
        known_flags=_known_flags(data),
        cache_defeat=_cache_defeat(readiness, where=source),
    )


def _cache_defeat(readiness: Mapping[str, Any], where: str) -> str | None:
    from .prompts import CACHE_DEFEATS
    method = readiness.get("cache_defeat")
    if method is not None and method not in CACHE_DEFEATS:
        raise ConfigError(f"{where}: key 'readiness.cache_defeat' is {method!r}, not one of "
                          f"{', '.join(CACHE_DEFEATS)}")
    return method

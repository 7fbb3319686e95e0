"""Campaign files: load, validate with messages that name the file and key, resolve paths.

A campaign is the YAML an operator writes at night: the engine profile, the podman socket,
the baseline shape, the levers each arm may change, and how long a boot may take. Relative
paths (compile cache, mounts, the campaign folder) are relative to the campaign file.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from arms.boot import BootLimits
from arms.errors import ConfigError
from arms.shape import COMPILE_CACHE_TARGET, Lever, Mount, Shape

TOP_KEYS = {"search", "name", "engine", "podman", "baseline", "levers", "boot", "journal", "measure",
            "objective", "constraints", "budget", "noise", "production", "telemetry", "profile",
            "description"}
BOOT_KEYS = {"timeout_s", "hang_s", "poll_s"}
MEASURE_KEYS = {"depths", "runs", "warm_tokens", "max_tokens", "run_timeout_s", "idle_timeout_s",
                "max_invalid_per_depth", "telemetry", "sweep", "link_gbs", "probe_interval_s", "membw_gbs"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


BootPlan = BootLimits              # the campaign's `boot:` section is the arm's boot limits


@dataclass(frozen=True)
class Budget:
    until: tuple[int, int] | None = None    # local HH:MM, next occurrence
    hours: float | None = None              # or a duration (simulated nights use this)
    max_arms: int | None = None


@dataclass(frozen=True)
class SearchPlan:
    objective: Any = None          # tuner.verdict.Objective
    constraints: Any = None        # tuner.verdict.Constraints
    recheck_every: int = 6         # re-measure the incumbent every K arms (noise band)
    min_effect: float = 0.02       # an arm must beat the incumbent by more than this (and the band)
    confirm: bool = True           # a better arm is booted and measured again before it is promoted
    prune_below: float = 0.30      # stop after the first depth when this far below the incumbent
    mode: str = "one-change"       # or "joint"
    budget: Budget = Budget()


@dataclass(frozen=True)
class Campaign:
    path: Path
    name: str
    engine: str
    podman: str | None
    baseline: Shape
    levers: dict[str, Lever]
    boot: BootPlan
    folder: Path
    raw: dict = field(default_factory=dict, repr=False)
    profile_overrides: dict = field(default_factory=dict, repr=False)
    measure: Any = None            # arms.measure.MeasurePlan
    search: SearchPlan = SearchPlan()
    production: Any = None         # tuner.guard.Production

    @property
    def telemetry(self) -> bool:
        return bool((self.raw.get("measure") or {}).get("telemetry"))

    def lever(self, name: str) -> Lever:
        try:
            return self.levers[name]
        except KeyError:
            known = ", ".join(sorted(self.levers)) or "none"
            raise ConfigError(f"{self.path}: unknown lever '{name}' (levers of this campaign: {known})") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for knode, _ in node.value:
            key = self.construct_object(knode, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice (first on line {seen[key] + 1}); keep one",
                    knode.start_mark)
            seen[key] = knode.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _err(path: Path, key: str, why: str) -> ConfigError:
    return ConfigError(f"{path}: key '{key}': {why}")


def _resolve_path(base: Path, p: str) -> str:
    q = Path(os.path.expanduser(p))
    return str(q if q.is_absolute() else (base / q).resolve())


def _baseline(path: Path, raw: Any) -> Shape:
    if not isinstance(raw, dict):
        raise _err(path, "baseline", "must be a mapping with image, model, args, env, ...")
    base = path.parent
    d = dict(raw)
    mounts = []
    for m in d.get("mounts") or []:
        mm = Mount.parse(m)
        mounts.append(Mount(_resolve_path(base, mm.source), mm.target, mm.read_only, mm.kind))
    if d.get("compile_cache"):
        cc = Mount.parse(d.pop("compile_cache"), default_target=COMPILE_CACHE_TARGET)
        mounts.append(Mount(_resolve_path(base, cc.source), cc.target, cc.read_only, cc.kind))
    model = d.get("model")
    if isinstance(model, str) and model.startswith("/") and Path(model).exists() \
            and not any(m.target == model for m in mounts):
        mounts.append(Mount(model, model, True))      # a host model dir is bind-mounted read-only
    d["mounts"] = mounts
    try:
        return Shape.from_mapping(d)
    except ConfigError as e:
        raise ConfigError(f"{path}: key 'baseline': {e}") from None


def load_campaign(path: str | os.PathLike) -> Campaign:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the campaign file: {e.strerror}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{p}{where}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: a campaign file is a mapping (name, engine, baseline, levers, ...)")
    for k in raw:
        if k not in TOP_KEYS:
            raise _err(p, k, f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _err(p, "name", f"{name!r} must be 1-64 letters, digits, '.', '_' or '-'")
    engine = raw.get("engine", "vllm-expert-offload")
    if not isinstance(engine, str):
        raise _err(p, "engine", "must name an engine profile (vllm, vllm-expert-offload, llamacpp) or a file")
    podman = raw.get("podman")
    if podman is not None and not isinstance(podman, str):
        raise _err(p, "podman", "must be a socket URL such as unix:///run/podman/podman.sock")
    baseline = _baseline(p, raw.get("baseline"))
    levers: dict[str, Lever] = {}
    lv = raw.get("levers") or {}
    if not isinstance(lv, dict):
        raise _err(p, "levers", "must be a mapping of lever: [values] or {values: [...], numerics: ...}")
    for lname, spec in lv.items():
        try:
            lever = Lever.from_spec(str(lname), spec)
        except ConfigError as e:
            raise ConfigError(f"{p}: key 'levers.{lname}': {e}") from None
        if lever.name in levers:
            raise _err(p, f"levers.{lname}", "this lever is listed twice; keep one")
        levers[lever.name] = lever
    baseline, levers = _canonical_flags(p, engine, raw.get("profile"), baseline, levers)
    boot_raw = raw.get("boot") or {}
    if not isinstance(boot_raw, dict) or set(boot_raw) - BOOT_KEYS:
        raise _err(p, "boot", f"known keys: {', '.join(sorted(BOOT_KEYS))}")
    try:
        boot = BootPlan(**{k: float(v) for k, v in boot_raw.items()})
    except (TypeError, ValueError):
        raise _err(p, "boot", "timeouts are numbers of seconds") from None
    folder_root = raw.get("journal", "journal")
    folder = Path(_resolve_path(p.parent, str(folder_root))) / name
    prof = raw.get("profile") or {}
    if not isinstance(prof, dict):
        raise _err(p, "profile", "must be a mapping of engine-profile keys to override")
    return Campaign(path=p, name=name, engine=engine, podman=podman, baseline=baseline, levers=levers,
                    boot=boot, folder=folder, raw=raw, profile_overrides=prof, measure=_measure(p, raw),
                    search=_search(p, raw), production=_production(p, raw))


def _canonical_flags(path: Path, engine: str, overrides, baseline: Shape, levers: dict[str, Lever]):
    """llama.cpp: one lever name per flag (``ngl``, ``-ngl`` and ``gpu-layers`` are
    ``n-gpu-layers``), from the profile's flag table (arms.spellings)."""
    from arms.profiles import load_profile
    from arms.spellings import FlagTable

    try:
        profile = load_profile(engine, overrides if isinstance(overrides, dict) else None)
    except ConfigError:
        return baseline, levers            # `tuner check` reports a bad profile
    if profile.family != "llamacpp" or not profile.flags:
        return baseline, levers
    table = FlagTable.from_mapping(profile.flags, profile.source)
    baseline = table.canonical_shape(baseline, f"{path}: key 'baseline'")
    out: dict[str, Lever] = {}
    for name, lever in levers.items():
        lever = table.canonical_lever(lever)
        if lever.name in out:
            raise _err(path, f"levers.{name}", f"this is the lever {lever.name} again (another spelling); keep one")
        out[lever.name] = lever
    return baseline, out


def _production(path: Path, raw: dict):
    from tuner.guard import Production

    return Production.from_mapping(raw.get("production"), str(path))


NOISE_KEYS = {"recheck_every", "min_effect", "confirm", "prune_below", "error_rate"}
MODES = ("one-change", "joint")
BUDGET_KEYS = {"until", "hours", "max_arms"}


def _search(path: Path, raw: dict) -> SearchPlan:
    from tuner.verdict import Constraints, Objective

    try:
        objective = Objective.parse(str(raw.get("objective", "decode_geomean")))
    except ConfigError as e:
        raise _err(path, "objective", str(e)) from None
    constraints = Constraints.from_mapping(raw.get("constraints"), str(path))
    noise = raw.get("noise") or {}
    if not isinstance(noise, dict) or set(noise) - NOISE_KEYS:
        raise _err(path, "noise", f"known keys: {', '.join(sorted(NOISE_KEYS))}")
    budget_raw = raw.get("budget") or {}
    if not isinstance(budget_raw, dict) or set(budget_raw) - BUDGET_KEYS:
        raise _err(path, "budget", f"known keys: {', '.join(sorted(BUDGET_KEYS))}")
    until = None
    if "until" in budget_raw:
        m = re.fullmatch(r"(\d{1,2}):(\d{2})", str(budget_raw["until"]))
        if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
            raise _err(path, "budget.until", f"{budget_raw['until']!r} is not a time of day like \"07:00\"")
        until = (int(m.group(1)), int(m.group(2)))
    try:
        budget = Budget(until=until, hours=float(budget_raw["hours"]) if "hours" in budget_raw else None,
                        max_arms=int(budget_raw["max_arms"]) if "max_arms" in budget_raw else None)
        plan = SearchPlan(objective=objective, constraints=constraints,
                          recheck_every=int(noise.get("recheck_every", 6)),
                          min_effect=float(noise.get("min_effect", 0.02)),
                          confirm=bool(noise.get("confirm", True)),
                          prune_below=float(noise.get("prune_below", 0.30)), budget=budget,
                          mode=str(raw.get("search", "one-change")))
    except (TypeError, ValueError):
        raise _err(path, "noise/budget", "values must be numbers (hours, max_arms, recheck_every, min_effect)") from None
    if plan.mode not in MODES:
        raise _err(path, "search", f"{plan.mode!r} is not one of {', '.join(MODES)}")
    if budget.max_arms is not None and budget.max_arms < 1:
        raise _err(path, "budget.max_arms", "must be at least 1")
    if budget.hours is not None and budget.hours <= 0:
        raise _err(path, "budget.hours", "must be positive (a deadline in the past starts nothing)")
    return plan


def _measure(path: Path, raw: dict):
    from arms.measure import MeasurePlan

    m = raw.get("measure") or {}
    if not isinstance(m, dict):
        raise _err(path, "measure", "must be a mapping (depths, runs, warm_tokens, max_tokens, ...)")
    for k in m:
        if k not in MEASURE_KEYS:
            raise _err(path, f"measure.{k}", f"unknown key (known: {', '.join(sorted(MEASURE_KEYS))})")
    kw = {k: v for k, v in m.items() if k not in ("telemetry", "sweep", "link_gbs", "probe_interval_s", "membw_gbs")}
    if "depths" in kw:
        if not isinstance(kw["depths"], list):
            raise _err(path, "measure.depths", "must be a list of prompt lengths in tokens, e.g. [166, 1087, 4064]")
        kw["depths"] = tuple(kw["depths"])
    try:
        return MeasurePlan(**kw)
    except (ConfigError, TypeError) as e:
        raise _err(path, "measure", str(e)) from None


def check_paths(shape: Shape) -> None:
    """Mount sources and device paths must exist before any container starts."""
    for m in shape.mounts:
        if m.target == COMPILE_CACHE_TARGET and not m.read_only:
            Path(m.source).mkdir(parents=True, exist_ok=True)    # the compile cache is ours to create
        elif not Path(m.source).exists():
            raise ConfigError(f"mount source {m.source} (-> {m.target}) does not exist on this host")
    for d in shape.devices:
        if d.startswith("/") and not Path(d).exists():
            raise ConfigError(f"device {d} does not exist on this host (CDI names like nvidia.com/gpu=all are passed as-is)")


def check_model_path(shape: Shape, family: str) -> None:
    """llama.cpp loads a GGUF file: an absolute model path must exist on this host (the baseline
    mounts it read-only) or lie under a mount, else every arm would fail model-load-failed."""
    model = shape.model
    if family != "llamacpp" or not model.startswith("/") or Path(model).exists():
        return
    if any(model == m.target or model.startswith(m.target.rstrip("/") + "/") for m in shape.mounts):
        return
    raise ConfigError(f"model {model} does not exist on this host and no mount provides it; "
                      "give the GGUF's host path (it is mounted read-only at the same path)")

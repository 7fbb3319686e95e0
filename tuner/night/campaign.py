"""Campaign files: load, validate with messages that name the file and key, resolve paths.

A campaign is the YAML an operator writes at night: the engine profile, the podman socket,
the baseline shape, the levers each arm may change, and how long a boot may take. Relative
paths (compile cache, mounts, the campaign folder) are relative to the campaign file.

The config is typed once: the pydantic models of ``tuner.night.schema`` check the file and hold
every default; ``load_campaign`` turns them into the runtime ``Campaign`` (the arms' plans built by
the models' ``plan()`` / ``limits()``). Nothing outside this module reads the file's raw mapping:
it is kept for the journal (``Campaign.record``, ``Campaign.identity``) and the secret sealer.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from arms.boot import BootLimits
from arms.conditions import QUIET_WAIT_S
from arms.errors import ConfigError
from arms.shape import COMPILE_CACHE_TARGET, Lever, Mount, Shape
from tuner.night.campaign_file import key_text
from tuner.night.compare import ERROR_RATE
from tuner.night.precheck import host_path_errors, lever_problem
from tuner.night.schema import CampaignInvalid, CampaignModel, Noise
from tuner.night.validation import lines_of, validated

log = logging.getLogger("tuner.campaign")

BootPlan = BootLimits              # the campaign's `boot:` section is the arm's boot limits


@dataclass(frozen=True)
class Budget:
    until: tuple[int, int] | None = None    # local HH:MM, next occurrence
    hours: float | None = None              # or a duration (simulated nights use this)
    max_arms: int | None = None
    timezone: str | None = None             # IANA zone of `until` (default: this host's)

    def until_epoch(self, wall_now: float) -> float | None:
        """The wall-clock time (epoch seconds) of the next `until`, DST-safe: 07:00 is 07:00
        on the day it falls, also when the clocks change overnight."""
        if self.until is None:
            return None
        import datetime as dt

        zone = _zone(self.timezone)
        now = dt.datetime.fromtimestamp(wall_now, zone) if zone else dt.datetime.fromtimestamp(wall_now)
        for days in (0, 1, 2):
            day = now.date() + dt.timedelta(days=days)
            at = dt.datetime.combine(day, dt.time(*self.until), tzinfo=zone)
            ts = at.timestamp()           # naive: local time through mktime (DST-aware)
            if ts > wall_now:
                return ts
        return None


def _zone(name: str | None):
    """The ZoneInfo for ``name``, or this host's zone (TZ, /etc/localtime); None: use mktime."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    name = name or os.environ.get("TZ", "").lstrip(":") or None
    if name is None:
        try:
            link = os.path.realpath("/etc/localtime")
            name = link.split("/zoneinfo/", 1)[1] if "/zoneinfo/" in link else None
        except OSError:
            name = None
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


_NOISE = Noise()


@dataclass(frozen=True)
class SearchPlan:
    """The search's settings (their defaults: ``tuner.night.schema.Noise``, the one place)."""
    objective: Any = None          # tuner.night.verdict.Objective
    constraints: Any = None        # tuner.night.verdict.Constraints
    recheck_every: int = _NOISE.recheck_every    # re-measure the incumbent every K arms
    min_effect: float = _NOISE.min_effect        # an arm must beat the incumbent by more than this
    confirm: bool = _NOISE.confirm               # a better arm is booted again before it is promoted
    prune_below: float = _NOISE.prune_below      # stop after the first depth when this far below
    mode: str = "one-change"       # or "joint"
    budget: Budget = Budget()
    error_rate: float = ERROR_RATE  # the chance a night promotes anything not truly better


BOX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


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
    raw: dict = field(default_factory=dict, repr=False)     # the file as written: journal and sealer only
    profile_overrides: dict = field(default_factory=dict, repr=False)
    measure: Any = None            # arms.measure.MeasurePlan
    search: SearchPlan = SearchPlan()
    production: Any = None         # tuner.night.guard.Production
    sweep_plan: Any = None         # arms.sweep.SweepPlan: the concurrency sweep every measured arm runs, or None
    telemetry: bool = False        # measure.telemetry: each arm's expert-cache telemetry window
    probe_interval_s: float = 2.0  # measure.probe_interval_s: host probes during an arm
    quiet_wait_s: float = QUIET_WAIT_S  # measure.quiet_wait_s: the longest wait for a quiet box after a contended boot
    link_gbs: float | None = None  # measure.link_gbs: the host-GPU link the roofline assumes
    membw_gbs: float | None = None  # measure.membw_gbs: host memory bandwidth for the llama.cpp roofline
    storage: Any = None            # schema.Storage: a shared campaign's database (tuner/night/shared.py), or None

    @property
    def shared(self) -> bool:
        return self.storage is not None

    def for_box(self, box: str) -> "Campaign":
        """A shared campaign as one box runs it: its own folder (lock, arm artefacts) under the
        campaign's, ``<journal>/<name>/<box>`` (tuner/night/shared.py)."""
        from dataclasses import replace

        if not BOX_NAME.fullmatch(box or ""):
            raise ConfigError(f"--box {box!r}: a box name is 1-64 letters, digits, '.', '_' or '-'")
        return replace(self, folder=self.folder / box)

    def _raw_safe(self) -> dict:
        """The file's mapping with the storage URL's password masked (journaled, hashed)."""
        if self.raw.get("storage") is None:
            return self.raw
        from tuner.night.storage import safe_url

        st = self.raw.get("storage")
        st = {**st, "url": safe_url(st.get("url", ""))} if isinstance(st, dict) else safe_url(str(st))
        return {**self.raw, "storage": st}

    def identity(self) -> str:
        """The campaign file's fingerprint: a resumed night must be the same campaign."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self._raw_safe(), sort_keys=True, default=str).encode()).hexdigest()[:16]

    def sealer(self):
        """The campaign's secrets sealer (arms.secrets.Sealer): every secret of the file, hidden in
        whatever the night writes."""
        from urllib.parse import urlsplit

        from arms.secrets import Sealer

        sealer = Sealer.of(self.baseline, self.raw)
        password = urlsplit(self.storage.url).password if self.shared else None
        return Sealer([*sealer.values, password]) if password else sealer

    def record(self) -> dict:
        """The campaign as journaled in campaign_start (its file's mapping, JSON-safe)."""
        import json

        return json.loads(json.dumps(self._raw_safe(), default=str))

    def lever(self, name: str) -> Lever:
        try:
            return self.levers[name]
        except KeyError:
            known = ", ".join(sorted(self.levers)) or "none"
            raise ConfigError(f"{self.path}: unknown lever '{name}' (levers of this campaign: {known})") from None


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
    """The campaign in ``path``: every error of the file at once (CampaignInvalid), each with
    its line and key; nothing is contacted (tuner/night/validation.py)."""
    p = Path(path)
    raw, model, warnings = validated(p)
    for w in warnings:
        log.warning("%s", w)
    errors: list[str] = []

    def part(key: str | tuple, build):
        try:
            return build()
        except ConfigError as e:
            loc = key if isinstance(key, tuple) else tuple(key.split("."))
            line, _ = lines_of(p).line(loc)
            why = re.sub(rf"^{re.escape(str(p))}: (key '[^']*': )?", "", str(e))
            errors.append(f"{p}:{line}: {key_text(loc)}: {why}")
            return None

    name = raw["name"]
    engine = raw.get("engine", "vllm-expert-offload")
    baseline = part("baseline", lambda: _baseline(p, raw.get("baseline")))
    levers: dict[str, Lever] = {}
    keys: dict[str, tuple] = {}            # lever name -> its key in the file
    for lname, spec in (raw.get("levers") or {}).items():
        lever = part(("levers", str(lname)), lambda: Lever.from_spec(str(lname), spec))
        if lever is not None:
            levers[lever.name] = lever
            keys[lever.name] = ("levers", str(lname))
    if baseline is not None:               # llama.cpp: one lever name and value per flag and argv
        baseline, levers = _canonical_flags(p, engine, raw.get("profile"), baseline, levers, keys, part,
                                            raw.get("baseline"))
        style = _style(engine, raw.get("profile"))
        for lname, lever in list(levers.items()):
            why = lever_problem(baseline, lever, style)
            if why:
                part(keys.get(lname, ("levers", lname)), lambda: _raise(why))
    folder = Path(_resolve_path(p.parent, model.journal)) / name
    measure = part("measure", lambda: model.measure.plan())
    search = part("budget", lambda: _search(p, raw, model))
    production = part("production", lambda: _production(p, raw))
    sweep = part("measure.sweep", lambda: model.measure.sweep_plan(search.objective.kind)) if search else None
    if errors:
        raise CampaignInvalid(errors)
    return Campaign(path=p, name=name, engine=engine, podman=model.podman, baseline=baseline, levers=levers,
                    boot=model.boot.limits(), folder=folder, raw=raw, profile_overrides=model.profile,
                    measure=measure, search=search, production=production, sweep_plan=sweep,
                    telemetry=model.measure.telemetry, probe_interval_s=model.measure.probe_interval_s,
                    quiet_wait_s=model.measure.quiet_wait_s,
                    link_gbs=model.measure.link_gbs, membw_gbs=model.measure.membw_gbs, storage=model.storage)


def _canonical_flags(path: Path, engine: str, overrides, baseline: Shape, levers: dict[str, Lever],
                     keys: dict[str, tuple], part, raw_baseline=None):
    """llama.cpp: one lever name per flag (``ngl``, ``-ngl`` and ``gpu-layers`` are
    ``n-gpu-layers``) and one value per argv (``flash-attn: "on"`` and ``on`` are one shape), from
    the profile's flag table (arms.spellings); each error goes to ``part`` under its key."""
    table = _flag_table(engine, overrides)
    if table is None:
        return baseline, levers
    baseline = part("baseline", lambda: table.canonical_shape(baseline, f"{path}: key 'baseline'")) or baseline
    base_args = (raw_baseline or {}).get("args") if isinstance(raw_baseline, dict) else None
    for raw_name, value in (base_args.items() if isinstance(base_args, dict) else ()):
        why = _word_problem(table, str(raw_name), dict(baseline.args).get(table.canonical(str(raw_name)), value))
        if why:
            part(("baseline", "args", str(raw_name)), lambda: _raise(why + "; every arm would fail bad-argument"))
    out: dict[str, Lever] = {}
    for name, lever in levers.items():
        canon = part(keys[name], lambda: table.canonical_lever(lever))
        why = next((w for w in (_word_problem(table, name, v) for v in (canon.values if canon else ())) if w), None)
        if why:
            part(keys[name], lambda: _raise(why + "; that arm would fail bad-argument"))
        elif canon is not None and canon.name in out:
            part(keys[name], lambda: _again(path, canon.name))
        elif canon is not None:
            out[canon.name] = canon
    return baseline, out


def _word_problem(table, name: str, value) -> str | None:
    """A value a words flag (``-fa on|off|auto``) cannot read: the table's words and ``same``
    texts are all it takes (after canonical_value, they are booleans or the ``same`` strings)."""
    from arms import values
    from arms.shape import ABSENT

    hit = table.lookup(name)
    if hit is None or not hit[0].words or value is ABSENT or isinstance(value, bool):
        return None
    spec = hit[0]
    texts = [t for t, _ in spec.same if isinstance(t, str)]
    words = [v for _, v in spec.same if isinstance(v, str)]
    if isinstance(value, str) and value in words:
        return None
    allowed = list(dict.fromkeys([*spec.words, *words, *texts]))
    return f"{spec.spell[0]} takes {', '.join(allowed)}, not {values.text(value)!r}"


def _raise(why: str):
    raise ConfigError(why)


def _style(engine: str, overrides) -> str:
    """How the engine's argv is written (arms.argv): llamacpp or vllm."""
    from arms.profiles import load_profile

    try:
        family = load_profile(engine, overrides if isinstance(overrides, dict) else None).family
    except ConfigError:
        return "vllm"
    return "llamacpp" if family == "llamacpp" else "vllm"


def _again(path: Path, lever: str):
    raise ConfigError(f"{path}: this is the lever {lever} again (another spelling); keep one")


def _flag_table(engine: str, overrides):
    """The profile's flag spelling table (arms.spellings), or None (no table, or a bad profile:
    `tuner check` reports that)."""
    from arms.profiles import load_profile
    from arms.spellings import FlagTable

    try:
        profile = load_profile(engine, overrides if isinstance(overrides, dict) else None)
    except ConfigError:
        return None
    if profile.family != "llamacpp" or not profile.flags:
        return None
    return FlagTable.from_mapping(profile.flags, profile.source)


def parse_change(camp: Campaign, text: str):
    """``--change LEVER=VALUE`` as the campaign's levers hold it: any spelling of a llama.cpp flag
    (``fa=1``, ``no-mmap=true``) is its canonical lever and value, as in the campaign file."""
    from arms.shape import parse_change as parse

    table = _flag_table(camp.engine, camp.profile_overrides)
    raw, eq, rest = text.partition("=")
    if table is None or not eq or raw.strip().startswith("env."):
        return parse(text, camp.levers)
    import json

    from arms.shape import ABSENT, thaw

    value = table.canonical_value(raw.strip(), parse(text)[1])
    return parse(f"{table.canonical(raw)}={'absent' if value is ABSENT else json.dumps(thaw(value))}", camp.levers)


def _production(path: Path, raw: dict):
    from tuner.night.guard import Production

    return Production.from_mapping(raw.get("production"), str(path))


def _search(path: Path, raw: dict, model: CampaignModel) -> SearchPlan:
    """The search's settings from the checked config (types and ranges: tuner.night.schema)."""
    from tuner.night.verdict import Constraints, Objective

    try:
        objective = Objective.parse(model.objective)
    except ConfigError as e:
        raise _err(path, "objective", str(e)) from None
    constraints = Constraints.from_mapping(raw.get("constraints"), str(path))
    b, n = model.budget, model.noise
    until = None
    if b.until is not None:
        m = re.fullmatch(r"(\d{1,2}):(\d{2})", str(b.until).strip())
        if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
            raise _err(path, "budget.until", f"{b.until!r} is not a time of day like \"07:00\"")
        until = (int(m.group(1)), int(m.group(2)))
    budget = Budget(until=until, hours=None if b.hours is None else float(b.hours), max_arms=b.max_arms,
                    timezone=b.timezone)
    return SearchPlan(objective=objective, constraints=constraints, recheck_every=n.recheck_every,
                      min_effect=float(n.min_effect), confirm=n.confirm, prune_below=float(n.prune_below),
                      budget=budget, mode=model.search, error_rate=float(n.error_rate))


def check_host(camp: Campaign, shape: Shape, family: str | None = None) -> None:
    """Every path the shape needs on this host (mount sources, devices, a writable compile cache,
    llama.cpp's model file), all errors at once, each at its own line of the campaign file."""
    if family is None:
        family = "llamacpp" if _style(camp.engine, camp.profile_overrides) == "llamacpp" else "vllm"
    errors = host_path_errors(camp.path, camp.raw, shape, family, lines_of(camp.path))
    if errors:
        raise CampaignInvalid(errors)


def check_paths(shape: Shape, camp: Campaign | None = None) -> None:
    """Mount sources and device paths must exist before any container starts; the compile cache
    is created. With ``camp``, ``check_host`` first: each error at its line of the campaign file."""
    if camp is not None:
        check_host(camp, shape)
    for m in shape.mounts:
        if m.target == COMPILE_CACHE_TARGET and not m.read_only:
            try:
                Path(m.source).mkdir(parents=True, exist_ok=True)    # the compile cache is ours to create
            except OSError as e:
                raise ConfigError(f"compile cache {m.source}: cannot create it ({e.strerror or e}); "
                                  "give a folder this user can write") from None
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

"""The campaign file's schema: exact types, ranges, every error at once with file:line and key.

``validate(path)`` reads a campaign YAML and returns the raw mapping, or raises ``CampaignInvalid``
listing each error as ``FILE:LINE: KEY: what was expected, got what (the fix)``. It contacts no
service: types and ranges come from the pydantic models below (strict: ``'false'`` is not a bool,
``2.7`` is not an integer), the meaning of each section from the same constructors the campaign
uses (levers, the baseline shape, the objective), lever names from the engine profile's ``flags``,
and what would waste a night or break on a path from ``tuner.night.precheck``. The file is read
by ``tuner.night.campaign_file`` (size, UTF-8, depth and alias limits before any YAML is built).
``json_schema()`` is the JSON Schema editors use (``tuner schema``; docs/campaign.schema.json).
"""
from __future__ import annotations

import difflib
import logging
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arms.boot import BootLimits
from arms.errors import ConfigError
from arms.measure import MeasurePlan
from arms.sweep import SweepPlan
from tuner.night import precheck
from tuner.night.campaign_file import MAX_BYTES, MAX_DEPTH, MAX_NODES, Lines, key_text, read_yaml  # noqa: F401
from tuner.night.compare import ERROR_RATE, MIN_EFFECT

log = logging.getLogger("tuner.campaign")

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]
PosInt = Annotated[int, Field(ge=1)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Baseline(_Model):
    """The shape every arm starts from."""
    image: str = Field(min_length=1, description="image reference; a tag is pinned to its digest")
    model: str = Field(min_length=1, description="model path or name passed to the engine")
    args: dict[str, Any] = Field(default_factory=dict, description="engine flags without --")
    env: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    mounts: list[str | dict[str, Any]] = Field(default_factory=list,
                                               description="SOURCE:TARGET[:ro] or {source, target, ...}")
    compile_cache: str | dict[str, Any] | None = Field(None, description="host folder mounted at the compile cache")
    devices: list[str] | str = Field(default_factory=list, description="device paths or CDI names")
    port: int = Field(8000, ge=1, le=65535)
    options: dict[str, Any] = Field(default_factory=dict)


# The defaults of the arm-level plans live once, in their dataclasses (arms/boot.py, arms/measure.py,
# arms/sweep.py: an arm can be run without a campaign); these models read them, and ``limits()`` /
# ``plan()`` build the plans the arms run.
class Boot(_Model):
    timeout_s: PosFloat = BootLimits.timeout_s
    hang_s: PosFloat = BootLimits.hang_s
    poll_s: PosFloat = BootLimits.poll_s

    def limits(self) -> BootLimits:
        return BootLimits(timeout_s=self.timeout_s, hang_s=self.hang_s, poll_s=self.poll_s)


class Sweep(_Model):
    """The concurrency sweep (arms/sweep.py; seeds 000/001): goodput at the SLO per arm."""
    levels: list[PosInt] = Field(default=list(SweepPlan.levels), min_length=1)
    duration_s: PosFloat = SweepPlan.duration_s
    output_tokens: Annotated[int, Field(ge=2)] = SweepPlan.output_tokens
    slo_ttft_s: PosFloat = SweepPlan.slo_ttft_s
    slo_tpot_s: PosFloat = SweepPlan.slo_tpot_s
    prompt_tokens: PosInt = SweepPlan.prompt_tokens
    request_timeout_s: PosFloat = SweepPlan.request_timeout_s
    idle_timeout_s: PosFloat = SweepPlan.idle_timeout_s
    max_requests_per_level: PosInt = SweepPlan.max_requests_per_level
    knee_tolerance: Fraction = SweepPlan.knee_tolerance

    def plan(self) -> SweepPlan:
        return SweepPlan(**{**self.model_dump(), "levels": tuple(self.levels)})


class Measure(_Model):
    depths: list[PosInt] = Field(default=list(MeasurePlan.depths), min_length=1)
    runs: PosInt = MeasurePlan.runs
    warm_tokens: Annotated[int, Field(ge=0)] = MeasurePlan.warm_tokens
    max_tokens: PosInt = MeasurePlan.max_tokens
    run_timeout_s: PosFloat = MeasurePlan.run_timeout_s
    idle_timeout_s: PosFloat = MeasurePlan.idle_timeout_s
    max_invalid_per_depth: Annotated[int, Field(ge=0)] = MeasurePlan.max_invalid_per_depth
    telemetry: bool = False
    link_gbs: PosFloat | None = None
    membw_gbs: PosFloat | None = Field(None, description="host memory bandwidth in GB/s for the report's roofline "
                                                         "(llama.cpp); default: host/membw.py's probe")
    probe_interval_s: PosFloat = 2.0
    sweep: bool | Sweep | None = Field(None, description="true or the sweep's settings: every measured arm runs "
                                                          "the concurrency sweep (always with goodput_at_slo)")

    def plan(self) -> MeasurePlan:
        """The arms' measurement plan (arms.measure.MeasurePlan)."""
        return MeasurePlan(depths=tuple(self.depths), runs=self.runs, warm_tokens=self.warm_tokens,
                           max_tokens=self.max_tokens, run_timeout_s=self.run_timeout_s,
                           idle_timeout_s=self.idle_timeout_s, max_invalid_per_depth=self.max_invalid_per_depth)

    def sweep_plan(self, objective_kind: str) -> SweepPlan | None:
        """The concurrency sweep every measured arm runs: ``sweep`` (true or its settings), and
        always when the objective is goodput_at_slo; else None."""
        if self.sweep in (None, False) and objective_kind != "goodput_at_slo":
            return None
        return (self.sweep if isinstance(self.sweep, Sweep) else Sweep()).plan()


class Concurrency(_Model):
    tokens: PosInt
    min: PosFloat


class ConstraintsModel(_Model):
    max_concurrency_at: Concurrency | None = None
    boot_seconds_max: PosFloat | None = None
    min_slots: PosInt | None = None


class Budget(_Model):
    until: Any = Field(None, description='local time of day "HH:MM" (quoted), next occurrence')
    timezone: str | None = Field(None, description="IANA zone for until (default: this host's)")
    hours: PosFloat | None = None
    max_arms: PosInt | None = None


class Noise(_Model):          # how sure a move must be: the one place of the search's defaults
    recheck_every: PosInt = 6
    min_effect: Fraction = MIN_EFFECT
    confirm: bool = True
    prune_below: Fraction = 0.30
    error_rate: float = Field(ERROR_RATE, gt=0, lt=0.5, description="the chance a night promotes anything that is not "
                              "truly better (one family error rate spent over the night's comparisons)")


class ProductionModel(_Model):
    unit: str = Field(min_length=1)
    guard: Literal["refuse-if-active", "stop-and-restore"] = "refuse-if-active"
    health_url: str | None = None
    restore_timeout_s: PosFloat = 900.0
    promote_as: Literal["quadlet", "unit", "env-file"] | None = None
    env_file: str | None = None
    unit_file: str | None = None
    quadlet_dir: str | None = None
    mapping: dict[str, str] = Field(default_factory=dict)
    smoke_depth: PosInt | None = None
    profile: str | None = None
    podman_version: str | None = None
    scope: Literal["system", "user"] | None = None


class CampaignModel(_Model):
    """An offload-tuner campaign file."""
    name: str = Field(pattern=NAME_PATTERN, description="1-64 letters, digits, '.', '_' or '-'")
    description: str | None = None
    engine: str = Field("vllm-expert-offload", description="engine profile name or YAML path")
    engine_newer: bool = Field(False, description="the engine build is newer than its profile: "
                                                  "lever flags the profile does not list are accepted")
    podman: str | None = Field(None, description="podman API socket URL (default: CONTAINER_HOST)")
    profile: dict[str, Any] = Field(default_factory=dict, description="engine profile overrides")
    baseline: Baseline
    levers: dict[str, Any] = Field(default_factory=dict,
                                   description="LEVER: [values] or {values: [...], numerics: preserving|changing}")
    boot: Boot = Field(default_factory=Boot)
    journal: str = "journal"
    measure: Measure = Field(default_factory=Measure)
    objective: str = Field("decode_geomean", description="decode_geomean, decode@DEPTH or goodput_at_slo "
                                                          "(the concurrency sweep's goodput, measure.sweep)")
    constraints: ConstraintsModel = Field(default_factory=ConstraintsModel)
    budget: Budget = Field(default_factory=Budget)
    noise: Noise = Field(default_factory=Noise)
    search: Literal["one-change", "joint"] = "one-change"
    production: ProductionModel | None = None


def json_schema() -> dict:
    return CampaignModel.model_json_schema()


class Journaled:
    """A journaled campaign (campaign_start's ``campaign``) read back through the same models, for
    the readers of a folder (status, report, promote). Each section on its own: a section an older
    tuner accepted and this one refuses reads as its defaults, never as an error of the morning."""

    def __init__(self, raw: dict | None):
        self.raw = dict(raw or {})
        self.noise: Noise = self._section(Noise, "noise")
        self.measure: Measure = self._section(Measure, "measure")
        self.budget: Budget = self._section(Budget, "budget")
        self.boot: Boot = self._section(Boot, "boot")

    def _section(self, model, key: str):
        try:
            return model.model_validate(self.raw.get(key) or {}, strict=False)
        except ValidationError:
            return model()

    @property
    def name(self) -> str | None:
        return self.raw.get("name")

    @property
    def engine(self) -> str:
        return str(self.raw.get("engine") or CampaignModel.model_fields["engine"].default)

    @property
    def objective(self) -> str:
        return str(self.raw.get("objective") or CampaignModel.model_fields["objective"].default)

    @property
    def constraints(self):
        """The night's constraints (tuner.night.verdict.Constraints)."""
        from tuner.night.verdict import Constraints

        return Constraints.from_mapping(self.raw.get("constraints"), "campaign")

    @property
    def has_production(self) -> bool:
        """A production section: the baseline is the production service's shape."""
        return bool(self.raw.get("production"))


# -- errors --------------------------------------------------------------------------------
class CampaignInvalid(ConfigError):
    """Every error of one campaign file, one ``FILE:LINE: KEY: message`` line each."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


_Lines = Lines                 # the key -> line map (tuner/night/campaign_file.py)


# -- validation ------------------------------------------------------------------------------
_HINTS = {
    "bool_type": "write true or false, unquoted",
    "int_type": "write a whole number, unquoted",
    "float_type": "write a number, unquoted",
    "string_type": "write it as text; quote it if YAML reads it as something else",
    "dict_type": "write a mapping (key: value lines)",
    "list_type": "write a list, e.g. [a, b]",
}


def _message(err: dict, key: str) -> str:
    kind, got = err["type"], err.get("input")
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        known = _fields_at(err["loc"][:-1])
        near = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
        return "unknown key" + (f"; did you mean '{near[0]}'?" if near else "") + \
            (f" (known: {', '.join(known)})" if known else "")
    msg = re.sub(r"^Input should", "should", err["msg"])
    got_text = f"{got!r}" if not isinstance(got, (dict, list)) else type(got).__name__
    hint = _HINTS.get(kind)
    if kind == "string_pattern_mismatch" and key == "name":
        msg = "must be 1-64 letters, digits, '.', '_' or '-'"
    return f"{msg}, got {got_text}" + (f" ({hint})" if hint else "")


def _fields_at(loc: tuple) -> list[str]:
    model: Any = CampaignModel
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None and isinstance(model, type) and part == model.__name__:
            continue                          # a union's tag: the member pydantic tried
        if field is None:
            return []
        model = _model_of(field.annotation)
    return sorted(getattr(model, "model_fields", {}))


def _model_of(annotation) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


class Report:
    def __init__(self, path: Path, lines: _Lines):
        self.path, self.lines = path, lines
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def _at(self, loc: tuple) -> tuple[int, str]:
        line, _ = self.lines.line(loc)
        return line, key_text(loc)

    def error(self, loc: tuple, why: str) -> None:
        line, key = self._at(loc)
        self.errors.append(f"{self.path}:{line}: {key or '(file)'}: {why}")

    def warn(self, loc: tuple, why: str) -> None:
        line, key = self._at(loc)
        self.warnings.append(f"{self.path}:{line}: {key}: {why}")


def validate(path: str | os.PathLike) -> tuple[dict, list[str]]:
    """The raw campaign mapping and its warnings; CampaignInvalid with every error otherwise."""
    raw, _, warnings = validated(path)
    return raw, warnings


def validated(path: str | os.PathLike) -> tuple[dict, CampaignModel, list[str]]:
    """The raw mapping (journaled as written), the typed config and the warnings; CampaignInvalid
    with every error otherwise."""
    p = Path(path)
    raw, lines = read_yaml(p)
    rep = Report(p, lines)
    if not isinstance(raw, dict):
        raise CampaignInvalid([f"{p}:1: (file): a campaign file is a mapping (name, engine, baseline, "
                               "levers, ...), got " + type(raw).__name__])
    _refuse_inert(raw, rep)
    model = None
    try:
        model = CampaignModel.model_validate({k: v for k, v in raw.items() if not _inert_key(k, v)})
    except ValidationError as e:
        errs = [(_clean_loc(err["loc"], lines), err) for err in e.errors()]
        locs = [loc for loc, _ in errs]
        for loc, err in errs:           # a union's other member ('true or a mapping') said at a deeper key
            if any(len(o) > len(loc) and o[:len(loc)] == loc for o in locs):
                continue
            rep.error(loc, _message(err, ".".join(map(str, loc))))
    _semantic(raw, model, rep)
    if rep.errors:
        for w in rep.warnings:
            log.warning("%s", w)
        raise CampaignInvalid(sorted(rep.errors, key=_line_no))
    return raw, model, rep.warnings


def _line_no(error: str) -> int:
    m = re.search(r":(\d+): ", error)
    return int(m.group(1)) if m else 0


def _clean_loc(loc: tuple, lines: _Lines) -> tuple:
    """Drop pydantic's union tags ('str', 'list[str]', 'function-after[...]') from a location."""
    out: tuple = ()
    for part in loc:
        if (*out, part) in lines.at or isinstance(part, int) or part in _all_fields():
            out = (*out, part)
        elif not re.match(r"^[a-z-]+\[.*\]$|^(str|int|float|bool|none|dict|list)$|^[A-Z]", str(part)):
            out = (*out, part)
    return out


def _all_fields() -> set[str]:
    names: set[str] = set()
    for m in (CampaignModel, Baseline, Boot, Measure, Concurrency, ConstraintsModel, Budget, Noise,
              ProductionModel):
        names |= set(m.model_fields)
    return names


# keys a campaign once accepted without doing anything with them: refused, with why
INERT = {
    ("telemetry", None): "top-level telemetry is not read; use measure.telemetry: true",
}


def _inert_key(k, v) -> bool:
    return (k, None) in INERT


def _refuse_inert(raw: dict, rep: Report) -> None:
    if "telemetry" in raw:
        rep.error(("telemetry",), INERT[("telemetry", None)])
    m = raw.get("measure")
    if raw.get("objective") == "goodput_at_slo" and isinstance(m, dict) and m.get("sweep") is False:
        rep.error(("measure", "sweep"), "objective goodput_at_slo is the sweep's goodput: remove sweep: false "
                                        "(or choose decode_geomean)")


def _semantic(raw: dict, model: CampaignModel | None, rep: Report) -> None:
    """What types alone cannot say: lever specs and names, the objective, `until`, the journal."""
    from arms.shape import ABSENT, Lever, lever_name
    from tuner.night.verdict import Objective

    obj = raw.get("objective")
    if isinstance(obj, str):
        try:
            Objective.parse(obj)
        except ConfigError as e:
            rep.error(("objective",), str(e))
    budget = raw.get("budget")
    if isinstance(budget, dict):
        _until(budget, rep)
        if budget.get("hours") is not None and budget.get("until") is not None:
            rep.error(("budget", "hours"), "give until or hours, not both")
    profile_flags = _profile_flags(raw, rep)
    precheck.check(raw, rep, profile_flags)
    levers = raw.get("levers")
    if not isinstance(levers, dict):
        if levers is not None:
            rep.error(("levers",), f"must be a mapping of LEVER: [values], got {type(levers).__name__}")
        return
    base_env = (raw.get("baseline") or {}).get("env") if isinstance(raw.get("baseline"), dict) else None
    base_env = base_env if isinstance(base_env, dict) else {}
    seen: dict[str, str] = {}
    for name, spec in levers.items():
        loc = ("levers", name)
        try:
            lever = Lever.from_spec(str(name), spec)
        except ConfigError as e:
            rep.error(loc, str(e))
            continue
        if lever.name in seen:
            rep.error(loc, f"the same lever as '{seen[lever.name]}'; keep one")
            continue
        seen[lever.name] = str(name)
        if lever.kind == "env":
            if lever.target not in base_env and ABSENT not in lever.values:
                near = difflib.get_close_matches(lever.target, list(base_env), n=1, cutoff=0.75)
                rep.warn(loc, f"env var {lever.target} is not in baseline.env and 'absent' is not one of "
                         "its values" + (f"; did you mean env.{near[0]}?" if near else
                                         "; check the spelling, or add absent to its values"))
        elif profile_flags and not raw.get("engine_newer") is True:
            flag = lever_name(name)
            if flag not in profile_flags and not (flag.startswith("no-") and flag[3:] in profile_flags):
                near = difflib.get_close_matches(flag, sorted(profile_flags), n=1, cutoff=0.6)
                rep.error(loc, f"'{flag}' is not a flag of engine profile '{raw.get('engine')}'"
                          + (f"; did you mean '{near[0]}'?" if near else "")
                          + " (a newer engine build: set engine_newer: true)")


def _profile_flags(raw: dict, rep: Report) -> frozenset:
    from arms.profiles import load_profile

    engine = raw.get("engine", "vllm-expert-offload")
    prof = raw.get("profile") or None
    if not isinstance(engine, str) or (prof is not None and not isinstance(prof, dict)):
        return frozenset()
    if isinstance(engine, str) and ("/" in engine or engine.endswith((".yaml", ".yml"))):
        engine = str((rep.path.parent / engine)) if not os.path.isabs(engine) else engine
    try:
        return load_profile(engine, prof).known_flags
    except ConfigError as e:
        rep.error(("engine",) if "overrides" not in str(e) else ("profile",), str(e))
        return frozenset()


_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")


def _until(budget: dict, rep: Report) -> None:
    until = budget.get("until")
    if until is None:
        pass
    elif isinstance(until, bool) or not isinstance(until, str):
        hint = ""
        if isinstance(until, int) and not isinstance(until, bool) and 0 <= until < 24 * 60:
            hint = f' (YAML read {until // 60}:{until % 60:02d} as the number {until}); quote it: ' \
                   f'until: "{until // 60:02d}:{until % 60:02d}"'
        rep.error(("budget", "until"), f"must be a quoted time of day like \"07:00\", got {until!r}"
                  + (hint or "; quote it: until: \"07:00\""))
    else:
        m = _CLOCK.fullmatch(until.strip())
        if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
            rep.error(("budget", "until"), f"{until!r} is not a time of day like \"07:00\" (24-hour HH:MM)")
    tz = budget.get("timezone")
    if isinstance(tz, str):
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            rep.error(("budget", "timezone"), f"{tz!r} is not an IANA time zone like Europe/Berlin")


def lines_of(path: str | os.PathLike) -> _Lines:
    """The key -> line map of a campaign file (for errors found after validation)."""
    try:
        return read_yaml(Path(path))[1]
    except ConfigError:
        return _Lines(None)

"""The campaign file's schema: the typed config, every key's type, range and default, once.

The pydantic models below are strict (``'false'`` is not a bool, ``2.7`` is not an integer) and
build the arms' plans (``Measure.plan()``, ``Boot.limits()``, ``Sweep.plan()``); the defaults of
those plans live in their dataclasses and are read here. ``tuner.night.validation`` checks a file
against them with every error at once, ``Journaled`` reads a journaled campaign back through them,
and ``json_schema()`` is the JSON Schema editors use (``tuner schema``; docs/campaign.schema.json).
"""
from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from arms.boot import BootLimits
from arms.conditions import QUIET_WAIT_S
from arms.errors import ConfigError
from arms.measure import MeasurePlan
from arms.sweep import SweepPlan
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
    quiet_wait_s: float = Field(QUIET_WAIT_S, ge=0, description="after a boot whose runs another process held, "
                                "wait at most this long for a quiet box before the next boot (0: go on at once)")
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


class Storage(_Model):
    """A shared campaign (tuner/night/shared.py): several boxes, one record in PostgreSQL."""
    url: str = Field(description="postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (a password is better in "
                                 "PGPASSWORD or ~/.pgpass)")
    grace_s: PosFloat = Field(120.0, description="a box silent this long: its open arm is interrupted")
    heartbeat_s: PosFloat = Field(10.0, description="how often a box says it is alive")
    wait_s: Annotated[float, Field(ge=0)] = Field(900.0, description="how long a box waits for a database "
                                                                     "that went away before it stops")
    mixed_hardware: bool = Field(False, description="allow boxes whose host fingerprints differ")

    @field_validator("url")
    @classmethod
    def _postgres(cls, v: str) -> str:
        from tuner.night.storage import SCHEMES, safe_url

        scheme = v.split("://", 1)[0] if "://" in v else ""
        if scheme not in SCHEMES or not v.split("://", 1)[1].strip("/"):
            raise ValueError(f"a postgresql:// URL (postgresql://USER@HOST:PORT/DATABASE), not {safe_url(v)!r}")
        return v


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
    storage: Storage | None = Field(None, description="a shared campaign's database (a URL, or {url, grace_s, "
                                                       "...}); default: the journal files in the campaign folder")

    @field_validator("storage", mode="before")
    @classmethod
    def _storage_url(cls, v):
        return {"url": v} if isinstance(v, str) else v


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

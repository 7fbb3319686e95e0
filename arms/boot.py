"""Boot one arm: start the shape's container, wait until ready or dead, explain the boot
from the engine's own log, check that each changed flag landed, and always tear down.

``boot_arm`` is a context manager: the measurement of an arm happens inside it, while the
engine is up; on the way out the container is removed whatever happened.
"""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from dataclasses import replace as _replace
from pathlib import Path
from typing import Iterator

from .bootlog import MAX_LOG_CHARS, BootReport, parse_boot_log
from .flags import flags_not_applied
from .host import Host
from .lifecycle import Booted, booted, container_spec
from .profiles import EngineProfile
from .readiness import ReadinessProbe, bind_failure
from .secrets import seal
from .shape import ABSENT, Shape

log = logging.getLogger("tuner.arms.boot")


@dataclass(frozen=True)
class BootLimits:
    timeout_s: float = 1200.0     # the seed's boots take 420-490 s
    hang_s: float = 600.0         # boot log silent this long and not ready: a hang
    poll_s: float = 1.0


@dataclass
class BootResult:
    arm: str
    shape: Shape
    report: BootReport
    boot_s: float                      # container start to ready (or to the failure)
    log_path: Path
    not_applied: list[str] = field(default_factory=list)   # changed flags the engine did not take

    @property
    def ready(self) -> bool:
        return self.report.outcome == "ready"

    @property
    def outcome(self) -> str:
        """The arm's boot verdict: ready, flag-not-applied, or the failure class."""
        if self.ready and self.not_applied:
            return "flag-not-applied"
        return self.report.outcome

    def to_dict(self) -> dict:
        return {"arm": self.arm, "outcome": self.outcome, "boot_s": round(self.boot_s, 3),
                "log": str(self.log_path), "flags_not_applied": list(self.not_applied),
                "shape": self.shape.to_dict(), "report": self.report.to_dict()}


def probe_for(profile: EngineProfile, shape: Shape | None = None) -> ReadinessProbe:
    return ReadinessProbe(health_path=profile.health_path, completion_path=profile.completion_path,
                          expect_models=expected_models(shape) if shape is not None else ())


def expected_models(shape: Shape) -> tuple[str, ...]:
    """The names the booted engine serves its model under: --served-model-name (vLLM) or
    --alias (llama.cpp) when set, and the model argument."""
    out = []
    for lever in ("served-model-name", "alias"):
        v = shape.value_of(lever)
        if v is not ABSENT and v is not None:
            out += [str(x) for x in v] if isinstance(v, (list, tuple)) else str(v).split()
    return (*out, str(shape.model)) if shape.model else tuple(out)


def changed_flags(shape: Shape, changes: dict) -> dict:
    """{flag: value or None} for the flag levers among ``changes`` (env levers are not in argv)."""
    out = {}
    for name in changes:
        if str(name).startswith("env."):
            continue
        v = shape.value_of(name)
        out[name] = None if v is ABSENT else v
    return out


@contextlib.contextmanager
def boot_arm(host: Host, shape: Shape, profile: EngineProfile, *, campaign: str, arm: str | int,
             folder: Path, changes: dict | None = None, limits: BootLimits = BootLimits(),
             extra_env: dict[str, str] | None = None) -> Iterator[tuple[BootResult, Booted]]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec = container_spec(shape, campaign=campaign, arm=arm, style=profile.family, extra_env=extra_env)
    tag = f"arm {arm}"
    holder = host.port_holder(shape.port)        # a method of every Host (arms.host)
    if holder:                         # refused before booting: the holder would answer for it
        report = BootReport(outcome="port-in-use", profile=profile.name, evidence=(
            f"port {shape.port} is already held by {holder}; stop it or give the campaign another "
            f"baseline.port",))
        result = BootResult(arm=str(arm), shape=shape, report=report, boot_s=0.0,
                            log_path=folder / "boot.log")
        (folder / "boot.json").write_text(json.dumps(result.to_dict(), indent=1, default=str))
        log.warning("[%s BOOT port-in-use] %s", tag, report.evidence[0])
        yield result, None
        return
    with booted(host, spec, log_path=folder / "boot.log", port=shape.port, probe=probe_for(profile, shape),
                timeout_s=limits.timeout_s, hang_s=limits.hang_s, poll_s=limits.poll_s, tag=tag) as b:
        st = b.ready.state
        if b.ready.outcome == "exited" or (st is not None and st.exited):
            st = host.state(b.cid)
        hint = b.ready.outcome if b.ready.outcome in ("boot-timeout", "hang") else None
        text = b.logs.text(MAX_LOG_CHARS)
        deadline = host.now() + 3.0
        while b.ready.ready and not profile.ready_pattern.search(text) and host.now() < deadline:
            host.sleep(0.05)          # the log copy trails the server by a few lines
            text = b.logs.text(MAX_LOG_CHARS)
        try:
            report = parse_boot_log(text, profile, exit_code=st.exit_code if st and st.exited else None,
                                    oom_killed=bool(st and st.oom_killed), outcome_hint=hint)
            parsed = True
        except Exception as e:       # a parser bug must not take the daemon down: unknown, with evidence
            log.exception("[%s BOOT] the boot-log parser failed", tag)
            report = BootReport(outcome="unknown", profile=profile.name,
                                evidence=(f"boot-log parser failed: {type(e).__name__}: {str(e)[:300]}",),
                                exit_code=st.exit_code if st and st.exited else None)
            parsed = False
        bind = bind_failure(text) if not report.ready or b.ready.outcome == "port-in-use" else None
        if bind is not None:           # the engine could not bind its port: whoever answered was not it
            report = _replace(report, outcome="port-in-use", evidence=(bind,))
        elif b.ready.outcome == "port-in-use":   # readiness saw another engine answer (its model)
            report = _replace(report, outcome="port-in-use", evidence=(b.ready.detail,))
        elif parsed and b.ready.ready and not report.ready:
            # the server answers and completes: the log format is unfamiliar, not a failure
            report = _as_ready(report)
        not_applied = flags_not_applied(changed_flags(shape, changes or {}), report.non_default_args,
                                        defaults=profile.arg_defaults) \
            if report.ready and report.non_default_args_raw is not None else []
        result = BootResult(arm=str(arm), shape=shape, report=report, boot_s=b.ready.seconds,
                            log_path=folder / "boot.log", not_applied=not_applied)
        (folder / "boot.json").write_text(json.dumps(seal(result.to_dict()), indent=1, default=str))   # secrets sealed
        verdict = result.outcome
        log.info("[%s BOOT %s] in %.1f s%s", tag, verdict, result.boot_s,
                 f" — {report.evidence[0]}" if report.evidence and not result.ready else "")
        yield result, b


def _as_ready(report: BootReport) -> BootReport:
    from dataclasses import replace

    return replace(report, outcome="ready", evidence=report.evidence or ("readiness probe: completion returned text",))

"""The production guard: the campaign never fights the production service for the GPU.

``refuse-if-active``: an active production unit stops the campaign before anything starts.
``stop-and-restore``: the unit is stopped and runtime-masked (so nothing restarts it), that is
journaled, and at the end — normal end, SIGTERM, or the next start after a crash — it is
unmasked, started and waited on until healthy.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import httpx

from arms.errors import ConfigError, HostError

log = logging.getLogger("tuner.guard")

GUARDS = ("refuse-if-active", "stop-and-restore")
PRODUCTION_KEYS = {"unit", "guard", "health_url", "restore_timeout_s", "promote_as", "env_file", "unit_file",
                   "quadlet_dir", "mapping", "smoke_depth", "profile", "podman_version", "scope"}
PROMOTE_AS = ("quadlet", "unit", "env-file")
SCOPES = ("system", "user")
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Production:
    unit: str
    guard: str = "refuse-if-active"
    health_url: str | None = None
    restore_timeout_s: float = 900.0
    # promotion (tuner promote / rollback): the form, where it lives, how to check it
    promote_as: str | None = None          # quadlet | unit | env-file
    unit_file: str | None = None           # unit: default /etc/systemd/system/UNIT
    quadlet_dir: str | None = None         # quadlet: default /etc/containers/systemd
    env_file: str | None = None            # env-file: required
    mapping: dict = field(default_factory=dict)   # env-file: lever (or image/model/port) -> VAR
    smoke_depth: int | None = None         # default: the campaign's first measure depth
    profile: str | None = None             # engine profile of the service (default: the campaign's)
    podman_version: str | None = None      # default: asked from podman
    scope: str | None = None               # system | user (systemctl --user); default from the paths

    @classmethod
    def from_mapping(cls, d, where: str) -> "Production | None":
        if d is None:
            return None
        if not isinstance(d, dict) or "unit" not in d:
            raise ConfigError(f"{where}: key 'production': needs at least unit: NAME.service")
        for k in d:
            if k not in PRODUCTION_KEYS:
                raise ConfigError(f"{where}: key 'production.{k}': unknown key (known: {', '.join(sorted(PRODUCTION_KEYS))})")
        guard = d.get("guard", "refuse-if-active")
        if guard not in GUARDS:
            raise ConfigError(f"{where}: key 'production.guard': {guard!r} is not one of {', '.join(GUARDS)}")
        return cls(unit=str(d["unit"]), guard=guard, health_url=d.get("health_url"),
                   restore_timeout_s=float(d.get("restore_timeout_s", 900)), **_promotion(d, where))


def _promotion(d: dict, where: str) -> dict:
    """The promotion keys of a production section, checked (tuner/production/promote.py uses them)."""
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{where}: key 'production.{key}': {why}")

    out: dict = {}
    form = d.get("promote_as")
    if form is not None and form not in PROMOTE_AS:
        raise bad("promote_as", f"{form!r} is not one of {', '.join(PROMOTE_AS)}")
    out["promote_as"] = form
    for key in ("unit_file", "quadlet_dir", "env_file", "profile", "podman_version"):
        if d.get(key) is not None and not isinstance(d[key], (str, int, float)):
            raise bad(key, "must be a string")
        out[key] = None if d.get(key) is None else str(d[key])
    mapping = d.get("mapping") or {}
    if not isinstance(mapping, dict):
        raise bad("mapping", "must map each lever to the serve script's variable, e.g. max-num-seqs: FRANK_PRIMARY_SEQS")
    for lever, var in mapping.items():
        if not isinstance(var, str) or not _ENV_VAR.match(var):
            raise bad(f"mapping.{lever}", f"{var!r} is not an environment variable name")
    out["mapping"] = {str(k): v for k, v in mapping.items()}
    if form == "env-file" and not out["env_file"]:
        raise bad("env_file", "promote_as: env-file needs env_file: PATH (the serve script's env file)")
    if form == "env-file" and not mapping:
        raise bad("mapping", "promote_as: env-file needs a mapping of each lever to the script's variable")
    if form == "quadlet" and not str(d["unit"]).endswith(".service"):
        raise bad("unit", f"a Quadlet NAME.container runs as NAME.service; {d['unit']!r} is not a .service")
    depth = d.get("smoke_depth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise bad("smoke_depth", f"{depth!r} must be a prompt length in tokens, e.g. 1087")
    out["smoke_depth"] = depth
    scope = d.get("scope")
    if scope is not None and scope not in SCOPES:
        raise bad("scope", f"{scope!r} is not one of {', '.join(SCOPES)}")
    out["scope"] = scope
    return out


class Guard:
    def __init__(self, prod: Production | None, host, journal):
        self.prod, self.host, self.journal = prod, host, journal
        self.holding = False

    def _pending(self) -> bool:
        """A previous run stopped the unit and never restored it."""
        state = None
        for r in self.journal.records:
            if r["op"] == "guard" and r.get("unit") == (self.prod.unit if self.prod else None):
                state = r.get("action")
        return state in ("stopped", "masked")

    def enter(self) -> None:
        if self.prod is None:
            return
        unit = self.prod.unit
        if self._pending():
            self.holding = True
            self.journal.append("guard", unit=unit, action="adopted",
                                note="a previous run stopped this unit and died; this run restores it at its end")
            log.warning("[guard] %s is still stopped by a previous run; it is restored at the end of this one", unit)
            return
        state = self.host.unit(unit, "is-active")
        if state not in ("active", "activating", "reloading"):
            self.journal.append("guard", unit=unit, action="checked", state=state)
            return
        if self.prod.guard == "refuse-if-active":
            raise ConfigError(f"production unit {unit} is {state}: stop it first, or set production.guard: "
                              "stop-and-restore to let the campaign stop it and restore it at the end")
        self.host.unit(unit, "stop")
        self.journal.append("guard", unit=unit, action="stopped", state_before=state)
        self.host.unit(unit, "mask-runtime")
        self.journal.append("guard", unit=unit, action="masked")
        self.holding = True
        log.info("[guard] stopped and masked %s for the campaign", unit)

    def exit(self) -> None:
        if self.prod is None or not self.holding:
            return
        unit = self.prod.unit
        self.host.unit(unit, "unmask-runtime")
        self.host.unit(unit, "start")
        healthy = self._wait_healthy()
        self.journal.append("guard", unit=unit, action="restored", healthy=healthy)
        self.holding = False
        log.info("[guard] restored %s (%s)", unit, "healthy" if healthy else "NOT healthy: check it")

    def _wait_healthy(self) -> bool:
        h = self.host
        end = h.now() + self.prod.restore_timeout_s
        while h.now() < end:
            if h.unit(self.prod.unit, "is-active") == "failed":
                return False
            if self.prod.health_url:
                try:
                    with h.http_client("", timeout=5.0) as c:
                        if c.get(self.prod.health_url).status_code == 200:
                            return True
                except (httpx.HTTPError, HostError):
                    pass
            elif h.unit(self.prod.unit, "is-active") == "active":
                return True
            h.sleep(2.0)
        return False

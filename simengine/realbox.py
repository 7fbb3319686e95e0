"""What makes a real box non-stationary, as landscape terms: per-boot spread, warm-up, a cold first
boot, drift and a step (another tenant). Pure functions of the landscape, the boot and the clock.

    boot_sigma: 0.02                        each boot's rate x exp(N(0, boot_sigma)): layout, placement
    warmup: {requests: 3, factor: 0.8}      the first N requests of every boot ramp from F up to 1
    cold_start: {factor: 0.7, boots: 1,     the first K boots of the box run at F and load
                 load_factor: 2.5}          load_factor times slower (the model read from disk)
    drift_per_hour: 0.02                    rate x exp(drift x hours since the epoch) (engine.py)
    drift_step: {at_hours: 3, factor: 0.95} from hour H on the rate is x F (a list: several steps)
    tenant: {at_hours: 1, until_hours: 2,   another process on the box from hour H until U: it
             cores: 1.5, factor: 0.8}       takes C cores (the simulated host reports them as the
                                            runs' foreign load) and the rate is x F (a list: several)

A boot knows its place on the box from ``SIMENGINE_BOOT_INDEX`` (0 for the first boot; the
simulated host counts its boots, a fresh host being a box whose page cache is cold), or else from
a counter file in ``SIMENGINE_BOX_STATE`` (a directory the operator bind-mounts from the host, so
podman boots count too). With neither, a boot cannot know it is early and is taken as warm.
Stdlib only.
"""
from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

WARMUP_KEYS = {"requests", "factor"}
COLD_KEYS = {"factor", "boots", "load_factor"}
STEP_KEYS = {"at_hours", "factor"}
TENANT_KEYS = {"at_hours", "until_hours", "cores", "factor"}
COLD_LOAD_FACTOR = 2.5          # a cold boot's model load, x the warm one, when the landscape names no load_factor
BOX_COUNTER = "simengine-boots"


@dataclass(frozen=True)
class BootTerms:
    """What one boot carries into its engine core (``Behaviour``)."""
    rate_factor: float = 1.0            # boot spread x cold start
    load_factor: float = 1.0            # model load time multiplier (cold start)
    cold: bool = False


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def problems(d: dict) -> list[tuple[str, str]]:
    """(key path, why) for every realbox key of a landscape mapping that is malformed."""
    out: list[tuple[str, str]] = []
    if "boot_sigma" in d and not (_num(d["boot_sigma"]) and 0 <= d["boot_sigma"] <= 1):
        out.append(("boot_sigma", f"a relative sigma in [0, 1] (e.g. 0.02), not {d['boot_sigma']!r}"))
    w = d.get("warmup")
    if w is not None:
        if not isinstance(w, dict) or set(w) - WARMUP_KEYS or not WARMUP_KEYS <= set(w):
            out.append(("warmup", f"a mapping {{requests: N, factor: F}}, not {w!r}"))
        else:
            if not (isinstance(w["requests"], int) and not isinstance(w["requests"], bool) and w["requests"] >= 0):
                out.append(("warmup.requests", f"a count >= 0, not {w['requests']!r}"))
            if not (_num(w["factor"]) and 0 < w["factor"] <= 1):
                out.append(("warmup.factor", f"a factor in (0, 1] (the first request's rate / the steady rate), not {w['factor']!r}"))
    c = d.get("cold_start")
    if c is not None:
        if not isinstance(c, dict) or set(c) - COLD_KEYS or not {"factor", "boots"} <= set(c):
            out.append(("cold_start", f"a mapping {{factor: F, boots: K[, load_factor: L]}}, not {c!r}"))
        else:
            if not (_num(c["factor"]) and c["factor"] > 0):
                out.append(("cold_start.factor", f"a positive factor (e.g. 0.7), not {c['factor']!r}"))
            if not (isinstance(c["boots"], int) and not isinstance(c["boots"], bool) and c["boots"] >= 0):
                out.append(("cold_start.boots", f"a count >= 0, not {c['boots']!r}"))
            if "load_factor" in c and not (_num(c["load_factor"]) and c["load_factor"] >= 1):
                out.append(("cold_start.load_factor", f"a factor >= 1, not {c['load_factor']!r}"))
    s = d.get("drift_step")
    if s is not None:
        steps = s if isinstance(s, list) else [s]
        for i, st in enumerate(steps):
            key = "drift_step" if not isinstance(s, list) else f"drift_step[{i}]"
            if not isinstance(st, dict) or set(st) != STEP_KEYS:
                out.append((key, f"a mapping {{at_hours: H, factor: F}}, not {st!r}"))
            elif not (_num(st["at_hours"]) and st["at_hours"] >= 0):
                out.append((f"{key}.at_hours", f"hours >= 0, not {st['at_hours']!r}"))
            elif not (_num(st["factor"]) and st["factor"] > 0):
                out.append((f"{key}.factor", f"a positive factor, not {st['factor']!r}"))
    t = d.get("tenant")
    if t is not None:
        for i, te in enumerate(t if isinstance(t, list) else [t]):
            key = "tenant" if not isinstance(t, list) else f"tenant[{i}]"
            out += _tenant_problems(key, te)
    return out


def _tenant_problems(key: str, te) -> list[tuple[str, str]]:
    if not isinstance(te, dict) or set(te) != TENANT_KEYS:
        return [(key, f"a mapping {{at_hours: H, until_hours: U, cores: C, factor: F}}, not {te!r}")]
    if not (_num(te["at_hours"]) and te["at_hours"] >= 0):
        return [(f"{key}.at_hours", f"hours >= 0, not {te['at_hours']!r}")]
    if not (_num(te["until_hours"]) and te["until_hours"] > te["at_hours"]):
        return [(f"{key}.until_hours", f"hours after at_hours {te['at_hours']!r}, not {te['until_hours']!r}")]
    if not (_num(te["cores"]) and te["cores"] >= 0):
        return [(f"{key}.cores", f"CPU cores >= 0 the tenant keeps busy (e.g. 1.5), not {te['cores']!r}")]
    if not (_num(te["factor"]) and te["factor"] > 0):
        return [(f"{key}.factor", f"a positive factor (the rate while it is there, e.g. 0.8), not {te['factor']!r}")]
    return []


def steps(d: dict) -> tuple[tuple[float, float], ...]:
    """The landscape's drift steps as (at seconds since the epoch, factor), in time order."""
    s = d.get("drift_step")
    if s is None:
        return ()
    return tuple(sorted((float(x["at_hours"]) * 3600.0, float(x["factor"])) for x in (s if isinstance(s, list) else [s])))


def tenants(d: dict) -> tuple[tuple[float, float, float, float], ...]:
    """The landscape's tenants as (from, until seconds since the epoch, cores, rate factor)."""
    t = d.get("tenant")
    if t is None:
        return ()
    return tuple(sorted((float(x["at_hours"]) * 3600.0, float(x["until_hours"]) * 3600.0, float(x["cores"]),
                         float(x["factor"])) for x in (t if isinstance(t, list) else [t])))


def tenant_factor(tens: tuple[tuple[float, float, float, float], ...], seconds: float) -> float:
    """The product of the rate factors of every tenant present at ``seconds``."""
    f = 1.0
    for at, until, _, factor in tens:
        if at <= seconds < until:
            f *= factor
    return f


def tenant_cores(tens: tuple[tuple[float, float, float, float], ...], t0: float, t1: float) -> float:
    """The tenants' CPU cores averaged over [t0, t1] seconds since the epoch (over no time: at t0)."""
    if t1 <= t0:
        return sum(c for at, until, c, _ in tens if at <= t0 < until)
    return sum(c * max(0.0, min(t1, until) - max(t0, at)) for at, until, c, _ in tens) / (t1 - t0)


def boot_index(env: dict) -> int | None:
    """This boot's place on the box (0: the first), or None when it cannot be known."""
    v = env.get("SIMENGINE_BOOT_INDEX")
    if v not in (None, ""):
        return int(v)
    state = env.get("SIMENGINE_BOX_STATE")
    if not state:
        return None
    path = Path(state) / BOX_COUNTER
    try:
        n = int(path.read_text().strip() or 0) if path.exists() else 0
        path.write_text(f"{n + 1}\n")
    except (OSError, ValueError):
        return None
    return n


def boot_terms(d: dict, noise_seed: int, index: int | None) -> BootTerms:
    """One boot's spread and cold start: the spread drawn from the boot's own noise seed (a night
    on the simulated host replays exactly), the cold start from its place on the box."""
    factor = 1.0
    sigma = float(d.get("boot_sigma", 0.0))
    if sigma:
        factor *= math.exp(random.Random(f"simengine-boot:{noise_seed}").gauss(0.0, sigma))
    cold = d.get("cold_start") or {}
    is_cold = bool(cold) and index is not None and index < int(cold.get("boots", 0))
    if is_cold:
        factor *= float(cold["factor"])
    load = float(cold.get("load_factor", COLD_LOAD_FACTOR)) if is_cold else 1.0
    return BootTerms(rate_factor=factor, load_factor=load, cold=is_cold)


def warmup_factor(requests: int, factor: float, n: int) -> float:
    """The n-th request's (1-based) rate factor: F for the first, rising linearly to 1 after N."""
    if requests <= 0 or n > requests:
        return 1.0
    return factor + (1.0 - factor) * (n - 1) / requests


def step_factor(drift_steps: tuple[tuple[float, float], ...], seconds: float) -> float:
    """The product of every drift step reached by ``seconds`` since the epoch."""
    f = 1.0
    for at, factor in drift_steps:
        if seconds >= at:
            f *= factor
    return f


"""Checking a campaign file against its schema: every error at once, each with file:line and key.

``validated(path)`` reads a campaign YAML (``tuner.night.campaign_file``: size, UTF-8, depth and
alias limits before any YAML is built) and returns the raw mapping, the typed config
(``tuner.night.schema.CampaignModel``) and the warnings, or raises ``CampaignInvalid`` listing each
error as ``FILE:LINE: KEY: what was expected, got what (the fix)``. It contacts no service: types
and ranges come from the models, the meaning of each section from the same constructors the
campaign uses (levers, the baseline shape, the objective), lever names from the engine profile's
``flags``, and what would waste a night or break on a path from ``tuner.night.precheck``.
"""
from __future__ import annotations

import difflib
import logging
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from arms.errors import ConfigError
from tuner.night import precheck
from tuner.night.campaign_file import Lines, key_text, read_yaml
from tuner.night.schema import (Baseline, Boot, Budget, CampaignInvalid, CampaignModel, Concurrency,  # noqa: F401
                                ConstraintsModel, Measure, Noise, ProductionModel)

log = logging.getLogger("tuner.campaign")


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
    if key.startswith("storage") and isinstance(got, str):       # a URL's password is never printed
        from tuner.night.storage import safe_url

        got, msg = safe_url(got), msg.replace(got, safe_url(got))
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
    def __init__(self, path: Path, lines: Lines):
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


def _clean_loc(loc: tuple, lines: Lines) -> tuple:
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


def lines_of(path: str | os.PathLike) -> Lines:
    """The key -> line map of a campaign file (for errors found after validation)."""
    try:
        return read_yaml(Path(path))[1]
    except ConfigError:
        return Lines(None)

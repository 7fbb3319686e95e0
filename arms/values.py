"""One codec for a lever value, wherever it is written or shown.

A value (an int, a float, a string, a JSON mapping, or ``ABSENT``: the flag or env var left
out) has three forms outside memory, each made here and nowhere else:

* ``encode`` / ``decode``: its JSON in the journal (``ABSENT`` as ``{"__absent__": true}``);
* ``text``: how a person reads it (report, status, CLI, logs) — ``text_of`` for a journaled one;
* ``param`` / ``choices`` / ``from_choice``: the Optuna study's string (a trial attribute in the
  one-change study, a categorical choice in joint mode), sealed by ``arms.secrets``' one rule: a
  secret value is ``"***"`` (as a choice, ``"*** #i"``, its place in the lever's list, so the
  choices stay distinct and the study never holds the value).

How a value is spelled on an engine's command line is the engine's business (``arms.argv`` and
``arms.spellings``, over ``arms.shape.format_value``), not a lever value's encoding.
"""
from __future__ import annotations

import json
from typing import Any

from arms.secrets import REDACTED, is_secret, looks_like_token, seal
from arms.shape import ABSENT, format_value, thaw

ABSENT_JSON = {"__absent__": True}


def encode(v: Any) -> Any:
    """A value as the journal's JSON (ABSENT survives the round trip)."""
    return dict(ABSENT_JSON) if v is ABSENT else thaw(v)


def decode(j: Any) -> Any:
    """The value a journaled JSON stands for."""
    return ABSENT if j == ABSENT_JSON else j


def text(v: Any) -> str:
    """A value as a person reads it."""
    return format_value(v)


def text_of(j: Any) -> str:
    """A journaled (encoded) value as a person reads it."""
    return text(decode(j))


def change_text(change, arrow: str = "→") -> str:
    """A (lever, value) change as a person reads it; "—" for none."""
    return "—" if not change else f"{change[0]} {arrow} {text(change[1])}"


def _json(v: Any) -> str:
    return json.dumps(encode(v), sort_keys=True)


def param(lever: str, v: Any) -> str:
    """A change's value as the study's string: its JSON, sealed."""
    if is_secret(str(lever)) or looks_like_token(v):
        return json.dumps(REDACTED)
    return seal(_json(v))


def choices(lever: str, values) -> list[str]:
    """A lever's values as the joint study's categorical choices: ``param`` where that is the
    value's own JSON, else ``"*** #i"`` (a sealed value, distinct by its place in the list)."""
    return [p if p == _json(v) else json.dumps(f"{REDACTED} #{i}")
            for i, (v, p) in enumerate((v, param(lever, v)) for v in values)]


def from_choice(lever: str, values, choice: str) -> Any:
    """The value a joint study's choice stands for (``choices``' inverse)."""
    return list(values)[choices(lever, values).index(choice)]


def choice_of(lever: str, values, v: Any) -> str:
    """The joint study's choice for value ``v`` of a lever (``param`` when it is not listed)."""
    values = list(values)
    return choices(lever, values)[values.index(v)] if v in values else param(lever, v)

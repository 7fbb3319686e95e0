"""The flag-landed check: did each changed engine flag reach the engine?

vLLM logs ``non-default args: {...}`` with the parsed values under snake_case keys. A flag
the arm changed must show up there with the value it was given; a flag changed TO absent
(value ``None``) must not show up. A silent argparse drop (a fork that renamed a flag, a
wrapper script that forgot to pass it) is then visible before any measurement is trusted.

Values compare loosely: ``32768 == '32768'``, ``True == 'true'``, ``'32k' == 32000``,
``'32K' == 32768``, and a JSON string equals the dict it encodes. Env-var levers
(``env.NAME``) are not engine flags and are skipped.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

__all__ = ["flags_not_applied", "arg_key", "loosely_equal"]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kmgtKMGT])$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def arg_key(flag: str) -> str:
    """``--expert-precise-memory`` / ``expert-precise-memory`` -> ``expert_precise_memory``."""
    return flag.strip().lstrip("-").replace("-", "_")


def flags_not_applied(changed_flags: Mapping[str, object], non_default_args: Mapping[str, object],
                      *, defaults: Mapping[str, object] | None = None) -> list[str]:
    """Names (as given) of the changed flags the engine's non-default args contradict.

    ``defaults`` (optional, keyed like ``changed_flags`` or by snake_case key) lists engine
    defaults: a flag set to its default is legitimately missing from the non-default args.
    """
    known_defaults = {arg_key(k): v for k, v in (defaults or {}).items()}
    offending = []
    for name, wanted in changed_flags.items():
        if name.startswith("env.") or name.startswith("env:"):
            continue
        key = arg_key(name)
        if wanted is not None and key.startswith("no_") and key not in non_default_args \
                and _truthy(wanted):
            key, wanted = key[3:], False          # --no-enforce-eager == enforce_eager False
        found, present = _lookup(non_default_args, key)
        if wanted is None:
            if present:
                offending.append(name)
        elif present:
            if not loosely_equal(wanted, found):
                offending.append(name)
        elif not (key in known_defaults and loosely_equal(wanted, known_defaults[key])):
            offending.append(name)
    return offending


def _lookup(args: Mapping[str, object], key: str) -> tuple[Any, bool]:
    """A key, or a dotted one (``compilation_config.mode``) inside a nested dict."""
    if key in args:
        return args[key], True
    head, dot, rest = key.partition(".")
    if dot and isinstance(args.get(head), Mapping):
        return _lookup(args[head], arg_key(rest))   # type: ignore[arg-type]
    return None, False


def _truthy(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in _TRUE | {""})


def loosely_equal(a: object, b: object) -> bool:
    a, b = _decode(a), _decode(b)
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (isinstance(a, Mapping) and isinstance(b, Mapping) and set(map(str, a)) == set(map(str, b))
                and all(loosely_equal(a[k], _by_str(b, str(k))) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(loosely_equal(x, y) for x, y in zip(a, b)))
    if isinstance(a, bool) or isinstance(b, bool):
        return _as_bool(a) is not None and _as_bool(a) == _as_bool(b)
    x, y = _as_number(a), _as_number(b)
    if x is not None and y is not None:
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    if a is None or b is None:
        return a is None and b is None
    return str(a).strip() == str(b).strip()


def _by_str(mapping: Mapping, key: str) -> object:
    for k, v in mapping.items():
        if str(k) == key:
            return v
    return None


def _decode(value: object) -> object:
    """A JSON object/array given as a string (``--speculative-config '{...}'``) -> data."""
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        return True if text in _TRUE else False if text in _FALSE else None
    return None


def _as_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    text = value.strip().replace(",", "").replace("_", "")
    try:
        return float(text)
    except ValueError:
        pass
    m = _HUMAN.match(text)                      # vLLM: 32k = 32000, 32K = 32768
    if m:
        number, suffix = float(m.group(1)), m.group(2)
        return number * (_DECIMAL[suffix] if suffix in _DECIMAL else _BINARY[suffix])
    return None

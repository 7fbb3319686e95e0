"""Secrets sealed at one gate: one rule for what is secret, one way to hide it.

Secret is
  * the value of an env var or a flag whose name says so — ``*token``, ``*key``, ``*secret``,
    ``*password`` as a word ending (HF_TOKEN, API_KEY, --hf-token, --api-key), not running on into
    more letters (R4D_LRU_UVA_TOKENS, --max-num-batched-tokens stay readable): ``arms.argv.is_secret``;
  * any string value that looks like a token: a known prefix (hf_, sk-, ghp_, glpat-, xoxb-, AKIA,
    a JWT's eyJ) followed by 16+ token characters, or 32+ characters of letters, digits, ``_-``
    mixing upper case, lower case and digits (hex digests and paths are not tokens).

``seal(obj)`` returns a copy of a JSON-like record with every secret replaced by ``***``: env
mappings and pair lists, shape ``args`` pairs, argv lists (the value after a secret flag), a
lever's ``change`` pair, and any token-looking string anywhere. ``Sealer`` also knows the real
secret values of one campaign and replaces them as literals in free text (logs, boot.log,
measure.json) — so a secret the engine echoes back is hidden too.

Identity is never computed from a sealed copy: ``Shape.key()`` of the real shape is journaled
beside the sealed shape (``tuner.night.state`` compares keys).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from arms.argv import REDACTED, is_secret

__all__ = ["REDACTED", "SealFilter", "Sealer", "is_secret", "looks_like_token", "seal", "secret_values"]

_PREFIXED = re.compile(r"^(hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abprs]-|AKIA|eyJ)[A-Za-z0-9_\-.=]{16,}$")
_GENERIC = re.compile(r"^[A-Za-z0-9_\-]{32,}$")
_IN_TEXT = re.compile(r"(?<![A-Za-z0-9_\-])(?:hf_|sk-|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abprs]-)[A-Za-z0-9_\-]{16,}")


def looks_like_token(value: Any) -> bool:
    if not isinstance(value, str) or " " in value or "/" in value:
        return False
    if _PREFIXED.match(value):
        return True
    return bool(_GENERIC.match(value)) and any(c.isupper() for c in value) and any(c.islower() for c in value) \
        and any(c.isdigit() for c in value)


def _hide(v: Any) -> Any:
    return REDACTED if v not in (None, "", REDACTED) and not isinstance(v, bool) else v


def _seal_argv(argv: list) -> list:
    out, hide_next = [], False
    for a in argv:
        if hide_next and not (isinstance(a, str) and a.startswith("-")):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if isinstance(a, str) and a.startswith("-") and is_secret(a.split("=", 1)[0]):
            if "=" in a:
                a = a.split("=", 1)[0] + "=" + REDACTED
            else:
                hide_next = True
        out.append(seal(a))
    return out


def _pair(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str)


def seal(obj: Any) -> Any:
    """A copy of ``obj`` (JSON-like) with every secret replaced by ``***``."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("env", "args", "options") and isinstance(v, dict):
                out[k] = {ek: (_hide(ev) if is_secret(str(ek)) else seal(ev)) for ek, ev in v.items()}
            elif k in ("env", "args", "options") and isinstance(v, list) and all(_pair(p) for p in v):
                out[k] = [[p[0], _hide(p[1]) if is_secret(p[0]) else seal(p[1])] for p in v]
            elif k in ("argv", "cmd", "command") and isinstance(v, list):
                out[k] = _seal_argv(v)
            elif k == "change" and _pair(v):
                out[k] = [v[0], _hide(v[1]) if is_secret(v[0]) else seal(v[1])]
            elif k == "levers" and isinstance(v, dict):
                out[k] = {ln: (_hide_all(lv) if is_secret(str(ln)) else seal(lv)) for ln, lv in v.items()}
            elif isinstance(k, str) and is_secret(k) and isinstance(v, (str, int, float)) and not isinstance(v, bool):
                out[k] = _hide(v)
            else:
                out[k] = seal(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [seal(x) for x in obj]
    if isinstance(obj, str):
        return REDACTED if looks_like_token(obj) else _IN_TEXT.sub(REDACTED, obj)
    return obj


def _hide_all(v: Any) -> Any:
    if isinstance(v, list):
        return [_hide(x) for x in v]
    if isinstance(v, dict):
        return {k: (_hide_all(x) if k == "values" else x) for k, x in v.items()}
    return _hide(v)


def secret_values(obj: Any, _secret: bool = False) -> set[str]:
    """Every real secret value in a JSON-like object (a shape's dict, a campaign's raw YAML), as
    the text it appears as in a log or argv."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("env", "args", "options") and isinstance(v, list) and all(_pair(p) for p in v):
                for name, x in v:
                    out |= secret_values(x, _secret or is_secret(name))
            else:
                out |= secret_values(v, _secret or (isinstance(k, str) and is_secret(k)))
    elif isinstance(obj, (list, tuple)):
        if _pair(obj) and is_secret(obj[0]):            # a (name, value) pair: env, args, a change
            _secret = True
        for i, x in enumerate(obj):
            prev = obj[i - 1] if i else None
            flag = isinstance(prev, str) and prev.startswith("-") and "=" not in prev and is_secret(prev)
            if isinstance(x, str) and x.startswith("-") and "=" in x and is_secret(x.split("=", 1)[0]):
                x, flag = x.split("=", 1)[1], True          # --api-key=VALUE
            out |= secret_values(x, _secret or flag)
    elif isinstance(obj, (str, int, float)) and not isinstance(obj, bool):
        text = str(obj)
        if (_secret and _literal_safe(text)) or looks_like_token(text):
            out.add(text)
    return out


def _literal_safe(text: str) -> bool:
    """Whether a secret's value can be hidden as a literal in free text without hitting other
    words or numbers: 6+ characters, not a number, not ``***``."""
    if len(text) < 6 or text == REDACTED:
        return False
    try:
        float(text)
        return False
    except ValueError:
        return True


class Sealer:
    """The secrets of one campaign, hidden in records (``seal``) and in free text (as literals)."""

    def __init__(self, values: Iterable[str] = ()):
        self.values = sorted({v for v in values if v and v != REDACTED}, key=len, reverse=True)
        self._re = re.compile("|".join(map(re.escape, self.values))) if self.values else None

    @classmethod
    def of_container(cls, env: Iterable, argv: Iterable[str]) -> "Sealer":
        """The secrets one container is started with (its env pairs and argv): what its engine
        may echo in its log (vLLM prints its non-default args, api_key included)."""
        return cls.of({"env": [list(p) for p in env], "argv": list(argv)})

    @classmethod
    def of(cls, *objs: Any) -> "Sealer":
        vals: set[str] = set()
        for o in objs:
            vals |= secret_values(o.to_dict() if hasattr(o, "to_dict") else o)
        return cls(vals)

    def text(self, s: str) -> str:
        s = self._re.sub(REDACTED, s) if self._re else s
        return _IN_TEXT.sub(REDACTED, s)

    def record(self, obj: Any) -> Any:
        sealed = seal(obj)
        if not self._re:
            return sealed
        return _walk_text(sealed, self.text)

    def file(self, path: Path) -> bool:
        """Seal a text file in place (boot.log, measure.json); True when it changed."""
        try:
            raw = Path(path).read_bytes()
        except OSError:
            return False
        text = raw.decode("utf-8", "surrogateescape")
        new = None
        if Path(path).suffix == ".json":            # a JSON file stays JSON: sealed as a record
            try:
                import json

                data = json.loads(text)
                sealed = self.record(data)
                new = text if sealed == data else json.dumps(sealed, indent=1)
            except ValueError:
                new = None
        if new is None:
            new = self.text(text)
        if new == text:
            return False
        Path(path).write_bytes(new.encode("utf-8", "surrogateescape"))
        return True


def _walk_text(obj: Any, fn) -> Any:
    if isinstance(obj, dict):
        return {k: _walk_text(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk_text(x, fn) for x in obj]
    return fn(obj) if isinstance(obj, str) else obj


class SealFilter(logging.Filter):
    """A logging filter that seals every message (install it on the handlers)."""

    def __init__(self, sealer: Sealer):
        super().__init__()
        self.sealer = sealer

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        sealed = self.sealer.text(msg)
        if sealed != msg:
            record.msg, record.args = sealed, None
        return True

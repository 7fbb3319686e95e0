"""The env-file form of a promotion, and redaction of production-file text. Pure.

An existing serve script (seed 002's frank-primary reads ``FRANK_PRIMARY_*``) takes its
settings from an env file; the campaign's ``production.mapping`` names the variable of each
lever (``max-num-seqs: FRANK_PRIMARY_SEQS``; ``env.R4D_LRU_GATHER_CHUNKS: R4D_LRU_GATHER_CHUNKS``;
the special keys ``image``, ``model`` and ``port`` map the shape's own fields).

Rules, tested with a table in tests/test_units.py:
  * ``true``/``false`` -> ``1``/``0``; numbers as written; dicts and lists -> compact JSON;
  * a lever the shape leaves out (``absent``) -> ``VAR=`` (empty): the script's
    ``${VAR:+--flag $VAR}`` then drops the flag, and no older value of VAR can survive from
    the file or the service's environment;
  * every mapped variable is written (the file describes the whole promoted shape, not only
    the night's changes); lines the tuner does not manage are kept as they were, in place;
  * a lever (or image/model/port) that differs from the campaign's baseline and has no
    mapping -> the promotion is refused, naming it; mounts, devices and container options
    cannot be expressed in an env file at all.
Values are written bare when safe, else single-quoted (double-quoted with backslashes when
they hold a quote), which both systemd's EnvironmentFile= and a shell's ``source`` read alike.
"""
from __future__ import annotations

import re

from arms.argv import is_secret
from arms.errors import ConfigError
from arms.secrets import looks_secret, seal_text
from arms.shape import ABSENT, Shape, format_value, lever_name

from tuner.production.unitsyntax import env_value, parse_env_line

__all__ = ["HEADER", "check_mapping", "env_text", "parse_env_file", "redact_text", "render_env_file"]

HEADER = "# Written by `tuner promote` (offload-tuner)"
_SPECIAL = ("image", "model", "port")


def mapping_of(mapping: dict) -> dict[str, str]:
    """The mapping with lever names normalised (env.NAME, flag spelling); image/model/port kept."""
    out = {}
    for k, v in (mapping or {}).items():
        key = str(k) if str(k) in _SPECIAL else lever_name(k)
        out[key] = str(v)
    return out


def _mapped_value(shape: Shape, key: str):
    if key in _SPECIAL:
        return getattr(shape, key)
    return shape.value_of(key)


def env_text(value) -> str:
    """One lever value as an env var's text: booleans 1/0, absent empty, JSON for dicts."""
    if value is ABSENT:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    return format_value(value)


def check_mapping(base: Shape, shape: Shape, mapping: dict) -> dict[str, str]:
    """The normalised mapping; ConfigError naming every changed lever it does not cover."""
    m = mapping_of(mapping)
    missing = []
    for ch in base.diff(shape):
        if ch.name not in m:
            missing.append(ch.describe())
    if missing:
        raise ConfigError(
            f"production.mapping has no variable for the changed lever{'s' if len(missing) > 1 else ''} "
            f"{'; '.join(missing)}: map each to the serve script's variable under production.mapping "
            "(e.g. `expert-prefetch: FRANK_PRIMARY_PREFETCH`), or promote_as: quadlet | unit")
    return m


def render_env_file(shape: Shape, mapping: dict, *, label: str, existing: str = "") -> str:
    """``existing`` with every mapped variable set to ``shape``'s value (replaced in place,
    else appended); other lines kept. The first line names the promotion."""
    m = mapping_of(mapping)
    want = {var: env_text(_mapped_value(shape, key)) for key, var in m.items()}
    out, seen = [f"{HEADER}: {label}."], set()
    for line in existing.splitlines():
        if line.startswith(HEADER):
            continue
        parsed = parse_env_line(line)
        if parsed and parsed[0] in want:
            if parsed[0] not in seen:
                out.append(f"{parsed[0]}={env_value(want[parsed[0]])}")
                seen.add(parsed[0])
            continue
        out.append(line)
    out += [f"{var}={env_value(v)}" for var, v in want.items() if var not in seen]
    return "\n".join(out).rstrip("\n") + "\n"


def parse_env_file(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        parsed = parse_env_line(line)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


# -- redaction ----------------------------------------------------------------------------------
_NAME_AT = re.compile(r"(?<![A-Za-z0-9_.])([A-Za-z_][A-Za-z0-9_]*)=")
_VALUE = re.compile(r"'[^'\n]*'|\"(?:[^\"\\\n]|\\.)*\"|(?:[^\s\"']|\\.)*")
_SECRET_FLAG = re.compile(r"(--?[A-Za-z0-9_.-]+)(=|[ \t]+)(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s\\]+)")


def redact_text(text: str) -> str:
    """Unit or env-file text with the values of secret-looking names (``HF_TOKEN=...``,
    ``--api-key ...``) replaced by ***: what any log, diff or journal sees."""
    out, pos = [], 0
    for m in _NAME_AT.finditer(text):
        if m.start() < pos:
            continue
        v = _VALUE.match(text, m.end())
        end = v.end() if v else m.end()
        if not (is_secret(m[1]) or (v and looks_secret(v[0].strip("'\"")))):     # by its name or by its look
            continue
        quoted_word = m.start() > 0 and text[m.start() - 1] == '"' and end < len(text)
        if quoted_word:                      # "NAME=value with spaces" as one quoted word
            close = _VALUE.match(text, m.start() - 1)
            end = close.end() - 1 if close else end
        out += [text[pos:m.end()], "***"]
        pos = end
    text = "".join(out) + text[pos:]
    text = _SECRET_FLAG.sub(lambda m: f"{m[1]}{m[2]}***" if (is_secret(m[1]) or looks_secret(m[3].strip("'\"")))
                            and m[3] != "***" else m[0], text)
    return seal_text(text)              # a token in any other place: hf_..., Bearer ..., a URL's password

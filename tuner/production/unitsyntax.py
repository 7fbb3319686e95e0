"""The text syntax under production files: systemd unit files, command lines and env files.
Pure functions; ``tuner.production.units`` builds Quadlet files, plain units and env files out of
them. The engine's argv inside a command line is read back by ``arms.argv.parse_argv``.

systemd rules followed (systemd.syntax(7), systemd.service(5) "Command lines"):
  * ``[Section]`` headers, ``Key=Value`` lines, ``#``/``;`` comments, a trailing backslash
    continues the line (the backslash becomes a space);
  * ``%`` starts a specifier everywhere, so a literal ``%`` is written ``%%``;
  * in command lines ``$NAME`` expands, so a literal ``$`` is written ``$$``;
  * words are split at whitespace; a word with whitespace, quotes, backslashes or control
    characters is double-quoted with C escapes (``\\"``, ``\\\\``, ``\\n``, ``\\xHH``).
Quadlet's ``Exec=``, ``Environment=`` and ``PodmanArgs=`` take the same word syntax.
"""
from __future__ import annotations

import re

from arms.errors import ConfigError

__all__ = [
    "env_value",
    "join_words",
    "parse_env_line",
    "parse_ini",
    "quote_word",
    "split_words",
]

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./{}\[\]-]+\Z")
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_C_UNESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r", "a": "\a",
                "b": "\b", "f": "\f", "v": "\v", "s": " ", "0": "\0"}


def _escape_specials(text: str, dollars: bool) -> str:
    text = text.replace("%", "%%")
    return text.replace("$", "$$") if dollars else text


def quote_word(word: str, dollars: bool = True) -> str:
    """One word of a systemd command line (or an Environment= assignment)."""
    text = _escape_specials(str(word), dollars)
    if text and _SAFE_WORD.match(text) and text != ";":
        return text
    out = []
    for ch in text:
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7f:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def join_words(words, dollars: bool = True) -> str:
    return " ".join(quote_word(w, dollars) for w in words)


def split_words(text: str, dollars: bool = True) -> list[str]:
    """The inverse of ``join_words``: systemd word splitting, quotes removed, C escapes
    resolved, ``%%`` (and ``$$`` in command lines) back to one character."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\n":
            i += 1
        if i >= n:
            break
        buf: list[str] = []
        quote = None
        while i < n:
            ch = text[i]
            if quote is None and ch in " \t\n":
                break
            if ch in "\"'" and (quote is None or quote == ch):
                quote = None if quote else ch
                i += 1
                continue
            if ch == "\\" and i + 1 < n:
                nxt = text[i + 1]
                if nxt == "x" and i + 3 < n:
                    buf.append(chr(int(text[i + 2:i + 4], 16)))
                    i += 4
                    continue
                buf.append(_C_UNESCAPES.get(nxt, nxt))
                i += 2
                continue
            buf.append(ch)
            i += 1
        if quote is not None:
            raise ConfigError(f"unbalanced {quote} quote in {text[:120]!r}")
        word = "".join(buf)
        word = word.replace("%%", "\0pct\0")
        if dollars:
            word = word.replace("$$", "$")
        words.append(word.replace("\0pct\0", "%"))
    return words


def parse_ini(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of every assignment, in order; continuation lines joined."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending: list[str] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if pending is not None:
            if line.startswith(("#", ";")):
                continue              # a comment inside a continued line is skipped
            if line.endswith("\\"):
                pending.append(line[:-1])
                continue
            pending.append(line)
            key, _, value = " ".join(pending).partition("=")
            out.append((section, key.strip(), value.strip()))
            pending = None
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if "=" not in line:
            raise ConfigError(f"line {n}: {raw.strip()[:80]!r} is neither [Section] nor Key=Value")
        if line.endswith("\\"):
            pending = [line[:-1]]
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    if pending is not None:
        key, _, value = " ".join(pending).partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


# -- env files (systemd EnvironmentFile= and shell `source` alike) ------------------------------
_ENV_SAFE = re.compile(r"[A-Za-z0-9_./:@%+,=-]*\Z")
_ENV_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z")


def env_value(text: str) -> str:
    """A value as an env-file line writes it: bare when safe, else quoted for both readers."""
    if _ENV_SAFE.match(text):
        return text
    if "'" not in text and "\n" not in text and "\\" not in text:
        return "'" + text + "'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", text).replace("\n", "\\n") + '"'


def parse_env_line(line: str) -> tuple[str, str] | None:
    """(NAME, value) of one ``NAME=value`` line (quotes removed), None for other lines."""
    m = _ENV_LINE.match(line)
    if not m:
        return None
    raw = m.group(2).strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return m.group(1), raw[1:-1]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        body = raw[1:-1].replace("\\n", "\n")
        return m.group(1), re.sub(r"\\([\\\"$`])", r"\1", body)
    return m.group(1), raw

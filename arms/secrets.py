"""Secrets sealed at one gate: one rule for what is secret, one way to hide it.

A **name** is secret (``is_secret``) when one of its word parts — split on ``_ - .``, other
punctuation and camelCase — is a secret word: token, key, secret(s), pass, passwd, password(s),
passphrase, pwd, auth, oauth, authorization, credential(s), cookie(s), session, private; or ends
in token / key / secret / password / passwd (NGROK_AUTHTOKEN, APIKEY, PGPASSWORD). So HF_TOKEN,
API_KEY, DB_PASS, HF_AUTH, MYSQL_PWD, SESSION, --hf-token, --api-key are secret, and names whose
parts only run on into more letters stay readable: R4D_LRU_UVA_TOKENS, --max-num-batched-tokens,
TOKENIZERS_PARALLELISM, KEYBOARD_LAYOUT (a "keyboard", not a key), BYPASS_CACHE, VLLM_USE_V1,
VLLM_ATTENTION_BACKEND, OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, MAX_JOBS, PYTORCH_CUDA_ALLOC_CONF.
Two exceptions keep a secret's *attributes* readable, because a tuner's lever must be seen:
  * the name's last part (after unit suffixes: _S, _MS, _MB, ...) is an attribute of the secret
    rather than the secret — timeout, ttl, size, len, limit, count, max, min, mode, type, method,
    backend, level, dir, path, file, url, host, port, name, user, enabled, ... (``_ATTRIBUTES``):
    SESSION_TIMEOUT_S, MAX_KEY_SIZE, R4D_AUTH_MODE, HF_TOKEN_PATH, PASSWORD_FILE stay readable
    (a file's path is not the secret; a URL's password is sealed by its value, below);
  * a secret word after ``per`` is a unit: KV_BYTES_PER_TOKEN; a name that starts with
    allow / enable / disable / no / use / require / skip is a switch: --allow-credentials, USE_AUTH.

A **value** is secret (``looks_secret``; ``looks_like_token`` is the same) when it looks like a
credential, whatever its name:
  * a known token prefix and 8+ more token characters that are not a plain word (hf_, sk-, sk_,
    ghp_/gho_/ghs_/ghu_/ghr_, github_pat_, glpat-, xoxa-/xoxb-/xoxp-/xoxr-/xoxs-, xapp-, npm_,
    pypi-): hf_SECRETauth, not hf_transfer; an AWS key id (AKIA/ASIA + 16); a JWT (eyJ...);
  * ``Bearer`` or ``Basic`` and a credential (sealed in place); a URL with ``user:password@`` (sealed in
    place: ``https://user:***@host/``);
  * a high-entropy string: 12+ characters of ``[A-Za-z0-9_-.+/=~]`` (no space, colon, quote,
    brace, comma, @; not starting with ``/ . ~``) with one separator-free piece that is random
    rather than made of words — 12+ characters mixing upper case, lower case and digits whose
    word-like runs (Capitalised or lower-case words of 3+ letters, 3+ capitals or digits) cover
    under 70 % of it, or 16+ characters of two classes covered under 60 %, or any 32+ run mixing
    all three. Hex (digests, UUIDs), numbers, paths, ``sha256:...``, JSON (``{"method":"mtp",...}``),
    model names (``Qwen/Qwen3-30B-A3B``, ``Llama3Instruct``) and ``expandable_segments:True`` are
    not secrets.

``seal(obj)`` returns a copy of a JSON-like record with every secret replaced by ``***``: env
mappings and pair lists, shape ``args`` pairs, argv lists (the value after a secret flag), a
lever's ``change`` pair, and any secret-looking string anywhere. ``Sealer`` also knows the real
secret values of one campaign and replaces them as literals in free text (logs, boot.log,
measure.json) — so a secret the engine echoes back is hidden too.

Identity is never computed from a sealed copy: ``Shape.key()`` of the real shape is journaled
beside the sealed shape (``tuner.night.state`` compares keys). A lever whose values are sealed is
still tuned: its study choices are ``"*** #i"`` (``arms.values.choices``).
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["REDACTED", "SealFilter", "Sealer", "is_secret", "looks_like_token", "looks_secret", "name_words", "seal",
           "seal_text", "secret_values"]

REDACTED = "***"

# -- names ------------------------------------------------------------------------------------------
_SECRET_WORDS = frozenset({
    "token", "key", "secret", "secrets", "pass", "passwd", "password", "passwords", "passphrase", "pwd",
    "auth", "oauth", "authorization", "credential", "credentials", "cookie", "cookies", "session", "private"})
_SECRET_ENDINGS = ("token", "key", "secret", "password", "passwd")
_ATTRIBUTES = frozenset({
    "timeout", "ttl", "expiry", "expires", "lifetime", "interval", "retries", "size", "len", "length", "limit",
    "count", "num", "max", "min", "mode", "type", "kind", "method", "backend", "format", "dtype", "level",
    "policy", "strategy", "version", "dir", "path", "file", "url", "uri", "endpoint", "host", "port", "name",
    "user", "username", "enable", "enabled", "disable", "disabled"})
_SWITCHES = frozenset({"allow", "enable", "disable", "no", "use", "require", "skip"})
_UNITS = frozenset({"s", "sec", "secs", "seconds", "ms", "us", "ns", "m", "mins", "minutes", "h", "hours",
                    "b", "kb", "mb", "gb", "kib", "mib", "gib", "bytes"})


def name_words(name: str) -> list[str]:
    """The lower-case word parts of a name: HF_TOKEN, --hf-token, env.HF_TOKEN, hfToken -> [hf, token]."""
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", str(name))
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def _secret_word(w: str) -> bool:
    return w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS)


def is_secret(name: str) -> bool:
    """Whether the value of an env var, flag or record key of this name is a secret (the module)."""
    words = name_words(name)
    if not any(_secret_word(w) and not (i and words[i - 1] == "per") for i, w in enumerate(words)):
        return False
    if words[0] in _SWITCHES:                  # --allow-credentials, --no-cors-credentials, USE_AUTH: on/off
        return False
    while len(words) > 1 and words[-1] in _UNITS:
        words = words[:-1]
    return not (words[-1] in _ATTRIBUTES and not _secret_word(words[-1]))


# -- values -----------------------------------------------------------------------------------------
_PREFIXES = r"hf_|sk-|sk_|gh[pousr]_|github_pat_|glpat-|xox[abprs]-|xapp-|npm_|pypi-"
_PREFIXED = re.compile(rf"^(?:{_PREFIXES})([A-Za-z0-9_\-.=]{{8,}})$")
_AWS_ID = re.compile(r"^(?:AKIA|ASIA)[A-Z0-9]{16}$")
_JWT = re.compile(r"^eyJ[A-Za-z0-9_\-]{8,}(?:\.[A-Za-z0-9_\-]*){0,2}$")
_SCHEME = re.compile(r"^(?:Bearer|Basic)\s+(\S{8,})$", re.IGNORECASE)
_URL_CREDS = re.compile(r"(?<![A-Za-z0-9+.\-])([A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*):([^\s/@]+)@")
_GENERIC = re.compile(r"^[A-Za-z0-9_\-.+/=~]{12,}$")
_PIECES = re.compile(r"[_\-.+/=~]+")
_HEX = re.compile(r"^(?:[0-9a-f]+|[0-9A-F]+)$")
_WORDLIKE = re.compile(r"[A-Z]?[a-z]{3,}|[A-Z]{3,}(?![a-z])|\d{3,}")
# in free text: the same prefixes, key ids, JWTs and schemes, wherever they stand
_IN_TEXT = re.compile(rf"(?<![A-Za-z0-9_\-])(?:(?:{_PREFIXES})[A-Za-z0-9_\-]{{8,}}|(?:AKIA|ASIA)[A-Z0-9]{{16}}(?![A-Z0-9])"
                      r"|eyJ[A-Za-z0-9_\-]{16,}(?:\.[A-Za-z0-9_\-]+){0,2})")
_SCHEME_IN_TEXT = re.compile(r"\b((?i:bearer)|Basic)(\s+)([A-Za-z0-9._~+/=\-]{8,})")


def _classes(s: str) -> int:
    return any(c.isupper() for c in s) + any(c.islower() for c in s) + any(c.isdigit() for c in s)


def _random_piece(p: str) -> bool:
    """One separator-free run of 12+ characters that is random rather than made of words."""
    if len(p) < 12 or _HEX.match(p):
        return False
    classes = _classes(p)
    if classes < 2:
        return False
    if classes == 3 and len(p) >= 32:
        return True
    cover = sum(len(w) for w in _WORDLIKE.findall(p)) / len(p)
    return cover < 0.7 if classes == 3 else (len(p) >= 16 and cover < 0.6)


def _prefixed(rest: str) -> bool:
    """The part after a known prefix: a credential when it mixes character classes or is one
    16+ run; not a plain word or identifier (hf_transfer, hf_hub_download)."""
    return _classes(rest) >= 2 or (len(rest) >= 16 and not re.search(r"[\-_.=]", rest))


def looks_secret(value: Any) -> bool:
    """Whether a value looks like a credential (the module), whatever its name."""
    if not isinstance(value, str) or value == REDACTED:
        return False
    m = _PREFIXED.match(value)
    if m and _prefixed(m[1]):
        return True
    scheme = _SCHEME.match(value)
    if _AWS_ID.match(value) or _JWT.match(value) or (scheme and _classes(scheme[1]) >= 2):
        return True
    if any(m[2] != REDACTED for m in _URL_CREDS.finditer(value)):
        return True
    if not _GENERIC.match(value) or value.startswith(("/", ".", "~")):
        return False
    return any(_random_piece(p) for p in _PIECES.split(value))


looks_like_token = looks_secret


def seal_text(text: str) -> str:
    """Free text with every credential-looking token in it replaced by ``***`` (prefixed tokens,
    key ids, JWTs, ``Bearer X``, a URL's password)."""
    text = _URL_CREDS.sub(lambda m: f"{m[1]}:{REDACTED}@", text)
    text = _SCHEME_IN_TEXT.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}" if _classes(m[3]) >= 2 else m[0], text)
    return _IN_TEXT.sub(lambda m: REDACTED if looks_secret(m[0]) or m[0].startswith(("AKIA", "ASIA", "eyJ")) else m[0],
                        text)


def _seal_str(s: str) -> str:
    s = seal_text(s)
    return REDACTED if looks_secret(s) else s


# -- records ----------------------------------------------------------------------------------------
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
        return _seal_str(obj)
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
        if (_secret and _literal_safe(text)) or looks_secret(text):
            out.add(text)
        out |= {m[2] for m in _URL_CREDS.finditer(text) if _literal_safe(m[2])}       # a URL's password
        m = _SCHEME.match(text)
        if m and _classes(m[1]) >= 2 and _literal_safe(m[1]):
            out.add(m[1])                                                            # Bearer's credential
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
        return seal_text(s)

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

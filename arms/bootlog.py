"""Parse an engine's boot log into a BootReport: a pure function over text.

Every regex comes from the EngineProfile (arms/profiles/*.yaml); this module only knows how
to clean lines, apply the profile's patterns and decide the outcome:

1. the kernel OOM-killed the container (``oom_killed``)            -> host-oom-killed
2. a specific failure signature (first in the profile's order wins) -> its class
3. the ready line was printed and the process is alive or exited 0 -> ready
4. a generic signature (engine-init-failed)                         -> its class
5. the caller's ``outcome_hint`` (boot-timeout / hang)              -> the hint
6. exit code 137 (SIGKILL), the log simply stops                    -> host-oom-killed
7. anything else                                                    -> unknown

Total and bounded: any text parses without an exception, in time linear in its length (every
profile regex is linear-time; tests/test_bootlog.py and bench/parser_timing.py hold them to it).
A log longer than ``MAX_LOG_CHARS`` (8 MiB) is cut to its head and tail (``clipped_chars`` says how
much went), a line longer than ``MAX_LINE_CHARS`` to its head, and a number that does not
parse (``1.2.3 GiB``) becomes None with its raw text kept in ``unparsed``.

Once the ready line is printed, only the lines after it are searched (steps 2 and 4-7), so a
non-fatal error before ready never undoes a boot, while a crash after it is explained.

Cleaning: CRLF and lone CR become line breaks, ANSI colour codes go, ``journalctl -o json``
lines are unwrapped (pieces split at journald's LineMax are rejoined), one physical line
holding two records is split, and the profile's prefixes (docker compose, process tags,
``[rank0]:``, level/time headers) are stripped. A failure line split in two by journald is
still found: when no single line matches, consecutive lines are tried joined.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from arms.profiles import OOM_FIELDS, PLAN_FIELDS, REPORT_FIELDS, EngineProfile, FailureSignature

__all__ = ["BootReport", "parse_boot_log", "clean_log_lines", "OUTCOME_HINTS"]

OUTCOME_HINTS = ("boot-timeout", "hang")
MAX_LOG_CHARS = 8 << 20           # head + tail kept of a longer log
MAX_LINE_CHARS = 64 << 10         # a longer line keeps its head
_CONVERT_ERRORS = (ValueError, TypeError, OverflowError, ArithmeticError)
_EVIDENCE_MAX = 3
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
_SIZE = re.compile(r"^\s*(-?[\d.,]+)\s*([A-Za-z]+)?\s*$")


@dataclass(frozen=True)
class BootReport:
    outcome: str                               # "ready" or a failure class
    evidence: tuple[str, ...] = ()             # cleaned log lines that decided the outcome
    profile: str = ""
    exit_code: int | None = None
    oom_killed: bool = False
    engine_version: str | None = None
    max_model_len: int | None = None
    kv_pool_tokens: int | None = None          # V1 "KV cache size: N tokens"; V0 blocks x size
    kv_blocks: int | None = None               # V0 "# GPU blocks: N"
    kv_block_size: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None     # "for N tokens per request"
    available_kv_gib: float | None = None
    plan: dict = field(default_factory=dict)   # memory plan numbers (see arms/profiles.py)
    model_load_gib: float | None = None
    model_load_s: float | None = None
    model_load_gib_s: float | None = None
    weights_load_s: float | None = None
    dynamo_s: float | None = None
    compile_s: float | None = None             # torch.compile total
    compile_graph_s: float | None = None       # first "Compiling a graph ... takes X s"
    compile_range: str | None = None           # "(1, 2048)"
    compile_cache_load_s: float | None = None
    compile_cache_hit: bool | None = None      # True: loaded only; False: compiled; None: neither
    graph_capture_s: float | None = None
    graph_gib: float | None = None
    init_engine_s: float | None = None
    init_compile_s: float | None = None
    non_default_args: dict = field(default_factory=dict)
    non_default_args_raw: str | None = None
    oom_detail: dict | None = None             # tried_to_allocate_gib, gpu, total_gib, free_gib
    failure_detail: dict = field(default_factory=dict)  # named groups of the deciding signature
    unparsed: dict = field(default_factory=dict)        # field -> raw text of a number that did not parse
    clipped_chars: int = 0                     # characters of an over-long log the parser skipped

    @property
    def ready(self) -> bool:
        return self.outcome == "ready"

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


class _Line(NamedTuple):
    level: str | None
    text: str


def clean_log_lines(text: str, profile: EngineProfile) -> list[str]:
    """The log as the parser sees it: one record per line, prefixes and colour removed."""
    return [line.text for line in _clean(text, profile)]


def parse_boot_log(text: str, profile: EngineProfile, exit_code: int | None = None,
                   oom_killed: bool = False, outcome_hint: str | None = None) -> BootReport:
    """Explain one boot from its log. ``exit_code`` is the container's (None while it runs),
    ``oom_killed`` what the host saw, ``outcome_hint`` the caller's own verdict (boot-timeout
    or hang) used only when the log names no cause. Pure: no I/O, no clock."""
    if outcome_hint is not None and outcome_hint not in OUTCOME_HINTS:
        raise ValueError(f"outcome_hint must be one of {OUTCOME_HINTS} or None, got {outcome_hint!r}")
    text, clipped = clip_log(text)
    lines = _clean(text, profile)
    unparsed: dict[str, str] = {}
    values, plan = _scan_fields(lines, profile, unparsed)
    outcome, evidence, detail = _decide(lines, profile, exit_code, oom_killed, outcome_hint, unparsed)

    block_size = values.get("kv_block_size") or profile.kv_block_size
    if values.get("kv_pool_tokens") is None and values.get("kv_blocks") is not None and block_size:
        values["kv_pool_tokens"] = values["kv_blocks"] * block_size
    if block_size:
        values["kv_block_size"] = block_size
    gib, secs = values.get("model_load_gib"), values.get("model_load_s")
    if gib is not None and secs:
        values["model_load_gib_s"] = round(gib / secs, 4)

    hit = miss = False
    for line in lines:
        miss = miss or bool(profile.compile_miss_pattern and profile.compile_miss_pattern.search(line.text))
        hit = hit or bool(profile.compile_hit_pattern and profile.compile_hit_pattern.search(line.text))
    cache_hit = False if miss else (True if hit else None)

    args, raw = _non_default_args(lines, profile)
    return BootReport(
        outcome=outcome, evidence=tuple(evidence), profile=profile.name, exit_code=exit_code,
        oom_killed=oom_killed, plan=plan, compile_cache_hit=cache_hit,
        non_default_args=args, non_default_args_raw=raw,
        oom_detail=_oom_detail(lines, profile, unparsed), failure_detail=detail, unparsed=unparsed,
        clipped_chars=clipped, **values)


def clip_log(text: str, limit: int = MAX_LOG_CHARS) -> tuple[str, int]:
    """(text, 0), or its first and last ``limit // 2`` characters joined by a marker line and
    the number of characters left out."""
    if len(text) <= limit:
        return text, 0
    half = limit // 2
    gone = len(text) - 2 * half
    return f"{text[:half]}\n[... {gone} characters of log not parsed ...]\n{text[-half:]}", gone


# ---------------------------------------------------------------- cleaning
def _clean(text: str, profile: EngineProfile) -> list[_Line]:
    out: list[_Line] = []
    for raw in _unjournal(text.replace("\r\n", "\n").split("\n")):
        for physical in raw.split("\r"):
            level, body = _strip(_ANSI.sub("", physical[:MAX_LINE_CHARS]), profile)
            pieces = profile.split_pattern.split(body) if profile.split_pattern else [body]
            for i, piece in enumerate(pieces):
                if i:
                    level, piece = _strip(piece, profile)
                piece = piece.rstrip()
                if piece:
                    out.append(_Line(level, piece))
    return out


def _unjournal(lines: list[str]) -> list[str]:
    """Unwrap ``journalctl -o json`` records; rejoin entries journald split at LineMax."""
    out: list[str] = []
    pending = ""
    for line in lines:
        stripped = line.strip()
        record = None
        if stripped.startswith("{") and '"MESSAGE"' in stripped:
            try:
                record = json.loads(stripped)
            except ValueError:
                record = None
        if not isinstance(record, dict) or "MESSAGE" not in record:
            if pending:
                out.append(pending)
                pending = ""
            out.append(line)
            continue
        message = record["MESSAGE"]
        if isinstance(message, list):            # non-UTF-8 / control chars: a byte array
            message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
        pending += str(message)
        if record.get("_LINE_BREAK") != "line-max":
            out.extend(pending.split("\n"))
            pending = ""
    if pending:
        out.append(pending)
    return out


def _strip(line: str, profile: EngineProfile) -> tuple[str | None, str]:
    level = None
    line = line.strip()
    for _ in range(12):
        changed = False
        for pattern in profile.strip_patterns:
            m = pattern.search(line)
            if m and m.end() > m.start():
                if "level" in pattern.groupindex and m.group("level"):
                    level = m.group("level")
                line = (line[:m.start()] + line[m.end():]).strip()
                changed = True
        if not changed:
            break
    return level, line


# ---------------------------------------------------------------- fields
def _scan_fields(lines: list[_Line], profile: EngineProfile, unparsed: dict) -> tuple[dict, dict]:
    found: dict[str, Any] = {}
    for _label, pattern in profile.field_patterns:
        kinds = {name: REPORT_FIELDS.get(name) or PLAN_FIELDS[name] for name in pattern.groupindex if name != "key"}
        summing = bool({"mib_sum", "count"} & set(kinds.values())) or "key" in pattern.groupindex
        for line in lines:
            # summing/counting fields take every match on the line: two records a busy log
            # follower delivered as one line still count twice
            matches = list(pattern.finditer(line.text)) if summing else [pattern.search(line.text)]
            for m in matches:
                if m is not None:
                    _take(m, kinds, found, unparsed)
            if matches and matches[0] is not None and not summing:
                break
    values = {k: v for k, v in found.items() if k in REPORT_FIELDS}
    plan = {k: v for k, v in found.items() if k in PLAN_FIELDS}
    return values, plan


def _take(m: re.Match, kinds: dict, found: dict, unparsed: dict) -> None:
    """One match's named groups into ``found``: summed, counted, per key, or first one wins (a
    number that does not parse is kept raw in ``unparsed``, never an exception)."""
    groups = m.groupdict()
    key = groups.pop("key", None)
    for name, raw in groups.items():
        kind = kinds[name]
        if kind == "count":
            value: Any = 1
        elif kind == "flag":
            value = raw is not None
        elif raw is None:
            continue
        else:
            try:
                value = _convert(kind, raw)
            except _CONVERT_ERRORS:
                unparsed.setdefault(name, raw[:200])
                continue
        if key is not None:         # (?P<key>CUDA0): one value per key (per backend, device)
            per = found.setdefault(name, {})
            if isinstance(per, dict):
                per[key] = round(per.get(key, 0) + value, 4) if kind in ("mib_sum", "count") \
                    else per.get(key, value)
        elif kind in ("mib_sum", "count"):
            found[name] = round(found.get(name, 0.0) + value, 4)
        elif name not in found:
            found[name] = value


def _convert(kind: str, raw: str) -> Any:
    raw = raw.strip()
    if kind == "str":
        return raw
    if kind == "int":
        number = raw.replace(",", "")
        return int(number) if number.lstrip("-").isdigit() else int(float(number))
    if kind == "float":
        return float(raw.replace(",", ""))
    if kind == "range_count":
        first, _, last = raw.partition("-")
        return int(last) - int(first) + 1 if last else 1
    if kind in ("gib", "mib", "mib_sum"):
        return _size(raw, 2**30 if kind == "gib" else 2**20)
    if kind == "count":
        return 1
    raise ValueError(f"unknown field kind {kind!r}")


def _size(raw: str, scale: int) -> float:
    """'76.00 MiB' -> in units of ``scale``; a bare number is already in those units."""
    m = _SIZE.match(raw)
    if not m:
        raise ValueError(f"not a size: {raw!r}")
    number = float(m.group(1).replace(",", ""))
    unit = (m.group(2) or "").lower()
    if not unit:
        return number
    if unit not in _UNITS:
        raise ValueError(f"unknown size unit in {raw!r}")
    value = number * _UNITS[unit] / scale
    return round(value, 6) if _UNITS[unit] != scale else number


def _auto(name: str, raw: str | None, unparsed: dict | None = None, integer: bool = False) -> Any:
    """A named group's value by its name (``*_gib``, ``*_mib``, integers, decimals, else the
    text); None, with the raw text in ``unparsed``, for a size or number that does not parse."""
    if raw is None:
        return None
    try:
        return int(raw) if integer else _auto_value(name, raw)
    except _CONVERT_ERRORS:
        if unparsed is not None:
            unparsed.setdefault(name, raw[:200])
        return None


def _auto_value(name: str, raw: str) -> Any:
    if name.endswith("_gib"):
        return _size(raw, 2**30)
    if name.endswith("_mib"):
        return _size(raw, 2**20)
    plain = raw.replace(",", "")
    if re.fullmatch(r"-?\d+", plain):
        return int(plain)
    if re.fullmatch(r"-?\d*\.\d+", plain):
        return float(plain)
    return raw


def _non_default_args(lines: list[_Line], profile: EngineProfile) -> tuple[dict, str | None]:
    pattern = profile.non_default_args_pattern
    if pattern is None:
        return {}, None
    for line in lines:
        m = pattern.search(line.text)
        if not m:
            continue
        raw = m.group("args").strip()
        try:
            parsed = json.loads(raw) if profile.non_default_args_style == "json" else ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return {}, raw
        return (parsed, raw) if isinstance(parsed, dict) else ({}, raw)
    return {}, None


def _oom_detail(lines: list[_Line], profile: EngineProfile, unparsed: dict) -> dict | None:
    pattern = profile.oom_pattern
    if pattern is None:
        return None
    texts = [line.text for line in lines]
    for candidates in (texts, [a + b for a, b in zip(texts, texts[1:])]):
        for text in candidates:
            m = pattern.search(text)
            if m:
                return {name: _auto(name, raw, unparsed, integer=OOM_FIELDS[name] == "int")
                        for name, raw in m.groupdict().items() if raw is not None}
    return None


# ---------------------------------------------------------------- outcome
def _decide(lines: list[_Line], profile: EngineProfile, exit_code: int | None,
            oom_killed: bool, hint: str | None, unparsed: dict) -> tuple[str, list[str], dict]:
    last = [lines[-1].text] if lines else []
    if oom_killed:
        return "host-oom-killed", last, {}
    ready_at = next((i for i, line in enumerate(lines) if profile.ready_pattern.search(line.text)), None)
    ready_line = lines[ready_at].text if ready_at is not None else ""
    if ready_at is not None:
        lines = lines[ready_at + 1:]        # only what happened after ready can undo it
    specific, generic = _match_failures(lines, profile)
    if specific is not None:
        return _verdict(*specific, unparsed)
    if ready_at is not None and exit_code in (None, 0):
        return "ready", [ready_line], {}
    if generic is not None:
        outcome, evidence, detail = _verdict(*generic, unparsed)
        root = _root_exception(lines, profile, generic[0])
        return outcome, ([root] if root else []) + evidence, detail
    if hint is not None:
        return hint, last, {}
    if exit_code in (137, -9):
        return "host-oom-killed", last, {}
    exceptions = [text for text in _loud(lines, profile)
                  if profile.exception_pattern and profile.exception_pattern.search(text)]
    return "unknown", exceptions[-1:] or last, {}


def _match_failures(lines: list[_Line], profile: EngineProfile):
    """(specific, generic): each None or (signature, [(text, match), ...])."""
    loud = _loud(lines, profile)
    generic = None
    for sig in profile.failures:
        hits = [(text, m) for text in loud if (m := sig.pattern.search(text))]
        if hits:
            if not sig.generic:
                return (sig, hits), generic
            generic = generic or (sig, hits)
    pairs = [a + b for a, b in zip(loud, loud[1:])]      # a line journald split in two
    for sig in profile.failures:
        if sig.generic:
            continue
        hits = [(text, m) for text in pairs if (m := sig.pattern.search(text))]
        if hits:
            return (sig, hits), generic
    return None, generic


def _loud(lines: list[_Line], profile: EngineProfile) -> list[str]:
    return [text for _i, text in _loud_indexed(lines, profile)]


def _loud_indexed(lines: list[_Line], profile: EngineProfile) -> list[tuple[int, str]]:
    """Lines that may decide a failure: not at a quiet level, not a traceback frame or the
    source line printed under it."""
    out: list[tuple[int, str]] = []
    after_frame = False
    for i, line in enumerate(lines):
        frame = bool(profile.frame_pattern and profile.frame_pattern.search(line.text))
        if not frame and not after_frame and line.level not in profile.quiet_levels:
            out.append((i, line.text))
        after_frame = frame
    return out


def _verdict(sig: FailureSignature, hits: list, unparsed: dict) -> tuple[str, list[str], dict]:
    evidence: list[str] = []
    for text, _m in hits:
        if text not in evidence:
            evidence.append(text)
    detail = {name: _auto(name, raw, unparsed) for name, raw in hits[0][1].groupdict().items()
              if raw is not None}
    return sig.cls, evidence[:_EVIDENCE_MAX], detail


def _root_exception(lines: list[_Line], profile: EngineProfile, sig: FailureSignature) -> str | None:
    """For a generic failure: the last exception line (not itself generic) before the last
    generic line at any level: "EngineCore failed to start." comes before the root cause,
    "Engine core initialization failed" after it."""
    if profile.exception_pattern is None:
        return None
    end = max(i for i, line in enumerate(lines) if sig.pattern.search(line.text))
    for i, text in reversed(_loud_indexed(lines, profile)):
        if i < end and profile.exception_pattern.search(text) and not sig.pattern.search(text):
            return text
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)

"""The campaign journal: the one durable source of truth for arms, in Optuna's style.

Append-only JSON lines, one operation each (``{"op": ..., "seq": n, "t": wall, ...}``),
written with flush + fsync so a returned ``append`` survives a kill -9. State is rebuilt by
replaying the operations (``tuner.state.replay``). Secrets in env values are redacted before writing.

Damage never ends the night's record: a line that cannot be replayed (NULs of a power loss, not
JSON, not an object, a record missing its fields) is skipped with one warning, and the writer
copies it — with its line number — to ``journal.quarantine.jsonl``; nothing is ever deleted. A
torn last line (the writer died mid-line) is cut by the next writer only, after the same copy.
Readers (``read_journal``) never write.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arms.secrets import Sealer, seal

from .records import OPS, RecordError, decode, encode  # noqa: F401 - OPS: the closed set, re-exported
from arms.errors import ConfigError

log = logging.getLogger("tuner.journal")

QUARANTINE_SUFFIX = ".quarantine.jsonl"

def quarantine_path(path: Path) -> Path:
    path = Path(path)
    return path.with_name(path.stem + QUARANTINE_SUFFIX)


@dataclass(frozen=True)
class Damage:
    """One line that cannot be replayed: its 1-based number, why, and its text (as read)."""
    line: int
    why: str
    text: str

    def to_dict(self) -> dict:
        return {"line": self.line, "why": self.why, "text": self.text}


@dataclass
class JournalRead:
    """A journal as read: the good records in order, the damaged lines, and a torn tail (the
    bytes after the last newline — a writer died mid-line, or is writing it right now)."""
    path: Path
    records: list[dict]
    damaged: list[Damage] = field(default_factory=list)
    torn: bytes = b""
    good_bytes: int = 0              # the bytes up to and including the last newline

    def warn(self) -> None:
        if self.damaged:
            d = self.damaged[0]
            log.warning("[journal] %s: %d damaged line(s) skipped, first line %d (%s); quarantine %s",
                        self.path, len(self.damaged), d.line, d.why, quarantine_path(self.path))

    def unreadable(self) -> ConfigError | None:
        """The error for a journal with lines but not one record that can be replayed."""
        if self.records or not self.damaged:
            return None
        d = self.damaged[0]
        return ConfigError(f"{self.path}: no readable record (first bad line {d.line}: {d.why}); the damaged lines "
                           f"are copied to {quarantine_path(self.path)} and nothing was deleted — move the journal "
                           "aside to start this campaign afresh")


def _why_damaged(line: bytes) -> tuple[str, dict | None]:
    if b"\0" in line:
        return "NUL bytes (a power loss mid-write?)", None
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"not JSON ({getattr(e, 'msg', e)})", None
    try:
        decode(rec)                                # the record types' one codec (tuner.records)
    except RecordError as e:
        return str(e), None
    return "", rec


def parse(data: bytes, path: Path) -> JournalRead:
    """Split journal bytes into good records, damaged lines and a torn tail. Pure."""
    cut = data.rfind(b"\n") + 1
    out = JournalRead(Path(path), [], torn=data[cut:], good_bytes=cut)
    for n, line in enumerate(data[:cut].split(b"\n")[:-1], 1):
        if not line.strip():
            continue
        why, rec = _why_damaged(line)
        if rec is None:
            out.damaged.append(Damage(n, why, line.decode("utf-8", "backslashreplace")))
        else:
            out.records.append(rec)
    return out


def read_journal(path: Path, *, warn: bool = True) -> JournalRead:
    """The reader's view: never writes, never locks. A torn tail is left alone (the writer may be
    finishing it); damaged lines are skipped with one warning."""
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    got = parse(data, path)
    if warn:
        got.warn()
    return got


def quarantine(path: Path, damaged: list[Damage], torn: bytes = b"", clock=time.time) -> Path:
    """Copy damaged lines (and a torn tail) to ``<stem>.quarantine.jsonl``, once each."""
    q = quarantine_path(path)
    seen: set[tuple] = set()
    if q.exists():
        for line in q.read_bytes().splitlines():
            try:
                d = json.loads(line)
                seen.add((d.get("line"), d.get("text")))
            except (ValueError, AttributeError):
                continue
    items = [d.to_dict() for d in damaged]
    if torn:
        items.append({"line": "tail", "why": "torn last line (no newline), cut by the writer",
                      "text": torn.decode("utf-8", "backslashreplace")})
    new = [d for d in items if (d["line"], d["text"]) not in seen]
    if new:
        with open(q, "ab") as f:
            for d in new:
                f.write((json.dumps({"file": Path(path).name, **d, "at": round(clock(), 3)}) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
    return q


def repair_tail(path: Path) -> int:
    """Cut a torn last line (no trailing newline), copying it to the quarantine first; returns the
    bytes removed. Only the writer calls this (under the campaign lock).

    Optuna's JournalFileBackend ignores a torn tail on read but the next append would be
    glued to it and the file could no longer be loaded, so both journals are repaired at start.
    """
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep == len(data):
        return 0
    quarantine(path, [], data[keep:])
    with open(path, "rb+") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    log.warning("[journal] cut a torn last line of %d bytes from %s (copied to %s)", len(data) - keep, path,
                quarantine_path(path))
    return len(data) - keep


def redact(obj: Any) -> Any:
    """The record as written: every secret sealed (``arms.secrets.seal``, the one rule)."""
    return seal(obj)


class Journal:
    """The writer: repairs a torn tail, quarantines damaged lines, appends fsync'd records. One per
    campaign folder at a time (``tuner.lock.CampaignLock`` is what makes it one)."""

    def __init__(self, path: Path, clock=time.time, sealer: Sealer | None = None):
        self.path = Path(path)
        self.sealer = sealer or Sealer()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.repaired = repair_tail(self.path)
        got = read_journal(self.path, warn=False)
        if got.damaged:
            quarantine(self.path, got.damaged, clock=clock)
        bad = got.unreadable()
        if bad:
            raise bad
        got.warn()
        self.damaged = got.damaged
        self._records = got.records
        self._seq = max((r["seq"] for r in self._records), default=-1) + 1

    @property
    def records(self) -> list[dict]:
        return list(self._records)

    def since(self, n: int) -> list[dict]:
        """The records from the ``n``-th on (what an incremental replay has not seen yet)."""
        return self._records[n:]

    def __len__(self) -> int:
        return len(self._records)

    def append(self, op: str, **fields: Any) -> dict:
        try:
            rec = encode(op, self._seq, round(self.clock(), 3), fields)
        except RecordError as e:         # a writer's bug: journaled anyway (replay will skip it), never a lost night
            log.error("[journal] %s record that replay will skip: %s", op, e)
            rec = {"op": op, "seq": self._seq, "t": round(self.clock(), 3), **fields}
        rec = self.sealer.record(rec)
        line = json.dumps(rec, separators=(",", ":"), default=str) + "\n"
        with open(self.path, "ab") as f:
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
        self._records.append(rec)
        self._seq += 1
        return rec


def refuse_orphaned(folder: Path, journal: "Journal") -> None:
    """A new night must not start over an old one whose journal is gone: arms on disk (or arm
    records) without a ``campaign_start`` are refused, never overwritten."""
    arms_dir = Path(folder) / "arms"
    arms = sorted(p.name for p in arms_dir.iterdir()) if arms_dir.is_dir() else []
    recorded = sum(r.get("op") == "arm_start" for r in journal.records)
    if arms or recorded:
        what = f"{len(arms)} arm folders under {arms_dir}" if arms else f"{recorded} arm records"
        raise ConfigError(f"{journal.path} has no campaign_start record but the folder holds {what}: the journal "
                          f"was emptied or lost; refusing to start a new night over them — restore the journal "
                          f"(or move {folder} aside to start afresh)")


def folder_of(arg: str | Path) -> Path:
    """A campaign folder given as itself, or as the campaign YAML file that writes to it."""
    p = Path(arg)
    if p.is_dir():
        return p
    from tuner.campaign import load_campaign

    return load_campaign(str(arg)).folder

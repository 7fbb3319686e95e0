"""The campaign journal: the one durable source of truth for arms, in Optuna's style.

Append-only JSON lines, one operation each (``{"op": ..., "seq": n, "t": wall, ...}``),
written with flush + fsync so a returned ``append`` survives a kill -9. State is rebuilt by
replaying the operations (``tuner.night.state.replay``). Secrets in env values are redacted before writing.

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
from pathlib import Path
from typing import Any

from arms.errors import ConfigError
from arms.secrets import Sealer, seal
from tuner.night.readback import Damage, quarantine_path, read_journal
from tuner.night.records import RecordError, encode

log = logging.getLogger("tuner.journal")


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


def record_line(op: str, seq: int, t: float, fields: dict, sealer: Sealer) -> tuple[dict, str]:
    """(the record as journaled, its JSON line without the newline): checked by the record codec,
    every secret sealed. A record the codec refuses is a writer's bug: journaled anyway (replay
    will skip it), never a lost night. The one encoding of both journals (file and shared)."""
    try:
        rec = encode(op, seq, t, fields)
    except RecordError as e:
        log.error("[journal] %s record that replay will skip: %s", op, e)
        rec = {"op": op, "seq": seq, "t": t, **fields}
    rec = sealer.record(rec)
    return rec, json.dumps(rec, separators=(",", ":"), default=str)


class Journal:
    """The writer: repairs a torn tail, quarantines damaged lines, appends fsync'd records. One per
    campaign folder at a time (``tuner.night.lock.CampaignLock`` is what makes it one)."""

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
        rec, line = record_line(op, self._seq, round(self.clock(), 3), fields, self.sealer)
        line += "\n"
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

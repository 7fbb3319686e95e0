"""Reading a campaign folder back, never writing it: the one way to name a folder (``folder_of``,
``campaign_folder``), the journal as read (good records, damaged lines, a torn tail) and its
records for the readers (status, report, export, dashboard, production).

A reader never locks, never cuts a torn tail (the writer may be finishing that line) and never
quarantines: the writer (``tuner.night.journal.Journal``) does both under the campaign lock.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from arms.errors import ConfigError
from tuner.night.records import RecordError, decode

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


def why_damaged(line: bytes) -> tuple[str, dict | None]:
    if b"\0" in line:
        return "NUL bytes (a power loss mid-write?)", None
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"not JSON ({getattr(e, 'msg', e)})", None
    try:
        decode(rec)                                # the record types' one codec (tuner.night.records)
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
        why, rec = why_damaged(line)
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


SHARED = "shared.json"           # a shared campaign's folder: where its record is (tuner/night/shared.py)
_URLS: dict[Path, str] = {}      # shared campaign folder -> the storage URL its YAML gave (with its password)


def folder_of(arg: str | Path) -> Path:
    """A campaign folder given as itself, or as the campaign YAML file that writes to it (a shared
    campaign's: the folder its boxes' folders are in)."""
    p = Path(arg)
    if p.is_dir():
        return p
    from tuner.night.campaign import load_campaign

    camp = load_campaign(str(arg))
    if camp.shared:
        _URLS[camp.folder.resolve()] = camp.storage.url
    return camp.folder


def shared_of(folder: Path) -> dict | None:
    """A shared campaign folder's ``shared.json`` ({storage, campaign}, no password), or None."""
    try:
        d = json.loads((Path(folder) / SHARED).read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("storage") and d.get("campaign") else None


def mark_shared(folder: Path, url: str, campaign: str) -> None:
    """Write ``shared.json`` (a box does, when it joins): readers of the folder find the record
    (``url`` without its password)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    # one temporary file per writer: boxes that join at once each replace the file whole (a shared
    # name lost the race: one box's rename took the other's file away, FileNotFoundError)
    tmp = Path(folder) / f"{SHARED}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(json.dumps({"storage": url, "campaign": campaign}) + "\n")
    os.replace(tmp, Path(folder) / SHARED)


def _shared_query(folder: Path, sql: str) -> list[tuple]:
    import psycopg2

    from tuner.night.storage import dsn

    mark = shared_of(folder) or {}
    url = _URLS.get(Path(folder).resolve()) or mark.get("storage")
    try:
        with psycopg2.connect(dsn(url), connect_timeout=10) as conn, conn.cursor() as cur:
            cur.execute(sql, (mark.get("campaign"),))
            return cur.fetchall()
    except psycopg2.Error as e:
        from tuner.night.storage import safe_url

        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{folder}: the shared campaign's storage {safe_url(url)} cannot be read ({first}); "
                          "give the campaign YAML, or set PGPASSWORD") from None


def shared_boxes(folder: Path) -> list[dict]:
    """A shared campaign's boxes as its database has them: name, host, last heartbeat and when it
    left (None: it has not said so), on the database's clock (``now``)."""
    rows = _shared_query(folder, "SELECT box, host, heartbeat, left_at, extract(epoch from clock_timestamp()) "
                                 "FROM tuner_boxes WHERE campaign = %s ORDER BY box")
    return [{"box": b, "host": h, "heartbeat": hb, "left": left, "now": float(now)} for b, h, hb, left, now in rows]


def shared_records(folder: Path) -> list[dict]:
    """A shared campaign's records, read from its database (never written): the URL its YAML gave,
    or ``shared.json``'s with the password from PGPASSWORD / ~/.pgpass."""
    rows = _shared_query(folder, "SELECT seq, line FROM tuner_records WHERE campaign = %s ORDER BY seq")
    out = []
    for seq, line in rows:
        why, rec = why_damaged(line.encode())
        if rec is None:
            log.warning("[journal] shared record %d skipped: %s", seq, why)
        else:
            out.append(rec)
    return out


def read_records(path: Path) -> list[dict]:
    """The journal's records without touching the file (``tuner.night.journal.read_journal``): a torn
    last line is skipped, a damaged line is skipped with one warning; a journal with no readable
    record at all is bad input."""
    got = read_journal(Path(path), warn=False)
    bad = got.unreadable()
    if bad:
        raise bad
    got.warn()
    return got.records


def campaign_folder(arg: str | Path) -> Path:
    """A campaign folder, or the folder a campaign YAML file writes to (as `tuner status`)."""
    folder = folder_of(arg)
    if not (folder / "journal.jsonl").exists() and shared_of(folder) is None:
        raise ConfigError(f"{folder} holds no journal.jsonl: give a campaign folder such as journal/<name> "
                          "(the campaign has not run yet?)")
    return folder


def load_records(folder: Path) -> list[dict]:
    shared = shared_of(folder) is not None and not (Path(folder) / "journal.jsonl").exists()
    records = shared_records(folder) if shared else read_records(Path(folder) / "journal.jsonl")
    if not any(r.get("op") == "campaign_start" for r in records):
        raise ConfigError(f"{Path(folder) / 'journal.jsonl'} has no campaign_start record: not a campaign journal")
    return records


def start_of(records: list[dict]) -> dict | None:
    """The night's ``campaign_start`` record (the first), None when the journal has none."""
    return next((r for r in records if r.get("op") == "campaign_start"), None)


DAEMON_PID = "daemon.pid"          # written by `tuner run` for its whole life (tuner/daemon.py)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one owned by another user counts: it runs)."""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def daemon_pid(folder: Path) -> int | None:
    """The pid of the `tuner run` that is writing ``folder`` now, None when none is: the one answer
    to "is the daemon alive" (status, promote, rollback ask it)."""
    try:
        pid = int((Path(folder) / DAEMON_PID).read_text())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


@dataclass
class ArmRecords:
    """One arm as a reader of the journal has it: its start and (first) end records, its change
    decoded; no Shape is built (a 10,000-arm report needs none). The night's own replay
    (tuner.night.state.Arm) adds the shapes the search compares."""

    n: int
    kind: str
    change: tuple | None
    incumbent: str
    start: dict
    end: dict | None

    @property
    def verdict(self) -> str | None:
        return (self.end or {}).get("verdict")


def arms_of(records: list[dict]) -> list[ArmRecords]:
    """Every arm of a journal in arm order, one pass; the first end of an arm wins (as replay)."""
    from arms import values

    starts: dict[int, dict] = {}
    ends: dict[int, dict] = {}
    for r in records:
        op = r.get("op")
        if op == "arm_start":
            starts[r["arm"]] = r
        elif op == "arm_end" and r.get("arm") in starts and r["arm"] not in ends:
            ends[r["arm"]] = r
    return [ArmRecords(n, s.get("kind"), (s["change"][0], values.decode(s["change"][1])) if s.get("change") else None,
                       s.get("incumbent"), s, ends.get(n)) for n, s in sorted(starts.items())]

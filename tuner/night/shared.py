"""A shared campaign: several boxes, one campaign, its record in PostgreSQL (``storage:``).

Each box runs its own `tuner run CAMPAIGN --box NAME`; all of them append to one journal, a
table of the campaign's records in the database (``tuner_records``: the very JSON lines a box's
``journal.jsonl`` would hold, numbered by one sequence), and share one Optuna study on the same
database (RDBStorage). What a box must decide with everyone's knowledge — which arm it runs next,
an arm's verdict and comparison, a move of the incumbent, the night's end — happens inside one
transaction that holds the campaign's advisory lock (``Fleet.transaction``): the box reads every
record committed before it, decides, appends, commits. So no arm is given to two boxes, and the
incumbent changes in one transaction. The long part of an arm (boot, measurement) holds nothing.

The database's clock is the journal's on a real box (a box whose clock is minutes off does not
move the deadline); a simulated fleet (``Turns``) takes turns in the order of its boxes' virtual
clocks. A box heartbeats (``tuner_boxes``); whoever notices a box silent for ``grace_s`` journals
its open arm ``interrupted`` and fails its trial. A database that goes away mid-night is waited
for with back-off (``Fleet.atomically``): the transaction that failed is rolled back and run
again from the top, so nothing is lost and nothing is written twice.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from arms.errors import ConfigError
from arms.secrets import Sealer
from tuner.night.readback import why_damaged
from tuner.night.journal import record_line
from tuner.night.storage import safe_url

log = logging.getLogger("tuner.shared")

SCHEMA = """
CREATE TABLE IF NOT EXISTS tuner_campaigns (
    name text PRIMARY KEY, hash text NOT NULL, created double precision NOT NULL);
CREATE TABLE IF NOT EXISTS tuner_records (
    campaign text NOT NULL, seq bigint NOT NULL, box text, line text NOT NULL,
    PRIMARY KEY (campaign, seq));
CREATE TABLE IF NOT EXISTS tuner_boxes (
    campaign text NOT NULL, box text NOT NULL, host text, pid integer, fingerprint text,
    joined double precision, heartbeat double precision, left_at double precision,
    PRIMARY KEY (campaign, box));
"""


def db_down(e: BaseException) -> bool:
    """Whether ``e`` says the database went away (a restart, the network): wait and run again.
    Optuna wraps SQLAlchemy's error in its own (``StorageInternalError`` ... ``from e``), so the
    chain of causes is read too."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if _db_down_here(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _db_down_here(e: BaseException) -> bool:
    try:
        import psycopg2
        if isinstance(e, (psycopg2.OperationalError, psycopg2.InterfaceError)):
            return True
    except ImportError:           # pragma: no cover - psycopg2 is a dependency
        pass
    try:
        import sqlalchemy.exc as sa
        if isinstance(e, (sa.OperationalError, sa.InterfaceError)) or \
                (isinstance(e, sa.DBAPIError) and e.connection_invalidated):
            return True
    except ImportError:           # pragma: no cover
        pass
    return False


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class Turns:
    """The boxes of a simulated fleet (one process, one virtual clock each) take the shared record
    in the order of their clocks: a box arriving at a transaction waits until every other box
    waits too, and the one whose clock reads earliest goes (ties: by name). So the simulated night
    is a discrete-event one: what a box reads at virtual time t is what the others committed
    before t."""

    def __init__(self, boxes: list[str]):
        self._cv = threading.Condition()
        self._running = set(boxes)
        self._waiting: dict[str, float] = {}

    def arrive(self, box: str, t: float) -> None:
        with self._cv:
            self._running.discard(box)
            self._waiting[box] = t
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._running and
                              min(self._waiting.items(), key=lambda kv: (kv[1], kv[0]))[0] == box)
            del self._waiting[box]
            self._running.add(box)

    def leave(self, box: str) -> None:
        with self._cv:
            self._running.discard(box)
            self._waiting.pop(box, None)
            self._cv.notify_all()


class Fleet:
    """One box's connection to a shared campaign. ``clock``: the journal's clock when it is not
    the database's (a simulated box: its virtual wall clock); ``turns``: a simulated fleet's
    order; ``grace_s``: how long a box may be silent before its open arm is called interrupted
    (None: never — a simulated fleet, where a box is silent for a whole virtual arm);
    ``wait_s``: how long a box waits for a database that went away before it gives up."""

    def __init__(self, url: str, campaign: str, box: str, *, clock: Callable[[], float] | None = None,
                 turns: Turns | None = None, grace_s: float | None = 120.0, heartbeat_s: float = 10.0,
                 wait_s: float = 900.0, sleep: Callable[[float], None] = time.sleep):
        self.url, self.campaign, self.box = url, campaign, box
        self.safe_url = safe_url(url)
        self.clock, self.turns = clock, turns
        self.grace_s, self.heartbeat_s, self.wait_s = grace_s, heartbeat_s, wait_s
        self._sleep = sleep
        self._conn = None
        self._depth = 0
        self._offset = 0.0                     # database clock - time.time(), measured at each transaction
        self._beat: threading.Thread | None = None
        self._stop_beat = threading.Event()
        self.journal = None                    # the SharedJournal refreshed at each transaction

    # -- connection ------------------------------------------------------------------------
    def _connect(self):
        import psycopg2

        from tuner.night.storage import dsn

        conn = psycopg2.connect(dsn(self.url), connect_timeout=10, application_name=f"offload-tuner {self.box}"[:63])
        conn.autocommit = False
        return conn

    def connect(self) -> "Fleet":
        """Open the connection and the tables; a database that cannot be reached (a wrong URL or
        password, no server) is one ``ConfigError`` line with the password masked."""
        try:
            self._conn = self._connect()
            with self._conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext('offload-tuner schema'))")
                cur.execute(SCHEMA)
            self._conn.commit()
        except Exception as e:   # noqa: BLE001 - whatever libpq says, one line
            if not db_down(e) and not type(e).__module__.startswith("psycopg2"):
                raise
            raise ConfigError(f"storage {self.safe_url}: cannot open the shared campaign ({_one_line(e)}); "
                              "check the URL, the password (PGPASSWORD or ~/.pgpass) and that the server runs"
                              ) from None
        return self

    def close(self) -> None:
        self._stop_beat.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        if self.turns is not None:
            self.turns.leave(self.box)

    # -- time ------------------------------------------------------------------------------
    def now(self) -> float:
        """The journal's clock: the database's on a real box (measured at each transaction)."""
        return self.clock() if self.clock is not None else time.time() + self._offset

    # -- transactions ----------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self):
        """Hold the campaign's advisory lock, with every record committed before it read into the
        journal; commit at the end (roll back on any error). Re-entrant: an inner one is the outer."""
        if self._depth:
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
            return
        if self.turns is not None:
            self.turns.arrive(self.box, self.now())
        mark = len(self.journal) if self.journal is not None else 0
        self._depth = 1
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            with self._conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s)), extract(epoch from clock_timestamp())",
                            ("offload-tuner " + self.campaign,))
                self._offset = float(cur.fetchone()[1]) - time.time()
                cur.execute("UPDATE tuner_boxes SET heartbeat = %s WHERE campaign = %s AND box = %s",
                            (self.now(), self.campaign, self.box))
            if self.journal is not None:
                self.journal.refresh()
            yield self
            self._conn.commit()
        except BaseException:
            if self.journal is not None:
                self.journal.truncate(mark)        # what this transaction appended never happened
            with contextlib.suppress(Exception):
                self._conn.rollback()
            raise
        finally:
            self._depth = 0

    def atomically(self, fn: Callable[[], Any], on_rollback: Callable[[], None] | None = None) -> Any:
        """``fn()`` inside one transaction; when the database goes away it is rolled back, waited
        for with back-off (up to ``wait_s``) and run again from the top."""
        waited, delay = 0.0, 1.0
        while True:
            try:
                with self.transaction():
                    return fn()
            except Exception as e:   # noqa: BLE001 - only a database that went away is waited for
                if not db_down(e):
                    raise
                if on_rollback is not None:
                    on_rollback()
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
                if waited >= self.wait_s:
                    raise ConfigError(f"storage {self.safe_url}: the database has been unreachable for "
                                      f"{waited:.0f} s ({_one_line(e)}); the box stops, its journal consistent — "
                                      "run `tuner run` again once the database is back") from None
                log.warning("[fleet WAIT] %s: the database went away (%s); retrying in %.0f s", self.box,
                            _one_line(e), delay)
                self._sleep(delay)
                waited += delay
                delay = min(30.0, delay * 2)

    def _cur(self):
        if not self._depth:
            raise RuntimeError("shared campaign: a database read or write outside a transaction")
        return self._conn.cursor()

    # -- the record ------------------------------------------------------------------------
    def records_since(self, seq: int) -> list[tuple[int, str, str]]:
        with self._cur() as cur:
            cur.execute("SELECT seq, box, line FROM tuner_records WHERE campaign = %s AND seq > %s ORDER BY seq",
                        (self.campaign, seq))
            return cur.fetchall()

    def insert(self, seq: int, line: str) -> None:
        with self._cur() as cur:
            cur.execute("INSERT INTO tuner_records (campaign, seq, box, line) VALUES (%s, %s, %s, %s)",
                        (self.campaign, seq, self.box, line))

    # -- boxes -----------------------------------------------------------------------------
    def join(self, identity: str, fingerprint: dict, *, force: bool = False, mixed: bool = False) -> None:
        """Register this box: refused (one line) when the database holds another campaign of this
        name, a live box already has this name, or this box's hardware differs from the others'."""
        fp = json.dumps(fingerprint, sort_keys=True)

        def go():
            with self._cur() as cur:
                cur.execute("SELECT hash FROM tuner_campaigns WHERE name = %s", (self.campaign,))
                row = cur.fetchone()
                if row is None:
                    cur.execute("INSERT INTO tuner_campaigns (name, hash, created) VALUES (%s, %s, %s)",
                                (self.campaign, identity, self.now()))
                elif row[0] != identity and not force:
                    raise ConfigError(f"storage {self.safe_url} holds another campaign named {self.campaign!r} "
                                      "(written by a different campaign file); pass --force-resume to continue "
                                      "it anyway, or give this campaign another name")
                cur.execute("SELECT box, host, pid, fingerprint, heartbeat, left_at FROM tuner_boxes "
                            "WHERE campaign = %s", (self.campaign,))
                others = cur.fetchall()
            me = socket.gethostname()
            for box, host, pid, ofp, beat, left in others:
                if box == self.box:
                    alive = left is None and (
                        (host == me and pid != os.getpid() and _pid_alive(pid)) or
                        (host != me and beat is not None and self.grace_s is not None and
                         self.now() - beat < self.grace_s))
                    if alive:
                        raise ConfigError(f"box {self.box!r} is already running this campaign (pid {pid} on "
                                          f"{host}): give each box its own --box name")
                elif ofp and ofp != fp and not mixed:
                    raise ConfigError(f"box {self.box!r} is not the same hardware as box {box!r} "
                                      f"({_differs(ofp, fp)}): a shared campaign compares boxes of one kind — "
                                      "set storage.mixed_hardware: true to allow it")
            with self._cur() as cur:
                cur.execute("INSERT INTO tuner_boxes (campaign, box, host, pid, fingerprint, joined, heartbeat) "
                            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (campaign, box) DO UPDATE SET "
                            "host = EXCLUDED.host, pid = EXCLUDED.pid, fingerprint = EXCLUDED.fingerprint, "
                            "joined = EXCLUDED.joined, heartbeat = EXCLUDED.heartbeat, left_at = NULL",
                            (self.campaign, self.box, me, os.getpid(), fp, self.now(), self.now()))
        self.atomically(go)
        if self.clock is None and self.heartbeat_s:
            self._beat = threading.Thread(target=self._heartbeat, name=f"heartbeat {self.box}", daemon=True)
            self._beat.start()

    def leave(self) -> None:
        """Say this box left (one try: a box that cannot say so is found silent after the grace)."""
        with contextlib.suppress(Exception):
            with self.transaction(), self._cur() as cur:
                cur.execute("UPDATE tuner_boxes SET left_at = %s WHERE campaign = %s AND box = %s",
                            (self.now(), self.campaign, self.box))

    def survey(self, identity: str) -> str:
        """What ``tuner check`` says of the shared campaign, read only: one line naming the campaign
        there (new, or its records and boxes); another campaign of this name is one ``ConfigError``."""
        with self.transaction(), self._cur() as cur:
            cur.execute("SELECT hash FROM tuner_campaigns WHERE name = %s", (self.campaign,))
            row = cur.fetchone()
            cur.execute("SELECT count(*) FROM tuner_records WHERE campaign = %s", (self.campaign,))
            n = cur.fetchone()[0]
            now, boxes = self.now(), self.boxes()
        if row is None:
            return f"storage {self.safe_url}: reachable; campaign {self.campaign!r} is new there"
        if row[0] != identity:
            raise ConfigError(f"storage {self.safe_url} holds another campaign named {self.campaign!r} "
                              "(written by a different campaign file); give this campaign another name")
        live = [b["box"] for b in boxes if b["left"] is None and b["heartbeat"] is not None
                and self.grace_s is not None and now - b["heartbeat"] < self.grace_s]
        return (f"storage {self.safe_url}: reachable; campaign {self.campaign!r} there: {n} records, "
                f"{len(boxes)} box(es) ({', '.join(b['box'] for b in boxes) or 'none'}), live now: "
                f"{', '.join(live) or 'none'}")

    def boxes(self) -> list[dict]:
        with self._cur() as cur:
            cur.execute("SELECT box, host, pid, heartbeat, left_at FROM tuner_boxes WHERE campaign = %s ORDER BY box",
                        (self.campaign,))
            return [dict(zip(("box", "host", "pid", "heartbeat", "left"), r)) for r in cur.fetchall()]

    def silent(self) -> dict[str, float]:
        """box -> seconds since its last heartbeat, for every other box silent past ``grace_s``
        (or that left): its open arms will never end."""
        if self.grace_s is None:
            return {}
        now = self.now()
        return {b["box"]: now - (b["heartbeat"] or 0.0) for b in self.boxes()
                if b["box"] != self.box and (b["left"] is not None or now - (b["heartbeat"] or 0.0) > self.grace_s)}

    def _heartbeat(self) -> None:
        conn = None
        while not self._stop_beat.wait(self.heartbeat_s):
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                    conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("UPDATE tuner_boxes SET heartbeat = extract(epoch from clock_timestamp()) "
                                "WHERE campaign = %s AND box = %s", (self.campaign, self.box))
            except Exception as e:   # noqa: BLE001 - a missed beat is retried; the night goes on
                log.debug("[fleet] heartbeat of %s failed: %s", self.box, _one_line(e))
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
        with contextlib.suppress(Exception):
            conn.close()


def _pid_alive(pid) -> bool:
    from tuner.night.readback import pid_alive

    return pid_alive(pid)


def _differs(a: str, b: str) -> str:
    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return "fingerprints differ"
    keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
    return "; ".join(f"{k}: {x.get(k)!r} there, {y.get(k)!r} here" for k in keys[:3]) or "fingerprints differ"


class SharedJournal:
    """The campaign journal of a shared campaign: the interface of ``tuner.night.journal.Journal``
    over the database's record table. Appends happen inside a ``Fleet.transaction`` (one of their
    own when none is open); ``refresh`` reads what other boxes committed."""

    def __init__(self, fleet: Fleet, clock: Callable[[], float], sealer: Sealer | None = None):
        self.fleet = fleet
        self.path = fleet.safe_url
        self.clock = clock
        self.sealer = sealer or Sealer()
        self.damaged: list = []
        self.repaired = 0
        self._records: list[dict] = []
        self._seq = -1
        fleet.journal = self
        fleet.atomically(lambda: None)          # the records so far

    def refresh(self) -> None:
        for seq, box, line in self.fleet.records_since(self._seq):
            why, rec = why_damaged(line.encode())
            if rec is None:
                log.warning("[journal] shared record %d (box %s) skipped: %s", seq, box, why)
            else:
                self._records.append(rec)
            self._seq = seq

    def truncate(self, n: int) -> None:
        """Forget the records from the ``n``-th on (a rolled-back transaction's)."""
        del self._records[n:]
        self._seq = self._records[-1]["seq"] if self._records else -1

    @property
    def records(self) -> list[dict]:
        return list(self._records)

    def since(self, n: int) -> list[dict]:
        return self._records[n:]

    def __len__(self) -> int:
        return len(self._records)

    def append(self, op: str, **fields: Any) -> dict:
        with self.fleet.transaction():
            seq = self._seq + 1
            rec, line = record_line(op, seq, round(self.clock(), 3), fields, self.sealer)
            self.fleet.insert(seq, line)
            self._records.append(rec)
            self._seq = seq
            return rec

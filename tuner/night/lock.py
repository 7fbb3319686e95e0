"""One writer per campaign folder: `tuner run` holds an exclusive ``fcntl.flock`` on
``<folder>/run.lock`` for its whole life. A second writer refuses in one line naming the holder
(pid, host, start time), which the holder wrote into the lock file. Readers (status, report,
export, dashboard) take no lock; ``holder`` reads the file without locking it.

The lock is the kernel's: it dies with the process (kill -9 included), so a stale ``run.lock``
left behind is never a reason to refuse — only a live flock is.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from arms.errors import ConfigError
from tuner.night.readback import pid_alive

log = logging.getLogger("tuner.lock")

LOCK_NAME = "run.lock"


class CampaignBusy(ConfigError):
    """Another `tuner run` holds the campaign folder."""


def holder(folder: Path) -> dict | None:
    """What the lock file says about its last writer (pid, host, started); None when unreadable.
    Says nothing about whether that writer still lives."""
    try:
        return json.loads((Path(folder) / LOCK_NAME).read_text() or "null")
    except (OSError, ValueError):
        return None


def _describe(h: dict | None) -> str:
    if not h:
        return "another process (it has not written its name yet)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("started", 0)))
    return f"pid {h.get('pid')} on host {h.get('host')} since {started}"


RUN = "tuner run"
HINTS = {RUN: "one `tuner run` per campaign folder — wait for it, or stop it (`tuner status` reads it meanwhile)"}


def busy_message(folder: Path, h: dict | None, command: str = RUN) -> str:
    """The one line a refused writer says: who holds ``folder``, and what to do."""
    cmd = (h or {}).get("command") or RUN
    who = f"being run by {_describe(h)}" if cmd == RUN else f"held by `{cmd}`, {_describe(h)}"
    hint = HINTS.get(command) or f"`{command}` waits for it to end (`tuner status` shows where it is); nothing was written"
    return f"{folder} is {who}: {hint}"


class CampaignLock:
    """``with CampaignLock(folder):`` — the exclusive writer's lock, or ``CampaignBusy``. Every
    writer of a campaign folder takes it: `tuner run` for its whole life, `tuner promote` and
    `tuner rollback` while they write (``command`` names the holder in the lock file)."""

    def __init__(self, folder: Path, clock=time.time, command: str = RUN):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.clock = clock
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> "CampaignLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CampaignBusy(busy_message(self.folder, holder(self.folder), self.command)) from None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": round(self.clock(), 3),
              "command": self.command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        log.debug("[lock] %s held by pid %d", self.path, me["pid"])
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)        # no stale name; the file itself stays (unlinking races a waiter)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "CampaignLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_held(folder: Path) -> bool:
    """Whether a live writer holds ``folder`` — asked without taking the lock: the holder's pid
    (from the file) must be alive on this host."""
    h = holder(folder)
    if not h or h.get("host") != socket.gethostname():
        return bool(h)
    return pid_alive(h.get("pid"))

"""Who holds a TCP port on this host: the pre-boot check that refuses an arm whose port is
already taken (with host networking, the engine would fail to bind while the old holder
answered its readiness probe and got measured in its place)."""
from __future__ import annotations

import errno
import socket

import psutil


def listener_pid(port: int) -> int | None | bool:
    """The pid listening on TCP ``port`` (any address); True when the port is held but its
    process cannot be seen; None when it is free."""
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                return c.pid if c.pid else True
    except (psutil.AccessDenied, OSError):
        pass
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as servers do: TIME_WAIT is no holder
                s.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
    return None


def describe_pid(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        cmd = " ".join(p.cmdline()) or p.name()
    except (psutil.Error, OSError):
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:160]})"


def ancestry(pid: int) -> set[int]:
    """``pid`` and every parent of it."""
    try:
        return {pid} | {p.pid for p in psutil.Process(pid).parents()}
    except (psutil.Error, OSError):
        return {pid}


def port_holder(port: int) -> str | None:
    """"pid N (command)" or "an unknown process" holding ``port``; None when it is free."""
    pid = listener_pid(port)
    if pid is None:
        return None
    return "an unknown process (not visible to this user)" if pid is True else describe_pid(pid)

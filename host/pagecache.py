"""Reading a model's files once before the night, so that the first boot is not the only cold one.

A 170 GiB model is read from disk by the night's first boot and from the page cache by every boot
after it: the first arm's decode reads slow (a real llama-server night here read 55-74 tok/s on
its first boot, 84-91 afterwards), and the starting shape's first measurement is then not like
its next ones. ``read_through`` reads every file under the given paths sequentially, in large
chunks and within a time budget, so the page cache holds what it can before the first boot.
"""
from __future__ import annotations

import time
from pathlib import Path

CHUNK = 16 * 2**20


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        q = Path(p)
        if q.is_file():
            out.append(q)
        elif q.is_dir():
            out += sorted(f for f in q.rglob("*") if f.is_file() and not f.is_symlink())
    return out


def read_through(paths: list[str], budget_s: float, clock=time.monotonic) -> dict:
    """Read the files under ``paths`` once; stop when ``budget_s`` seconds are spent. Returns what
    was read: files, bytes, seconds, and whether every file was read to its end."""
    t0, files, total, complete = clock(), 0, 0, True
    buf = bytearray(CHUNK)
    for f in _files(paths):
        try:
            with open(f, "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(buf)
                    total += n or 0
                    if not n:
                        break
                    if clock() - t0 > budget_s:
                        complete = False
                        break
        except OSError:
            continue                      # unreadable: the boot will say so in its own words
        if not complete:
            break                         # the budget is spent (this file read in part)
        files += 1
    return {"files": files, "bytes": total, "seconds": round(clock() - t0, 3), "complete": complete}

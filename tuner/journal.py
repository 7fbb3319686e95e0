"""The campaign journal: the one durable source of truth for arms, in Optuna's style.

Append-only JSON lines, one operation each (``{"op": ..., "seq": n, "t": wall, ...}``),
written with flush + fsync so a returned ``append`` survives a kill -9. A torn last line (the
process died mid-write) is cut off when the journal is opened; state is rebuilt by replaying
the operations (``tuner.state.replay``). Secrets in env values are redacted before writing.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable

from arms.argv import is_secret

log = logging.getLogger("tuner.journal")

ABSENT_JSON = {"__absent__": True}


def encode_value(v):
    """A lever value as JSON for the journal and Optuna (ABSENT survives the round trip)."""
    from arms.shape import ABSENT, thaw

    return dict(ABSENT_JSON) if v is ABSENT else thaw(v)


def decode_value(v):
    from arms.shape import ABSENT

    return ABSENT if v == ABSENT_JSON else v


OPS = ("campaign_start", "arm_start", "arm_end", "told", "incumbent", "guard", "campaign_end", "note", "promotion",
       "compare")   # compare: a challenger vs the incumbent (tuner/compare.py)


def repair_tail(path: Path) -> int:
    """Cut a torn last line (no trailing newline); returns the bytes removed.

    Optuna's JournalFileBackend ignores a torn tail on read but the next append would be
    glued to it and the file could no longer be loaded, so both journals are repaired at start.
    """
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # walk back to the last newline
        pos = size - 1
        chunk = 4096
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            i = buf.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        else:
            keep = 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    log.warning("[journal] cut a torn last line of %d bytes from %s", size - keep, path)
    return size - keep


def redact(obj: Any) -> Any:
    """Replace the values of secret-looking env keys anywhere in a record."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "env" and isinstance(v, dict):
                out[k] = {ek: ("***" if is_secret(ek) else ev) for ek, ev in v.items()}
            elif k == "env" and isinstance(v, list):
                out[k] = [[p[0], "***" if is_secret(str(p[0])) else p[1]] if isinstance(p, (list, tuple)) and len(p) == 2
                          else p for p in v]
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list):
        return [redact(x) for x in obj]
    return obj


class Journal:
    def __init__(self, path: Path, clock=time.time):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.repaired = repair_tail(self.path)
        self._records = list(self._read())
        self._seq = self._records[-1]["seq"] + 1 if self._records else 0

    def _read(self) -> Iterable[dict]:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    from arms.errors import ConfigError

                    raise ConfigError(f"{self.path}:{n}: journal line is not JSON ({e.msg}); "
                                      "move the file aside to start this campaign afresh") from None

    @property
    def records(self) -> list[dict]:
        return list(self._records)

    def append(self, op: str, **fields: Any) -> dict:
        if op not in OPS:
            raise ValueError(f"unknown journal op {op!r}")
        rec = redact({"op": op, "seq": self._seq, "t": round(self.clock(), 3), **fields})
        line = json.dumps(rec, separators=(",", ":"), default=str) + "\n"
        with open(self.path, "ab") as f:
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
        self._records.append(rec)
        self._seq += 1
        return rec

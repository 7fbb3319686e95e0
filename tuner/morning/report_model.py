"""The pieces of a morning report that the report builder (``tuner.morning.report``) and its sections
(``tuner.morning.report_sections``) share: limits, the Section block list, value formatting. Both
import from here, so neither imports the other at module level."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from arms.shape import ABSENT, Change

from arms.values import text

ROWS_PER_GROUP = 25          # arm-table rows per group before the rest is summarised
MEMORY_ROWS = 40
FAILURE_EXAMPLES = 5         # arms shown per failure class
TELEMETRY_ARMS = 8
GROUPS = ("Incumbent moves", "Baseline and re-checks", "Better, not confirmed", "Undecided — not settled",
          "Parity — ruled out", "Worse — ruled out", "Failed")


@dataclass
class Section:
    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)   # (p|ul|table|code|img|h3, data)

    def add(self, kind: str, data) -> Section:
        self.blocks.append((kind, data))
        return self


def missing(v) -> bool:
    return v is None or bool(pd.isna(v))


def _num(v, nd=2, unit="") -> str:
    return "—" if missing(v) else f"{v:,.{nd}f}{unit}"


def _pct(v, signed=True) -> str:
    return "—" if missing(v) else (f"{v:+.1%}" if signed else f"{v:.1%}")


def _when(t: float, day: bool = True) -> str:
    """A journal time in this host's zone, named (``TZ`` sets it: the example report uses UTC)."""
    import time

    return time.strftime("%Y-%m-%d %H:%M %Z" if day else "%H:%M %Z", time.localtime(t))


def _span(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def _words(ch: Change) -> str:
    """A shape difference for the operator: add / drop / set."""
    name = ch.name
    flag = f"`{name[4:]}` (env)" if name.startswith("env.") else f"`--{name}`"
    if ch.after is ABSENT:
        return f"drop {flag} (production has {text(ch.before)})"
    if ch.before is ABSENT:
        return f"add {flag} {text(ch.after)}"
    return f"set {flag} {text(ch.before)} → {text(ch.after)}"





"""The report's "Boxes" section for a shared campaign (tuner/night/shared.py): which box ran what,
how each box's rates sit against the others' (its offset, measured on the shapes several boxes
booted), and the spread between boxes. None for a campaign of one box."""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

import pandas as pd

from tuner.morning.report_model import Section


def box_of(arm) -> str | None:
    return (arm.start or {}).get("box")


def box_offsets(arms) -> dict[str, tuple[float, int]]:
    """box -> (its offset: the mean over shapes booted on several boxes of its log rate minus the
    shape's mean over those boxes, as a fraction; how many shapes said so). Boxes that shared no
    shape with another box are left out."""
    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for a in arms:
        end = a.end or {}
        obj = (end.get("score") or {}).get("objective")
        box = box_of(a)
        m = end.get("measurement") or {}
        if box and obj and obj > 0 and m.get("outcome") == "measured" and end.get("verdict") != "corrupt":
            by[(a.start or {}).get("identity") or ""][box].append(math.log(obj))
    devs: dict[str, list[float]] = defaultdict(list)
    for boxes in by.values():
        if len(boxes) < 2:
            continue
        means = {b: statistics.fmean(v) for b, v in boxes.items()}
        centre = statistics.fmean(means.values())
        for b, m in means.items():
            devs[b].append(m - centre)
    return {b: (math.expm1(statistics.fmean(d)), len(d)) for b, d in devs.items()}


def boxes(b, df: pd.DataFrame) -> Section | None:
    arms = list(b.arms.values())
    names = sorted({x for x in (box_of(a) for a in arms) if x})
    if not names:
        return None
    s = Section("Boxes")
    offsets = box_offsets(arms)
    s.add("p", f"{len(names)} boxes shared this campaign through one database; each challenger was judged "
               "against the incumbent's boots on its own box (a box's own offset cancels in its blocks).")
    rows = []
    for name in names:
        mine = [a for a in arms if box_of(a) == name]
        v = Counter((a.end or {}).get("verdict") or "running" for a in mine)
        off = offsets.get(name)
        rows.append({"box": name, "arms": len(mine),
                     "arm numbers": _ranges([a.n for a in mine]),
                     "better": v.get("better", 0), "undecided": v.get("undecided", 0),
                     "parity / worse": v.get("parity", 0) + v.get("worse", 0),
                     "failed": sum(c for k, c in v.items() if k.startswith("boot-failed") or k in ("corrupt", "invalid")),
                     "interrupted": v.get("interrupted", 0),
                     "ahead": sum(1 for a in mine if (a.start or {}).get("ahead") is not None),
                     "offset": "—" if off is None else f"{off[0]:+.1%} ({off[1]} shape{'s' if off[1] != 1 else ''})"})
    s.add("table", pd.DataFrame(rows))
    ahead = ahead_text(arms, b.st.moves)
    if ahead:
        s.add("p", ahead)
    if len(offsets) >= 2:
        spread = statistics.pstdev(v for v, _ in offsets.values())
        s.add("p", f"Measured box spread: {spread:.1%} (the standard deviation of the boxes' offsets; an offset is a "
                   "box's decode rate against the mean of the boxes on the shapes several of them booted).")
    return s


def ahead_text(arms, moves) -> str | None:
    """What the arms begun ahead of a move (tuner/night/ahead.py) came to: how many, and how many
    were measured against a shape that then led (the others' comparisons moved nothing)."""
    ahead = [a for a in arms if (a.start or {}).get("ahead") is not None]
    if not ahead:
        return None
    led = {m.get("identity") for m in moves}
    used = sum(1 for a in ahead if a.incumbent in led)
    promoted = sum(1 for m in moves if any(a.n == m.get("arm") for a in ahead))
    return (f"{len(ahead)} arm(s) were begun ahead of a move: measured against a challenger that read better while its "
            f"blocks closed, the likely next incumbent. {used} of them were of a shape that then led (their "
            f"comparisons carried on from there; {promoted} became a move themselves), {len(ahead) - used} of one "
            "that never did (judged against it, they moved nothing).")


def _ranges(ns: list[int]) -> str:
    ns = sorted(ns)
    out, i = [], 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        out.append(str(ns[i]) if i == j else f"{ns[i]}–{ns[j]}")
        i = j + 1
    text = ", ".join(out)
    return text if len(text) <= 60 else text[:57] + "…"

"""What the search proposes (tuner/night/search.py, tuner/night/sharing.py): the next arm's kind,
its one change from the incumbent and why, and the shape that change makes."""
from __future__ import annotations

from dataclasses import dataclass

from arms.shape import Shape


@dataclass(frozen=True)
class Proposal:
    kind: str                               # baseline | probe | confirm | recheck | start
    change: tuple[str, object] | None = None
    why: str = ""
    ahead: int | None = None                # begun ahead of this arm's move (tuner/night/ahead.py)


def apply(shape: Shape, change: tuple[str, object] | None) -> Shape:
    if change is None:
        return shape
    return shape.with_change(change[0], change[1])

"""Ahead of a move: on a shared campaign, a box works at the incumbent-to-be.

A challenger at the incumbent that reads better but still waits for incumbent boots around its own
(an open block, tuner/night/blocks.py: ``gain.promising`` and ``open``) is most likely the next
incumbent. While its blocks close, a box that has booted that challenger itself already holds a
boot of the incumbent-to-be on its own hardware, so it can measure the neighbours of that shape
against it: the same blocked comparisons the move would otherwise start from nothing, one chain
step earlier. Several boxes make this pay; one box has nothing to overlap (its next arm is the
bracket itself), so a campaign of one box never works ahead.

Such an arm is journaled with ``ahead`` (the challenger's arm whose shape it supposes) and its
``incumbent`` is that shape's key: its comparison is keyed there, made by the usual test at the
usual error rate (``judging``), and it can move the incumbent only once that shape leads. If the
move never comes, the arm stays in the journal, measured and judged against a shape that never
led; nothing else reads it.

``supposing(state, n)`` is the state as if arm ``n``'s shape were the incumbent: a shallow view
(the indexes are shared, read-only) with the supposed move appended, so the search's policy
(``search.propose``) runs on it unchanged. Pure: no I/O, no clock.
"""
from __future__ import annotations

import copy

from arms import values
from tuner.night.state import Arm, State
from tuner.night.verdict import Score


def base_comparison(state: State, arm: Arm) -> dict | None:
    """The latest comparison of ``arm``'s change at the current incumbent (None without one)."""
    if arm.change is None:
        return None
    return state.comparison_at(state.incumbent_key, arm.change[0], values.text(arm.change[1]))


def supposing(state: State, n: int) -> State:
    """The state as if arm ``n``'s shape (a challenger at the incumbent) were the incumbent: its
    measured boots are the incumbent's samples, and the supposed move (with its comparison) ends
    the list of moves, so an undo of it is not proposed and carried estimates are widened for it."""
    arm = state.arms[n]
    view = copy.copy(state)
    view.incumbent, view.incumbent_key, view.incumbent_arm = arm.shape, arm.key, arm.n
    sc = arm.score
    view.incumbent_score = Score(sc.feasible, sc.violation, sc.objective) if sc else None
    view.samples = [a.end["score"]["objective"] for a in state.finished()
                    if a.key == arm.key and (a.end or {}).get("score")
                    and a.end["score"].get("objective") is not None and a.verdict != "corrupt"]
    move = {"op": "incumbent", "arm": arm.n, "supposed": True, "previous": state.incumbent_key,
            "change": [arm.change[0], values.encode(arm.change[1])],
            "previous_value": values.encode(state.incumbent.value_of(arm.change[0]))}
    c = base_comparison(state, arm)
    if c is not None:
        move["comparison"] = {k: v for k, v in c.items() if k != "arm"}
    view.moves = [*state.moves, move]
    return view


def still_ahead(state: State, a: Arm, promising) -> bool:
    """Whether arm ``a``, begun ahead of a move (``start.ahead``), still waits on it: the shape it
    supposed is a challenger at the current incumbent whose latest comparison reads better
    (``promising``) with blocks still open."""
    base = state.arms.get(a.start.get("ahead")) if a.start.get("ahead") is not None else None
    if base is None or base.key != a.incumbent or base.incumbent != state.incumbent_key:
        return False                    # not a challenger of the incumbent any more: its move will not come
    c = base_comparison(state, base)
    return c is not None and bool(c.get("open")) and promising(c)

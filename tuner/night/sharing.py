"""Several boxes, one campaign (tuner/night/shared.py): which arm a box takes while other boxes
run theirs. Pure policy over the replayed state, as the search's own (tuner/night/search.py) is,
which asks it:
  - what other boxes run now is never given again (``in_flight``);
  - a box's first challenger comes before its second boot of the start (``probe_first``), and
    one called better on that one boot gets its second boot before it too (``CONFIRM_FIRST``);
  - a challenger that reads better while another box has it in hand gets a *twin* on this box
    (``twin``): the boxes' blocks run side by side;
  - while another box closes two boots of a likely next incumbent (``pending_moves``), a box works
    ahead of that move (``ahead``, tuner/night/ahead.py) before it closes its own block of it
    (``in_hand``, ``brackets_here``) or boots the incumbent that move replaces (``landing``);
  - a box neither confirms, twins nor brackets a challenger outrun by a likely next incumbent that
    reads better by as much or more (``outruns``): once that move comes, it is read again there;
  - boxes boot the undecided challenger of highest expected gain side by side (``join``).
Each but ``in_flight`` is one constant below, on by default (tests and benches turn them off).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from arms import values
from arms.verdict import Verdict
from tuner.night.ahead import supposing
from tuner.night.gain import BOOTS_CAP, carried_effect, promising
from tuner.night.proposal import Proposal
from tuner.night.state import State

TWINS = 2                # boxes at once on one challenger (``twin``)
AHEAD = True             # boxes work at the likely next incumbent (``ahead``)
AHEAD_BOOTS = 2          # ... once it reads better (``promising``) on this many boots (or is called better)
AHEAD_TWINS = 4          # ... booting it on at most this many boxes at once
BRACKET_IN_HAND = True   # a box leaves its bracket for later while another box closes two boots of it (``in_hand``)
OUTRUN = True            # a box does not add boots to a challenger a likelier next incumbent outruns (``outruns``)
LANDING = True           # ... nor to the incumbent another box is closing the move away from (``landing``)
PROBE_FIRST = True       # a box boots its first challenger before its second boot of the start (``probe_first``)
CONFIRM_FIRST = True     # ... and one called better on its one boot gets its second boot before it (search.propose)
JOIN = 4                 # boxes at once on the undecided challenger of highest expected gain (``join``)


def probe_first(state: State, box: str, mine: list) -> bool:
    """Whether ``box``, with no challenger of its own yet (``mine``: its finished arms), boots one
    before its second boot of the starting shape. That second boot then follows the challenger and
    closes its block (A B A): it is still the box's first boot-to-boot pair, and the challenger's
    first reading is judged again on it (``Judging``) with every box's first pair at once, so each
    box's first comparison can close one boot sooner. A first challenger that reads better there
    gets its second boot from another box (``twin``). One box keeps the old order (the start
    measured twice, then the challengers): its first reading would rest on its own single pair."""
    return PROBE_FIRST and not any(a.kind in ("probe", "confirm") for a in mine) and others_at_work(state, box)


def brackets_here(state: State, c: dict, box: str) -> bool:
    """Whether ``box`` is the one to close comparison ``c``'s open blocks now: one of them is a boot
    of its own (only a boot on the challenger's own box closes its block), and no other box is
    closing two of its boots now (``in_hand``: this box works ahead first)."""
    return opens_on(state, c, box) and not (BRACKET_IN_HAND and in_hand(state, c, box) >= 2)


def others_at_work(state: State, box: str) -> bool:
    """Whether any box but ``box`` has journaled an arm (one box has nothing to share)."""
    return any(a.box != box for a in state.arms.values())


def running_here(state: State) -> dict[tuple[str, str], list]:
    """(lever, value text) -> the boots of that challenger at the incumbent running now, any box."""
    out: dict[tuple[str, str], list] = {}
    for a in state.open_arms:
        if a.change and a.incumbent == state.incumbent_key and a.kind in ("probe", "confirm"):
            out.setdefault(a.challenger, []).append(a)
    return out


def twins_running(state: State, box: str) -> dict[tuple[str, str], int]:
    """(lever, value text) -> boots of that challenger at the incumbent running now on other boxes
    than ``box``: each will have its own block beside this box's (A B A there beside A B A here)."""
    out = {k: sum(a.box != box for a in arms) for k, arms in running_here(state).items()}
    return {k: n for k, n in out.items() if n}


def in_flight(state: State, box: str | None) -> set[tuple[str, str]]:
    """(lever, value text) of the challengers other boxes are running now at this incumbent: a
    shared campaign never gives the same arm to two boxes."""
    return set(twins_running(state, box))


def running_of(state: State, arm) -> int:
    """Boots of ``arm``'s shape running now, any box."""
    return sum(1 for a in state.open_arms if a.key == arm.key)


def in_hand(state: State, c: dict, box: str) -> int:
    """Boots of comparison ``c``'s challenger whose blocks another box is closing now (an incumbent
    boot running there, begun after the boot), plus those closed already; 0 when no other box is
    closing any. Two of them are what a move rests on (``verdict.promotes``; the loop judges the
    closed blocks alone), so on a shared campaign a box whose own boot of the challenger is still
    open leaves its bracket for later and works ahead of the move instead (``ahead``): its boot of
    the challenger is its own boot of the incumbent-to-be. If the move does not come when that
    bracket ends, the open block is again this box's to close. Closed blocks alone never count: a
    challenger still open after them needs more than they showed."""
    closing = {}
    for a in state.open_arms:
        if a.kind == "recheck" and a.key == state.incumbent_key and a.box != box:
            closing[a.box] = min(closing.get(a.box, a.n), a.n)
    now = closed = 0
    for b in c.get("blocks") or []:
        a = state.arms.get(b.get("boot"))
        if b.get("closed"):
            closed += 1
        elif a is not None and a.box in closing and closing[a.box] > a.n:
            now += 1
    return now + closed if now else 0


def opens_on(state: State, c: dict, box: str) -> bool:
    """Whether one of comparison ``c``'s open blocks is a boot of ``box``."""
    for b in c.get("blocks") or []:
        a = state.arms.get(b.get("boot"))
        if not b.get("closed") and a is not None and a.box == box:
            return True
    return False


def outruns(state: State, key: tuple[str, str], called: bool = False) -> bool:
    """On a shared campaign: whether challenger ``key`` (lever, value text), as its comparison at
    the incumbent reads it, is outrun by a likely next incumbent (``pending_moves``; ``called``:
    one called ``better`` only) that reads better by as much or more. Once that move comes this
    challenger is judged again at the new incumbent (its reading carried as a prior), so another
    boot of it here is worth less than this box's own boot of the incumbent-to-be and what follows
    it (``twin``, ``ahead``). Its second boot waits for any likely move; a twin or a bracket, which
    a box gives a challenger another box holds or its own block, for one called better (a move
    that reads better only by ``promising`` often needs more boots than it has). Off with
    ``OUTRUN``."""
    c = state.comparison_at(state.incumbent_key, *key) if OUTRUN else None
    effect = (c or {}).get("effect")
    return effect is not None and any(arm.challenger != key and m["effect"] >= effect for m, arm in pending_moves(state)
                                      if not called or m.get("verdict") == Verdict.BETTER)


def landing(state: State, box: str) -> tuple[dict, object] | None:
    """On a shared campaign: whether a move is landing on another box: it is closing two boots or
    more of a likely next incumbent called ``better`` now (``in_hand``: what a move rests on). A
    boot of the current incumbent on ``box`` (its own first, the start's second, a bracket of another challenger, a
    re-measure) would then most likely measure a shape that no longer leads when it ends, while
    a boot of the incumbent-to-be is what this box needs next anyway: it works ahead of that move
    (``ahead``) first. If the move does not come, the boot of the incumbent is still there to take.
    The (comparison, arm) of that move, None when none lands; off with ``LANDING``."""
    return next(((c, arm) for c, arm in pending_moves(state)
                 if c.get("verdict") == Verdict.BETTER and in_hand(state, c, box) >= 2), None) if LANDING else None


def twin(state: State, box: str, busy: set) -> Proposal | None:
    """On a shared campaign: this box's boot of a challenger another box has in hand at this
    incumbent, when the evidence already says better (called ``better`` or ``promising`` here, or
    ``better`` at an earlier incumbent and still above zero from its lever's value now,
    ``carried_effect``: effects mostly carry) and this box has no boot of it here yet: one
    running on another box now, one whose better reading waits only for its bracket, or
    (``PROBE_FIRST``) one read better on a single boot whose block is closed already.
    Such a challenger needs two boots or more, each bracketed on its own box, before it can move
    anything (``verdict.promotes``); run side by side, the boxes' A B A blocks take the time of
    one box's A B B A, and a twin still open when the first box's blocks close does not hold the
    move up (the loop judges the closed blocks alone, ``Judging._closed_move``). If the move
    comes, this box's boot of it is its own boot of the new incumbent, so it starts on the next
    challenger at once. At most ``TWINS`` boxes at once on one challenger; the test is the same."""
    inc = state.incumbent_key
    cmp = state.latest_comparisons()
    mine = {a.challenger for a in state.arms.values() if a.change and a.incumbent == inc and a.box == box}
    running = {k: len(arms) for k, arms in running_here(state).items()}
    held: dict[tuple[str, str], object] = {}
    for a in state.arms.values():
        if a.change and a.incumbent == inc and a.kind in ("probe", "confirm") and a.box != box:
            held.setdefault(a.challenger, a)
    best = None
    for key, a in held.items():
        if key in mine or running.get(key, 0) >= TWINS:
            continue
        c = cmp.get((inc, key[0], key[1]))
        if c is not None:
            if not promising(c) or (key not in running and not c.get("open")
                                    and not (PROBE_FIRST and (c.get("boots") or [0])[0] < 2)):
                continue
            why, worth = f"{c['verdict']} {c['effect']:+.1%} after {c['boots'][0]} boot(s) here", c["effect"]
            if outruns(state, key, called=True):
                continue                        # the likelier move first: this one is read again there
        else:
            at = next((k for k in reversed(cmp) if k[1] == key[0] and k[2] == key[1]), None)   # its latest, any incumbent
            if key not in running or at is None or cmp[at].get("verdict") != Verdict.BETTER:
                continue
            read = cmp[at]["effect"]
            worth = carried_effect(state, at[0], key[0], read)
            if worth <= 0:
                continue                        # its lever moved since: it read better beside the value that won
            why = f"better at an earlier incumbent ({read:+.1%})"
        if best is None or worth > best[0]:
            best = (worth, a, why)
    if best is None:
        return None
    _, a, why = best
    return Proposal("confirm", a.change, why=f"twin of arm {a.n} ({a.box}): {why}; this box's blocks beside it")


def pending_moves(state: State) -> list[tuple[dict, object]]:
    """(comparison, arm) of the challengers at the incumbent that read better (``promising``) on
    two boots or more, or are called better, and wait only for incumbent boots around theirs (an
    open block): the likely next incumbents, best reading first."""
    inc = state.incumbent_key
    out = []
    for (k, name, vt), c in state.latest_comparisons().items():
        if k != inc or not c.get("open") or not promising(c):
            continue
        if c.get("verdict") != Verdict.BETTER and (c.get("boots") or [0])[0] < AHEAD_BOOTS:
            continue
        arm = state.arms.get(c.get("arm"))
        if arm is not None and arm.change is not None and arm.incumbent == inc and arm.end is not None:
            out.append((c, arm))
    out.sort(key=lambda x: -x[0]["effect"])
    return out


def ahead(state: State, box: str, policy: Callable[[State], Proposal | None],
          moves: list[tuple[dict, object]] | None = None) -> Proposal | None:
    """On a shared campaign: this box's next arm at the incumbent-to-be (tuner/night/ahead.py).
    For the likeliest pending move (``pending_moves``, or ``moves``: the one landing): a box with
    no boot of that shape yet boots it (a twin: more evidence for the move, and this box's own boot
    of the incumbent-to-be); a box with one measures the next neighbour there, by ``policy`` (the
    search's, as at the incumbent, never itself working ahead). Off with ``AHEAD``."""
    if not AHEAD or not others_at_work(state, box):
        return None                             # one box: its next arm is the bracket itself, nothing to overlap
    for c, arm in pending_moves(state) if moves is None else moves:
        if state.boots_of(arm.key, box) < 1:
            tried = any(a.box == box and a.key == arm.key and a.incumbent == state.incumbent_key
                        for a in state.arms.values())       # one that failed to boot here: not again
            running = running_of(state, arm)
            if tried or running >= AHEAD_TWINS or c["boots"][0] + running >= BOOTS_CAP:
                continue
            return Proposal("confirm", arm.change, why=f"twin of arm {arm.n} ({arm.box}): ahead — {c['verdict']} "
                                                       f"{c['effect']:+.1%} after {c['boots'][0]} boot(s) waits for "
                                                       "its blocks; this box's boot of the likely next incumbent")
        view = supposing(state, arm.n)
        p = policy(view)
        if p is not None and p.kind in ("probe", "confirm", "recheck"):
            return replace(p, ahead=arm.n, why=f"ahead of arm {arm.n} ({arm.change[0]} -> "
                                               f"{values.text(arm.change[1])}): {p.why}")
    return None


def join(state: State, best: tuple, box: str, busy: set) -> Proposal | None:
    """On a shared campaign: when the challenger of highest expected gain this box can take is an
    undecided one another box is booting now (one ranked above it that another box probes for the
    first time is not this box's to take), this box boots it beside (up to ``JOIN`` boxes at once):
    a small effect needs several bracketed boots, and boxes booting it side by side gather them in
    the time one box takes for one (each box's blocks are its own)."""
    _, name, value, why = best
    key = (name, values.text(value))
    if JOIN <= 1 or key not in busy:
        return None
    c = state.comparison_at(state.incumbent_key, *key)
    if c is None or c.get("verdict") != Verdict.UNDECIDED or (c.get("effect") or 0) <= 0:
        return None
    running = running_here(state).get(key, [])
    if not running or len(running) >= JOIN or any(a.box == box for a in running) \
            or c["boots"][0] + len(running) >= BOOTS_CAP:
        return None
    a = running[0]
    return Proposal("confirm", (name, value), why=f"twin of arm {a.n} ({a.box}): the best expected gain, {why}; "
                                                  "this box's blocks beside it")


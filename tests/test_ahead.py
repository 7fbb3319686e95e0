"""Working ahead of a move on a shared campaign (tuner/night/ahead.py, tuner/night/sharing.py):
the state as if a pending challenger led, the policy run on it, and what a box with and without a
boot of that challenger is given."""
from __future__ import annotations

import math
import random

from arms.shape import ABSENT, Lever
from tests.test_search import BASE, LEVERS
from tuner.night import sharing
from tuner.night.ahead import still_ahead, supposing
from tuner.night.blocks import Boot, boot_spread
from tuner.night.journal import Journal
from tuner.night.judging import Judging
from tuner.night.gain import promising
from tuner.night.proposal import apply
from tuner.night.search import candidates, encode_value, propose
from tuner.night.sharing import pending_moves
from tuner.night.state import replay

C = ("env.R4D_LRU_GATHER_CHUNKS", 32)
SC = lambda o: {"feasible": True, "violation": 0.0, "objective": o}  # noqa: E731
MEASURED = {"outcome": "measured", "depths": {}}


class Night:
    """A shared campaign's journal written by hand: arms of named boxes, some still running."""

    def __init__(self, tmp_path, boxes: str, start=("baseline", "recheck")):
        self.j = Journal(tmp_path / "j.jsonl")
        self.n = 0
        for kind, obj in zip(start, (26.0, 26.1)):                      # each box's own pair of the start
            for box in boxes:
                self.arm(box, kind, verdict=kind, obj=obj)

    def start(self, box, kind, change=None, base=BASE, ahead=None):
        n, self.n = self.n, self.n + 1
        shape = base.with_change(*change) if change else base
        self.j.append("arm_start", arm=n, kind=kind, shape=shape.to_dict(), incumbent=base.key(), trial=n, box=box,
                      change=[change[0], encode_value(change[1])] if change else None,
                      **({"ahead": ahead} if ahead is not None else {}))
        return n

    def end(self, n, verdict, obj):
        self.j.append("arm_end", arm=n, verdict=verdict, score=SC(obj), measurement=MEASURED)

    def arm(self, box, kind, change=None, verdict="parity", obj=30.0, **kw):
        n = self.start(box, kind, change, **kw)
        self.end(n, verdict, obj)
        return n

    def compare(self, n, change, effect, boots, blocks, base=BASE, verdict="undecided", se=0.015):
        self.j.append("compare", arm=n, incumbent=base.key(), change=[change[0], encode_value(change[1])], look=n,
                      comparison={"verdict": verdict, "effect": effect, "lo": effect - 3 * se, "hi": effect + 3 * se,
                                  "se": se, "boots": [boots, 4], "runs": [9 * boots, 36], "alpha": 1e-5,
                                  "sigma": [0.03, 0.03], "open": sum(not c for _, c in blocks),
                                  "blocks": [{"boot": b, "closed": c} for b, c in blocks]})

    def better_on_two(self, box):
        """C called better (+10 %) on ``box``'s probe and its second boot, both blocks open."""
        p1 = self.arm(box, "probe", C, verdict="better", obj=28.6)
        self.compare(p1, C, 0.10, 1, [(p1, False)], verdict="better")
        p2 = self.arm(box, "confirm", C, verdict="better", obj=28.7)
        self.compare(p2, C, 0.10, 2, [(p1, False), (p2, False)], verdict="better")
        return p1, p2

    def state(self):
        return replay(self.j.records, BASE, LEVERS)


def pending_night(tmp_path) -> tuple[Night, int]:
    """Boxes a, b, c at the start; C read +10 % on a (arm 6, bracketed by arm 8) and on b (arm 7,
    its block still open): a pending move."""
    nt = Night(tmp_path, "abc")
    a = nt.arm("a", "probe", C, verdict="undecided", obj=28.6)
    nt.compare(a, C, 0.10, 1, [(a, False)])
    b = nt.arm("b", "confirm", C, verdict="undecided", obj=28.7)
    nt.compare(b, C, 0.10, 2, [(a, False), (b, False)])
    r = nt.arm("a", "recheck", verdict="recheck", obj=26.0)
    nt.compare(a, C, 0.10, 2, [(a, True), (b, False)])      # a's block closed by its recheck (bracketed)
    return nt, r


def test_the_supposed_state_leads_with_the_pending_challenger_and_leaves_the_real_one_alone(tmp_path):
    nt, _ = pending_night(tmp_path)
    st = nt.state()
    (c, arm), = pending_moves(st)
    assert arm.n == 6 and promising(c) and c["open"] == 1
    view = supposing(st, arm.n)
    assert view.incumbent == BASE.with_change(*C) and view.incumbent_key == arm.key != st.incumbent_key
    assert sorted(view.samples) == [28.6, 28.7]                     # its boots are the incumbent's samples
    assert view.moves[-1]["supposed"] and str(view.moves[-1]["previous_value"]) == "8"
    assert st.incumbent == BASE and st.incumbent_key == BASE.key() and not st.moves and 28.6 not in st.samples
    moves = [(name, v) for _, name, v, _ in candidates(view, LEVERS)]
    assert C not in moves and ("env.R4D_LRU_GATHER_CHUNKS", 8) not in moves   # neither itself nor its undo
    assert ("max-num-seqs", 2) in moves


def test_a_box_that_booted_the_pending_challenger_measures_its_neighbours_ahead(tmp_path, monkeypatch):
    nt, _ = pending_night(tmp_path)
    st = nt.state()
    p = propose(st, LEVERS, box="a")
    assert p.ahead == 6 and p.kind == "probe" and p.why.startswith("ahead of arm 6"), p
    shape = apply(supposing(st, 6).incumbent, p.change)
    assert str(shape.value_of(C[0])) == "32" and len(shape.diff(BASE)) == 2, shape.diff(BASE)
    # b's block of it is still open: b closes it first; c has no boot of it: c boots it (a twin)
    assert propose(st, LEVERS, box="b").kind == "recheck"
    pc = propose(st, LEVERS, box="c")
    assert pc.kind == "confirm" and pc.change == C and pc.ahead is None and pc.why.startswith("twin of arm 6")
    monkeypatch.setattr(sharing, "AHEAD", False)
    plain = propose(st, LEVERS, box="a")
    assert plain.ahead is None and plain.kind == "probe"


def test_a_box_leaves_its_bracket_for_later_while_two_boots_of_the_challenger_have_theirs(tmp_path, monkeypatch):
    """C read better on a's two boots and on b's twin, every block open. While nothing closes a's
    blocks, b brackets its own; once a's recheck runs (it closes two boots: what a move rests on), b
    works ahead of the move on its boot of C. Once a's blocks closed and moved nothing, b closes its
    own."""
    nt = Night(tmp_path, "ab")
    p1 = nt.arm("a", "probe", C, verdict="better", obj=28.6)
    nt.compare(p1, C, 0.10, 1, [(p1, False)], verdict="better")
    p2 = nt.arm("a", "confirm", C, verdict="better", obj=28.7)
    tw = nt.arm("b", "confirm", C, verdict="better", obj=28.7)
    nt.compare(tw, C, 0.10, 3, [(p1, False), (p2, False), (tw, False)])
    st = nt.state()
    assert sharing.in_hand(st, st.latest_comparisons()[(BASE.key(), C[0], "32")], "b") == 0
    assert propose(st, LEVERS, box="b").why.startswith(f"bracket arm {tw}")
    nt.start("a", "recheck")                                         # a closes its two now
    st = nt.state()
    assert sharing.in_hand(st, st.latest_comparisons()[(BASE.key(), C[0], "32")], "b") == 2
    p = propose(st, LEVERS, box="b")
    assert p.ahead == tw and p.kind == "probe" and p.why.startswith(f"ahead of arm {tw}"), p
    monkeypatch.setattr(sharing, "BRACKET_IN_HAND", False)
    assert propose(st, LEVERS, box="b").kind == "recheck"      # (it reads promising, not called better: no landing)
    monkeypatch.setattr(sharing, "BRACKET_IN_HAND", True)
    assert sharing.in_hand(st, st.latest_comparisons()[(BASE.key(), C[0], "32")], "a") == 0   # not a's own recheck
    nt.compare(tw, C, 0.10, 3, [(p1, True), (p2, True), (tw, False)])  # a's closed: undecided on them
    r = next(a for a in nt.state().open_arms)
    nt.end(r.n, "recheck", 26.0)
    assert propose(nt.state(), LEVERS, box="b").kind == "recheck", "closed blocks that moved nothing: b closes its own"


def test_a_box_boots_the_likelier_next_incumbent_before_confirming_a_challenger_it_outruns(tmp_path, monkeypatch):
    """C reads +10 % on a's two boots (its blocks open: a pending move); b's probe of another
    change reads better by less on one boot. b boots C (its own boot of the incumbent-to-be), not
    the second boot of its own, which the move would make to be judged again; a reading above C's
    is confirmed; one box alone confirms as before."""
    other = ("max-num-seqs", 3)
    nt = Night(tmp_path, "ab")
    p1, p2 = nt.better_on_two("a")
    q = nt.arm("b", "probe", other, verdict="better", obj=27.4)
    nt.compare(q, other, 0.05, 1, [(q, False)], verdict="better")
    st = nt.state()
    p = propose(st, LEVERS, box="b")
    assert p.kind == "confirm" and p.change == C and p.why.startswith(f"twin of arm {p1}"), p
    assert propose(st, LEVERS).why == f"confirm arm {q}: a second boot"          # one box: as before
    monkeypatch.setattr(sharing, "OUTRUN", False)
    assert propose(st, LEVERS, box="b").why == f"confirm arm {q}: a second boot"
    monkeypatch.setattr(sharing, "OUTRUN", True)
    nt.compare(q, other, 0.15, 1, [(q, False)], verdict="better")
    assert propose(nt.state(), LEVERS, box="b").why == f"confirm arm {q}: a second boot"


def test_a_box_boots_the_incumbent_to_be_before_the_incumbent_a_landing_move_replaces(tmp_path, monkeypatch):
    """C reads +10 % on a's two boots and a is closing both now (the move is landing); box c's own
    probe of another change reads +12 % on two boots, its blocks open. c's bracket of it would boot
    the incumbent that a's move is about to replace: c boots C instead (its own boot of the
    incumbent-to-be, ahead of that move), and brackets its own once the move did not come."""
    other = ("max-num-seqs", 3)
    nt = Night(tmp_path, "abc")
    p1, p2 = nt.better_on_two("a")
    q1 = nt.arm("c", "probe", other, verdict="undecided", obj=29.1)
    q2 = nt.arm("c", "confirm", other, verdict="undecided", obj=29.2)
    nt.compare(q2, other, 0.12, 2, [(q1, False), (q2, False)], se=0.03)
    st = nt.state()
    assert sharing.landing(st, "c") is None                          # nothing closes C's boots yet
    assert propose(st, LEVERS, box="c").why.startswith(f"bracket arm {q2}")
    r = nt.start("a", "recheck")                                     # a closes its two now
    st = nt.state()
    c, arm = sharing.landing(st, "c")
    assert arm.challenger == (C[0], "32") and sharing.landing(st, "a") is None   # a's own recheck: no landing for a
    p = propose(st, LEVERS, box="c")
    assert p.kind == "confirm" and p.change == C and "ahead" in p.why, p
    monkeypatch.setattr(sharing, "LANDING", False)
    assert propose(st, LEVERS, box="c").why.startswith(f"bracket arm {q2}")
    monkeypatch.setattr(sharing, "LANDING", True)
    nt.compare(p2, C, 0.10, 2, [(p1, False), (p2, False)])          # only promising, not called better:
    assert sharing.landing(nt.state(), "c") is None                  # it may need more boots than these two
    assert propose(nt.state(), LEVERS, box="c").why.startswith(f"bracket arm {q2}")
    nt.end(r, "recheck", 26.0)
    nt.compare(p2, C, 0.01, 2, [(p1, True), (p2, True)], verdict="parity")   # closed: no move
    assert propose(nt.state(), LEVERS, box="c").why.startswith(f"bracket arm {q2}")


def test_a_challenger_a_likelier_move_outruns_gets_no_twin_and_no_bracket(tmp_path, monkeypatch):
    """C reads +10 % on three boots (a's two still open: a likely next incumbent); box b's other
    change reads +5 % on its two boots, open. b does not bracket its own (the move would have it
    judged again) but boots C, its boot of the incumbent-to-be; c, whose boot of C is closed
    already, gives b's change no twin but measures C's neighbours ahead of the move."""
    other = ("max-num-seqs", 3)
    nt = Night(tmp_path, "abc")
    p1 = nt.arm("a", "probe", C, verdict="better", obj=28.6)
    p2 = nt.arm("a", "confirm", C, verdict="better", obj=28.7)
    tw = nt.arm("c", "confirm", C, verdict="better", obj=28.7)
    nt.arm("c", "recheck", verdict="recheck", obj=26.0)
    nt.compare(tw, C, 0.10, 3, [(p1, False), (p2, False), (tw, True)], verdict="better")
    q1 = nt.arm("b", "probe", other, verdict="better", obj=27.3)
    q2 = nt.arm("b", "confirm", other, verdict="better", obj=27.3)
    nt.compare(q2, other, 0.05, 2, [(q1, False), (q2, False)], verdict="better")
    st = nt.state()
    assert sharing.outruns(st, (other[0], "3")) and not sharing.outruns(st, (C[0], "32"))
    pb = propose(st, LEVERS, box="b")
    assert pb.kind == "confirm" and pb.change == C and pb.why.startswith(f"twin of arm {p1}"), pb
    pc = propose(st, LEVERS, box="c")
    assert pc.kind == "probe" and pc.ahead == tw, pc
    monkeypatch.setattr(sharing, "OUTRUN", False)
    assert propose(st, LEVERS, box="b").why.startswith(f"bracket arm {q2}")
    pc = propose(st, LEVERS, box="c")
    assert pc.kind == "confirm" and pc.change == other and pc.why.startswith(f"twin of arm {q1}"), pc


def test_an_arm_begun_ahead_waits_while_its_base_is_pending_and_not_after(tmp_path):
    nt, _ = pending_night(tmp_path)
    base = BASE.with_change(*C)
    d = nt.arm("a", "probe", ("max-num-seqs", 2), verdict="undecided", obj=30.0, base=base, ahead=6)
    nt.compare(d, ("max-num-seqs", 2), 0.05, 1, [(d, False)], base=base)
    st = nt.state()
    assert still_ahead(st, st.arms[d], promising)
    nt.compare(6, C, -0.01, 3, [(6, True), (7, True)], verdict="parity")    # C's blocks closed: no move
    st = nt.state()
    assert not pending_moves(st) and not still_ahead(st, st.arms[d], promising)


def test_boxes_boot_the_undecided_challenger_of_highest_expected_gain_side_by_side(tmp_path):
    nt = Night(tmp_path, "ab")
    a = nt.arm("a", "probe", C, verdict="undecided", obj=27.0)
    nt.compare(a, C, 0.04, 1, [(a, True)], se=0.03)               # +4 % ± 3 %: worth more boots
    again = nt.start("a", "probe", C)                              # a boots it again now
    st = nt.state()
    best = candidates(st, LEVERS)[0]
    assert (best[1], best[2]) == C, best                           # the highest expected gain
    p = propose(st, LEVERS, box="b")
    assert p.kind == "confirm" and p.change == C and p.why.startswith(f"twin of arm {again} (a)"), p
    busy = {(C[0], "32")}
    assert sharing.join(st, best, "a", busy) is None                 # never beside itself
    nt.end(again, "undecided", 27.1)
    nt.compare(again, C, -0.01, 2, [(a, True), (again, True)], verdict="undecided", se=0.02)
    nt.start("a", "probe", C)
    st = nt.state()
    assert sharing.join(st, best, "b", busy) is None, "a reading at or below zero is not joined"
    nt.compare(again, C, 0.03, 4, [(a, True), (again, True)], verdict="undecided", se=0.02)
    assert sharing.join(nt.state(), best, "b", busy) is None, "4 boots and 1 running reach the boot cap"


def test_a_box_joins_the_undecided_challenger_below_a_change_another_box_probes_first(tmp_path):
    """The change of highest expected gain is one box c probes for the first time now, the next an
    undecided one box a boots again: box b joins a (an untried change is not two boxes' at once,
    the undecided one gathers its boots faster side by side)."""
    levers = {"expert-prefetch": Lever.from_spec("expert-prefetch", ["absent", 1]), C[0]: LEVERS[C[0]]}
    nt = Night(tmp_path, "abc")
    a = nt.arm("a", "probe", C, verdict="undecided", obj=26.6)
    nt.compare(a, C, 0.02, 1, [(a, True)])                         # +2 % ± 1.5 %: below an untried change
    again = nt.start("a", "probe", C)
    nt.start("c", "probe", ("expert-prefetch", ABSENT))
    st = nt.state()
    ranked = [(x[1], x[2]) for x in candidates(st, levers)]
    assert ranked == [("expert-prefetch", ABSENT), C], ranked
    p = propose(st, levers, box="b")
    assert p.kind == "confirm" and p.change == C and p.why.startswith(f"twin of arm {again} (a)"), p


def test_an_arm_begun_ahead_stops_waiting_once_another_move_came_first(tmp_path):
    nt, _ = pending_night(tmp_path)
    base = BASE.with_change(*C)
    d = nt.arm("a", "probe", ("max-num-seqs", 2), verdict="undecided", obj=30.0, base=base, ahead=6)
    nt.compare(d, ("max-num-seqs", 2), 0.05, 1, [(d, False)], base=base)
    e = nt.arm("c", "confirm", ("expert-prefetch", 2), verdict="better", obj=31.0)
    other = BASE.with_change("expert-prefetch", 2)
    nt.j.append("incumbent", arm=e, shape=other.to_dict(), identity=other.key(), score=SC(31.0), samples=[31.0])
    nt.compare(6, C, 0.10, 2, [(6, False)], base=other)            # C again, at the new incumbent: another shape
    st = nt.state()
    assert st.incumbent_key == other.key() and not still_ahead(st, st.arms[d], promising)


def test_a_box_whose_boot_of_the_pending_challenger_failed_does_not_boot_it_again(tmp_path):
    nt, _ = pending_night(tmp_path)
    n = nt.start("c", "confirm", C)
    nt.j.append("arm_end", arm=n, verdict="boot-failed:oom", score=None)
    p = propose(nt.state(), LEVERS, box="c")
    assert not (p.kind == "confirm" and p.change == C), p


class Promoter(Judging):
    """``Judging._settled_wins`` over a hand-written journal: a move is an ``incumbent`` record."""

    def __init__(self, nt):
        self.nt = nt

    def _replay(self):
        return self.nt.state()

    def _promote(self, st, n, comparison=None):
        if any(m.get("arm") == n for m in st.moves):
            return
        a = st.arms[n]
        self.nt.j.append("incumbent", arm=n, shape=a.shape.to_dict(), identity=a.key, score=SC(30.0), samples=[30.0],
                         previous=a.incumbent, change=[a.change[0], encode_value(a.change[1])])


def test_a_win_decided_ahead_moves_the_incumbent_once_its_base_leads(tmp_path):
    """D won at I+C while C still waited for its blocks (judged there, it moved nothing); C's move
    makes I+C the incumbent, and D's win is then a move at once, chained in one pass."""
    nt, _ = pending_night(tmp_path)
    base = BASE.with_change(*C)
    d = nt.arm("a", "probe", ("max-num-seqs", 2), verdict="better", obj=33.0, base=base, ahead=6)
    nt.compare(d, ("max-num-seqs", 2), 0.08, 2, [(d, True)], base=base, verdict="better")
    st = Promoter(nt)._settled_wins(nt.state())
    assert st.incumbent_key == BASE.key() and not st.moves            # C has not moved: nothing
    nt.compare(6, C, 0.10, 3, [(6, True), (7, True)], verdict="better")
    st = Promoter(nt)._settled_wins(nt.state())
    assert [m["arm"] for m in st.moves] == [6, d] and st.incumbent == base.with_change("max-num-seqs", 2)


def test_a_box_boots_its_first_challenger_before_its_second_boot_of_the_start(tmp_path, monkeypatch):
    """On a shared campaign a box's second boot of the start follows its first challenger and
    closes that challenger's block (A B A), unless that challenger was called better on its one
    boot: then its second boot comes first (A B B A, as on one box; ``CONFIRM_FIRST``). A first
    challenger read better on its one boot, its block closed, gets its second boot from a box
    with none of it yet. One box measures the start
    twice first, as before; with the flag off every box does."""
    nt = Night(tmp_path, "abc", start=("baseline",))
    st = nt.state()
    first = propose(st, LEVERS, box="a")
    assert first.kind == "probe", first
    (tmp_path / "solo").mkdir()
    solo = Night(tmp_path / "solo", "a", start=("baseline",))
    assert propose(solo.state(), LEVERS, box="a").why.startswith("re-measure the starting shape at once")
    assert propose(solo.state(), LEVERS).why.startswith("re-measure the starting shape at once")
    monkeypatch.setattr(sharing, "PROBE_FIRST", False)
    assert propose(st, LEVERS, box="a").why.startswith("re-measure the starting shape at once")
    monkeypatch.setattr(sharing, "PROBE_FIRST", True)

    p = nt.arm("a", "probe", C, verdict="better", obj=28.6)
    nt.compare(p, C, 0.10, 1, [(p, False)], verdict="better")
    again = propose(nt.state(), LEVERS, box="a")                         # called better: B B, then A (CONFIRM_FIRST)
    assert again.kind == "confirm" and again.change == C and again.why.startswith(f"confirm arm {p}"), again
    monkeypatch.setattr(sharing, "CONFIRM_FIRST", False)
    assert propose(nt.state(), LEVERS, box="a").why.startswith("re-measure the starting shape at once")
    nt.arm("a", "recheck", verdict="recheck", obj=26.0)
    nt.compare(p, C, 0.10, 1, [(p, True)], verdict="better")           # its block closed: A B A on a
    x = nt.arm("b", "probe", ("max-num-seqs", 2), verdict="worse", obj=20.0)
    monkeypatch.setattr(sharing, "CONFIRM_FIRST", True)                  # not called better: A B A as before
    assert propose(nt.state(), LEVERS, box="b").why.startswith("re-measure the starting shape at once")
    nt.arm("b", "recheck", verdict="recheck", obj=26.1)
    nt.arm("c", "recheck", verdict="recheck", obj=26.1)                 # c measured the start twice
    st = nt.state()
    assert st.finished()[-1].n > x
    tw = propose(st, LEVERS, box="c")
    assert tw.kind == "confirm" and tw.change == C and tw.why.startswith(f"twin of arm {p} (a)"), tw
    assert propose(st, LEVERS, box="a").change != C                     # a has its boot of it
    monkeypatch.setattr(sharing, "PROBE_FIRST", False)
    assert propose(st, LEVERS, box="c").change != C, "without the flag a closed single boot waits"


def box_axis(st) -> dict[int, float]:
    """Each started arm's place on the comparison's axis (``State.place``)."""
    return {n: st.place(n, a.box) for n, a in st.arms.items()}


def test_a_box_s_boots_sit_on_its_own_arms_axis_where_their_pairs_are_read(tmp_path):
    """On a shared campaign the arm numbers advance once per arm of any box: four boxes put one
    box's successive boots four times further apart there. Each boot is placed on its own box's
    arms (``State.place``), so a box's two boots of the start five of its arms apart are a boot pair
    (``blocks.PAIR_GAP``) as on one box, not 20 campaign arms apart and dropped. One box: the
    axis is the arm order itself."""
    nt = Night(tmp_path, "abcd")                                       # arms 0-3 baselines, 4-7 rechecks
    for _ in range(3):
        for box in "abcd":
            nt.arm(box, "probe", C, verdict="undecided", obj=28.0)    # arms 8-19
    for box in "abcd":
        nt.arm(box, "recheck", verdict="recheck", obj=26.0)           # arms 20-23
    st = nt.state()
    axis = box_axis(st)
    assert [axis[n] for n in (0, 4, 8, 12, 16, 20)] == [0, 1, 2, 3, 4, 5]          # box a's own arms
    assert [axis[n] for n in (3, 7, 11, 15, 19, 23)] == [0, 1, 2, 3, 4, 5]         # box d's
    rng = random.Random(3)

    def boots(place):
        return [[Boot(n, place(n), {"512": [math.log(26.0) + rng.gauss(0, 0.01) for _ in range(6)]},
                      box=st.arms[n].box) for n in sorted(st.arms) if st.arms[n].box == box and st.arms[n].kind
                 in ("baseline", "recheck")] for box in "abcd"]
    own, campaign = boot_spread(boots(axis.get)), boot_spread(boots(float))
    assert (own.pairs, campaign.pairs) == (8, 4)        # baseline->recheck on each box, and recheck->recheck 16 arms on

    one = Night(tmp_path / "one", "a")
    for _ in range(4):
        one.arm("a", "probe", C, verdict="undecided", obj=28.0)
    assert box_axis(one.state()) == {n: float(n) for n in range(6)}

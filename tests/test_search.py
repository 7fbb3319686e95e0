"""The one-change policy over replayed state (pure: no I/O, no clock)."""
from __future__ import annotations

import math

import pytest

from arms.shape import ABSENT, Lever, Shape
from tuner.night.journal import Journal
from tuner.night.gain import BOOTS_CAP, DECIDE_Z
from tuner.night.search import candidates, encode_value, propose
from tuner.night.state import replay

IMG = "localhost/x@sha256:" + "b" * 64
BASE = Shape.from_mapping({"image": IMG, "model": "/m", "args": {"expert-prefetch": 1, "max-num-seqs": 4},
                           "env": {"R4D_LRU_GATHER_CHUNKS": 8}})
LEVERS = {"expert-prefetch": Lever.from_spec("expert-prefetch", ["absent", 1, 2]),
          "max-num-seqs": Lever.from_spec("max-num-seqs", [2, 3, 4]),
          "env.R4D_LRU_GATHER_CHUNKS": Lever.from_spec("env.R4D_LRU_GATHER_CHUNKS", [8, 32])}
SC = lambda o, f=True, v=0.0: {"feasible": f, "violation": v, "objective": o}  # noqa: E731


class J:
    def __init__(self, tmp_path):
        self.j = Journal(tmp_path / "j.jsonl")
        self.inc = BASE

    def arm(self, kind, change=None, verdict="parity", obj=30.0, **extra):
        n = len([r for r in self.j.records if r["op"] == "arm_start"])
        shape = self.inc.with_change(*change) if change else self.inc
        self.j.append("arm_start", arm=n, kind=kind, shape=shape.to_dict(), incumbent=self.inc.key(), trial=n,
                      change=[change[0], encode_value(change[1])] if change else None)
        self.j.append("arm_end", arm=n, kind=kind, verdict=verdict, score=SC(obj), **extra)
        return n, shape

    def move(self, n, shape, obj):
        self.j.append("incumbent", arm=n, shape=shape.to_dict(), score=SC(obj), samples=[obj])
        self.inc = shape

    def state(self):
        return replay(self.j.records, BASE)


def test_first_the_baseline_then_every_neighbour_once(tmp_path):
    j = J(tmp_path)
    assert propose(j.state(), LEVERS).kind == "baseline"
    j.arm("baseline", verdict="baseline", obj=26.0)
    p = propose(j.state(), LEVERS)
    assert p.kind == "recheck" and "at once" in p.why                     # the first noise estimate
    j.arm("recheck", verdict="recheck", obj=26.2)
    cands = candidates(j.state(), LEVERS)
    assert [(c[1], c[2]) for c in cands] == [("expert-prefetch", ABSENT), ("expert-prefetch", 2),
                                              ("max-num-seqs", 2), ("max-num-seqs", 3),
                                              ("env.R4D_LRU_GATHER_CHUNKS", 32)]


def test_a_win_is_confirmed_before_anything_else_and_then_neighbours_are_rejudged(tmp_path):
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    j.arm("probe", ("max-num-seqs", 3), verdict="better", obj=27.0, delta=0.04)
    p = propose(j.state(), LEVERS)
    assert p.kind == "confirm" and p.change == ("max-num-seqs", 3)
    n, shape = j.arm("confirm", ("max-num-seqs", 3), verdict="better", obj=27.1)
    j.move(n, shape, 27.1)
    st = j.state()
    assert st.incumbent == shape
    order = [(c[1], c[2], c[3]) for c in candidates(st, LEVERS)]
    assert ("max-num-seqs", 3) not in [(o[0], o[1]) for o in order]          # the incumbent's own value


def test_structural_failures_are_never_repeated_memory_ones_only_at_a_new_incumbent(tmp_path):
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    j.arm("probe", ("max-num-seqs", 2), verdict="boot-failed:constraint-violation", obj=None)
    j.arm("probe", ("env.R4D_LRU_GATHER_CHUNKS", 32), verdict="boot-failed:oom", obj=None)
    j.arm("probe", ("expert-prefetch", ABSENT), verdict="better", obj=39.0, delta=0.5)
    n, shape = j.arm("confirm", ("expert-prefetch", ABSENT), verdict="better", obj=39.2)
    j.move(n, shape, 39.2)
    cands = {(c[1], c[2]): c[3] for c in candidates(j.state(), LEVERS)}
    assert ("max-num-seqs", 2) not in cands
    assert cands[("env.R4D_LRU_GATHER_CHUNKS", 32)] == "memory failure at an earlier incumbent"
    first = candidates(j.state(), LEVERS)[0]
    assert first[3].startswith("untried")


def test_recheck_every_k_arms(tmp_path):
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    for v in (2, 3):
        j.arm("probe", ("max-num-seqs", v), verdict="worse", obj=25.0, delta=-0.04)
    assert propose(j.state(), LEVERS, recheck_every=2).kind == "recheck"
    assert propose(j.state(), LEVERS, recheck_every=3).kind == "probe"


def test_an_interrupted_confirmation_is_confirmed_again(tmp_path):
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    j.arm("probe", ("expert-prefetch", ABSENT), verdict="better", obj=39.0, delta=0.5)
    j.arm("confirm", ("expert-prefetch", ABSENT), verdict="interrupted", obj=None)
    p = propose(j.state(), LEVERS)
    assert p.kind == "confirm" and p.change == ("expert-prefetch", ABSENT)


def test_nothing_left_ends_the_search(tmp_path):
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    for lever, lv in LEVERS.items():
        for v in lv.values:
            if j.state().incumbent.value_of(lever) != v and not (v is ABSENT and j.state().incumbent.value_of(lever) is ABSENT):
                j.arm("probe", (lever, v), verdict="worse", obj=20.0, delta=-0.2)
    assert propose(j.state(), LEVERS, recheck_every=0) is None


def _cmp(j, n, change, verdict, effect, lo, hi, boots=1):
    j.j.append("compare", arm=n, incumbent=j.inc.key(), change=[change[0], encode_value(change[1])], look=n,
               comparison={"verdict": verdict, "effect": effect, "lo": lo, "hi": hi, "se": 0.01, "boots": [boots, 2],
                           "runs": [9 * boots, 18], "alpha": 0.001, "sigma": [0.03, 0.03]})


def test_an_undecided_challenger_gets_another_boot_and_a_decided_night_is_spent_not_ended(tmp_path):
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    n, _ = j.arm("probe", ("expert-prefetch", ABSENT), verdict="better", obj=28.0, delta=0.07)
    _cmp(j, n, ("expert-prefetch", ABSENT), "better", 0.07, 0.03, 0.1)
    n, shape = j.arm("confirm", ("expert-prefetch", ABSENT), verdict="better", obj=28.1, delta=0.07)
    _cmp(j, n, ("expert-prefetch", ABSENT), "better", 0.07, 0.04, 0.1, boots=2)
    j.j.append("incumbent", arm=n, shape=shape.to_dict(), score=SC(28.1), samples=[28.1],
               change=["expert-prefetch", encode_value(ABSENT)], previous_value=encode_value(1))
    j.inc = shape
    j.arm("recheck", verdict="recheck", obj=28.0)
    decided = {("expert-prefetch", 2): ("worse", -0.05, -0.08, -0.02), ("max-num-seqs", 2): ("parity", 0.0, -0.01, 0.008),
               ("max-num-seqs", 3): ("undecided", 0.01, -0.02, 0.03), ("env.R4D_LRU_GATHER_CHUNKS", 32): ("worse", -0.1, -0.2, -0.05)}
    for ch, (v, e, lo, hi) in decided.items():
        n, _ = j.arm("probe", ch, verdict=v, obj=28.0 * (1 + e), delta=e)
        _cmp(j, n, ch, v, e, lo, hi)
    p = propose(j.state(), LEVERS, recheck_every=0)
    assert p.kind == "probe" and p.change == ("max-num-seqs", 3) and "undecided" in p.why     # another boot
    for boots in range(2, BOOTS_CAP + 1):
        n, _ = j.arm("probe", ("max-num-seqs", 3), verdict="undecided", obj=28.1, delta=0.004)
        _cmp(j, n, ("max-num-seqs", 3), "undecided", 0.004, -0.01, 0.015, boots=boots)
    p = propose(j.state(), LEVERS, recheck_every=0)          # every one decided or at its cap: re-examine
    # seqs 2 (parity, 1 boot) can still prove more than seqs 3 (undecided, at its boot cap)
    assert p.kind == "probe" and p.change == ("max-num-seqs", 2) and p.why.startswith("re-examine")
    n, _ = j.arm("probe", ("max-num-seqs", 2), verdict="parity", obj=28.0, delta=0.0)
    _cmp(j, n, ("max-num-seqs", 2), "parity", 0.0, -0.005, -0.001, boots=2)
    p = propose(j.state(), LEVERS, recheck_every=0)
    assert p.kind == "probe" and p.change == ("max-num-seqs", 3) and p.why.startswith("re-examine")
    n, _ = j.arm("probe", ("max-num-seqs", 3), verdict="parity", obj=28.0, delta=0.0)
    _cmp(j, n, ("max-num-seqs", 3), "parity", 0.0, -0.005, -0.001, boots=BOOTS_CAP + 1)
    p = propose(j.state(), LEVERS, recheck_every=0)
    assert p.kind == "start"                                                      # the closing head-to-head


def test_the_incumbents_telemetry_points_at_prefetch_when_its_precision_is_low(tmp_path):
    """The arm's telemetry record as arms.telemetry writes it (report.summary.precision)."""
    j = J(tmp_path)
    tel = {"status": "ok", "report": {"summary": {"precision": 0.36, "hit_rate": 0.9}, "ranks": {}}}
    j.arm("baseline", verdict="baseline", obj=26.0, telemetry=tel)
    j.arm("recheck", verdict="recheck", obj=26.2, telemetry=tel)
    levers = {k: LEVERS[k] for k in ("max-num-seqs", "env.R4D_LRU_GATHER_CHUNKS", "expert-prefetch")}
    first = candidates(j.state(), levers)[0]
    assert first[1] == "expert-prefetch" and "prefetch precision 36%" in first[3]
    j2 = J(tmp_path / "b")
    j2.arm("baseline", verdict="baseline", obj=26.0)
    j2.arm("recheck", verdict="recheck", obj=26.2)
    assert candidates(j2.state(), levers)[0][1] == "max-num-seqs"           # no telemetry: listing order


def test_a_change_too_noisy_to_ever_decide_waits_behind_every_other_candidate():
    """A lever whose runs spread 40 %: at the last incumbent it read +2 % ± 10 % on three boots.
    Its effect is the most uncertain, so plain expected gain would try it first at every new
    incumbent; but at its boot cap it could only show an effect above ~+27 %, so it is worth
    less than an untried change and a change that read +1.5 % ± 1 %."""
    from tuner.night.gain import expected_gain, provable

    noisy = {"effect": 0.02, "se": 0.10, "boots": [3, 2], "hi": 0.2}
    quiet = {"effect": 0.015, "se": 0.01, "boots": [3, 2], "hi": 0.03}
    shrink = math.sqrt(3 / BOOTS_CAP)           # three boots so far, the standard error shrunk to the cap
    assert provable(noisy) == pytest.approx(DECIDE_Z * 0.10 * shrink) and provable(quiet) == pytest.approx(DECIDE_Z * 0.01 * shrink)
    assert expected_gain(0.02, 0.10) > expected_gain(0.0, 0.05) > expected_gain(0.015, 0.022)   # the old order
    assert expected_gain(0.02, 0.10, provable(noisy)) < expected_gain(0.015, 0.022, provable(quiet)) \
        < expected_gain(0.0, 0.05)


def test_the_policy_tries_an_untried_change_before_a_noisy_one_carried_over(tmp_path):
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    levers = {k: LEVERS[k] for k in ("max-num-seqs", "env.R4D_LRU_GATHER_CHUNKS")}
    for boots in (1, 2, 3):
        n, _ = j.arm("probe", ("max-num-seqs", 3), verdict="undecided", obj=26.5, delta=0.02)
        j.j.append("compare", arm=n, incumbent=j.inc.key(), change=["max-num-seqs", 3], look=n,
                   comparison={"verdict": "undecided", "effect": 0.02, "lo": -0.3, "hi": 0.25, "se": 0.10,
                               "boots": [boots, 2], "runs": [9 * boots, 18], "alpha": 0.001, "sigma": [0.4, 0.03]})
    n, shape = j.arm("probe", ("env.R4D_LRU_GATHER_CHUNKS", 32), verdict="better", obj=28.0, delta=0.07)
    _cmp(j, n, ("env.R4D_LRU_GATHER_CHUNKS", 32), "better", 0.07, 0.03, 0.1, boots=2)
    j.j.append("incumbent", arm=n, shape=shape.to_dict(), score=SC(28.0), samples=[28.0],
               change=["env.R4D_LRU_GATHER_CHUNKS", 32], previous_value=8)
    j.inc = shape
    j.arm("recheck", verdict="recheck", obj=28.0)
    p = propose(j.state(), levers, recheck_every=0)
    assert p.kind == "probe" and p.change == ("max-num-seqs", 2), p        # untried, before the noisy carry-over


def _open(j, n, change, verdict, effect, se, boots, open_):
    j.j.append("compare", arm=n, incumbent=j.inc.key(), change=[change[0], encode_value(change[1])], look=n,
               comparison={"verdict": verdict, "effect": effect, "lo": -0.05, "hi": effect + 0.05, "se": se,
                           "boots": [boots, 2], "runs": [9 * boots, 18], "alpha": 1e-5, "sigma": [0.03, 0.03],
                           "open": open_, "blocks": [{"boot": n, "closed": False}]})


def test_an_undecided_challenger_reading_well_above_zero_gets_its_bracket_and_an_erratic_one_does_not(tmp_path):
    """Early in a night the boot spread rests on a pair or two, so a +10 % reading on two open
    boots stays undecided: the incumbent is booted to close its blocks all the same. A lever whose
    boots spread so much that it could not prove +10 % at its boot cap is not bracketed."""
    ch = ("env.R4D_LRU_GATHER_CHUNKS", 32)
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    for boots in (1, 2):
        n, _ = j.arm("probe", ch, verdict="undecided", obj=28.6, delta=0.1)
        _open(j, n, ch, "undecided", 0.10, 0.015, boots, boots)
    p = propose(j.state(), LEVERS, recheck_every=0)
    assert p.kind == "recheck" and p.why.startswith(f"bracket arm {n}")
    j2 = J(tmp_path / "b")
    j2.arm("baseline", verdict="baseline", obj=26.0)
    j2.arm("recheck", verdict="recheck", obj=26.1)
    for boots in (1, 2, 3):
        n, _ = j2.arm("probe", ch, verdict="undecided", obj=28.6, delta=0.1)
        _open(j2, n, ch, "undecided", 0.10, 0.04, boots, boots)      # 2.4 se, but it could prove only ~+11 %
    p = propose(j2.state(), LEVERS, recheck_every=0)
    assert not (p.kind == "recheck" and p.why.startswith("bracket"))


def _after_a_move(tmp_path, pruned_delta, move_effect):
    """A probe of ``expert-prefetch: absent`` pruned at the first incumbent (it read ``pruned_delta``),
    then the incumbent moves by ``move_effect`` on another lever."""
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=26.0)
    j.arm("recheck", verdict="recheck", obj=26.1)
    j.arm("probe", ("expert-prefetch", ABSENT), verdict="worse", obj=26.0 * (1 + pruned_delta), delta=pruned_delta)
    ch = ("env.R4D_LRU_GATHER_CHUNKS", 32)
    n, shape = j.arm("confirm", ch, verdict="better", obj=26.0 * (1 + move_effect), delta=move_effect)
    _cmp(j, n, ch, "better", move_effect, move_effect - 0.02, move_effect + 0.02, boots=2)
    j.j.append("incumbent", arm=n, shape=shape.to_dict(), score=SC(26.0 * (1 + move_effect)), samples=[1.0],
               change=[ch[0], 32], previous_value=8, comparison={"effect": move_effect})
    j.inc = shape
    j.arm("recheck", verdict="recheck", obj=26.0 * (1 + move_effect))
    return j


def test_a_large_reading_carried_across_a_large_move_is_read_again_before_an_untried_change(tmp_path):
    """Interactions scale with the main effects they join: ``speculative-config: absent`` read -50 %
    at the first incumbent, then a +47 % move on a lever it works with; what it reads now is anyone's
    guess, so it is probed again before the untried changes. A -2 % reading carried across a +4 %
    move stays -2 % ± a little, and waits behind the untried."""
    from tuner.night.gain import carried_sigma

    big = _after_a_move(tmp_path / "big", -0.5, 0.47)
    first = candidates(big.state(), LEVERS)[0]
    assert (first[1], first[2]) == ("expert-prefetch", ABSENT) and "earlier incumbent" in first[3]
    small = _after_a_move(tmp_path / "small", -0.02, 0.04)
    order = [(c[1], c[2]) for c in candidates(small.state(), LEVERS)]
    assert order.index(("expert-prefetch", ABSENT)) > order.index(("max-num-seqs", 2))
    st = big.state()
    assert carried_sigma(st, 0.04, -0.5, 2) > 10 * carried_sigma(st, 0.04, -0.5, 99)   # nothing moved since arm 99
    assert carried_sigma(st, 0.04, -0.5, 2) > 2 * carried_sigma(st, 0.04, -0.02, 2)


def _moved(j, n, shape, change, previous_value, effect):
    j.j.append("incumbent", arm=n, shape=shape.to_dict(), score=SC(30.0), samples=[30.0], previous=j.inc.key(),
               change=[change[0], encode_value(change[1])], previous_value=encode_value(previous_value),
               comparison={"effect": effect})
    j.inc = shape


def test_a_value_read_beside_the_one_that_won_is_carried_from_the_winner(tmp_path):
    """At the first incumbent gather chunks 32 read +7 % and 64 read +4 %, both better; 32 wins.
    From 32, 64 is expected at about 1.04 / 1.07 - 1 = -2.8 % (effects in ratio add), not +4 %:
    it waits behind the untried changes, and another box probing it is not given a twin."""
    from tuner.night.gain import carried_effect
    from tuner.night.sharing import twin

    levers = {**LEVERS, "env.R4D_LRU_GATHER_CHUNKS": Lever.from_spec("env.R4D_LRU_GATHER_CHUNKS", [8, 32, 64])}
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=30.0)
    j.arm("recheck", verdict="recheck", obj=30.1)
    base = j.inc.key()
    for v, eff in ((64, 0.04), (32, 0.07)):
        n, shape = j.arm("probe", ("env.R4D_LRU_GATHER_CHUNKS", v), verdict="better", obj=30.0 * (1 + eff), delta=eff)
        _cmp(j, n, ("env.R4D_LRU_GATHER_CHUNKS", v), "better", eff, eff - 0.02, eff + 0.02, boots=2)
    _moved(j, n, shape, ("env.R4D_LRU_GATHER_CHUNKS", 32), 8, 0.07)
    j.arm("recheck", verdict="recheck", obj=32.1)
    st = j.state()
    assert carried_effect(st, base, "env.R4D_LRU_GATHER_CHUNKS", 0.04) == pytest.approx(1.04 / 1.07 - 1)
    assert carried_effect(st, base, "max-num-seqs", 0.04) == 0.04                 # another lever: as read
    assert carried_effect(st, st.incumbent_key, "env.R4D_LRU_GATHER_CHUNKS", 0.04) == 0.04   # read here
    cands = [(c[1], c[2], c[3]) for c in candidates(st, levers)]
    order = [c[:2] for c in cands]
    assert order.index(("env.R4D_LRU_GATHER_CHUNKS", 64)) > order.index(("max-num-seqs", 2))
    assert "-2.8% from this env.R4D_LRU_GATHER_CHUNKS" in dict(((c[0], c[1]), c[2]) for c in cands)[
        ("env.R4D_LRU_GATHER_CHUNKS", 64)]
    # another box probes 64 here now: a value that read better only beside the winner gets no twin
    j.j.append("arm_start", arm=99, kind="probe", shape=j.inc.with_change("env.R4D_LRU_GATHER_CHUNKS", 64).to_dict(),
               incumbent=j.inc.key(), change=["env.R4D_LRU_GATHER_CHUNKS", 64], box="b")
    assert twin(j.state(), "a", set()) is None
    # a lever that did not move keeps its reading, and its twin
    k = ("max-num-seqs", 3)
    j2 = J(tmp_path / "other")
    j2.arm("baseline", verdict="baseline", obj=30.0)
    j2.arm("recheck", verdict="recheck", obj=30.1)
    n, _ = j2.arm("probe", k, verdict="better", obj=31.2, delta=0.04)
    _cmp(j2, n, k, "better", 0.04, 0.02, 0.06, boots=2)
    n, shape = j2.arm("probe", ("env.R4D_LRU_GATHER_CHUNKS", 32), verdict="better", obj=32.1, delta=0.07)
    _moved(j2, n, shape, ("env.R4D_LRU_GATHER_CHUNKS", 32), 8, 0.07)
    j2.j.append("arm_start", arm=99, kind="probe", shape=j2.inc.with_change(*k).to_dict(), incumbent=j2.inc.key(),
                change=[k[0], 3], box="b")
    p = twin(j2.state(), "a", set())
    assert p is not None and p.change == k and "+4.0%" in p.why


def test_a_change_pruned_at_a_later_incumbent_is_not_carried_from_an_earlier_reading(tmp_path):
    """Prefetch 2 read -3 % at the first incumbent (a comparison); after prefetch moved to absent
    (+47 %) its probe was pruned at -70 % (no comparison: stopped after its first depth). After the
    next move its latest probe is what it is carried from, not the -3 % from before: it waits
    behind the untried changes instead of being probed again after every move."""
    j = J(tmp_path)
    j.arm("baseline", verdict="baseline", obj=30.0)
    j.arm("recheck", verdict="recheck", obj=30.1)
    n, _ = j.arm("probe", ("expert-prefetch", 2), verdict="worse", obj=29.0, delta=-0.03)
    _cmp(j, n, ("expert-prefetch", 2), "worse", -0.03, -0.05, -0.01, boots=1)
    n, shape = j.arm("probe", ("expert-prefetch", ABSENT), verdict="better", obj=44.0, delta=0.47)
    _moved(j, n, shape, ("expert-prefetch", ABSENT), 1, 0.47)
    j.arm("recheck", verdict="recheck", obj=44.1)
    j.arm("probe", ("expert-prefetch", 2), verdict="worse", obj=None, reason="pruned after depth 166: 12 vs 44 tok/s")
    n, shape = j.arm("probe", ("env.R4D_LRU_GATHER_CHUNKS", 32), verdict="better", obj=47.0, delta=0.07)
    _moved(j, n, shape, ("env.R4D_LRU_GATHER_CHUNKS", 32), 8, 0.07)
    j.arm("recheck", verdict="recheck", obj=47.1)
    cands = {(c[1], c[2]): (i, c[3]) for i, c in enumerate(candidates(j.state(), LEVERS))}
    assert cands[("expert-prefetch", 2)][1] == "worse at an earlier incumbent"          # its latest probe
    assert cands[("expert-prefetch", 2)][0] > cands[("max-num-seqs", 2)][0]

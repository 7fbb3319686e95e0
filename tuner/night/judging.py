"""The night's judging: each challenger's comparison blocked in time against the incumbent
(tuner/night/blocks.py), at the next promotion look's error rate (tuner/night/compare.py), how
long a boot measures while its comparison is undecided, and the re-judging of challengers whose
better reading waited for incumbent boots around theirs. A part of ``CampaignLoop`` (its journal,
campaign, host, the state it replays, and its promotion), kept apart so the loop reads as the
night's order of events."""
from __future__ import annotations

import logging

from arms import values
from arms.lifecycle import crashpoint
from tuner.night.ahead import still_ahead
from tuner.night.blocks import Boot, boot_spread, compare_blocked, drift_of
from tuner.night.compare import look_alpha
from tuner.night.gain import promising
from tuner.night.proposal import Proposal
from tuner.night.sharing import pending_moves
from tuner.night.state import State
from tuner.night.verdict import can_promote, promotes

log = logging.getLogger("tuner.loop")
EXTEND_CAP = 4        # a challenger's boot measures at most this many times the plan's runs


def planned_looks(levers: dict) -> int:
    """The night's planned promotion looks (``look_alpha``'s L): one per neighbour value. A look is
    a comparison that could promote (``verdict.can_promote``): a value's two boots, bracketed, is
    one; a third boot when those left it undecided another. (Three per value while every
    comparison was charged: a probe's, its confirmation's and the bracketing one.)"""
    return sum(max(1, len(lv.values) - 1) for lv in levers.values())


class Judging:
    """The comparison half of ``CampaignLoop`` (a mixin: it uses the loop's ``journal``, ``camp``,
    ``host``, ``_boots``, ``_replay``, ``_promote`` and ``_tell_waiting``)."""

    @staticmethod
    def _awaits_bracket(st: State, a) -> bool:
        """Arm ``a``'s latest comparison reads better (``gain.promising``) but waits for incumbent
        boots around its boots (tuner/night/blocks.py): its trial stays RUNNING until ``_bracket`` decides it, so the
        study's value is the one the move (or its absence) gives."""
        if a.end is None or not a.change or a.incumbent != st.incumbent_key and not still_ahead(st, a, promising):
            return False
        c = st.latest_comparisons().get((a.incumbent, a.change[0], values.text(a.change[1])))
        return c is not None and c.get("arm") == a.n and bool(c.get("open")) and promising(c)

    @property
    def error_rate(self) -> float:
        return self.camp.search.error_rate

    def _planned_looks(self) -> int:
        return planned_looks(self.camp.levers)

    def _depth(self) -> int | None:
        obj = self.camp.search.objective
        return obj.depth if obj.kind == "decode" else None

    def _comparable(self) -> bool:
        return self.camp.search.objective.kind in ("decode", "decode_geomean")

    def _compare(self, st: State, shape, extra: dict | None, against=None, arm: int | None = None,
                 closed_only: bool = False):
        """The comparison of ``shape`` (its boots so far, plus ``extra``: the boot measuring now)
        against the incumbent (or ``against``), blocked in time (tuner/night/blocks.py), at the
        next promotion look's error rate split over ``EXTEND_CAP`` tests (a boot whose runs grow
        while it is undecided, ``_extender``, is tested after each batch). A bracketing look
        (``_bracket``) splits it too: at its whole rate a noisy lever whose blocks all read
        high on a drifting box moved at +10.8 % [+0.3 %] (bench/results/realbox.md, stop 40)."""
        ref = st.incumbent if against is None else against
        depth = self._depth()
        cache = self._boots                 # a finished boot's runs never change: split them once
        arms = st.arms
        series = {k: [cache.get((n, t)) or cache.setdefault((n, t), Boot.of(n, st.place(n, arms[n].box), m, depth,
                                                                            hours=t, box=arms[n].box))   # its box's arm order
                      for n, t, m in b] for k, b in st.measured_boots().items()}
        if extra:
            n = st.next_n if arm is None else arm
            box = getattr(self, "box", None)
            series.setdefault(shape.key(), []).append(Boot.of(n, st.place(n, box), extra, depth,
                                                              hours=self.host.wall() / 3600.0, box=box))
        by_box: dict = {}                   # a box's boots of one shape: the spread and drift are within a box
        for key, boots in series.items():
            for b in boots:
                by_box.setdefault((key, b.box), []).append(b)
        drift = drift_of(list(by_box.values()))
        spread = boot_spread([b for (key, _), b in by_box.items() if key != shape.key()], drift)   # its own: the floor
        k = st.looks + 1
        return compare_blocked(series.get(shape.key(), []), series.get(ref.key(), []), spread=spread,
                               alpha=look_alpha(self.error_rate, k, self._planned_looks(), EXTEND_CAP),
                               min_effect=self.camp.search.min_effect, drift=drift, closed_only=closed_only), k

    def _closed_move(self, st: State, arm, cmp: dict | None, extra: dict | None = None) -> dict | None:
        """The comparison that moves the incumbent to ``arm``'s shape when its own (``cmp``) says
        better but waits for a bracket on another box only (a shared campaign, ``sharing.twin``):
        the test on its closed blocks alone, else None. Both tests must say better; the open boots
        are left out for when they ran. A test that could promote is journaled (``kind: closed``)
        whatever it reads: it is a promotion look, and spends its share of the night's rate
        (``State.looks``; one that moved nothing is kept apart, ``State.closed_tests``: it is
        no reading of the change)."""
        if cmp is None or cmp.get("verdict") != "better" or not cmp.get("open") or getattr(self, "box", None) is None:
            return None
        new, look = self._compare(st, arm.shape, extra, arm=arm.n, closed_only=True)
        test = new.to_dict() if new is not None else None
        if test is None or not can_promote(test):
            return None
        left = [b["boot"] for b in cmp.get("blocks") or [] if not b.get("closed")]
        self.journal.append("compare", arm=arm.n, incumbent=st.incumbent.key(), look=look, kind="closed",
                            change=[arm.change[0], values.encode(arm.change[1])], comparison=test, left_out=left)
        log.info("[arm %s CLOSED] %s -> %s: %s on its closed blocks (boot(s) %s still open left out)", arm.n,
                 arm.change[0], values.text(arm.change[1]), new.verdict, ", ".join(map(str, left)))
        return test if promotes(arm.kind, None, test) else None

    def _settled_wins(self, st: State) -> State:
        """Promote the wins at the incumbent whose move is not journaled: a confirmed or bracketed
        win a crash cut off (resume calls this), or on a shared campaign one decided ahead of the
        move that made its shape's base the incumbent (tuner/night/ahead.py: judged there before
        that shape led, it could not move anything then). Each move may make another such win the
        next one: looked for again until none is left."""
        while True:
            here = st.incumbent.key()
            for a in st.finished():
                if a.change and promotes(a.kind, a.end, (a.end or {}).get("compare")) and a.incumbent == here:
                    self._promote(st, a.n)
                    break
            else:
                for (inc, _, _), c in st.latest_comparisons().items():
                    a = st.arms.get(c.get("arm"))
                    if inc == here and a is not None and a.change and promotes(a.kind, None, c):
                        self._promote(st, a.n, {k: v for k, v in c.items() if k != "arm"})
                        break
            st = self._replay()
            if st.incumbent.key() == here:
                return st

    def _bracket(self, st: State, n: int | None) -> State:
        """Re-judge the challengers at this incumbent whose better reading (``gain.promising``)
        waited for incumbent boots around theirs (an open block, tuner/night/blocks.py): once a later incumbent boot closes one,
        the comparison is journaled again (``kind: bracketed``, ``closed_by`` the arm that did) and
        promotes when it still says better. Idempotent: resume calls it too."""
        if not self._comparable():
            return st
        here = st.incumbent.key()
        bases = {a.key: a.shape for _, a in pending_moves(st)} if getattr(self, "box", None) is not None else {}
        for (inc, name, vt), c in st.latest_comparisons().items():
            if inc != here and inc not in bases or not c.get("open") or not promising(c):
                continue
            arm = st.arms.get(c.get("arm"))
            if arm is None or arm.change is None or (arm.end or {}).get("verdict") is None:
                continue
            new, look = self._compare(st, arm.shape, None, against=None if inc == here else bases[inc])
            if new is None or new.open >= c["open"]:
                continue
            self.journal.append("compare", arm=arm.n, incumbent=inc, look=look, kind="bracketed",
                                closed_by=n, change=[arm.change[0], values.encode(arm.change[1])],
                                comparison=new.to_dict())
            log.info("[arm %s BRACKETED%s] %s -> %s: %s %s (%d open block(s) left)", arm.n,
                     "" if inc == here else f" ahead of arm {arm.start.get('ahead')}", arm.change[0],
                     values.text(arm.change[1]), new.verdict, new.interval_text(), new.open)
            st = self._replay()
            if inc != here:
                continue                          # judged where it was begun: it moves nothing before that leads
            moving = new.to_dict() if promotes(arm.kind, None, new.to_dict()) else self._closed_move(st, arm, new.to_dict())
            if moving is not None:
                self._promote(self._replay(), arm.n, moving)
                if n is not None:
                    crashpoint("incumbent", n)
                if bases:                         # comparisons begun ahead of this move may now close or win
                    return self._bracket(self._settled_wins(self._replay()), n)
                st = self._replay()
                break
        self._tell_waiting(st, n)
        return self._replay()

    def _extender(self, st: State, p: Proposal, shape, n: int):
        """How many more runs per depth this boot measures: first, while some depth holds fewer
        than the plan's runs that no other process held (``arms.conditions``: contended runs are
        left out of every comparison), replacements for them, up to ``EXTEND_CAP`` x the plan (a
        passing tenant costs minutes, not the boot); then the incumbent and the starting shape
        to twice the plan's runs; a challenger while its comparison is undecided, up to
        ``EXTEND_CAP`` x, and only while its runs' noise is still the larger part of a boot's
        variance: where boots spread more than the boot's mean can still move, more runs buy
        nothing (another boot does), and a boot kept measuring because it read close to its
        reference would make the pairs of such boots understate the spread. Each of those tests
        runs at a share of the look's rate (``look_alpha``'s peeks): a test that cannot promote (its
        block is open) still stops the runs on a ``better`` reading, and the look that brackets the
        boot reuses them (it tests at the share of the next look that can promote: ``State.looks``
        counts those only)."""
        runs = self.camp.measure.runs
        if p.kind == "joint" or not self._comparable():
            return None

        def more(m: dict) -> int:
            depths = [d for d in (m.get("depths") or {}).values() if d.get("runs")]
            have = min((len(d["runs"]) for d in depths), default=0)
            usable = min((sum(1 for x in d["runs"] if x.get("valid") and not x.get("contended")) for d in depths),
                         default=0)
            held = any(x.get("contended") for d in depths for x in d["runs"])
            if held and usable < runs and have < EXTEND_CAP * runs:
                return min(runs - usable, EXTEND_CAP * runs - have)   # runs another process held: replaced while there is room
            if p.kind in ("baseline", "recheck", "start"):
                return runs if have < 2 * runs else 0
            if have >= EXTEND_CAP * runs or st.incumbent_arm is None:
                return 0
            c, _ = self._compare(st, shape, m, arm=n)
            if c is None or c.verdict != "undecided":
                return 0
            if c.boot_sigma and c.sigma[0] and c.boot_sigma ** 2 > c.sigma[0] ** 2 / (have * max(1, len(depths))):
                return 0                     # the boots, not the runs, hold the variance
            return runs
        return more

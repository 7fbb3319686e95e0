"""Campaign state, rebuilt by replaying the journal. Nothing here does I/O."""
from __future__ import annotations

import bisect
import json
import logging
import statistics
from dataclasses import dataclass, field
from types import MappingProxyType

from arms.errors import ConfigError
from arms.secrets import REDACTED
from arms.shape import Shape

from arms import values
from tuner.night.records import ArmEnd, ArmStart, CampaignEnd, CampaignStart, Compare, Guard, IncumbentMove, Record, Told, decode
from arms.verdict import Verdict, failure_class
from tuner.night.verdict import NoiseBand, Score, can_promote

log = logging.getLogger("tuner.state")

STRUCTURAL = {"constraint-violation", "bad-argument", "unsupported", "engine-init-failed", "no-gpu",
              "flag-not-applied", "corrupt", "model-load-failed"}
MEMORY = {"oom", "kv-too-small", "insufficient-memory-for-utilization", "host-oom-killed"}
MEASURES = ("baseline", "recheck", "confirm", "probe")   # a boot of a shape: the last one is when it was last measured


@dataclass
class Arm:
    n: int
    kind: str                      # baseline | probe | confirm | recheck | joint
    shape: Shape
    change: tuple[str, object] | None
    incumbent: str                 # key of the incumbent it was judged against
    trial: int | None
    start: dict
    end: dict | None = None
    told: bool = False

    @property
    def key(self) -> str:
        """The shape's identity, computed from the real shape when it was journaled (the journaled
        shape itself has its secrets sealed)."""
        return self.start.get("identity") or self.shape.key()

    @property
    def verdict(self) -> str | None:
        return (self.end or {}).get("verdict")

    @property
    def challenger(self) -> tuple[str, str] | None:
        """(lever, value text) of its one change, None for a boot of a shape with no change."""
        return (self.change[0], values.text(self.change[1])) if self.change else None

    @property
    def box(self) -> str | None:
        """The box that ran it (None on a campaign of one box: tuner/night/shared.py)."""
        return self.start.get("box")

    @property
    def score(self) -> Score | None:
        s = (self.end or {}).get("score")
        return Score(s["feasible"], s["violation"], s["objective"]) if s else None


@dataclass
class State:
    baseline: Shape
    arms: dict[int, Arm] = field(default_factory=dict)
    incumbent: Shape | None = None
    incumbent_arm: int | None = None
    incumbent_score: Score | None = None
    samples: list[float] = field(default_factory=list)      # the incumbent's objective re-measures
    started: dict | None = None
    ends: list[dict] = field(default_factory=list)          # every campaign_end (a night stopped and resumed)
    guard: list[dict] = field(default_factory=list)
    moves: list[dict] = field(default_factory=list)
    incumbent_key: str | None = None
    shapes: dict[str, Shape] = field(default_factory=dict)   # key -> the real shape, where known
    comparisons: list[dict] = field(default_factory=list)   # "compare" records: a challenger vs the incumbent
    closed_tests: list[dict] = field(default_factory=list)  # closed-blocks tests that moved nothing (looks spent)

    # Indexes kept by ``apply_record`` as arms end, so that what the loop asks per arm costs
    # O(1) amortised rather than a pass over every finished arm (a 10,000-arm night was quadratic;
    # bench/replay_scale.py). ``tests/test_state_incremental.py`` checks each against the pass
    # over the finished arms (``from_scratch``) after every arm of a simulated night.
    _max_n: int = field(default=-1, repr=False, compare=False)
    _done: list = field(default_factory=list, repr=False, compare=False)             # finished arms, by n
    _done_n: list = field(default_factory=list, repr=False, compare=False)           # their n (bisect)
    _var_sum: float = field(default=0.0, repr=False, compare=False)                  # sum of finished arms' noise^2, by n
    _var_count: int = field(default=0, repr=False, compare=False)
    _var_last: int = field(default=-1, repr=False, compare=False)                    # n of the last arm in the sum
    _hist: dict = field(default_factory=dict, repr=False, compare=False)             # (lever, value text) -> probes
    _here: dict = field(default_factory=dict, repr=False, compare=False)             # incumbent key -> the same, there
    _meas: dict = field(default_factory=dict, repr=False, compare=False)             # Shape -> [(n, measurement)]
    _last_measure: dict = field(default_factory=dict, repr=False, compare=False)     # key -> n of its last re-measure
    _fails: dict = field(default_factory=dict, repr=False, compare=False)   # (lever, value text) -> (corrupt, boot-failure classes)
    _starts: dict = field(default_factory=dict, repr=False, compare=False)  # incumbent key -> its finished "start" arms
    _latest: dict = field(default_factory=dict, repr=False, compare=False)  # see latest_comparisons
    _box_n: dict = field(default_factory=dict, repr=False, compare=False)   # box -> its arms' n, sorted (``place``)
    looks: int = 0                   # comparisons of a change that could promote (the looks spent so far)

    @property
    def ended(self) -> dict | None:
        """The last campaign_end (None while the night has not ended)."""
        return self.ends[-1] if self.ends else None

    @property
    def next_n(self) -> int:
        return self._max_n + 1

    @property
    def open_arms(self) -> list[Arm]:
        return [a for a in self.arms.values() if a.end is None]

    @property
    def band(self) -> NoiseBand:
        # pooled: the mean of the arms' variances (one arm's 2-3 runs say little on their own)
        n = self._var_count
        return NoiseBand(tuple(self.samples), within=(self._var_sum / n) ** 0.5 if n else 0.0, pooled_arms=n)

    def finished(self) -> list[Arm]:
        """The finished arms, in arm order."""
        return list(self._done)

    @property
    def incumbent_value(self) -> float | None:
        """The incumbent's objective as the loop judges with it: the median of its re-measures
        (the score of the arm that made it incumbent when it has none)."""
        if self.samples:
            return statistics.median(self.samples)
        return self.incumbent_score.objective if self.incumbent_score else None

    def judged(self, min_effect: float) -> dict:
        """What the next arm is judged against, as the loop journals it (``arm_end`` and
        ``campaign_end`` records carry it as ``judged``; status and the report print it)."""
        noise = self.band.relative
        return {"incumbent_arm": self.incumbent_arm, "incumbent_value": self.incumbent_value,
                "noise_band": noise, "band": max(noise, min_effect), "measures": len(self.samples)}

    def tried_here(self) -> dict[tuple[str, str], list[Arm]]:
        """(lever, value text) -> the probes of that change judged at the current incumbent (read-only)."""
        return MappingProxyType(self._here.get(self.incumbent_key, {}))

    def history(self) -> dict[tuple[str, str], list[Arm]]:
        """(lever, value text) -> every probe of that change, at any incumbent (read-only)."""
        return MappingProxyType(self._hist)

    def measurements_of(self, shape: Shape) -> list[dict]:
        """The measurements of every finished, measured, uncorrupted boot of ``shape`` (any kind)."""
        return [m for _, m in self._meas.get(shape, ())]

    def failures(self, change: tuple[str, str]) -> tuple[bool, frozenset]:
        """(whether any probe of ``(lever, value text)`` came back corrupt, the classes of its boot
        failures) over the whole night."""
        corrupt, classes = self._fails.get(change, (False, frozenset()))
        return corrupt, frozenset(classes)

    def starts_at(self, key: str) -> list[Arm]:
        """The finished boots of the starting shape (head-to-head, kind ``start``) judged at ``key``."""
        return list(self._starts.get(key, ()))

    def latest_comparisons(self) -> dict[tuple[str, str, str], dict]:
        """(incumbent key, lever, value text) -> the latest comparison of that challenger there
        (the comparison, with its ``arm``)."""
        return dict(self._latest)

    def comparison_at(self, key: str, lever: str, value_text: str) -> dict | None:
        """The latest comparison of challenger (``lever``, ``value_text``) at incumbent ``key``."""
        return self._latest.get((key, lever, value_text))

    def measured_boots(self) -> dict[str, list[tuple[int, float, dict]]]:
        """Shape key -> (arm, hours on the journal's clock when the arm ended, measurement) of each
        of its measured, uncorrupted boots, in arm order (what ``measurements_of`` returns, timed)."""
        out: dict[str, list[tuple[int, float, dict]]] = {}
        for a in self._done:
            m = (a.end or {}).get("measurement")
            if m and a.verdict != Verdict.CORRUPT and m.get("outcome") == "measured" and a.end.get("t") is not None:
                out.setdefault(a.key, []).append((a.n, a.end["t"] / 3600.0, m))
        return out

    def arms_since_incumbent_measure(self, box: str | None = None) -> int:
        """Finished arms since the incumbent was last booted; ``box``: counted on that box only
        (a shared campaign: each box measures its own incumbent boots, tuner/night/shared.py)."""
        if box is not None:
            n = 0
            for a in reversed(self._done):
                if a.box != box:
                    continue
                if a.kind in MEASURES and a.key == self.incumbent_key:
                    return n
                n += 1
            return n
        last = self._last_measure.get(self.incumbent_key)
        return len(self._done_n) - (0 if last is None else bisect.bisect_right(self._done_n, last))

    def incumbent_boots(self, box: str | None) -> int:
        """Measured boots of the incumbent on ``box``, finished or running now (a box's first
        arms at an incumbent are its own boots of it: its comparisons are blocked by box)."""
        return self.boots_of(self.incumbent_key, box)

    def boots_of(self, key: str, box: str | None) -> int:
        """Measured boots of shape ``key`` on ``box``, finished or running now."""
        n = 0
        for a in self.arms.values():
            if a.box == box and a.key == key and a.kind in MEASURES and \
                    (a.end is None or ((a.end.get("measurement") or {}).get("outcome") == "measured"
                                       and a.verdict != Verdict.CORRUPT)):
                n += 1
        return n

    # -- the indexes ----------------------------------------------------------------------------
    def place(self, n: int, box: str | None) -> float:
        """Arm ``n``'s place on the comparison's time axis (tuner/night/blocks.py): how many arms of
        its box ``box`` came before it (one box: the arm order itself). A box's boots are what its
        blocks, its drift and its boot pairs are read from; on a shared campaign the arm numbers
        advance once per arm of *any* box, so N boxes would put a box's successive boots N times
        further apart (``blocks.PAIR_GAP`` would then drop pairs one box keeps). ``n`` need not
        have started yet (the boot measuring now)."""
        return float(bisect.bisect_left(self._box_n.get(box, ()), n))

    def _started(self, a: Arm, replaced: Arm | None = None) -> None:
        self._max_n = max(self._max_n, a.n)
        if replaced is not None:                # the same n started again: it counts once, on its new box
            ns = self._box_n.get(replaced.box, [])
            i = bisect.bisect_left(ns, a.n)
            if i < len(ns) and ns[i] == a.n:
                ns.pop(i)
        bisect.insort(self._box_n.setdefault(a.box, []), a.n)
        if replaced is not None and replaced.end is not None:
            self._reindex()             # a finished arm started again (a damaged journal): afresh

    def _reindex(self) -> None:
        self._done, self._done_n, self._hist, self._here, self._meas, self._last_measure = [], [], {}, {}, {}, {}
        self._fails, self._starts = {}, {}
        self._var_sum, self._var_count, self._var_last = 0.0, 0, -1
        for a in sorted((a for a in self.arms.values() if a.end is not None), key=lambda a: a.n):
            self._ended(a)

    def _ended(self, a: Arm) -> None:
        """Fold a just-finished arm into the indexes (arms end in arm order in the loop; one that
        ends out of order is inserted in place)."""
        i = bisect.bisect_right(self._done_n, a.n)
        self._done_n.insert(i, a.n)
        self._done.insert(i, a)
        noise = (a.end or {}).get("noise")
        if _number(noise):
            if a.n > self._var_last:
                self._var_sum += noise ** 2
                self._var_count += 1
                self._var_last = a.n
            else:                       # out of order: the sum in arm order, afresh (rare)
                var = [x.end["noise"] ** 2 for x in self._done if _number(x.end.get("noise"))]
                self._var_sum, self._var_count, self._var_last = sum(var), len(var), self._done_n[-1]
        if a.change and a.kind == "probe" and a.verdict != Verdict.INTERRUPTED:
            k = a.challenger
            _insort(self._hist.setdefault(k, []), a)
            _insort(self._here.setdefault(a.incumbent, {}).setdefault(k, []), a)
            corrupt, classes = self._fails.get(k, (False, set()))
            if failure_class(a.verdict) is not None:
                classes.add(failure_class(a.verdict))
            self._fails[k] = (corrupt or a.verdict == Verdict.CORRUPT, classes)
        if a.kind == "start":
            _insort(self._starts.setdefault(a.incumbent, []), a)
        m = a.end.get("measurement")
        if m and a.verdict != Verdict.CORRUPT and m.get("outcome") == "measured":
            got = self._meas.setdefault(a.shape, [])
            if got and got[-1][0] > a.n:
                got.insert(bisect.bisect_right([x[0] for x in got], a.n), (a.n, m))
            else:
                got.append((a.n, m))
        if a.kind in MEASURES:
            self._last_measure[a.key] = max(self._last_measure.get(a.key, -1), a.n)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _insort(arms: list, a: Arm) -> None:
    if not arms or arms[-1].n < a.n:
        arms.append(a)
    else:
        arms.insert(bisect.bisect_right([x.n for x in arms], a.n), a)


def from_scratch(st: State) -> dict:
    """What the indexes answer, computed as ``State`` did before it kept them: a pass over every
    arm (the definition the incremental ``State`` keeps; tests compare the two after every arm)."""
    fin = [a for a in st.arms.values() if a.end is not None]          # arm dict order, as before
    done = sorted(fin, key=lambda a: a.n)
    var = [a.end["noise"] ** 2 for a in fin if _number(a.end.get("noise"))]
    band = NoiseBand(tuple(st.samples), within=(sum(var) / len(var)) ** 0.5 if var else 0.0, pooled_arms=len(var))
    here: dict = {}
    for a in done:
        if a.change and a.incumbent == st.incumbent_key and a.kind == "probe" and a.verdict != Verdict.INTERRUPTED:
            here.setdefault(a.challenger, []).append(a)
    hist: dict = {}
    for a in fin:
        if a.change and a.kind == "probe" and a.verdict != Verdict.INTERRUPTED:
            hist.setdefault(a.challenger, []).append(a)
    meas: dict = {}
    for a in done:
        m = a.end.get("measurement")
        if m and a.verdict != Verdict.CORRUPT and m.get("outcome") == "measured":
            meas.setdefault(a.shape, []).append(m)
    since = 0
    for a in reversed(done):
        if a.kind in MEASURES and a.key == st.incumbent_key:
            break
        since += 1
    fails = {}
    for k, past in hist.items():
        fails[k] = (any(a.verdict == Verdict.CORRUPT for a in past),
                    frozenset(failure_class(a.verdict) for a in past if failure_class(a.verdict) is not None))
    starts: dict = {}
    for a in done:
        if a.kind == "start":
            starts.setdefault(a.incumbent, []).append(a)
    latest = {}
    for r in st.comparisons:
        ch = r.get("change")
        if ch:
            latest[(r.get("incumbent"), ch[0], values.text_of(ch[1]))] = {**r["comparison"], "arm": r.get("arm")}
    return {"next_n": max(st.arms, default=-1) + 1, "finished": [a.n for a in done], "band": band,
            "tried_here": here, "history": hist, "measurements": meas, "since_measure": since,
            "looks": sum(1 for r in st.comparisons + st.closed_tests
                          if r.get("change") and can_promote(r.get("comparison") or {})), "failures": fails, "starts": starts,
            "latest": latest}


def incremental(st: State) -> dict:
    """The same answers from the indexes (``from_scratch``'s counterpart)."""
    shapes = {a.shape for a in st.arms.values()}
    meas = {s: st.measurements_of(s) for s in shapes}
    return {"next_n": st.next_n, "finished": [a.n for a in st.finished()], "band": st.band,
            "tried_here": dict(st.tried_here()), "history": dict(st.history()),
            "measurements": {s: m for s, m in meas.items() if m}, "since_measure": st.arms_since_incumbent_measure(),
            "looks": st.looks, "failures": {k: st.failures(k) for k in st.history()},
            "starts": {k: st.starts_at(k) for k in {a.incumbent for a in st.finished() if a.kind == "start"}},
            "latest": st.latest_comparisons()}


def _resolve(sealed: Shape, key: str | None, base: Shape | None, change, levers) -> tuple[Shape, tuple | None]:
    """The real shape (and change) behind a journaled, sealed one: the incumbent it was proposed
    from with its change applied, the change's value taken from the campaign's levers when it
    was sealed."""
    if key is None or sealed.key() == key or base is None:
        return sealed, change
    if change is None:
        return (base if base.key() == key else sealed), change
    lever, value = change
    values = [value] if value != REDACTED else list(getattr((levers or {}).get(lever), "values", ()) or ())
    for v in values:
        cand = base.with_change(lever, v)
        if cand.key() == key:
            return cand, (lever, v)
    return sealed, change


def _joint(baseline: Shape, params: dict, levers: dict, key: str) -> Shape | None:
    """A joint arm's real shape from its study params (sealed choices, ``arms.values``)."""
    shape = baseline
    try:
        for name, lever in levers.items():
            shape = shape.with_change(name, values.from_choice(name, lever.values, params[name]))
    except (KeyError, ValueError):
        return None
    return shape if shape.key() == key else None


def replay_decisions(records: list[dict], baseline: Shape) -> State:
    """The State of the records that decide the incumbent — the campaign, the moves, the
    comparisons, its baseline and re-check arms — without a Shape for each of 10,000 probes: the
    incumbent, its re-measures, moves, comparisons and ends are those of the whole journal's State
    (what the morning report reads)."""
    return replay([r for r in records if r.get("op") not in ("arm_start", "arm_end", "told")
                   or r.get("kind") in ("baseline", "recheck")], baseline)


def replay(records: list[dict], baseline: Shape, levers: dict | None = None) -> State:
    """State from the journal's records. ``baseline`` and ``levers`` are the campaign's real ones
    (the loop's); a reader passes the journaled baseline and no levers, and gets sealed shapes
    with the real identities (keys)."""
    return Replay(baseline, levers).update(records)


class Replay:
    """Incremental replay: one ``State`` that folds in only the records appended since the last
    ``update`` (the loop's per-arm cost no longer grows with the night; bench/replay_scale.py).
    ``follow(journal)`` reads a ``tuner.night.journal.Journal``'s new records without copying the rest."""

    def __init__(self, baseline: Shape, levers: dict | None = None):
        self.levers = levers
        self.state = State(baseline=baseline, incumbent=baseline, incumbent_key=baseline.key())
        self.state.shapes[baseline.key()] = baseline
        self.done = 0
        self._shapes: dict[str, Shape] = {}          # journaled shape (canonical JSON) -> Shape: most repeat

    def update(self, records) -> State:
        for r in records[self.done:]:
            self._apply(r)
        self.done = len(records)
        return self.state

    def follow(self, journal) -> State:
        for r in journal.since(self.done):
            self._apply(r)
            self.done += 1
        return self.state

    def _apply(self, r: dict) -> None:
        try:
            apply_record(self.state, r, self.levers, self._shapes)
        except (ConfigError, KeyError, TypeError, ValueError, AttributeError) as e:
            # the journal's line checks passed but the record does not replay (a shape that is not
            # one): skipped like any damaged line, never the end of the night's record
            log.warning("[journal] record seq %s (%s) skipped: %s", r.get("seq"), r.get("op"), e)


def _shape(d: dict, cache: dict | None) -> Shape:
    if cache is None:
        return Shape.from_dict(d)
    k = json.dumps(d, sort_keys=True, separators=(",", ":"))
    got = cache.get(k)
    if got is None:
        got = cache[k] = Shape.from_dict(d)
    return got


def _real_change(st: State, raw: dict) -> dict:
    """A journaled record whose ``change`` names its arm's real change (a secret lever value is
    sealed on disk; the search compares values, so it reads the real one from the replayed arm)."""
    a = st.arms.get(raw.get("arm"))
    if a is None or a.change is None or not raw.get("change"):
        return raw
    return {**raw, "change": [a.change[0], values.encode(a.change[1])]}


def apply_record(st: State, r, levers: dict | None = None, shapes: dict | None = None) -> None:
    """Fold one journal record (typed, ``tuner.night.records``, or its JSON object) into ``st``:
    replay is this, record after record."""
    rec = r if isinstance(r, Record) else decode(r)
    if isinstance(rec, CampaignStart):
        if st.started is None:
            st.started = rec.raw
            bk = rec.baseline_identity
            if bk and st.baseline.key() != bk and st.baseline.to_dict() == rec.baseline:
                st.incumbent_key = bk          # a reader holds the sealed baseline
                st.shapes[bk] = st.baseline
    elif isinstance(rec, ArmStart):
        change = (rec.change[0], values.decode(rec.change[1])) if rec.change else None
        sealed = _shape(rec.shape, shapes)
        shape, change = _resolve(sealed, rec.identity, st.shapes.get(rec.incumbent), change, levers)
        if rec.params and levers and rec.identity and shape.key() != rec.identity:
            shape = _joint(st.baseline, rec.params, levers, rec.identity) or shape
        arm = Arm(n=rec.arm, kind=rec.kind, shape=shape, change=change, incumbent=rec.incumbent, trial=rec.trial,
                  start=rec.raw)
        replaced = st.arms.get(rec.arm)
        st.arms[rec.arm] = arm
        st._started(arm, replaced)
        st.shapes.setdefault(arm.key, shape)
    elif isinstance(rec, ArmEnd):
        a = st.arms.get(rec.arm)
        if a is not None and a.end is None:
            a.end = rec.raw
            st._ended(a)
            obj = (rec.score or {}).get("objective")
            if a.kind in ("baseline", "recheck") and a.key == st.incumbent_key and obj is not None:
                st.samples.append(obj)
                if a.kind == "baseline" and st.incumbent_score is None:
                    st.incumbent_score = a.score
                    st.incumbent_arm = a.n
    elif isinstance(rec, Told):
        a = st.arms.get(rec.arm)
        if a is not None:
            a.told = True
    elif isinstance(rec, IncumbentMove):
        a = st.arms.get(rec.arm)
        if a is not None and (rec.identity is None or a.key == rec.identity):
            st.incumbent, st.incumbent_key = a.shape, a.key
        else:
            st.incumbent = _shape(rec.shape, shapes)
            st.incumbent_key = rec.identity or st.incumbent.key()
        st.shapes.setdefault(st.incumbent_key, st.incumbent)
        st.incumbent_arm = rec.arm
        sc = rec.score
        st.incumbent_score = Score(sc["feasible"], sc["violation"], sc["objective"])
        st.samples = [x for x in rec.samples if x is not None]
        st.moves.append(_real_change(st, rec.raw))
    elif isinstance(rec, Compare):
        r = _real_change(st, rec.raw)
        c = r.get("comparison") or {}
        if r.get("change") and can_promote(c):
            st.looks += 1                    # a look that could promote spends its share (verdict.can_promote)
        if r.get("kind") == "closed" and c.get("verdict") != Verdict.BETTER:
            st.closed_tests.append(r)        # a look spent (Judging._closed_move), no reading of the change
            return
        st.comparisons.append(r)
        if r.get("change"):
            ch = r["change"]
            st._latest[(r.get("incumbent"), ch[0], values.text_of(ch[1]))] = {**r["comparison"], "arm": r.get("arm")}
    elif isinstance(rec, Guard):
        st.guard.append(rec.raw)
    elif isinstance(rec, CampaignEnd):
        st.ends.append(rec.raw)

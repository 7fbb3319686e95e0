"""Campaign state, rebuilt by replaying the journal. Nothing here does I/O."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from arms.errors import ConfigError
from arms.secrets import REDACTED
from arms.shape import Shape

from .journal import decode_value, encode_value
from .records import ArmEnd, ArmStart, CampaignEnd, CampaignStart, Compare, Guard, IncumbentMove, Record, Told, decode
from .verdict import NoiseBand, Score

log = logging.getLogger("tuner.state")

STRUCTURAL = {"constraint-violation", "bad-argument", "unsupported", "engine-init-failed", "no-gpu",
              "flag-not-applied", "corrupt", "model-load-failed"}
MEMORY = {"oom", "kv-too-small", "insufficient-memory-for-utilization", "host-oom-killed"}


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
    ended: dict | None = None
    guard: list[dict] = field(default_factory=list)
    moves: list[dict] = field(default_factory=list)
    incumbent_key: str | None = None
    shapes: dict[str, Shape] = field(default_factory=dict)   # key -> the real shape, where known
    comparisons: list[dict] = field(default_factory=list)   # "compare" records: a challenger vs the incumbent

    @property
    def next_n(self) -> int:
        return max(self.arms, default=-1) + 1

    @property
    def open_arms(self) -> list[Arm]:
        return [a for a in self.arms.values() if a.end is None]

    @property
    def band(self) -> NoiseBand:
        var = [a.end["noise"] ** 2 for a in self.finished() if (a.end or {}).get("noise") is not None]
        # pooled: the mean of the arms' variances (one arm's 2-3 runs say little on their own)
        return NoiseBand(tuple(self.samples), within=(sum(var) / len(var)) ** 0.5 if var else 0.0,
                         pooled_arms=len(var))

    def finished(self) -> list[Arm]:
        return [a for a in self.arms.values() if a.end is not None]

    def tried_here(self) -> dict[tuple[str, str], list[Arm]]:
        """(lever, value text) -> the probes of that change judged at the current incumbent."""
        key = self.incumbent_key
        out: dict[tuple[str, str], list[Arm]] = {}
        for a in sorted(self.finished(), key=lambda a: a.n):
            if a.change and a.incumbent == key and a.kind == "probe" and a.verdict != "interrupted":
                out.setdefault((a.change[0], _vt(a.change[1])), []).append(a)
        return out

    def history(self) -> dict[tuple[str, str], list[Arm]]:
        out: dict[tuple[str, str], list[Arm]] = {}
        for a in self.finished():
            if a.change and a.kind == "probe" and a.verdict != "interrupted":
                out.setdefault((a.change[0], _vt(a.change[1])), []).append(a)
        return out

    def measurements_of(self, shape: Shape) -> list[dict]:
        """The measurements of every finished, measured, uncorrupted boot of ``shape`` (any kind)."""
        return [a.end["measurement"] for a in sorted(self.finished(), key=lambda a: a.n)
                if a.shape == shape and (a.end or {}).get("measurement") and a.verdict != "corrupt"
                and (a.end["measurement"].get("outcome") == "measured")]

    def measured_boots(self) -> dict[str, list[tuple[float, dict]]]:
        """Shape key -> (hours on the journal's clock when the arm ended, measurement) of each of
        its measured, uncorrupted boots, in order (what ``measurements_of`` returns, timed)."""
        out: dict[str, list[tuple[float, dict]]] = {}
        for a in sorted(self.finished(), key=lambda a: a.n):
            m = (a.end or {}).get("measurement")
            if m and a.verdict != "corrupt" and m.get("outcome") == "measured" and a.end.get("t") is not None:
                out.setdefault(a.key, []).append((a.end["t"] / 3600.0, m))
        return out

    def arms_since_incumbent_measure(self) -> int:
        n = 0
        for a in sorted(self.finished(), key=lambda a: a.n, reverse=True):
            if a.kind in ("baseline", "recheck", "confirm") and a.key == self.incumbent_key:
                break
            n += 1
        return n


def _vt(value) -> str:
    from arms.shape import format_value

    return format_value(value)


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


def replay(records: list[dict], baseline: Shape, levers: dict | None = None) -> State:
    """State from the journal's records. ``baseline`` and ``levers`` are the campaign's real ones
    (the loop's); a reader passes the journaled baseline and no levers, and gets sealed shapes
    with the real identities (keys)."""
    return Replay(baseline, levers).update(records)


class Replay:
    """Incremental replay: one ``State`` that folds in only the records appended since the last
    ``update`` (the loop's per-arm cost no longer grows with the night; bench/replay_scale.py).
    ``follow(journal)`` reads a ``tuner.journal.Journal``'s new records without copying the rest."""

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
    return {**raw, "change": [a.change[0], encode_value(a.change[1])]}


def apply_record(st: State, r, levers: dict | None = None, shapes: dict | None = None) -> None:
    """Fold one journal record (typed, ``tuner.records``, or its JSON object) into ``st``:
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
        change = (rec.change[0], decode_value(rec.change[1])) if rec.change else None
        sealed = _shape(rec.shape, shapes)
        shape, change = _resolve(sealed, rec.identity, st.shapes.get(rec.incumbent), change, levers)
        arm = Arm(n=rec.arm, kind=rec.kind, shape=shape, change=change, incumbent=rec.incumbent, trial=rec.trial,
                  start=rec.raw)
        st.arms[rec.arm] = arm
        st.shapes.setdefault(arm.key, shape)
    elif isinstance(rec, ArmEnd):
        a = st.arms.get(rec.arm)
        if a is not None and a.end is None:
            a.end = rec.raw
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
        st.comparisons.append(_real_change(st, rec.raw))
    elif isinstance(rec, Guard):
        st.guard.append(rec.raw)
    elif isinstance(rec, CampaignEnd):
        st.ended = rec.raw

"""Campaign state, rebuilt by replaying the journal. Nothing here does I/O."""
from __future__ import annotations

from dataclasses import dataclass, field

from arms.shape import Shape

from .journal import decode_value
from .verdict import NoiseBand, Score

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
        key = self.incumbent.key() if self.incumbent else None
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

    def arms_since_incumbent_measure(self) -> int:
        n = 0
        for a in sorted(self.finished(), key=lambda a: a.n, reverse=True):
            if a.kind in ("baseline", "recheck", "confirm") and a.shape == self.incumbent:
                break
            n += 1
        return n


def _vt(value) -> str:
    from arms.shape import format_value

    return format_value(value)


def replay(records: list[dict], baseline: Shape) -> State:
    st = State(baseline=baseline, incumbent=baseline)
    for r in records:
        op = r["op"]
        if op == "campaign_start":
            st.started = st.started or r
        elif op == "arm_start":
            ch = r.get("change")
            st.arms[r["arm"]] = Arm(n=r["arm"], kind=r["kind"], shape=Shape.from_dict(r["shape"]),
                                    change=(ch[0], decode_value(ch[1])) if ch else None,
                                    incumbent=r["incumbent"], trial=r.get("trial"), start=r)
        elif op == "arm_end":
            a = st.arms.get(r["arm"])
            if a is not None and a.end is None:
                a.end = r
                obj = (r.get("score") or {}).get("objective")
                if a.kind in ("baseline", "recheck") and a.shape == st.incumbent and obj is not None:
                    st.samples.append(obj)
                    if a.kind == "baseline" and st.incumbent_score is None:
                        st.incumbent_score = a.score
                        st.incumbent_arm = a.n
        elif op == "told":
            a = st.arms.get(r["arm"])
            if a is not None:
                a.told = True
        elif op == "incumbent":
            st.incumbent = Shape.from_dict(r["shape"])
            st.incumbent_arm = r["arm"]
            sc = r["score"]
            st.incumbent_score = Score(sc["feasible"], sc["violation"], sc["objective"])
            st.samples = [x for x in r.get("samples", []) if x is not None]
            st.moves.append(r)
        elif op == "compare":
            st.comparisons.append(r)
        elif op == "guard":
            st.guard.append(r)
        elif op == "campaign_end":
            st.ended = r
    return st


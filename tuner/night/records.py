"""The journal's record types: a closed set, one codec each way.

``decode(d)`` turns a journal line's object into its typed record (``RecordError`` with the
reason when it is not one — the journal quarantines such a line); ``encode(op, seq, t, fields)``
is what the writer appends, checked by the same table, so the writer cannot journal a record
that replay would refuse. Every type keeps the whole object as ``raw`` (the fields a reader
such as the report or export wants beyond the typed ones, and those a newer tuner adds). An op
outside the set decodes to ``Other`` and replay ignores it, so a newer journal still reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SHAPE_KEYS = frozenset({"image", "model", "args", "env", "mounts", "devices", "port", "options"})   # Shape.to_dict()
SCORE_KEYS = ("feasible", "violation", "objective")


class RecordError(ValueError):
    """A journal object that is not a record of its op (the message is the reason)."""


@dataclass(frozen=True)
class Record:
    op: str
    seq: int
    t: float | None
    raw: dict = field(repr=False, compare=False)


@dataclass(frozen=True)
class CampaignStart(Record):
    baseline: dict | None = None
    campaign_hash: str | None = None
    baseline_identity: str | None = None     # the real baseline's key (its journaled copy is sealed)
    deadline: float | None = None            # the night's deadline, epoch s on the journal's clock (fixed
                                             #   at the start; a resume keeps it); absent before it was journaled
    simulated: bool | None = None            # run on a simulated host (`tuner run --simulated`): never promoted
    membw: dict | None = None                # {gbs, source}: host memory bandwidth measured at the start (llama.cpp)


@dataclass(frozen=True)
class ArmStart(Record):
    arm: int = 0
    kind: str = ""
    shape: dict = field(default_factory=dict)
    incumbent: str = ""                      # key of the incumbent it is judged against
    change: list | None = None               # [lever, encoded value]
    trial: int | None = None
    identity: str | None = None              # the real shape's key
    judged: dict | None = None               # the incumbent value and band it is judged against (State.judged)
    params: dict | None = None               # a joint arm's study params (sealed choices, arms.values)
    box: str | None = None                   # the box that ran it (a shared campaign, tuner/night/shared.py)
    ahead: int | None = None                 # begun ahead of that arm's move (tuner/night/ahead.py)


@dataclass(frozen=True)
class ArmEnd(Record):
    arm: int = 0
    verdict: str | None = None
    score: dict | None = None


@dataclass(frozen=True)
class Told(Record):
    arm: int = 0
    trial: int | None = None


@dataclass(frozen=True)
class IncumbentMove(Record):
    arm: int = 0
    shape: dict = field(default_factory=dict)
    score: dict = field(default_factory=dict)
    samples: list = field(default_factory=list)
    identity: str | None = None


@dataclass(frozen=True)
class Compare(Record):
    """A challenger judged against the incumbent (or the head-to-head with the start): the
    samples, the test, its interval and error rate (``tuner/night/compare.py``)."""
    arm: int = 0
    comparison: dict = field(default_factory=dict)
    change: list | None = None


@dataclass(frozen=True)
class Guard(Record):
    pass


@dataclass(frozen=True)
class CampaignEnd(Record):
    reason: str | None = None
    no_result: dict | None = None            # {"cause", "evidence"}: a night that learned nothing (loop.NoResult)
    judged: dict | None = None               # the final incumbent value and band (State.judged)
    error_rate: float | None = None


@dataclass(frozen=True)
class Note(Record):
    pass


@dataclass(frozen=True)
class Promotion(Record):
    pass


@dataclass(frozen=True)
class Other(Record):
    """An op this tuner does not know (a newer one wrote it): kept, never replayed."""


REQ = object()
# op -> (type, {field: (python type, REQ or the default)})
TYPES: dict[str, tuple[type, dict[str, tuple[Any, Any]]]] = {
    "campaign_start": (CampaignStart, {"baseline": (dict, None), "campaign_hash": (str, None),
                                       "baseline_identity": (str, None), "deadline": (float, None),
                                       "simulated": (bool, None), "membw": (dict, None)}),
    "arm_start": (ArmStart, {"arm": (int, REQ), "kind": (str, REQ), "shape": (dict, REQ), "incumbent": (str, REQ),
                             "change": (list, None), "trial": (int, None), "identity": (str, None),
                             "judged": (dict, None), "params": (dict, None), "box": (str, None),
                             "ahead": (int, None)}),
    "arm_end": (ArmEnd, {"arm": (int, REQ), "verdict": (str, None), "score": (dict, None)}),
    "told": (Told, {"arm": (int, REQ), "trial": (int, None)}),
    "incumbent": (IncumbentMove, {"arm": (int, REQ), "shape": (dict, REQ), "score": (dict, REQ),
                                  "samples": (list, []), "identity": (str, None)}),
    "compare": (Compare, {"arm": (int, REQ), "comparison": (dict, REQ), "change": (list, None)}),
    "guard": (Guard, {}),
    "campaign_end": (CampaignEnd, {"reason": (str, None), "judged": (dict, None), "error_rate": (float, None),
                                   "no_result": (dict, None)}),
    "note": (Note, {}),
    "promotion": (Promotion, {}),
}
OPS = tuple(TYPES)


def _is(v: Any, typ: type) -> bool:
    if typ is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if typ is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, typ)


def decode(d: Any) -> Record:
    """The typed record of one journal object, or ``RecordError`` saying why it is none."""
    if not isinstance(d, dict):
        raise RecordError(f"not a JSON object (a {type(d).__name__})")
    op, seq, t = d.get("op"), d.get("seq"), d.get("t")
    if not isinstance(op, str) or not _is(seq, int):
        raise RecordError("no op or seq")
    if t is not None and not _is(t, float):
        raise RecordError(f"{op} record with a time that is not a number")
    if op not in TYPES:
        return Other(op, seq, t, d)
    cls, spec = TYPES[op]
    kw: dict[str, Any] = {}
    for name, (typ, default) in spec.items():
        v = d.get(name)
        if v is None:
            if default is REQ:
                raise RecordError(f"{op} record without a valid {name!r}")
            kw[name] = list(default) if isinstance(default, list) else default
        elif not _is(v, typ):
            raise RecordError(f"{op} record without a valid {name!r}")
        else:
            kw[name] = v
    for name in ("shape", "baseline"):
        if isinstance(kw.get(name), dict) and set(kw[name]) != SHAPE_KEYS:
            raise RecordError(f"{op} record with an unreadable {name}")
    sc = kw.get("score")
    if sc is not None and any(k not in sc for k in SCORE_KEYS):
        raise RecordError(f"{op} record with a malformed score")
    ch = kw.get("change")
    if ch is not None and (len(ch) != 2 or not isinstance(ch[0], str)):
        raise RecordError(f"{op} record with a malformed change")
    return cls(op, seq, t, d, **kw)


def encode(op: str, seq: int, t: float | None, fields: dict) -> dict:
    """The object the writer appends, checked as ``decode`` will read it back (``ValueError``
    here is a bug in the writer, never bad input)."""
    if op not in TYPES:
        raise ValueError(f"unknown journal op {op!r}")
    d = {"op": op, "seq": seq, "t": t, **fields}
    decode(d)
    return d


def latest_judged(records: list[dict]) -> dict | None:
    """The latest journaled judgement (``State.judged``: the incumbent value, the noise band and
    the decision band the loop judges with), from the last ``arm_start`` or ``campaign_end`` that
    carries one; None for a journal written before it was journaled. Status and the report print
    this, never a value of their own."""
    for r in reversed(records):
        if r.get("op") in ("arm_start", "campaign_end") and isinstance(r.get("judged"), dict):
            return r["judged"]
    return None

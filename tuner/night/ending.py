"""When a night ends, besides running out of proposals: its deadline, and a night that learned nothing.

The deadline is the night's, not the process's. It is fixed once, when the night starts, and
journaled in ``campaign_start`` as epoch seconds on the journal's own clock (``Host.wall``: a
simulated host's wall clock is simulated); every resume — after a crash, a kill -9, a reboot —
reads it back, so a crash never hands the night a fresh budget. A journal written before the
deadline was journaled gets the deadline its budget gives from the night's first record.

A night learns nothing when the shape every arm is judged against never yields anything to judge
with: the rule (``no_result``) is that the starting shape's first boots — the baseline arm and,
when re-checks are on, the re-check that follows it at once — all finished without the objective
(and, with constraints, without even a score the constraints could rank). From then on every
challenger would be compared with nothing: its verdict is at best "parity, no objective to
compare", no incumbent can move, and the rest of the budget buys no information. So the night
stops after those two boots (not after eight hours), says ``no result`` with the cause and the
engine's own evidence line, and ``tuner run`` exits with ``NO_RESULT_EXIT`` (tuner/cli.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from tuner.night.readback import start_of

NO_RESULT_EXIT = 3          # `tuner run`: the night ran and learned nothing (README, tuner/cli.py)
START_KINDS = ("baseline", "recheck", "start")


def deadline_from(budget, host_now: float, wall_now: float | None = None) -> float | None:
    """The host-clock deadline for `until` (HH:MM, next occurrence) or `hours`, for a night
    starting now."""
    if budget.hours is not None:
        return host_now + budget.hours * 3600
    if budget.until is None:
        return None
    wall_now = time.time() if wall_now is None else wall_now
    return host_now + (budget.until_epoch(wall_now) - wall_now)     # DST-safe (zoneinfo)


def budget_deadline(budget, start_wall: float | None) -> float | None:
    """The journal-clock deadline of a night whose first record is at ``start_wall`` (an older
    journal's, which did not journal its deadline)."""
    if start_wall is None:
        return None
    if budget.hours is not None:
        return start_wall + budget.hours * 3600
    return budget.until_epoch(start_wall) if budget.until is not None else None


def night_deadline(start: dict | None, budget, proposed_wall: float | None) -> float | None:
    """The night's deadline on the journal's clock: the journaled one (``start`` is the night's
    ``campaign_start``), the one its budget gives from its start (an older journal), or — a new
    night, no ``start`` yet, or one that started without a deadline — ``proposed_wall``, which
    the loop journals for a new night."""
    if start is None:
        return proposed_wall
    if start.get("deadline") is not None:
        return float(start["deadline"])
    if "deadline" in start:           # the night started without one: a resume may give it one
        return proposed_wall
    old = budget_deadline(budget, start.get("t")) if budget is not None else None
    return proposed_wall if old is None else old


def continue_night(records: list[dict], host, budget, proposed: float | None,
                   wall=None) -> tuple[float | None, float | None]:
    """(the night's deadline on the journal's clock, the same on the host's clock) for a loop
    opening ``records``; ``proposed`` is a new night's deadline on the host clock. A host that
    keeps a virtual clock (``continue_clock``: host.simhost.SimHost) first moves it on to the
    journal's last time, so a resumed simulated night never restarts at 0 and its journal times
    never run backwards. ``wall``: the journal's clock when it is not the host's (a shared
    campaign's: the database's, tuner/night/shared.py)."""
    last = next((r["t"] for r in reversed(records) if r.get("t") is not None), None)
    if last is not None:
        host.continue_clock(last)
    start = start_of(records)
    offset = (wall or host.wall)() - host.now()    # host clock -> journal clock
    wall = night_deadline(start, budget, None if proposed is None else proposed + offset)
    return wall, None if wall is None else wall - offset


@dataclass(frozen=True)
class NoResult:
    cause: str
    evidence: str | None = None       # the engine's own line (a boot's evidence), or the arm's reason

    def text(self) -> str:
        return f"no result: {self.cause}" + (f" — evidence: {self.evidence}" if self.evidence else "")

    def to_dict(self) -> dict:
        return {"cause": self.cause, "evidence": self.evidence}

    @classmethod
    def from_dict(cls, d: dict | None) -> NoResult | None:
        return cls(str(d.get("cause")), d.get("evidence")) if isinstance(d, dict) and d.get("cause") else None


def _evidence(end: dict) -> str | None:
    ev = (end.get("boot") or {}).get("evidence") or (end.get("quality") or {}).get("evidence") or []
    return str(ev[0]) if ev else (str(end["reason"]) if end.get("reason") else None)


def _start_boots(st):
    """The starting shape's finished boots, in arm order (while no incumbent moved)."""
    base = st.baseline.key()
    return (a for a in st.finished() if a.kind in START_KINDS and a.key == base and a.verdict not in (None, "interrupted"))


def _judgeable(end: dict, constraints: bool) -> bool:
    sc = end.get("score") or {}
    return sc.get("objective") is not None or (constraints and bool(sc))


def judged_start(st, constraints: bool) -> bool:
    """Whether the night has something to judge against: an incumbent moved, or a boot of the
    starting shape yielded the objective (with constraints: a score they rank)."""
    return bool(st.moves) or any(_judgeable(a.end or {}, constraints) for a in _start_boots(st))


def no_result(st, *, boots: int, objective: str, constraints: bool) -> NoResult | None:
    """The night's ``NoResult`` when its starting shape's first ``boots`` finished boots gave
    nothing to judge against; None while they have not all finished, or when one gave something."""
    if judged_start(st, constraints):
        return None
    first = []
    for a in _start_boots(st):
        first.append(a)
        if len(first) == boots:
            break
    if len(first) < boots:
        return None
    ends = [a.end or {} for a in first]
    failed = [e for e in ends if str(e.get("verdict", "")).startswith("boot-failed")]
    n = len(first)
    if len(failed) == n:
        classes = sorted({str(e["verdict"]).split(":", 1)[-1] for e in failed})
        cause = (f"the starting shape did not boot ({n} of {n} boots failed: {', '.join(classes)}); "
                 "every challenger is judged against it, so the night stopped")
    elif failed or any(e.get("verdict") in ("invalid", "corrupt") for e in ends):
        verdicts = ", ".join(str(e.get("verdict")) for e in ends)
        cause = (f"the starting shape gave no trusted measurement in {n} boots ({verdicts}); every challenger "
                 "is judged against it, so the night stopped")
    else:
        cause = (f"the starting shape booted but never yielded the objective {objective} ({n} boots): no arm "
                 "can be compared with it, so the night stopped")
    return NoResult(cause, next((x for x in map(_evidence, ends) if x), None))


def final_end(records: list[dict], campaign_hash: str, deadline_passed: bool) -> dict | None:
    """The night's last ``campaign_end`` when nothing can resume it: it is the journal's last
    record of the night (a promotion may follow) and the deadline has passed, or the night
    learned nothing and the campaign file is the same (it would learn nothing again)."""
    night = [r for r in records if r["op"] in ("campaign_start", "note", "arm_start", "arm_end", "campaign_end")]
    if not night or night[-1]["op"] != "campaign_end":
        return None
    end, start = night[-1], night[0]
    same = start.get("op") == "campaign_start" and start.get("campaign_hash") == campaign_hash
    return end if deadline_passed or (NoResult.from_dict(end.get("no_result")) and same) else None

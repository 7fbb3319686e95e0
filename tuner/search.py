"""Which arm next: a pure policy over the replayed state (no I/O, no clock).

One-change mode walks the incumbent's neighbourhood: confirm a `better` arm before anything
else, re-measure the incumbent every K arms, then try changes in order of promise — changes that
won at an earlier incumbent first (they are re-judged against the new one), then untried
changes, then ones that were at parity, then memory failures of an older incumbent, then
losers. A change that failed structurally (constraint violation, bad argument, corrupt, a
dropped flag, ...) is never repeated; a memory failure is not repeated at the same incumbent.
Joint mode (for comparison) lets Optuna's sampler pick whole shapes.
"""
from __future__ import annotations

from dataclasses import dataclass

from arms.shape import Lever, Shape, format_value

from .journal import decode_value, encode_value  # noqa: F401 - encode_value is this module's API too
from .state import MEMORY, STRUCTURAL, State


@dataclass(frozen=True)
class Proposal:
    kind: str                               # baseline | probe | confirm | recheck
    change: tuple[str, object] | None = None
    why: str = ""


def _value_text(v) -> str:
    return format_value(v)


def candidates(state: State, levers: dict[str, Lever]) -> list[tuple[float, str, object, str]]:
    """(priority, lever, value, why) of every one-change neighbour still worth an arm."""
    inc = state.incumbent
    here = state.tried_here()
    hist = state.history()
    # undoing a confirmed move is known to lose: the confirmation measured exactly that pair
    undo = {(m["change"][0], _value_text(decode_value(m["previous_value"]))) for m in state.moves
            if m.get("change") and "previous_value" in m}
    out = []
    order = 0
    for name, lever in levers.items():
        current = _value_text(inc.value_of(name))
        for value in lever.values:
            order += 1
            vt = _value_text(value)
            if vt == current or (name, vt) in undo:
                continue
            if (name, vt) in here:
                tries = here[(name, vt)]
                last = tries[-1].end or {}
                if len(tries) == 1 and last.get("verdict") == "parity" and \
                        (last.get("delta") or 0) >= 0.5 * (last.get("threshold") or 1):
                    out.append((2.9 + order / 1000, name, value,
                                f"parity leaning better ({_pct(last.get('delta'))}): a second look"))
                continue
            past = hist.get((name, vt), [])
            outcomes = [a.verdict or "" for a in past]
            boot_classes = {v.split(":", 1)[1] for v in outcomes if v.startswith("boot-failed:")}
            if any(v == "corrupt" for v in outcomes) or boot_classes & STRUCTURAL:
                continue                                       # structural: never again
            if not past:
                out.append((1.0 + order / 1000, name, value, "untried"))
                continue
            last = past[-1]
            delta = (last.end or {}).get("delta")
            if last.verdict == "better":
                out.append((0.0 - (delta or 0), name, value, f"won at an earlier incumbent ({_pct(delta)})"))
            elif last.verdict == "parity":
                out.append((2.0 + order / 1000, name, value, "parity at an earlier incumbent"))
            elif boot_classes & MEMORY:
                out.append((2.5 + order / 1000, name, value, "memory failure at an earlier incumbent"))
            elif last.verdict == "worse":
                out.append((3.0 - (delta or 0) / 10, name, value, f"lost at an earlier incumbent ({_pct(delta)})"))
            else:
                out.append((2.8 + order / 1000, name, value, f"{last.verdict} at an earlier incumbent"))
    out.sort(key=lambda c: c[0])
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def propose(state: State, levers: dict[str, Lever], *, recheck_every: int = 6, confirm: bool = True) -> Proposal | None:
    done = sorted(state.finished(), key=lambda a: a.n)
    if not any(a.kind == "baseline" and a.verdict not in (None, "interrupted") for a in done):
        return Proposal("baseline", why="measure the starting shape")
    if recheck_every and not any(a.kind == "recheck" and a.verdict not in (None, "interrupted") for a in done):
        return Proposal("recheck", why="re-measure the starting shape at once: the first noise estimate")
    if confirm:
        inc = state.incumbent.key()
        for a in reversed(done):
            if a.verdict == "interrupted" or a.kind == "recheck":
                continue              # a crash cut the confirmation short: confirm again
            if a.kind == "probe" and a.verdict == "better" and a.incumbent == inc:
                return Proposal("confirm", a.change, why=f"confirm arm {a.n}")
            break
    if recheck_every and state.arms_since_incumbent_measure() >= recheck_every:
        return Proposal("recheck", why=f"re-measure the incumbent every {recheck_every} arms (noise band)")
    cands = candidates(state, levers)
    if not cands:
        return None
    _, name, value, why = cands[0]
    return Proposal("probe", (name, value), why=why)


def apply(shape: Shape, change: tuple[str, object] | None) -> Shape:
    if change is None:
        return shape
    return shape.with_change(change[0], change[1])



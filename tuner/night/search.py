"""Which arm next: a pure policy over the replayed state (no I/O, no clock).

One-change mode walks the incumbent's neighbourhood. Before anything else: measure the start
(twice: the second boot is the first boot-to-boot evidence), give a challenger the comparison
called ``better`` on one boot its second boot, boot the incumbent after a challenger that reads
better on two boots with no incumbent boot after them yet (``_pending_bracket``: it closes their
blocks, tuner/night/blocks.py), and re-measure the incumbent every K arms. Then
the next challenger is the one-change neighbour of highest *expected gain*, E[max(0, X)] for
X ~ N(mu, sigma^2), where mu and sigma come from
  - the sequential comparison at this incumbent, when it is still undecided (another boot);
  - the comparison at an earlier incumbent, carried over (effects are mostly additive; sigma is
    widened for interactions);
  - for an untried change, a prior raised by the engine's own evidence (a constraint the
    incumbent misses points at the capacity levers, a low prefetch precision at prefetch, a low
    spec acceptance at spec depth) and by adjacency (the lever whose value just won),
so the order the operator listed the levers in only breaks exact ties.
A change that failed structurally (constraint violation, bad argument, corrupt, a dropped flag,
...) is never repeated; a memory failure is not repeated at the same incumbent.

When every challenger is decided, the night is spent, not abandoned: the decided ones whose
interval still reaches above zero (weakest evidence first) get another boot, then the final
incumbent meets the starting shape head to head, then the undecided ones get more boots. Only
when all of that is done (or no boot can change anything) does the search end.
On a shared campaign (``box``) each box boots the incumbent itself before its challengers, and a
challenger that already reads better while another box has it in hand gets a *twin* on this
box (``_twin``): the boxes' blocks run side by side. While another box closes two boots of a likely
next incumbent, a box works ahead of that move (``_ahead``) before it closes its own block of it
(``in_hand``) or confirms a challenger that reads better by less (``_outrun``).
Joint mode (for comparison) lets Optuna's sampler pick whole shapes.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from statistics import NormalDist

from arms.shape import Lever, Shape

from arms import values
from arms.values import decode as decode_value, encode as encode_value  # noqa: F401 - the codec's names, for importers
from arms.verdict import Verdict
from tuner.night.state import MEMORY, STRUCTURAL, State
from tuner.night.verdict import by_constraint

_N = NormalDist()
BOOTS_CAP = 5            # boots of one challenger at one incumbent before it is called undecided
REEXAMINE_CAP = 7        # ... while the night re-examines weak evidence
HEAD_TO_HEAD = 3         # boots of the starting shape in the closing head-to-head
TWINS = 2                # boxes at once on one challenger (a shared campaign: ``_twin``)
AHEAD = True             # a shared campaign's boxes work at the likely next incumbent (``_ahead``)
AHEAD_BOOTS = 2          # ... once it reads better (``promising``) on this many boots (or is called better)
AHEAD_TWINS = 4          # ... booting it on at most this many boxes at once
BRACKET_IN_HAND = True   # a box leaves its bracket for later while another box closes two boots of it (``in_hand``)
OUTRUN = True            # a box does not confirm a challenger a likelier next incumbent outruns (``_outrun``)
JOIN = 4                 # boxes at once on the undecided challenger of highest expected gain (``_join``)
DECIDE_Z = 3.5           # standard errors a promotion needs, about (the night's looks run at 1e-4 and below)
PROMISING_Z = 2.0        # an undecided challenger reading this many standard errors better is worth a bracket
PRIOR_SIGMA = 0.05       # an untried change: mean 0, this sigma
RETRY_SIGMA = 0.03       # a change that failed for memory, retried once the plan moved: less likely to pay
CARRY_SIGMA = 0.02       # added (in quadrature) to a carried estimate: the effect may interact
INTERACTION = 0.1        # ... plus this much per unit of |log effect| the incumbent moved since
HEREDITY = 2.0           # ... plus this much per unit of (|log effect| moved since) x (|log effect| read):
                         #     interactions scale with the main effects (``carried_sigma``)
CAPACITY = re.compile(r"(max-model-len|kv-cache|max-num-seqs|gpu-memory-utilization|precise-memory|ctx-size|"
                      r"cache-type|parallel|n-cpu-moe|n-gpu-layers)")
PREFETCH = re.compile(r"prefetch", re.I)
SPEC = re.compile(r"(speculative|draft|num_speculative_tokens)", re.I)


@dataclass(frozen=True)
class Proposal:
    kind: str                               # baseline | probe | confirm | recheck | start
    change: tuple[str, object] | None = None
    why: str = ""
    ahead: int | None = None                # begun ahead of this arm's move (tuner/night/ahead.py)


def expected_gain(mu: float, sigma: float, bar: float = 0.0) -> float:
    """E[X 1{X > bar}] for X ~ N(mu, sigma^2): the gain a challenger is expected to bring when
    only an effect above ``bar`` can be shown (``bar`` 0: E[max(0, X)])."""
    if sigma <= 0:
        return mu if mu > bar else 0.0
    z = (bar - mu) / sigma
    return mu * (1 - _N.cdf(z)) + sigma * _N.pdf(z)


def provable(c: dict) -> float:
    """The smallest effect a challenger's own comparison could still show at its boot cap: its
    standard error shrunk to ``BOOTS_CAP`` boots, times ``DECIDE_Z``. A change whose own noise
    (a lever whose runs spread 40 %) keeps that bar far above any plausible effect is worth
    little more measuring, however uncertain its effect: more boots cannot make it a move."""
    boots = max(1, (c.get("boots") or [1])[0])
    return DECIDE_Z * c["se"] * math.sqrt(boots / max(boots, BOOTS_CAP))


def latest_comparisons(state: State) -> dict[tuple[str, str, str], dict]:
    """(incumbent key, lever, value text) -> the latest comparison of that challenger there."""
    return state.latest_comparisons()          # kept as the comparisons are replayed


def drift_since(state: State, arm: int | None) -> float:
    """How far the incumbent moved since arm ``arm``: the sum of |log effect| of the moves after it
    (a move decided by the constraints counts 0.05). A carried estimate is trusted less the
    further the incumbent has moved (a +47 % move changes which neighbours pay)."""
    out = 0.0
    for m in state.moves:
        if arm is None or m.get("arm", -1) > arm:
            eff = (m.get("comparison") or {}).get("effect")
            out += abs(math.log1p(eff)) if eff is not None and eff > -1 else 0.05
    return out


def carried_sigma(state: State, se: float, effect: float, arm: int | None) -> float:
    """The standard deviation of an effect read at an earlier incumbent, as a guess of it here:
    its own standard error, widened by ``CARRY_SIGMA`` and by the distance the incumbent moved
    since (``drift_since``), the more so the larger the effect read (interactions scale with
    the main effects they join: a change that read -50 % before a +47 % move may read anything
    after it, one that read -2 % before a +4 % move still reads about -2 %)."""
    drift = drift_since(state, arm)
    read = abs(math.log1p(effect)) if effect > -1 else 1.0
    return math.hypot(se, CARRY_SIGMA + (INTERACTION + HEREDITY * read) * drift)


def evidence(state: State, name: str) -> tuple[float, str]:
    """A prior mean for an untried change of lever ``name`` from the engine's own evidence."""
    inc = state.arms.get(state.incumbent_arm) if state.incumbent_arm is not None else None
    end = (inc.end or {}) if inc else {}
    sc = state.incumbent_score
    if sc is not None and not sc.feasible and CAPACITY.search(name):
        return 0.05, "the incumbent misses a constraint: a capacity lever"
    prec = prefetch_precision(end.get("telemetry"))
    if prec is not None and prec < 0.5 and PREFETCH.search(name):
        return 0.05, f"prefetch precision {prec:.0%}"
    acc = (end.get("measurement") or {}).get("acceptance")
    if acc is not None and acc < 0.5 and SPEC.search(name):
        return 0.02, f"spec acceptance {acc:.0%}"
    last = state.moves[-1] if state.moves else None
    if last and last.get("change") and last["change"][0] == name:
        return 0.02, "its neighbour value just won"
    return 0.0, ""


def prefetch_precision(tel) -> float | None:
    """The expert cache's prefetch precision from an arm's telemetry window (arms.telemetry's
    record: report.summary.precision), None without one."""
    rep = (tel or {}).get("report") if isinstance(tel, dict) else None
    summary = (rep or {}).get("summary") if isinstance(rep, dict) else None
    prec = (summary or {}).get("precision") if isinstance(summary, dict) else None
    return prec if isinstance(prec, (int, float)) and not isinstance(prec, bool) else None


def candidates(state: State, levers: dict[str, Lever]) -> list[tuple[float, str, object, str]]:
    """(-expected gain, lever, value, why) of every one-change neighbour still worth an arm now,
    best first."""
    inc = state.incumbent
    inc_key = inc.key()
    here = state.tried_here()
    hist = state.history()
    cmp = latest_comparisons(state)
    undo = {(m["change"][0], values.text_of(m["previous_value"])) for m in state.moves
            if m.get("change") and "previous_value" in m}
    out = []
    order = 0
    for name, lever in levers.items():
        current = values.text(inc.value_of(name))
        for value in lever.values:
            order += 1
            vt = values.text(value)
            if vt == current or (name, vt) in undo:
                continue
            past = hist.get((name, vt), [])
            corrupt, boot_classes = state.failures((name, vt))
            if corrupt or boot_classes & STRUCTURAL:
                continue                                       # structural: never again
            tries = here.get((name, vt), [])
            c = cmp.get((inc_key, name, vt))
            tie = order / 1e6
            if tries:
                last = tries[-1]
                if c is None or c.get("verdict") != Verdict.UNDECIDED or c["boots"][0] >= BOOTS_CAP:
                    continue                    # decided here (or a failure here): re-examined later
                mu, se = c["effect"], c["se"]
                out.append((-expected_gain(mu, se, provable(c)) + tie, name, value,
                            f"undecided {c['effect']:+.1%} ± {se:.1%} after {c['boots'][0]} boot(s): another boot"))
                continue
            earlier = [k for k in cmp if k[1] == name and k[2] == vt]
            if earlier:
                c = cmp[earlier[-1]]
                mu, sigma = c["effect"], carried_sigma(state, c["se"], c["effect"], c.get("arm"))
                why = f"{c['verdict']} at an earlier incumbent ({c['effect']:+.1%})"
                out.append((-expected_gain(mu, sigma, provable(c)) + tie, name, value, why))
                continue
            elif past and boot_classes & MEMORY:
                moved = [m for m in state.moves if m.get("arm", -1) > past[-1].n and m.get("change")
                         and CAPACITY.search(m["change"][0])]
                if moved:                       # the memory plan changed since: worth a retry, after the untried
                    mu, why_e = evidence(state, name)
                    sigma, why = RETRY_SIGMA, f"memory failure before {moved[-1]['change'][0]} moved" + \
                        (f" ({why_e})" if why_e else "")
                else:
                    mu, sigma, why = -0.02, 0.02, "memory failure at an earlier incumbent"
            elif past:
                last = past[-1]
                d = (last.end or {}).get("delta")
                if d is None and last.verdict == Verdict.WORSE:
                    d = -0.3                    # pruned after its first depth, or no objective at all
                mu = d or 0.0
                sigma = carried_sigma(state, 0.04, mu, last.n)
                why = f"{last.verdict} at an earlier incumbent"
            else:
                mu, why_e = evidence(state, name)
                sigma, why = PRIOR_SIGMA, "untried" + (f" ({why_e})" if why_e else "")
            out.append((-expected_gain(mu, sigma) + tie, name, value, why))
    out.sort(key=lambda c: c[0])
    return out


def reexamine(state: State, levers: dict[str, Lever], cap: int,
              busy: set | frozenset = frozenset()) -> tuple[str, object, str] | None:
    """The decided or undecided challenger at this incumbent whose interval still reaches above
    zero with the most gain left to show (``expected_gain`` above what it could still prove),
    while it has fewer than ``cap`` boots."""
    inc_key = state.incumbent.key()
    best = None
    for (k, name, vt), c in latest_comparisons(state).items():
        if k != inc_key or name not in levers or c["boots"][0] >= cap or c["hi"] <= 0 or (name, vt) in busy:
            continue
        value = next((v for v in levers[name].values if values.text(v) == vt), None)
        worth = expected_gain(c["effect"], c["se"], provable(c))
        if value is None or (best and best[0] >= worth):
            continue
        best = (worth, name, value, f"re-examine: {c['verdict']} {c['effect']:+.1%}, upper bound {c['hi']:+.1%} "
                                    f"after {c['boots'][0]} boot(s)")
    return best[1:] if best else None


def _pending_confirm(state: State, done) -> Proposal | None:
    inc = state.incumbent.key()
    for a in reversed(done):
        if a.verdict == Verdict.INTERRUPTED or a.kind in ("recheck", "start"):
            continue              # a crash cut the confirmation short: confirm again
        if a.kind in ("probe", "confirm") and a.verdict == Verdict.BETTER and a.incumbent == inc and by_constraint(a.end):
            break                 # promoted at once (resume: loop._start)
        if a.kind in ("probe", "confirm") and a.verdict == Verdict.BETTER and a.incumbent == inc:
            c = next((r["comparison"] for r in reversed(state.comparisons) if r.get("arm") == a.n), None)
            if c is None or c["boots"][0] < 2:        # a probe better on 2+ boots waits for its bracket only
                return Proposal("confirm", a.change, why=f"confirm arm {a.n}: a second boot")
        break
    return None


def _outrun(state: State, p: Proposal) -> bool:
    """On a shared campaign: whether the challenger ``p`` would confirm is outrun by a likely next
    incumbent (``pending_moves``) that reads better by more: once that move comes, this challenger
    is judged again at the new incumbent (its reading carried), so this box's next boot is worth
    more as its own boot of the incumbent-to-be and what follows it (``_twin``, ``_ahead``)."""
    key = (p.change[0], values.text(p.change[1]))
    c = state.comparison_at(state.incumbent_key, *key)
    mine = c["effect"] if c is not None and c.get("effect") is not None else None
    return mine is not None and any((arm.change[0], values.text(arm.change[1])) != key and m["effect"] >= mine
                                    for m, arm in pending_moves(state))


def promising(c: dict) -> bool:
    """A comparison worth closing: called ``better``, or undecided but reading better by more than
    ``PROMISING_Z`` standard errors (an open block's interval is wide on purpose, and early in the
    night the boot spread rests on a pair or two: its t quantile keeps a +10 % reading undecided
    until an incumbent boot brackets it), and by more than it could ever show at its boot cap
    (``provable``: a lever whose runs spread 40 % reads +10 % on many boots and proves nothing).
    Where the test took the night's boot spread at its upper bound (too few pairs yet), the search
    reads the standard error at the estimate (``se_estimate``): a bracket is what adds the pairs."""
    if c.get("verdict") == Verdict.BETTER:
        return True
    eff, se = c.get("effect"), c.get("se_estimate") or c.get("se")   # a spread from few pairs: its estimate
    return c.get("verdict") == Verdict.UNDECIDED and eff is not None and se is not None and eff > 0 \
        and math.log1p(eff) > PROMISING_Z * se and eff > provable({**c, "se": se})


def _pending_bracket(state: State, box: str | None = None) -> Proposal | None:
    """A recheck when a challenger at this incumbent reads better (``promising``) on two boots or
    more but some of its boots have no incumbent boot after them yet (an open block,
    tuner/night/blocks.py): the incumbent's next boot closes them (A B B A) and the loop judges the
    challenger again (``CampaignLoop._bracket``). Asked once per challenger boot: a recheck that
    already ran after it (and could not close the block: it failed to boot) is not repeated. On a
    shared campaign (``box``) only a boot on the challenger's own box closes its block: the box
    whose boot it was asks; a twin of it running on another box counts toward the two boots (A B A
    here beside A B A there), and while another box is closing two of its boots now (``in_hand``)
    this box works ahead first."""
    inc = state.incumbent.key()
    last_recheck = max((a.n for a in state.finished() if a.kind == "recheck" and a.key == inc
                        and (box is None or a.box == box)), default=-1)
    twins: dict[tuple[str, str], int] = {}       # boots of a challenger running on other boxes: they count
    if box is not None:
        for a in state.open_arms:
            if a.change and a.incumbent == inc and a.box != box and a.kind in ("probe", "confirm"):
                k = (a.change[0], values.text(a.change[1]))
                twins[k] = twins.get(k, 0) + 1
    for (k, name, vt), c in state.latest_comparisons().items():
        if k == inc and c.get("open") and promising(c) and (c.get("boots") or [0])[0] + twins.get((name, vt), 0) >= 2 \
                and (c.get("arm") or -1) > last_recheck \
                and (box is None or _opens_on(state, c, box) and not (BRACKET_IN_HAND and in_hand(state, c, box) >= 2)):
            return Proposal("recheck", why=f"bracket arm {c.get('arm')}: it reads better, but {c['open']} of its "
                                           "boots have no incumbent boot after them yet")
    return None


def in_hand(state: State, c: dict, box: str) -> int:
    """Boots of comparison ``c``'s challenger whose blocks another box is closing now (an incumbent
    boot running there, begun after the boot), plus those closed already; 0 when no other box is
    closing any. Two of them are what a move rests on (``verdict.promotes``; the loop judges the
    closed blocks alone), so on a shared campaign a box whose own boot of the challenger is still
    open leaves its bracket for later and works ahead of the move instead (``_ahead``): its boot of
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


def _opens_on(state: State, c: dict, box: str) -> bool:
    """Whether one of comparison ``c``'s open blocks is a boot of ``box``."""
    for b in c.get("blocks") or []:
        a = state.arms.get(b.get("boot"))
        if not b.get("closed") and a is not None and a.box == box:
            return True
    return False


def in_flight(state: State, box: str | None) -> set[tuple[str, str]]:
    """(lever, value text) of the challengers other boxes are running now at this incumbent: a
    shared campaign never gives the same arm to two boxes."""
    inc = state.incumbent_key
    return {(a.change[0], values.text(a.change[1])) for a in state.open_arms
            if a.change and a.box != box and a.incumbent == inc}


def _twin(state: State, box: str, busy: set) -> Proposal | None:
    """On a shared campaign: this box's boot of a challenger another box has in hand at this
    incumbent, when the evidence already says better (called ``better`` or ``promising`` here, or
    ``better`` at an earlier incumbent: effects mostly carry) and this box has no boot of it here
    yet: one running on another box now, or one whose better reading waits only for its bracket.
    Such a challenger needs two boots or more, each bracketed on its own box, before it can move
    anything (``verdict.promotes``); run side by side, the boxes' A B A blocks take the time of
    one box's A B B A, and a twin still open when the first box's blocks close does not hold the
    move up (the loop judges the closed blocks alone, ``Judging._closed_move``). If the move
    comes, this box's boot of it is its own boot of the new incumbent, so it starts on the next
    challenger at once. At most ``TWINS`` boxes at once on one challenger; the test is the same."""
    inc = state.incumbent_key
    cmp = state.latest_comparisons()
    mine = {(a.change[0], values.text(a.change[1])) for a in state.arms.values()
            if a.change and a.incumbent == inc and a.box == box}
    running: dict[tuple[str, str], int] = {}
    for a in state.open_arms:
        if a.change and a.incumbent == inc and a.kind in ("probe", "confirm"):
            k = (a.change[0], values.text(a.change[1]))
            running[k] = running.get(k, 0) + 1
    held: dict[tuple[str, str], object] = {}
    for a in state.arms.values():
        if a.change and a.incumbent == inc and a.kind in ("probe", "confirm") and a.box != box:
            held.setdefault((a.change[0], values.text(a.change[1])), a)
    best = None
    for key, a in held.items():
        if key in mine or running.get(key, 0) >= TWINS:
            continue
        c = cmp.get((inc, key[0], key[1]))
        if c is not None:
            if not promising(c) or (key not in running and not c.get("open")):
                continue
            why, worth = f"{c['verdict']} {c['effect']:+.1%} after {c['boots'][0]} boot(s) here", c["effect"]
        else:
            earlier = [c for k, c in cmp.items() if k[1] == key[0] and k[2] == key[1]]
            if key not in running or not earlier or earlier[-1].get("verdict") != Verdict.BETTER:
                continue
            why, worth = f"better at an earlier incumbent ({earlier[-1]['effect']:+.1%})", earlier[-1]["effect"]
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


def _ahead(state: State, levers: dict[str, Lever], box: str, recheck_every: int, busy: set) -> Proposal | None:
    """On a shared campaign: this box's next arm at the incumbent-to-be (tuner/night/ahead.py).
    For the likeliest pending move (``pending_moves``): a box with no boot of that shape yet boots
    it (a twin: more evidence for the move, and this box's own boot of the incumbent-to-be); a box
    with one measures the next neighbour there, by the same policy as at the incumbent."""
    from tuner.night.ahead import supposing

    if not any(a.box != box for a in state.arms.values()):
        return None                             # one box: its next arm is the bracket itself, nothing to overlap
    for c, arm in pending_moves(state):
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
        p = propose(view, levers, recheck_every=recheck_every, confirm=True, spend=False, box=box, ahead=False)
        if p is not None and p.kind in ("probe", "confirm", "recheck"):
            return replace(p, ahead=arm.n, why=f"ahead of arm {arm.n} ({arm.change[0]} -> "
                                               f"{values.text(arm.change[1])}): {p.why}")
    return None


def _join(state: State, best: tuple, box: str, busy: set) -> Proposal | None:
    """On a shared campaign: when the challenger of highest expected gain this box can take is an
    undecided one another box is booting now (one ranked above it that another box probes for the
    first time is not this box's to take), this box boots it beside (up to ``JOIN`` boxes at once):
    a small effect needs several bracketed boots, and boxes booting it side by side gather them in
    the time one box takes for one (each box's blocks are its own)."""
    _, name, value, why = best
    key = (name, values.text(value))
    if key not in busy:
        return None
    c = state.comparison_at(state.incumbent_key, *key)
    if c is None or c.get("verdict") != Verdict.UNDECIDED or (c.get("effect") or 0) <= 0:
        return None
    running = [a for a in state.open_arms if a.change and a.incumbent == state.incumbent_key
               and (a.change[0], values.text(a.change[1])) == key]
    if not running or len(running) >= JOIN or any(a.box == box for a in running) \
            or c["boots"][0] + len(running) >= BOOTS_CAP:
        return None
    a = running[0]
    return Proposal("confirm", (name, value), why=f"twin of arm {a.n} ({a.box}): the best expected gain, {why}; "
                                                  "this box's blocks beside it")


def running_of(state: State, arm) -> int:
    """Boots of ``arm``'s shape running now, any box."""
    return sum(1 for a in state.open_arms if a.key == arm.key)


def propose(state: State, levers: dict[str, Lever], *, recheck_every: int = 6, confirm: bool = True,
            spend: bool = True, box: str | None = None, ahead: bool = True) -> Proposal | None:
    """The next arm. ``box``: the box asking, on a shared campaign (tuner/night/shared.py): the
    starting shape, the incumbent's re-measures and a bracket are its own (its comparisons are
    blocked by box), and what another box runs now is not given again."""
    done = state.finished()                    # in arm order
    mine = done if box is None else [a for a in done if a.box == box]
    busy = in_flight(state, box) if box is not None else set()
    if not any(a.kind == "baseline" and a.verdict not in (None, Verdict.INTERRUPTED) for a in mine) \
            and (box is None or state.incumbent_key == state.baseline.key()):
        return Proposal("baseline", why="measure the starting shape" + (" on this box" if box else ""))
    if box is not None and state.incumbent_boots(box) < 1:
        return Proposal("recheck", why="this box's own boot of the incumbent: its comparisons are blocked by box")
    if recheck_every and not any(a.kind == "recheck" and a.verdict not in (None, Verdict.INTERRUPTED) for a in mine):
        return Proposal("recheck", why="re-measure the starting shape at once: the first noise estimate")
    if confirm:
        p = _pending_confirm(state, done)
        if p is not None and (p.change[0], values.text(p.change[1])) not in busy \
                and not (box is not None and OUTRUN and _outrun(state, p)):
            return p
    p = _pending_bracket(state, box)
    if p is not None:
        return p
    if recheck_every and state.arms_since_incumbent_measure(box) >= recheck_every:
        return Proposal("recheck", why=f"re-measure the incumbent every {recheck_every} arms (noise band)")
    if box is not None and confirm:
        p = _twin(state, box, busy)
        if p is not None:
            return p
        p = _ahead(state, levers, box, recheck_every, busy) if ahead and AHEAD else None
        if p is not None:
            return p
    joins = box is not None and confirm and JOIN > 1
    for c in candidates(state, levers):        # best first: the first this box can take
        if (c[1], values.text(c[2])) not in busy:
            return Proposal("probe", (c[1], c[2]), why=c[3])
        p = _join(state, c, box, busy) if joins else None
        if p is not None:
            return p
    if not spend:
        return None
    r = reexamine(state, levers, REEXAMINE_CAP, busy)
    if r is not None:
        return Proposal("probe", (r[0], r[1]), why=r[2])
    if state.incumbent != state.baseline:
        starts = sum(1 for a in state.starts_at(state.incumbent.key()) if a.verdict not in (None, Verdict.INTERRUPTED))
        if starts < HEAD_TO_HEAD:
            if state.arms_since_incumbent_measure(box) >= 1 and starts > 0:
                return Proposal("recheck", why="head-to-head against the starting shape: the incumbent's turn")
            return Proposal("start", why=f"head-to-head: the starting shape, boot {starts + 1} of {HEAD_TO_HEAD}")
    r = reexamine(state, levers, 4 * REEXAMINE_CAP, busy)
    if r is not None:
        return Proposal("probe", (r[0], r[1]), why=r[2])
    return None


def apply(shape: Shape, change: tuple[str, object] | None) -> Shape:
    if change is None:
        return shape
    return shape.with_change(change[0], change[1])

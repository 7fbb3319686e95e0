"""Which arm next: a pure policy over the replayed state (no I/O, no clock).

One-change mode walks the incumbent's neighbourhood. Before anything else: measure the start
(twice: the second boot is the first boot-to-boot evidence), give a challenger the comparison
called ``better`` on one boot its second boot, boot the incumbent after a challenger that reads
better on two boots with no incumbent boot after them yet (``_pending_bracket``: it closes their
blocks, tuner/night/blocks.py), and re-measure the incumbent every K arms. Then
the next challenger is the one-change neighbour of highest *expected gain*, E[max(0, X)] for
X ~ N(mu, sigma^2), where mu and sigma come from
  - the sequential comparison at this incumbent, when it is still undecided (another boot);
  - the comparison at an earlier incumbent, carried over (effects are mostly additive: a value of
    a lever that moved since is read from the value that won, ``gain.carried_effect``; sigma is
    widened for interactions), or the change's latest probe where one came after it (pruned at its
    first depth, it has no comparison of its own);
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
On a shared campaign (``box``) each box boots the incumbent itself before its challengers, and what
the other boxes run now shapes this box's next arm: twins, working ahead, joins
(tuner/night/sharing.py). What a reading is worth (expected gain, ``provable``, ``promising``, a
carried estimate's sigma) is tuner/night/gain.py.
Joint mode (for comparison) lets Optuna's sampler pick whole shapes.
"""
from __future__ import annotations

import re

from arms.shape import Lever

from arms import values
from arms.values import decode as decode_value, encode as encode_value  # noqa: F401 - the codec's names, for importers
from arms.verdict import Verdict
from tuner.night import sharing
from tuner.night.gain import BOOTS_CAP, carried_effect, carried_sigma, expected_gain, promising, provable
from tuner.night.proposal import Proposal
from tuner.night.state import MEMORY, STRUCTURAL, State
from tuner.night.verdict import by_constraint

REEXAMINE_CAP = 7        # ... while the night re-examines weak evidence
HEAD_TO_HEAD = 3         # boots of the starting shape in the closing head-to-head
PRIOR_SIGMA = 0.05       # an untried change: mean 0, this sigma
RETRY_SIGMA = 0.03       # a change that failed for memory, retried once the plan moved: less likely to pay
CAPACITY = re.compile(r"(max-model-len|kv-cache|max-num-seqs|gpu-memory-utilization|precise-memory|ctx-size|"
                      r"cache-type|parallel|n-cpu-moe|n-gpu-layers)")
PREFETCH = re.compile(r"prefetch", re.I)
SPEC = re.compile(r"(speculative|draft|num_speculative_tokens)", re.I)


def latest_comparisons(state: State) -> dict[tuple[str, str, str], dict]:
    """(incumbent key, lever, value text) -> the latest comparison of that challenger there."""
    return state.latest_comparisons()          # kept as the comparisons are replayed


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
            if earlier and past and past[-1].n > (cmp[earlier[-1]].get("arm") or -1):
                earlier = []                    # a later probe (pruned, failed for memory) says more
            if earlier:
                c = cmp[earlier[-1]]
                mu = carried_effect(state, earlier[-1][0], name, c["effect"])
                sigma = carried_sigma(state, c["se"], c["effect"], c.get("arm"))
                why = f"{c['verdict']} at an earlier incumbent ({c['effect']:+.1%}" + \
                    (f"; {mu:+.1%} from this {name})" if mu != c["effect"] else ")")
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
                mu = carried_effect(state, last.incumbent, name, d) if d else 0.0
                sigma = carried_sigma(state, 0.04, d or 0.0, last.n)
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


def _pending_bracket(state: State, box: str | None = None) -> Proposal | None:
    """A recheck when a challenger at this incumbent reads better (``promising``) on two boots or
    more but some of its boots have no incumbent boot after them yet (an open block,
    tuner/night/blocks.py): the incumbent's next boot closes them (A B B A) and the loop judges the
    challenger again (``CampaignLoop._bracket``). Asked once per challenger boot: a recheck that
    already ran after it (and could not close the block: it failed to boot) is not repeated. On a
    shared campaign (``box``) only a boot on the challenger's own box closes its block: the box
    whose boot it was asks; a twin of it running on another box counts toward the two boots (A B A
    here beside A B A there), and while another box is closing two of its boots now (``sharing.in_hand``)
    this box works ahead first."""
    inc = state.incumbent.key()
    last_recheck = max((a.n for a in state.finished() if a.kind == "recheck" and a.key == inc
                        and (box is None or a.box == box)), default=-1)
    twins = sharing.twins_running(state, box) if box is not None else {}   # boots on other boxes: they count
    for (k, name, vt), c in state.latest_comparisons().items():
        if k == inc and c.get("open") and promising(c) and (c.get("boots") or [0])[0] + twins.get((name, vt), 0) >= 2 \
                and (c.get("arm") or -1) > last_recheck \
                and (box is None or (sharing.brackets_here(state, c, box)
                                     and not (sharing.others_at_work(state, box)
                                              and sharing.outruns(state, (name, vt), called=True)))):
            return Proposal("recheck", why=f"bracket arm {c.get('arm')}: it reads better, but {c['open']} of its "
                                           "boots have no incumbent boot after them yet")
    return None


def propose(state: State, levers: dict[str, Lever], *, recheck_every: int = 6, confirm: bool = True,
            spend: bool = True, box: str | None = None, ahead: bool = True) -> Proposal | None:
    """The next arm. ``box``: the box asking, on a shared campaign (tuner/night/shared.py): the
    starting shape, the incumbent's re-measures and a bracket are its own (its comparisons are
    blocked by box), and what another box runs now is not given again."""
    done = state.finished()                    # in arm order
    mine = done if box is None else [a for a in done if a.box == box]
    busy = sharing.in_flight(state, box) if box is not None else set()
    if not any(a.kind == "baseline" and a.verdict not in (None, Verdict.INTERRUPTED) for a in mine) \
            and (box is None or state.incumbent_key == state.baseline.key()):
        return Proposal("baseline", why="measure the starting shape" + (" on this box" if box else ""))
    work_ahead = (lambda moves=None: sharing.ahead(state, box, lambda view: propose(
        view, levers, recheck_every=recheck_every, confirm=True, spend=False, box=box, ahead=False), moves)) \
        if box is not None and confirm and ahead else (lambda moves=None: None)
    land = sharing.landing(state, box) if box is not None and confirm and ahead else None
    if land is not None:
        p = work_ahead([land])                 # a boot of the incumbent now would measure one about to be replaced
        if p is not None:
            return p
    if box is not None and state.incumbent_boots(box) < 1:
        return Proposal("recheck", why="this box's own boot of the incumbent: its comparisons are blocked by box")
    if recheck_every and not any(a.kind == "recheck" and a.verdict not in (None, Verdict.INTERRUPTED) for a in mine) \
            and not (box is not None and sharing.probe_first(state, box, mine)):
        p = _pending_confirm(state, mine) if box is not None and confirm and sharing.CONFIRM_FIRST else None
        if p is not None and (p.change[0], values.text(p.change[1])) not in busy:
            return p                           # its first challenger called better: B B, then A closes both
        return Proposal("recheck", why="re-measure the starting shape at once: the first noise estimate")
    if confirm:
        p = _pending_confirm(state, done)
        key = (p.change[0], values.text(p.change[1])) if p is not None else None
        if p is not None and key not in busy and not (box is not None and sharing.outruns(state, key)):
            return p
    p = _pending_bracket(state, box)
    if p is not None:
        return p
    if recheck_every and state.arms_since_incumbent_measure(box) >= recheck_every:
        return Proposal("recheck", why=f"re-measure the incumbent every {recheck_every} arms (noise band)")
    if box is not None and confirm:
        p = sharing.twin(state, box, busy)
        if p is not None:
            return p
        p = work_ahead()
        if p is not None:
            return p
    joins = box is not None and confirm
    for c in candidates(state, levers):        # best first: the first this box can take
        if (c[1], values.text(c[2])) not in busy:
            return Proposal("probe", (c[1], c[2]), why=c[3])
        p = sharing.join(state, c, box, busy) if joins else None
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


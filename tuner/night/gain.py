"""What a challenger's evidence is worth to the search (tuner/night/search.py): the gain it is
expected to bring, the smallest effect its own comparison could still show, whether an undecided
reading is worth closing, and how far a reading taken at an earlier incumbent still says something
here. Pure numbers over comparisons and the replayed state: no I/O, no clock."""
from __future__ import annotations

import math
from statistics import NormalDist

from arms.verdict import Verdict
from tuner.night.state import State

_N = NormalDist()
BOOTS_CAP = 5            # boots of one challenger at one incumbent before it is called undecided
DECIDE_Z = 3.5           # standard errors a promotion needs, about (the night's looks run at 1e-4 and below)
PROMISING_Z = 2.0        # an undecided challenger reading this many standard errors better is worth a bracket
CARRY_SIGMA = 0.02       # added (in quadrature) to a carried estimate: the effect may interact
INTERACTION = 0.1        # ... plus this much per unit of |log effect| the incumbent moved since
HEREDITY = 2.0           # ... plus this much per unit of (|log effect| moved since) x (|log effect| read):
                         #     interactions scale with the main effects (``carried_sigma``)


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


def carried_effect(state: State, key: str, name: str, effect: float) -> float:
    """What a change of lever ``name``, read ``effect`` at incumbent ``key``, predicts at the
    incumbent now. Where the incumbent's own value of that lever moved since (a move x -> y read
    e), the change now starts from y: under the additivity the carry rests on it reads
    (1 + effect) / (1 + e) - 1, move after move (a value that read +4 % beside one that won with
    +7 % reads -3 % from the winner). Moves of other levers leave the mean alone; their
    interactions widen its sigma (``carried_sigma``)."""
    if key == state.incumbent_key:
        return effect
    seen = False
    for m in state.moves:
        seen = seen or m.get("previous") == key
        e = (m.get("comparison") or {}).get("effect")
        if seen and m.get("change") and m["change"][0] == name and e is not None and e > -1:
            effect = (1 + effect) / (1 + e) - 1
    return effect


def carried_sigma(state: State, se: float, effect: float, arm: int | None) -> float:
    """The standard deviation of an effect read at an earlier incumbent, as a guess of it here:
    its own standard error, widened by ``CARRY_SIGMA`` and by the distance the incumbent moved
    since (``drift_since``), the more so the larger the effect read (interactions scale with
    the main effects they join: a change that read -50 % before a +47 % move may read anything
    after it, one that read -2 % before a +4 % move still reads about -2 %)."""
    drift = drift_since(state, arm)
    read = abs(math.log1p(effect)) if effect > -1 else 1.0
    return math.hypot(se, CARRY_SIGMA + (INTERACTION + HEREDITY * read) * drift)

"""Comparisons blocked in time: a challenger's boots judged against the incumbent boots around
them, never against the incumbent's boots pooled over the night. Pure functions.

The unit of replication is the boot (Kalibera & Jones): a boot has its own offset (placement,
layout, what the box was doing), and a box drifts (thermals, another tenant). So a challenger's
boot B is compared with a *reference* read off the incumbent's boots next to it in time:

- **closed block** — incumbent boots before and after B (A B A, or A B B A when the challenger's
  confirming boot follows at once): the reference is the incumbent's line through them, read at
  B's time (with one boot on each side, the linear interpolation). A drift that is linear over
  the block cancels exactly;
- **open block** — incumbent boots on one side only (the challenger was just booted): the
  reference is the mean of the nearest incumbent boots, moved along the night's drift when one is clearly
  there (``compare.estimate_drift``), with that drift's uncertainty added (never a line through
  the incumbent's boots extrapolated: its variance grows with the gap). An open block can
  *drop* a challenger (a wrong drop costs a missed gain) but never promote one: ``promotes``
  waits until every boot of the challenger is bracketed, and the search boots the incumbent to
  close the blocks (``search._pending_bracket``);
- a block across which the incumbent itself *jumped* (moved, beyond what the night's drift
  explains, by more than ``JUMP_Z`` standard errors of its boot-to-boot spread and by more than
  the minimum effect: a step, a drift that reversed inside the block) cannot be trusted to cancel
  anything: it counts as open, and the comparison says so.

The estimate is one linear contrast over boot means (each boot: its mean log rate over the
comparison's depths), so its variance is exact for independent boots, shared incumbent boots
included (A B1 A B2 A: the middle A serves both challengers): sum of c_b^2 (sigma_boot^2 +
the boot's own run variance). sigma_boot^2, the boot-to-boot variance beyond the runs' noise,
is pooled over the night from successive differences of every other shape's boots in time order
(robust to a slow drift; trimmed against a robust scale, robust to one erratic shape or one
step), corrected for the runs' own noise (``boot_spread``). Until it rests on
``MIN_SPREAD_PAIRS`` pairs it is taken at its one-sided upper confidence bound (``SPREAD_LEVEL``),
as if known: a variance from a pair or two can come out near zero by chance, and Welch-Satterthwaite
then lets the runs' many degrees of freedom speak for it (a night of a few arms can still promote a
large effect; a small one waits for the boots to show the spread). The challenger's own
boot-to-boot spread enters as a floor when it is clearly larger: with two blocks or more whose differences spread more than ``OWN_SPREAD_F``
times what the night's spread predicts, the standard error is at least theirs (a lever that makes
boots erratic). Taking the larger of two estimates every time would inflate every interval by
the noise of a one-degree-of-freedom variance.
"""
from __future__ import annotations

import math
import statistics
from statistics import NormalDist
from dataclasses import dataclass

from tuner.night.compare import (DRIFT_Z, MIN_EFFECT, SIGMA_FLOOR, Comparison, Drift, Side, _split_runs,
                                 _welch_df, decide, estimate_drift, growth, t_quantile)

_N = NormalDist()
BRACKET = 2      # incumbent boots read on each side of a challenger's boot
JUMP_Z = 4.0     # an incumbent that moved this many standard errors across a block jumped
PAIR_GAP = 8     # boots of one shape further apart than this (arms of their box) say more about the box than the boot
TRIM_Z = 3.0     # a successive difference beyond this many robust sigmas is a jump, not spread ...
TRIM_KEEP = 1 - 2 * TRIM_Z * _N.pdf(TRIM_Z) / (2 * _N.cdf(TRIM_Z) - 1)   # E[z^2 | |z| < TRIM_Z] of a normal
TRIM_MIN_PAIRS = 12  # ... from this many pairs on (the median of fewer squares is too rough a scale); below it a
TRIM_P = 0.001       # pair is a jump when the other pairs make it this unlikely (Bonferroni over the pairs) ...
TRIM_SHARE = 0.25    # ... and no more than this share of them
MIN_SPREAD_PAIRS = 5  # below this many successive boot pairs the night's spread is taken at its upper bound ...
SPREAD_LEVEL = 0.1    # ... the one-sided 90 % bound of a chi-square with that many degrees of freedom
OWN_SPREAD_F = 6.6   # the challenger's block differences spread this many times what the night predicts
                     # (the F quantile at 0.99 for one degree of freedom): its own boots are erratic


@dataclass(frozen=True)
class Boot:
    """One measured boot: its arm, its place on the comparison's time axis ``t``, {depth: [log rates
    kept]}, and when it measured on the clock (``hours``, for the drift a block saw). The loop's
    axis is the arm order of the boot's own box (a box's arms are close to evenly spaced, and a
    decision must not depend on whose clock ran it: the simulated host's or the box's;
    ``State.place``); a reader may pass hours."""

    arm: int
    t: float
    runs: dict
    disturbed: int = 0
    contended: int = 0
    hours: float | None = None
    box: str | None = None        # the box it ran on (a shared campaign): its blocks are of that box's boots

    @classmethod
    def of(cls, arm: int, t: float, measurement: dict | None, depth: int | None = None,
           hours: float | None = None, box: str | None = None) -> "Boot":
        runs, dropped, contended = _split_runs(measurement, depth)
        return cls(arm, t, runs, dropped, contended, t if hours is None else hours, box)

    def mean(self, depths: list[str]) -> float:
        return statistics.fmean(statistics.fmean(self.runs[d]) for d in depths)

    def mean_var(self, depths: list[str], s2: float) -> float:
        """The variance of ``mean`` from the runs' noise alone (one run's variance ``s2``)."""
        return s2 * sum(1 / len(self.runs[d]) for d in depths) / len(depths) ** 2


@dataclass(frozen=True)
class Spread:
    """The night's boot-to-boot variance of a boot's mean log rate, beyond its runs' noise."""

    var: float
    pairs: int                 # successive boot pairs it was estimated from (its degrees of freedom)
    upper: float = 0.0         # its one-sided upper confidence bound (``SPREAD_LEVEL``), for a night with few pairs

    @property
    def sigma(self) -> float:
        return math.sqrt(self.var)


def run_var(boots: list[Boot], depths: list[str] | None = None) -> tuple[float, int]:
    """One run's variance of the log rate, pooled within boots and depths, and its degrees of freedom."""
    ss, dof = 0.0, 0
    for b in boots:
        for d, xs in b.runs.items():
            if (depths is None or d in depths) and len(xs) >= 2:
                ss += statistics.variance(xs) * (len(xs) - 1)
                dof += len(xs) - 1
    return (max(ss / dof, SIGMA_FLOOR ** 2) if dof else SIGMA_FLOOR ** 2), dof


def _clear(drift: Drift | None) -> bool:
    return drift is not None and abs(drift.per_h) > DRIFT_Z * drift.se


CHI2_1_MEDIAN = 0.45494    # the median of a chi-square with one degree of freedom: a robust scale


def boot_spread(series: list[list[Boot]], drift: Drift | None = None) -> Spread:
    """sigma_boot^2 from successive differences of each shape's boots in arm order, no more than
    ``PAIR_GAP`` apart: E[(y2 - y1)^2]
    = 2 sigma_boot^2 + the two means' run variances (+ the drift over the gap, taken out when it is
    clearly there). Jumps are left out first (a step, another tenant's arrival, is one huge
    difference: it must not make every boot look noisy; it is a jump of its own,
    ``compare_blocked``): from ``TRIM_MIN_PAIRS`` pairs on, differences beyond ``TRIM_Z`` times a
    robust scale (``_robust_spread``: a median, which several pairs across one step do not move);
    below, only a difference that stands out from all the others (``_jumps``). The rest are
    averaged (the mean square successive difference: far more efficient than a median), each pair
    weighted by
    the inverse variance of its square, (2 sigma_boot^2 + its runs' noise)^-2 (a shape whose runs
    spread 40 % says next to nothing about boots; weighting by the runs' noise alone would let
    long-measured boots, the ones whose comparison stayed close, speak for the rest), clipped at
    0: a night whose boots agree to their runs' noise has none."""
    sq, noise = [], []
    for boots in series:
        boots = sorted((b for b in boots if b.runs), key=lambda b: b.arm)
        if len(boots) < 2:
            continue
        s2, _ = run_var(boots)
        for a, b in zip(boots, boots[1:]):
            depths = sorted(set(a.runs) & set(b.runs))
            if not depths or b.t - a.t > PAIR_GAP:
                continue                 # a shape met again hours later: its difference holds the night's steps
            delta = b.mean(depths) - a.mean(depths)
            if _clear(drift):
                delta -= drift.per_h * (b.t - a.t)
            sq.append(delta * delta)
            noise.append(a.mean_var(depths, s2) + b.mean_var(depths, s2))
    if not sq:
        return Spread(0.0, 0)
    rough = _robust_spread(sq, noise)                  # a robust scale for the weights, each pair its own noise
    if len(sq) >= TRIM_MIN_PAIRS:                      # the jumps out against the robust scale (the trim's own bias put back)
        kept = [(q / TRIM_KEEP, v) for q, v in zip(sq, noise) if q <= TRIM_Z ** 2 * (2 * rough + v)]
    else:                                              # few pairs: a jump stands out from all the others
        cut = _jumps(sq, noise)
        kept = [(q, v) for i, (q, v) in enumerate(zip(sq, noise)) if i not in cut]
    # a pair's weight: the inverse variance of its square, ~ (2 sigma_boot^2 + its runs' noise)^-2 at the
    # robust sigma_boot (an erratic shape's pairs say little; a pair of long-measured boots no more than
    # its boots allow)
    w = [1 / (2 * rough + v) ** 2 for _, v in kept]      # v > 0: a run's variance is floored (run_var)
    var = sum(wi * (q - v) for wi, (q, v) in zip(w, kept)) / sum(w) / 2
    k = len(kept)
    msq, mv = statistics.fmean(q for q, _ in kept), statistics.fmean(v for _, v in kept)
    upper = max(0.0, (k * msq / chi2_quantile(SPREAD_LEVEL, k) - mv) / 2)      # E[q] at its upper bound
    return Spread(max(0.0, var), k, max(upper, var))


def _jumps(sq: list[float], noise: list[float]) -> set[int]:
    """The pairs that are jumps (a step, a tenant's arrival), not spread: one at a time, the pair
    whose square stands furthest above what the pairs left say (their mean square beyond their
    runs' noise, plus its own runs' noise) is cut while that ratio is beyond the F(1, k) quantile at
    ``TRIM_P`` over the k pairs left (Bonferroni over the pairs), and no more than ``TRIM_SHARE`` of
    them. Against the others' mean square, not their median: the median of a few squares is a
    rough scale, and cutting against it took honest pairs for jumps (a box whose boots spread 5 %
    read 1.2 % from the 5 pairs it kept, and a zero-effect lever was promoted). Several pairs across
    one step mask each other here: from ``TRIM_MIN_PAIRS`` on, the median's scale does the cutting."""
    left = set(range(len(sq)))
    cut: set[int] = set()
    while len(left) >= 3 and len(cut) < TRIM_SHARE * len(sq):
        def ratio(i: int) -> float:
            others = [j for j in left if j != i]
            s = max(0.0, statistics.fmean(sq[j] - noise[j] for j in others)) / 2
            return sq[i] / (2 * s + noise[i])
        worst = max(left, key=ratio)
        k = len(left) - 1
        if ratio(worst) <= t_quantile(1 - TRIM_P / (2 * len(left)), k) ** 2:
            break
        left.discard(worst)
        cut.add(worst)
    return cut


def chi2_quantile(p: float, k: int) -> float:
    """The lower ``p`` quantile of a chi-square with ``k`` degrees of freedom: exact for 1 and 2,
    else Wilson-Hilferty's cube-root normal (within a few per cent from 3 on)."""
    if k == 1:
        return _N.inv_cdf((1 + p) / 2) ** 2
    if k == 2:
        return -2 * math.log(1 - p)
    z = _N.inv_cdf(p)
    return k * max(1e-9, 1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


def _robust_spread(sq: list[float], noise: list[float]) -> float:
    """The sigma_boot^2 at which the pairs' standardised squares q / (2 sigma_boot^2 + v) have the
    median of a chi-square with one degree of freedom (0 when they fall below it at 0 already): a
    scale no step and no erratic shape moves (a shape whose runs spread 40 % has a v of its own)."""
    def med(s: float) -> float:
        return statistics.median(q / (2 * s + v) for q, v in zip(sq, noise))
    if med(0.0) <= CHI2_1_MEDIAN:
        return 0.0
    lo, hi = 0.0, max(sq)
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if med(mid) > CHI2_1_MEDIAN else (lo, mid)
    return hi


def drift_of(series: list[list[Boot]]) -> Drift | None:
    """``compare.estimate_drift`` over boots: one slope per unit of the axis, every shape its own level."""
    return estimate_drift([Side(tuple(b.runs for b in s if b.runs), tuple(b.t for b in s if b.runs))
                           for s in series])


def _reference(t: float, refs: list[Boot]) -> list[float]:
    """Weights on ``refs`` of their least-squares line read at time ``t`` (one boot each side: the
    linear interpolation; all at one time: their mean)."""
    n = len(refs)
    tm = statistics.fmean(r.t for r in refs)
    sxx = sum((r.t - tm) ** 2 for r in refs)
    if n == 1 or sxx <= 1e-12:
        return [1 / n] * n
    return [1 / n + (r.t - tm) * (t - tm) / sxx for r in refs]


def compare_blocked(challenger: list[Boot], incumbent: list[Boot], *, spread: Spread, alpha: float,
                    drop_alpha: float = 0.05, min_effect: float = MIN_EFFECT,
                    drift: Drift | None = None, closed_only: bool = False) -> Comparison | None:
    """The blocked test of ``challenger``'s boots against ``incumbent``'s; None when they share no
    depth, or either side has no measured boot. ``closed_only``: the challenger's boots with
    incumbent boots on both sides only (the test a promotion may rest on while another box's boot
    of the challenger still waits for its bracket: which boots are left out depends on when they
    ran, never on what they read)."""
    chal = sorted((b for b in challenger if b.runs), key=lambda b: b.arm)
    inc = sorted((b for b in incumbent if b.runs), key=lambda b: b.arm)
    if not chal or not inc:
        return None
    plans = []
    for b in chal:
        here = [a for a in inc if a.box == b.box]        # a box's own offset cancels in its blocks
        before = [a for a in here if a.arm < b.arm][-BRACKET:]
        after = [a for a in here if a.arm > b.arm][:BRACKET]
        if (before and after) if closed_only else (before or after):
            plans.append((b, before, after))
    if not plans:
        return None
    chal = [b for b, _, _ in plans]
    used = {a.arm: a for _, bf, af in plans for a in bf + af}
    depths = sorted(set.intersection(*(set(b.runs) for b in chal), *(set(a.runs) for a in used.values())))
    s2c, dfc = run_var(chal, depths)
    s2i, dfi = run_var(inc, depths)
    if not depths or (dfc == 0 and dfi == 0):
        return None
    J = len(chal)
    coef: dict[int, float] = {}
    mv: dict[int, float] = {}
    blocks, diffs, block_vars = [], [], []
    open_n, extrap_var = 0, 0.0
    for b, before, after in plans:
        refs = before + after
        w = _reference(b.t, refs) if before and after else [1 / len(refs)] * len(refs)   # never extrapolated
        ref = sum(wi * r.mean(depths) for wi, r in zip(w, refs))
        closed = bool(before) and bool(after)
        jumped = False
        seen = None
        if closed:
            a0, a1 = before[-1], after[0]
            step = a1.mean(depths) - a0.mean(depths)
            h0, h1 = (a0.t if a0.hours is None else a0.hours), (a1.t if a1.hours is None else a1.hours)
            if h1 > h0:
                seen = step / (h1 - h0)
            sd = math.sqrt(2 * spread.var + a0.mean_var(depths, s2i) + a1.mean_var(depths, s2i))
            slow = drift.per_h * (a1.t - a0.t) if _clear(drift) else 0.0     # what the night's drift explains
            jumped = abs(step - slow) > JUMP_Z * sd and abs(step - slow) > math.log1p(min_effect)
        shift = 0.0
        if not closed and _clear(drift):
            gap = b.t - statistics.fmean(r.t for r in refs)
            shift = drift.per_h * gap              # the night's drift (per unit of the axis) over the gap
            ref += shift
            extrap_var += (drift.se * gap) ** 2 / J ** 2
        if not closed or jumped:
            open_n += 1
        d = b.mean(depths) - ref
        diffs.append(d)
        block_vars.append((w, b.mean_var(depths, s2c) + sum(wi * wi * r.mean_var(depths, s2i) for wi, r in zip(w, refs))))
        coef[b.arm] = coef.get(b.arm, 0.0) + 1 / J
        mv[b.arm] = b.mean_var(depths, s2c)
        for wi, r in zip(w, refs):
            coef[r.arm] = coef.get(r.arm, 0.0) - wi / J
            mv[r.arm] = r.mean_var(depths, s2i)
        blocks.append({"boot": b.arm, "ref": [r.arm for r in refs], "w": [round(x, 3) for x in w],
                       "diff": round(math.expm1(d), 5), "closed": closed and not jumped,
                       **({"jumped": True} if jumped else {}),
                       **({"drift_shift": round(growth(shift), 5)} if shift else {}),
                       **({"drift_per_h": round(growth(seen), 5)} if seen is not None else {})})
    log_eff = sum(diffs) / J
    chal_arms = {b.arm for b in chal}
    few = spread.pairs < MIN_SPREAD_PAIRS      # a spread from a pair or two: its upper bound, taken as known
    bounded = few and spread.upper > spread.var
    cc = sum(c * c for c in coef.values())
    parts = [(cc * (spread.upper if few else spread.var), 10 ** 6 if few else spread.pairs),
             (sum(coef[a] ** 2 * mv[a] for a in coef if a in chal_arms), dfc),
             (sum(coef[a] ** 2 * mv[a] for a in coef if a not in chal_arms), dfi)]
    if extrap_var:
        parts.append((extrap_var, max(1, drift.boots - drift.shapes - 1)))
    parts = [(v, dof) for v, dof in parts if v > 0]
    var = sum(v for v, _ in parts)
    # the search reads the standard error at the estimate (tuner/night/gain.promising)
    se_estimate = math.sqrt(max(0.0, var - cc * (spread.upper - spread.var))) if bounded else None
    df = _welch_df([(v, max(dof, 1)) for v, dof in parts])
    se = math.sqrt(var)
    boot_level = False
    if J >= 2:          # the challenger's own boots spread more than the night's: its spread, not the night's
        expected = statistics.fmean(spread.var * (1 + sum(w * w for w in _w)) + v for _w, v in block_vars)
        seen = statistics.variance(diffs)
        if seen > OWN_SPREAD_F * expected:
            se_b = math.sqrt(seen / J + extrap_var)
            if se_b > se:
                se, boot_level = se_b, True
            if se_estimate is not None:
                se_estimate = max(se_estimate, se_b)
    eff, lo, hi, verdict, why = decide(log_eff, se, df, alpha=alpha, drop_alpha=drop_alpha, min_effect=min_effect)
    if verdict != "better" and bounded:
        why += (f"; the boot-to-boot spread rests on {spread.pairs} boot pair(s): taken at its upper bound "
                f"{math.sqrt(spread.upper):.1%} until {MIN_SPREAD_PAIRS}")
    if verdict == "better" and open_n:
        why += f"; {open_n} of {J} boot(s) not yet bracketed by the incumbent: no promotion until they are"
    elif verdict == "undecided" and any(bl.get("jumped") for bl in blocks):
        why += "; the incumbent jumped across a block (a step or a drift that reversed): it cancels nothing"
    seen = [bl["drift_per_h"] for bl in blocks if "drift_per_h" in bl]
    runs_i = sum(len(r.runs[d]) for r in used.values() for d in depths)
    lo_arm, hi_arm = min(used), max(used)      # the incumbent boots in the blocks' span, used or left out whole
    span = [a for a in incumbent if lo_arm <= a.arm <= hi_arm]
    return Comparison(eff, se, lo, hi, alpha, drop_alpha,
                      (sum(len(b.runs[d]) for b in chal for d in depths), runs_i), (J, len(used)),
                      (math.sqrt(s2c) if dfc else None, math.sqrt(s2i) if dfi else None), boot_level, verdict, why,
                      None, (sum(b.disturbed for b in chal), sum(a.disturbed for a in span)),
                      (sum(b.contended for b in chal), sum(a.contended for a in span)),
                      blocks=tuple(blocks), open=open_n, boot_sigma=spread.sigma, spread_pairs=spread.pairs,
                      drift_seen=statistics.fmean(seen) if seen else None, se_estimate=se_estimate)

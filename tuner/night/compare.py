"""Sequential, paired comparisons of a challenger shape against the incumbent. Pure functions.

The samples are the runs themselves: per depth, the log decode rate of every valid run of every
boot of a shape. A comparison pairs the two shapes depth by depth (the depths' own rates differ;
only their ratio is the effect), uses each side's *own* variance (Welch: s_c^2/n_c + s_i^2/n_i,
never a band pooled from other arms), and, once both sides have two boots or more, the larger of
the run-level and the boot-level standard error (boot-to-boot variance is then measured, not
assumed away). The effect is the geometric mean over depths of the challenger/incumbent ratio,
the objective ``decode_geomean`` compares.

Error rate. A promotion is a one-sided test that the effect is > 0. The night spends a family
error rate ``alpha`` (noise.error_rate, default ``ERROR_RATE``) over all of its promotion looks:
the k-th look of the night is run at alpha_k = alpha * L / ((k + L - 1)(k + L)), which sums to
alpha over any number of looks (L, the planned looks, spreads it; more looks only get stricter),
and a look whose boot may be tested up to P times as its runs grow (the loop's extension cap)
runs each test at alpha_k / P. So the chance that a night promotes any change that is not truly
better is at most alpha, whatever the number of comparisons and however often a boot is peeked
at (bench/results/false_promotions.md measures it: without the split the peeks made a look's
real error rate 1.5-1.8x its stated one, with it 0.25-0.33x). Only a look that could promote
is one of the k (``verdict.can_promote``: two boots of the challenger or more, every one
bracketed; facts of when the boots ran, never of what they read). Blocked in time
(``tuner/night/blocks.py``), a growing boot is open and its tests promote nothing: they spend
no look of their own and run at the share of the look that can promote next, split the same
way, because a ``better`` reading stops its runs at a high point and the look that brackets
it later reads them (an efficacy stop at an interim look; a stop on ``worse`` or ``parity``, a
futility stop, does not raise a later look's rate). The bracketing look tests finished boots
once and could run at the whole alpha_k (bench/results/false_promotions.md: 0.75-0.92x its rate
on zero-effect challengers grown and stopped at that same rate); it still splits it: at the
whole rate a noisy lever on a drifting box moved (bench/results/realbox.md, stop 40). Dropping a challenger (worse, or
parity: it cannot be worth the minimum effect) is tested at a fixed ``drop_alpha`` per look: a
wrong drop costs a missed gain, never a false promotion, and the night re-examines the closest
drops while it has budget.

Drift. On one GPU two engines cannot run at once, so the incumbent and its challengers take
turns: the incumbent is re-measured between challengers (``noise.recheck_every``), and every
shape measured on two boots or more shows how the same shape's rate moved with the clock. A
slow drift (thermals, other tenants) would otherwise read as an effect: a challenger measured
an hour after the incumbent's boots gains the hour's drift. ``estimate_drift`` fits one slope
per hour to every shape's boots (each shape its own level); when the slope is clearly there
(|slope| > ``DRIFT_Z`` standard errors), each boot's runs are moved to a common time before the
test, and the slope's own uncertainty, times the gap between the two sides' times, joins the
standard error.

Contention. A run its measurement marked ``contended`` (another process held the box during it:
``arms.conditions``) is left out before anything else, like a disturbed run, and counted on its
own (``Side.contended``, ``Comparison.contended``, in the journal's comparison record when any).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from statistics import NormalDist

from arms.steady import steady, valid_logs

_N = NormalDist()
ERROR_RATE = 0.01          # noise.error_rate's default: the chance a night promotes anything not truly better
MIN_EFFECT = 0.02          # noise.min_effect's default: the smallest gain worth a move
SIGMA_FLOOR = 0.004        # a relative sigma below this is not believed (three identical runs)
DRIFT_Z = 2.0              # a drift is corrected for once its slope is this many standard errors from 0


GROWTH_CAP = 20.0    # |log| of a per-hour rate beyond this is written capped (e^20 - 1 is "huge", never an overflow)


def growth(log_rate: float) -> float:
    """A per-hour log rate as a relative change per hour, ``expm1``; a rate taken over seconds
    (a test night of one-second arms: a 0.3 step in 0.0003 h) is capped at ``GROWTH_CAP``
    instead of overflowing."""
    return math.expm1(max(-GROWTH_CAP, min(GROWTH_CAP, log_rate)))


def runs_by_depth(measurement: dict | None, depth: int | None = None) -> dict[str, list[float]]:
    """{depth: [log decode tok/s of each valid, undisturbed run]} of one measurement (to_dict form)."""
    return _split_runs(measurement, depth)[0]


def _split_runs(measurement: dict | None, depth: int | None) -> tuple[dict[str, list[float]], int, int]:
    """``runs_by_depth``, how many valid runs ``undisturbed`` left out of it, and how many valid
    runs were left out first because another process held the box during them (a run marked
    ``contended`` by its measurement, ``arms.conditions``; records without the mark keep all).
    Before either, the boot's warm-up runs are left out, and a boot that never settled gives
    nothing (``arms.steady``)."""
    out: dict[str, list[float]] = {}
    dropped = contended = 0
    settled = steady(measurement)
    if settled.unstable:
        return out, 0, 0                  # a boot that never settled: no evidence of a steady rate
    logs = valid_logs(measurement)
    for d, r in ((measurement or {}).get("depths") or {}).items():
        if depth is not None and int(d) != depth:
            continue
        xs = logs[str(d)]
        contended += sum(1 for x in r.get("runs") or [] if x.get("valid") and x.get("decode_tok_s")) - len(xs)
        kept = settled.runs.get(str(d), [])             # what arms.steady's trims kept (``undisturbed``)
        dropped += len(xs) - len(kept)
        kept = kept[settled.warmup.get(str(d), 0):]      # arms.steady counts them among the undisturbed
        if kept:
            out[str(d)] = kept
    return out, dropped, contended


@dataclass(frozen=True)
class Side:
    """One shape's evidence: its boots, each {depth: [log rates]}."""

    boots: tuple[dict, ...]
    times: tuple[float, ...] = ()      # hours: when each boot measured (empty: not known)
    disturbed: int = 0                 # valid runs left out as disturbed (``undisturbed``)
    contended: int = 0                 # valid runs left out: another process held the box (``_split_runs``)

    @classmethod
    def of(cls, measurements: list[dict | None], depth: int | None = None,
           times: list[float] | None = None) -> "Side":
        if times is not None and len(times) != len(measurements):
            times = None                    # not one time per boot: the times are not used
        split = [_split_runs(m, depth) for m in measurements]
        pairs = [(b, t) for (b, _, _), t in zip(split, times if times is not None else [None] * len(measurements)) if b]
        known = times is not None and all(t is not None for _, t in pairs)
        return cls(tuple(b for b, _ in pairs), tuple(t for _, t in pairs) if known else (),
                   sum(n for _, n, _ in split), sum(c for _, _, c in split))

    def common_depths(self) -> list[str]:
        return sorted(set.intersection(*(set(b) for b in self.boots))) if self.boots else []

    def shifted(self, per_h: float, t0: float) -> "Side":
        """Every boot's runs moved to time ``t0`` along a drift of ``per_h`` (log rate per hour)."""
        return Side(tuple({d: [x - per_h * (t - t0) for x in xs] for d, xs in b.items()}
                          for b, t in zip(self.boots, self.times)), tuple(t0 for _ in self.times), self.disturbed,
                    self.contended)

    def pooled(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for b in self.boots:
            for d, xs in b.items():
                out.setdefault(d, []).extend(xs)
        return out

    @property
    def runs(self) -> int:
        return sum(len(xs) for b in self.boots for xs in b.values())

    def boot_means(self, depths: list[str]) -> list[float]:
        """Each boot's mean log rate over the given depths (boots that measured all of them)."""
        return [statistics.fmean(statistics.fmean(b[d]) for d in depths) for b in self.boots
                if all(d in b for d in depths)]

    def spread(self) -> float | None:
        """The relative sigma of one run (pooled over depths), None with too few runs."""
        ss, df = 0.0, 0
        for xs in self.pooled().values():
            if len(xs) >= 2:
                ss += statistics.variance(xs) * (len(xs) - 1)
                df += len(xs) - 1
        return math.sqrt(ss / df) if df else None


@dataclass(frozen=True)
class Drift:
    per_h: float              # log decode rate per hour, every shape alike
    se: float
    boots: int                # boots it was fitted to
    shapes: int


def estimate_drift(sides: list[Side]) -> Drift | None:
    """One slope over time fitted to every shape's boot means (each shape its own level: the
    within-shape regression), None with too few repeated shapes to fit one."""
    pts: list[tuple[float, float]] = []
    shapes = 0
    for s in sides:
        if len(s.boots) < 2 or len(s.times) != len(s.boots):
            continue
        depths = s.common_depths()
        if not depths:
            continue
        ys = s.boot_means(depths)
        tm, ym = statistics.fmean(s.times), statistics.fmean(ys)
        pts += [(t - tm, y - ym) for t, y in zip(s.times, ys)]
        shapes += 1
    sxx = sum(t * t for t, _ in pts)
    df = len(pts) - shapes - 1
    if shapes == 0 or df < 1 or sxx <= 1e-12:
        return None
    b = sum(t * y for t, y in pts) / sxx
    rss = sum((y - b * t) ** 2 for t, y in pts)
    return Drift(b, math.sqrt(rss / df / sxx), len(pts), shapes)


@dataclass(frozen=True)
class Comparison:
    effect: float             # relative effect, challenger / incumbent - 1 (geomean over depths)
    se: float                 # standard error of the log effect
    lo: float                 # one-sided lower bound at alpha (relative)
    hi: float                 # upper bound at drop_alpha (relative)
    alpha: float              # the promotion look's error rate
    drop_alpha: float
    runs: tuple[int, int]     # (challenger, incumbent) runs
    boots: tuple[int, int]
    sigma: tuple[float | None, float | None]      # each side's own relative sigma of one run
    boot_level: bool          # the boot-to-boot standard error was the larger
    verdict: str              # better | worse | parity | undecided
    why: str
    drift_per_h: float | None = None    # the drift corrected for (relative per hour), None: none seen
    disturbed: tuple[int, int] = (0, 0)  # runs left out as disturbed (challenger, incumbent)
    contended: tuple[int, int] = (0, 0)  # runs left out: another process held the box (challenger, incumbent)
    # comparisons blocked in time (tuner/night/blocks.py); empty for the pooled test
    blocks: tuple = ()                   # one per challenger boot: its reference boots, weights, difference
    open: int = 0                        # blocks not bracketed by incumbent boots (or jumped): no promotion yet
    boot_sigma: float | None = None      # the night's boot-to-boot sigma the test used
    spread_pairs: int = 0                # successive boot pairs that sigma was estimated from
    drift_seen: float | None = None      # the incumbent's mean drift per hour across the closed blocks
    se_estimate: float | None = None     # the standard error at the spread's estimate, where the test took its
                                         # upper bound (too few boot pairs): what the search reads

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.blocks:              # the pooled test: the old records' shape
            for k in ("blocks", "open", "boot_sigma", "spread_pairs", "drift_seen", "se_estimate"):
                d.pop(k)
        else:
            d["blocks"] = list(self.blocks)
            d["boot_sigma"] = round(self.boot_sigma or 0.0, 6)
            if self.drift_seen is None:
                d.pop("drift_seen")
            else:
                d["drift_seen"] = round(self.drift_seen, 6)
            if self.se_estimate is None:
                d.pop("se_estimate")
            else:
                d["se_estimate"] = round(self.se_estimate, 6)
        for k in ("effect", "se", "lo", "hi"):
            d[k] = round(d[k], 6)
        if self.drift_per_h is None:
            d.pop("drift_per_h")
        else:
            d["drift_per_h"] = round(self.drift_per_h, 6)
        d["sigma"] = [None if s is None else round(s, 5) for s in self.sigma]
        for k in ("disturbed", "contended"):     # absent when none: the old records' shape
            if not any(getattr(self, k)):
                d.pop(k)
            else:
                d[k] = list(getattr(self, k))
        return d

    def interval_text(self) -> str:
        return f"{self.effect:+.1%} [{self.lo:+.1%}, {self.hi:+.1%}]"


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (one-sided ``p``) for ``df`` degrees of freedom: exact for 1 and 2,
    else the Cornish-Fisher expansion in 1/df (Abramowitz & Stegun 26.7.5; it errs on the wide
    side at few df and tiny tails). The estimated variances of a handful of runs are not known
    variances: at a night's per-look error rates (1e-3 and below) the normal quantile would
    promote zero effects far more often than the stated rate."""
    z = _N.inv_cdf(p)
    if df >= 1e6:
        return z
    if df < 2.5:
        if df < 1.5:
            return math.tan(math.pi * (p - 0.5))
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    g = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))


def _welch_df(parts: list[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance terms (term, its own degrees of
    freedom)."""
    num = sum(v for v, _ in parts) ** 2
    den = sum(v * v / dof for v, dof in parts if dof > 0)
    return num / den if den > 0 else 1e6


def _pooled_var(side: dict[str, list[float]], depths: list[str]) -> tuple[float, int]:
    """One side's variance of one run's log rate, pooled over the depths (each depth its own mean:
    the noise is relative, so the depths share it), and its degrees of freedom. Pooling matters:
    three runs per depth give each depth's variance 2 degrees of freedom, and a sum of such
    estimates has tails far heavier than the t quantile the test reads; pooled, one boot of three
    depths x three runs has 6."""
    ss = sum((len(side[d]) - 1) * statistics.variance(side[d]) for d in depths)
    dof = sum(len(side[d]) - 1 for d in depths)
    return max(ss / dof, SIGMA_FLOOR ** 2), dof


def look_alpha(alpha: float, k: int, planned: int, peeks: int = 1) -> float:
    """The error rate of one test of the k-th (1-based) promotion look: the look's share of the
    night's family error rate ``alpha``, split evenly over the ``peeks`` times its boot's runs
    may be tested (a boot measures more runs while its comparison is undecided and stops as soon
    as it is decided: each of those tests may stop it on a ``better`` reading, so each is
    charged)."""
    L = max(1, planned)
    return alpha * L / ((k + L - 1) * (k + L)) / max(1, peeks)


def decide(log_eff: float, se: float, df: float, *, alpha: float, drop_alpha: float,
           min_effect: float) -> tuple[float, float, float, str, str]:
    """(effect, lower bound at ``alpha``, upper bound at ``drop_alpha``, verdict, why) of a log
    effect and its standard error: ``better`` when the lower bound is above 0 (and the effect at
    least half the minimum), ``worse`` when the upper bound is below 0, ``parity`` when it is below
    half the minimum effect, else ``undecided``."""
    z_up = t_quantile(1 - alpha, df)
    z_drop = _N.inv_cdf(1 - drop_alpha)
    lo, hi = math.expm1(log_eff - z_up * se), math.expm1(log_eff + z_drop * se)
    eff = math.expm1(log_eff)
    if lo > 0 and eff >= min_effect / 2:
        return eff, lo, hi, "better", f"lower bound {lo:+.1%} > 0 at error rate {alpha:.2g}"
    if hi < 0:
        return eff, lo, hi, "worse", f"upper bound {hi:+.1%} < 0"
    if hi < min_effect / 2:
        return eff, lo, hi, "parity", f"upper bound {hi:+.1%} below half the minimum effect {min_effect:.0%}"
    return eff, lo, hi, "undecided", f"interval [{lo:+.1%}, {hi:+.1%}] straddles 0"


def compare(challenger: Side, incumbent: Side, *, alpha: float, drop_alpha: float = 0.05,
            min_effect: float = MIN_EFFECT, drift: Drift | None = None) -> Comparison | None:
    """The test over every sample so far; None when the two sides share no depth with 2+ runs.
    ``drift``: the night's drift (``estimate_drift``), corrected for when it is clearly there."""
    drift_var, drift_per_h = 0.0, None
    if drift is not None and challenger.times and incumbent.times and abs(drift.per_h) > DRIFT_Z * drift.se:
        t0 = statistics.fmean(incumbent.times)
        gap = statistics.fmean(challenger.times) - t0
        challenger, incumbent = challenger.shifted(drift.per_h, t0), incumbent.shifted(drift.per_h, t0)
        drift_var, drift_per_h = (drift.se * gap) ** 2, growth(drift.per_h)
    pc, pi = challenger.pooled(), incumbent.pooled()
    depths = sorted(d for d in pc if d in pi and len(pc[d]) >= 2 and len(pi[d]) >= 2)
    if not depths:
        return None
    D = len(depths)
    diffs = [statistics.fmean(pc[d]) - statistics.fmean(pi[d]) for d in depths]
    parts = []
    for side in (pc, pi):
        v, dof = _pooled_var(side, depths)        # one relative sigma per side, pooled over its depths
        parts.append((v * sum(1 / len(side[d]) for d in depths) / D ** 2, dof))
    var = sum(v for v, _ in parts)
    df = _welch_df(parts)
    log_eff = sum(diffs) / D
    se = math.sqrt(var + drift_var)
    boot_level = False
    bc, bi = challenger.boot_means(depths), incumbent.boot_means(depths)
    if len(bc) >= 2 and len(bi) >= 2:
        se_b = math.sqrt(statistics.variance(bc) / len(bc) + statistics.variance(bi) / len(bi) + drift_var)
        if se_b > se:
            se, boot_level = se_b, True    # a floor from the boots; the degrees of freedom stay the runs'
    eff, lo, hi, verdict, why = decide(log_eff, se, df, alpha=alpha, drop_alpha=drop_alpha, min_effect=min_effect)
    return Comparison(eff, se, lo, hi, alpha, drop_alpha, (challenger.runs, incumbent.runs),
                      (len(challenger.boots), len(incumbent.boots)), (challenger.spread(), incumbent.spread()),
                      boot_level, verdict, why, drift_per_h, (challenger.disturbed, incumbent.disturbed),
                      (challenger.contended, incumbent.contended))

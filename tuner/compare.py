"""Sequential, paired comparisons of a challenger shape against the incumbent. Pure functions.

The samples are the runs themselves: per depth, the log decode rate of every valid run of every
boot of a shape. A comparison pairs the two shapes depth by depth (the depths' own rates differ;
only their ratio is the effect), uses each side's *own* variance (Welch: s_c^2/n_c + s_i^2/n_i,
never a band pooled from other arms), and, once both sides have two boots or more, the larger of
the run-level and the boot-level standard error (boot-to-boot variance is then measured, not
assumed away). The effect is the geometric mean over depths of the challenger/incumbent ratio,
the objective ``decode_geomean`` compares.

Error rate. A promotion is a one-sided test that the effect is > 0. The night spends a family
error rate ``alpha`` (noise.error_rate, default 0.05) over all of its promotion looks: the k-th
look of the night is run at alpha_k = alpha * L / ((k + L - 1)(k + L)), which sums to alpha over
any number of looks (L, the planned looks, spreads it; more looks only get stricter), so the
chance that a night promotes any change that is not truly better is at most alpha, whatever the
number of comparisons. Dropping a challenger (worse, or parity: it cannot be worth the minimum
effect) is tested at a fixed ``drop_alpha`` per look: a wrong drop costs a missed gain, never a
false promotion, and the night re-examines the closest drops while it has budget.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from statistics import NormalDist

_N = NormalDist()
SIGMA_FLOOR = 0.004        # a relative sigma below this is not believed (three identical runs)


def runs_by_depth(measurement: dict | None, depth: int | None = None) -> dict[str, list[float]]:
    """{depth: [log decode tok/s of each valid run]} of one measurement (to_dict form)."""
    out: dict[str, list[float]] = {}
    for d, r in ((measurement or {}).get("depths") or {}).items():
        if depth is not None and int(d) != depth:
            continue
        xs = [math.log(x["decode_tok_s"]) for x in r.get("runs") or []
              if x.get("valid") and x.get("decode_tok_s")]
        if xs:
            out[str(d)] = xs
    return out


@dataclass(frozen=True)
class Side:
    """One shape's evidence: its boots, each {depth: [log rates]}."""

    boots: tuple[dict, ...]

    @classmethod
    def of(cls, measurements: list[dict | None], depth: int | None = None) -> "Side":
        return cls(tuple(b for b in (runs_by_depth(m, depth) for m in measurements) if b))

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

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("effect", "se", "lo", "hi"):
            d[k] = round(d[k], 6)
        d["sigma"] = [None if s is None else round(s, 5) for s in self.sigma]
        return d

    def interval_text(self) -> str:
        return f"{self.effect:+.1%} [{self.lo:+.1%}, {self.hi:+.1%}]"


def look_alpha(alpha: float, k: int, planned: int) -> float:
    """The k-th (1-based) promotion look's share of the night's family error rate ``alpha``."""
    L = max(1, planned)
    return alpha * L / ((k + L - 1) * (k + L))


def compare(challenger: Side, incumbent: Side, *, alpha: float, drop_alpha: float = 0.05,
            min_effect: float = 0.02) -> Comparison | None:
    """The test over every sample so far; None when the two sides share no depth with 2+ runs."""
    pc, pi = challenger.pooled(), incumbent.pooled()
    depths = sorted(d for d in pc if d in pi and len(pc[d]) >= 2 and len(pi[d]) >= 2)
    if not depths:
        return None
    diffs, var = [], 0.0
    for d in depths:
        vc = max(statistics.variance(pc[d]), SIGMA_FLOOR ** 2)
        vi = max(statistics.variance(pi[d]), SIGMA_FLOOR ** 2)
        diffs.append(statistics.fmean(pc[d]) - statistics.fmean(pi[d]))
        var += vc / len(pc[d]) + vi / len(pi[d])
    D = len(depths)
    log_eff = sum(diffs) / D
    se = math.sqrt(var) / D
    boot_level = False
    bc, bi = challenger.boot_means(depths), incumbent.boot_means(depths)
    if len(bc) >= 2 and len(bi) >= 2:
        se_b = math.sqrt(statistics.variance(bc) / len(bc) + statistics.variance(bi) / len(bi))
        if se_b > se:
            se, boot_level = se_b, True
    z_up = _N.inv_cdf(1 - alpha)
    z_drop = _N.inv_cdf(1 - drop_alpha)
    lo, hi = math.expm1(log_eff - z_up * se), math.expm1(log_eff + z_drop * se)
    eff = math.expm1(log_eff)
    if lo > 0 and eff >= min_effect / 2:
        verdict, why = "better", f"lower bound {lo:+.1%} > 0 at error rate {alpha:.2g}"
    elif hi < 0:
        verdict, why = "worse", f"upper bound {hi:+.1%} < 0"
    elif hi < min_effect / 2:
        verdict, why = "parity", f"upper bound {hi:+.1%} below half the minimum effect {min_effect:.0%}"
    else:
        verdict, why = "undecided", f"interval [{lo:+.1%}, {hi:+.1%}] straddles 0"
    return Comparison(eff, se, lo, hi, alpha, drop_alpha, (challenger.runs, incumbent.runs),
                      (len(challenger.boots), len(incumbent.boots)), (challenger.spread(), incumbent.spread()),
                      boot_level, verdict, why)

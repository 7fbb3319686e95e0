"""What a night on this box can show: the arithmetic of a comparison blocked in time. Pure functions.

A challenger's boots are read against the incumbent boots around them (tuner/night/blocks.py). The
cheapest such design that cancels a linear drift alternates the two shapes, A B A B ... A: n
challenger boots between n + 1 incumbent boots, each challenger boot against its two neighbours'
mean. Its contrast has variance s^2 (2n - 1/2) / n^2, for one boot's variance s^2 = the box's
boot-to-boot variance + a boot's run noise (one run's variance over the runs in a boot's mean).
When boots spread, s^2 no longer shrinks with more runs: only more boots buy precision, and a small
move costs many of them (bench/results/power_bound.md: at a 2 % boot spread, the four moves of
small-gather need ~94 boots at error rate 0.01, more than 8 hours hold).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from tuner.night.compare import t_quantile

_N = NormalDist()
MAX_BOOTS = 400       # past this many challenger boots a move is called out of reach


def contrast_var(n: int, s2: float) -> float:
    """The variance of the A B A ... B A contrast of ``n`` challenger boots (one boot's variance ``s2``)."""
    return s2 * (2 * n - 0.5) / n ** 2


def _bound(alpha: float, df: float | None) -> float:
    """The one-sided quantile a promotion's lower bound reads at ``alpha``: Student's t at ``df``
    degrees of freedom (a spread estimated from few boot pairs), the normal one without."""
    return _N.inv_cdf(1 - alpha) if df is None else t_quantile(1 - alpha, df)


def shown_at(n: int, s2: float, alpha: float, df: float | None = None) -> float:
    """The relative effect ``n`` challenger boots show half the time at one-sided error rate ``alpha``
    (the effect whose estimate sits exactly on the bound)."""
    return math.expm1(_bound(alpha, df) * math.sqrt(contrast_var(n, s2)))


def boots_for(effect: float, s2: float, alpha: float, power: float = 0.5, df: float | None = None) -> int | None:
    """The fewest challenger boots that show a true relative ``effect`` with chance ``power`` at
    error rate ``alpha``; None past ``MAX_BOOTS`` (or for an effect that is no gain)."""
    if effect <= 0:
        return None
    z = _bound(alpha, df) + _N.inv_cdf(power)
    d = math.log1p(effect)
    for n in range(1, MAX_BOOTS + 1):
        if d >= z * math.sqrt(contrast_var(n, s2)):
            return n
    return None


@dataclass(frozen=True)
class BoxNoise:
    """The night's last reading of how much one boot's mean varies: its parts and the look's error rate."""

    boot_sigma: float          # boot-to-boot, beyond the runs' noise
    pairs: int                 # successive boot pairs it rests on
    run_sigma: float           # one run's relative sigma
    runs_per_boot: float       # runs in one boot's mean (per comparison depth, all depths pooled)
    alpha: float               # the last promotion look's error rate

    @property
    def s2(self) -> float:
        return self.boot_sigma ** 2 + self.run_sigma ** 2 / max(1.0, self.runs_per_boot)

    @property
    def df(self) -> float:
        """Welch-Satterthwaite degrees of freedom of one boot's variance: the boot spread rests on
        ``pairs``, the runs' noise on many; as the night's test reads them."""
        b, r = self.boot_sigma ** 2, self.s2 - self.boot_sigma ** 2
        den = b * b / max(1, self.pairs) + r * r / 1e6
        return (b + r) ** 2 / den if den > 0 else 1e6

    @classmethod
    def of(cls, comparison: dict) -> "BoxNoise | None":
        """From one journaled blocked comparison (``Comparison.to_dict``); None for a pooled one."""
        c = comparison
        if c.get("boot_sigma") is None or not c.get("boots") or not c["boots"][1]:
            return None
        run = c.get("sigma") or (None, None)
        sigma = run[1] if run[1] is not None else run[0]
        return cls(float(c["boot_sigma"]), int(c.get("spread_pairs") or 0), float(sigma or 0.0),
                   c["runs"][1] / c["boots"][1], float(c["alpha"]))

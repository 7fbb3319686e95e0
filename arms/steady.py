"""Steady state per boot: which of a boot's first runs were warm-up, and whether the boot ever
settled. A pure function over one measurement (``Measurement.to_dict()`` form).

A boot is not steady from its first request (Barrett et al., "Virtual Machine Warmup Blows Hot and
Cold"): the first requests run before caches, allocators, compiled graphs and the CPU's clocks
have settled. Steady state is tested, not assumed with a fixed count of discarded runs:

- **Warm-up.** The runs in request order (the depths in the order they were measured, each
  depth's runs in order), each as its log rate less the median of its depth's later half of runs
  (the level the boot settled at: warm-up runs would pull a median of all runs down). A leading run more than
  ``WARM_Z`` robust sigmas *below* the boot's level is warm-up, and so is the next one, until a run
  is not: the leading prefix is left out (at most half of a depth's runs, and never below two
  runs: a depth of two runs keeps both), and journaled.
- **Unstable.** After the warm-up, the runs' trend with request order (one slope, each depth its
  own level). A boot whose rate still moves by more than ``UNSTABLE_MOVE`` across its runs, at
  more than ``UNSTABLE_T`` standard errors, never settled; so does one still warming at the cap.
  Such a boot says nothing about its shape's steady rate: the arm's verdict is ``unstable``
  (never better, never worse), and its boots are left out of every comparison.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

WARM_Z = 2.5           # a leading run this many robust sigmas below its boot's level is warm-up
UNSTABLE_T = 6.0       # a trend over the runs this many standard errors from flat ...
UNSTABLE_DF = 10       # ... estimated with at least this many degrees of freedom (a boot of 3 x 3 runs has 5: its
                       # slope's t has tails far too heavy to call one boot in a night unstable by chance)
UNSTABLE_MOVE = 0.04   # ... and moving the rate by more than this across the boot: never settled
MIN_SIGMA = 0.004      # a robust sigma below this is not believed (identical runs)
DISTURBED = math.log(3)    # a run this far from its boot's median rate at its depth was disturbed


def undisturbed(xs: list[float]) -> list[float]:
    """The log rates of one boot at one depth without the runs something else disturbed: a run
    more than ``DISTURBED`` (x3 either way) from the median of its three or more siblings. A
    host that stalls one request for two minutes (another tenant, reclaim, a hypervisor) gives a
    run at 1 % of the others' rate; in log space that one run is a variance no effect can clear,
    and a whole night's comparisons end undecided. Noise never moves one run threefold (a 6 %
    sigma would need 18 sigma); a shape that really is that erratic keeps at most one run in
    three out and is still judged on the rest."""
    if len(xs) < 3:
        return xs
    med = statistics.median(xs)
    return [x for x in xs if abs(x - med) <= DISTURBED]


@dataclass(frozen=True)
class Steady:
    warmup: dict = field(default_factory=dict)     # depth -> leading valid runs left out as warm-up
    unstable: str | None = None                    # why the boot never settled, None: it did
    trend: float | None = None                     # relative change of the rate across the boot's runs

    def to_dict(self) -> dict:
        d: dict = {"warmup": dict(self.warmup)}
        if self.unstable:
            d["unstable"] = self.unstable
        if self.trend is not None:
            d["trend"] = round(self.trend, 5)
        return d

    @property
    def warmup_runs(self) -> int:
        return sum(self.warmup.values())


def _sequence(measurement: dict) -> list[tuple[str, int, float]]:
    """(depth, index, log rate) in request order of each depth's valid runs that another process did
    not hold (``contended``) and nothing disturbed (``undisturbed``): warm-up is looked for among
    the runs the comparison would otherwise keep."""
    out = []
    for d, r in ((measurement or {}).get("depths") or {}).items():
        ok = [x for x in r.get("runs") or [] if x.get("valid") and x.get("decode_tok_s") and not x.get("contended")]
        out += [(str(d), i, x) for i, x in enumerate(undisturbed([math.log(x["decode_tok_s"]) for x in ok]))]
    return out


def steady(measurement: dict | None) -> Steady:
    seq = _sequence(measurement or {})
    by_depth: dict[str, list[float]] = {}
    for d, _, x in seq:
        by_depth.setdefault(d, []).append(x)
    if len(seq) < 4:
        return Steady()
    med = {d: statistics.median(xs[len(xs) // 2:]) for d, xs in by_depth.items()}   # its later runs: the level
    dev = [x - med[d] for d, _, x in seq]
    sigma = max(1.4826 * statistics.median(abs(v) for v in dev), MIN_SIGMA)
    warm: dict[str, int] = {}
    capped = False
    for (d, i, x), v in zip(seq, dev):
        if v >= -WARM_Z * sigma:
            break
        if warm.get(d, 0) + 1 > min(len(by_depth[d]) // 2, len(by_depth[d]) - 2):   # a depth keeps 2 runs
            capped = len(by_depth[d]) >= 6 and v < -2 * WARM_Z * sigma   # too few runs to say it never settles
            break
        warm[d] = warm.get(d, 0) + 1
    kept = [(d, i, x) for d, i, x in seq if i >= warm.get(d, 0)]
    full = any(n == min(len(by_depth[d]) // 2, len(by_depth[d]) - 2) for d, n in warm.items())   # all it may: still rising?
    trend, se = _trend(seq if full else kept)
    if capped:
        return Steady(warm, f"still warming after {sum(warm.values())} run(s): every leading run below the boot's "
                            f"level by more than {WARM_Z:g} sigma", trend)
    if trend is not None and se is not None and abs(trend) > UNSTABLE_MOVE and abs(trend) > UNSTABLE_T * se:
        return Steady(warm, f"the rate moved {trend:+.1%} across its runs ({abs(trend) / se:.1f} standard errors): "
                            "it never settled", trend)
    return Steady(warm, None, trend)


def _trend(seq: list[tuple[str, int, float]]) -> tuple[float | None, float | None]:
    """The relative change of the rate from the boot's first kept run to its last, from one slope
    on request order (each depth its own level), and its standard error."""
    pts, groups = [], {}
    for k, (d, _, x) in enumerate(seq):
        groups.setdefault(d, []).append((k, x))
    for g in groups.values():
        if len(g) < 2:
            continue
        km, xm = statistics.fmean(k for k, _ in g), statistics.fmean(x for _, x in g)
        pts += [(k - km, x - xm) for k, x in g]
    sxx = sum(k * k for k, _ in pts)
    df = len(pts) - len([g for g in groups.values() if len(g) >= 2]) - 1
    if df < UNSTABLE_DF or sxx <= 0:
        return None, None
    b = sum(k * x for k, x in pts) / sxx
    rss = sum((x - b * k) ** 2 for k, x in pts)
    span = len(seq) - 1
    return math.expm1(b * span), math.sqrt(rss / df / sxx) * span

"""Steady state per boot: which of a boot's first runs were warm-up, and whether the boot ever
settled. A pure function over one measurement (``Measurement.to_dict()`` form).

A boot is not steady from its first request (Barrett et al., "Virtual Machine Warmup Blows Hot and
Cold"): the first requests run before caches, allocators, compiled graphs and the CPU's clocks
have settled. Steady state is tested, not assumed with a fixed count of discarded runs:

- **Warm-up.** The runs in request order (the depths in the order they were measured, each
  depth's runs in order), each as its log rate less the median of its depth's later half of runs
  (the level the boot settled at: warm-up runs would pull a median of all runs down). A leading run more than
  ``WARM_Z`` robust sigmas *below* the boot's level is warm-up, and so is each next one more than
  ``WARM_NEXT_Z`` below it, until a run is not: the leading prefix is left out (at most half of a
  depth's runs, and never below two runs: a depth of two runs keeps both), and journaled. The
  first run's sigma is that of its distance from a level that is itself the median of a few runs,
  and its bar is high: a cut is one-sided, so each chance-low first run taken for warm-up moves a
  steady boot up. At 2.5 sigmas of the run alone 6 % of steady boots of three runs per depth lost
  their first run; at 3.5 sigmas of its distance 1.5 % do, and a first run 20 % slow is still cut
  in 89 % of such boots (99 % at twelve runs per depth; bench/results/false_promotions.md).
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

WARM_Z = 3.5           # the first run this many robust sigmas below its boot's level is warm-up (the sigma of
                       # its distance from a level that is the median of its depth's m later runs: x sqrt(1 + pi / 2m))
WARM_NEXT_Z = 2.5      # ... and then each next run this many robust sigmas below it, until one is not
UNSTABLE_T = 6.0       # a trend over the runs this many standard errors from flat ...
UNSTABLE_DF = 10       # ... estimated with at least this many degrees of freedom (a boot of 3 x 3 runs has 5: its
                       # slope's t has tails far too heavy to call one boot in a night unstable by chance)
UNSTABLE_MOVE = 0.04   # ... and moving the rate by more than this across the boot: never settled
MIN_SIGMA = 0.004      # a robust sigma below this is not believed (identical runs)
DISTURBED = math.log(3)    # a run this far from its boot's median rate at its depth was disturbed ...
DISTURBED_Z = 6.0          # ... and this many times the boot's own run spread (``run_scale``) from it


def valid_logs(measurement: dict | None) -> dict[str, list[float]]:
    """{depth: [log decode tok/s of each valid run no other process held (``contended``)]}, in request order."""
    return {str(d): [math.log(x["decode_tok_s"]) for x in r.get("runs") or []
                     if x.get("valid") and x.get("decode_tok_s") and not x.get("contended")]
            for d, r in ((measurement or {}).get("depths") or {}).items()}


def run_scale(depths: list[list[float]]) -> float:
    """A boot's own run spread: the standard deviation of its log rates about their depth's mean,
    pooled over its depths, from the runs within ``DISTURBED`` of their depth's median (three
    runs or more). The runs a stall slowed x3 are not in it, so one stall cannot hide itself;
    the rest are, so a shape whose runs really spread 40 % is measured as spreading 40 %."""
    ss, dof = 0.0, 0
    for xs in depths:
        if len(xs) < 3:
            continue
        med = statistics.median(xs)
        ys = [x for x in xs if abs(x - med) <= DISTURBED]
        if len(ys) >= 2:
            ss += statistics.variance(ys) * (len(ys) - 1)
            dof += len(ys) - 1
    return math.sqrt(ss / dof) if dof else 0.0


def undisturbed(xs: list[float], scale: float = 0.0) -> list[float]:
    """The log rates of one boot at one depth without the runs something else disturbed: a run
    more than ``DISTURBED`` (x3 either way) from the median of its three or more siblings, and
    more than ``DISTURBED_Z`` times the boot's own run spread (``scale``, ``run_scale``). A
    host that stalls one request for two minutes (another tenant, reclaim, a hypervisor) gives a
    run at 1 % of the others' rate; in log space that one run is a variance no effect can clear,
    and a whole night's comparisons end undecided. Noise never moves one run threefold when runs
    spread a few per cent (a 6 % sigma would need 18 sigma). A shape whose runs spread 40 % does
    move one threefold, one run in a hundred and fifty: cut at x3 alone, its kept runs would
    spread less than its runs do and its comparisons would read a standard error ~10 % too small
    (bench/results/false_promotions.md); its own spread keeps them, and a stall at 1 % of its
    rate still goes."""
    if len(xs) < 3:
        return xs
    med = statistics.median(xs)
    cut = max(DISTURBED, DISTURBED_Z * scale)
    return [x for x in xs if abs(x - med) <= cut]


@dataclass(frozen=True)
class Steady:
    warmup: dict = field(default_factory=dict)     # depth -> leading valid runs left out as warm-up
    unstable: str | None = None                    # why the boot never settled, None: it did
    trend: float | None = None                     # relative change of the rate across the boot's runs
    runs: dict = field(default_factory=dict, compare=False, repr=False)   # depth -> its undisturbed log rates,
                                                   # in request order, warm-up included (what the trims kept)

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
    logs = valid_logs(measurement)
    scale = run_scale(list(logs.values()))
    return [(d, i, x) for d, xs in logs.items() for i, x in enumerate(undisturbed(xs, scale))]


def steady(measurement: dict | None) -> Steady:
    seq = _sequence(measurement or {})
    by_depth: dict[str, list[float]] = {}
    for d, _, x in seq:
        by_depth.setdefault(d, []).append(x)
    if len(seq) < 4:
        return Steady(runs=by_depth)
    med = {d: statistics.median(xs[len(xs) // 2:]) for d, xs in by_depth.items()}   # its later runs: the level
    dev = [x - med[d] for d, _, x in seq]
    sigma = max(1.4826 * statistics.median(abs(v) for v in dev), MIN_SIGMA)
    warm: dict[str, int] = {}
    capped = False
    for (d, i, x), v in zip(seq, dev):
        bar = WARM_NEXT_Z if warm else WARM_Z * math.sqrt(1 + math.pi / 2 / (len(by_depth[d]) - len(by_depth[d]) // 2))
        if v >= -bar * sigma:
            break
        if warm.get(d, 0) + 1 > min(len(by_depth[d]) // 2, len(by_depth[d]) - 2):   # a depth keeps 2 runs
            capped = len(by_depth[d]) >= 6 and v < -2 * WARM_NEXT_Z * sigma   # too few runs to say it never settles
            break
        warm[d] = warm.get(d, 0) + 1
    kept = [(d, i, x) for d, i, x in seq if i >= warm.get(d, 0)]
    full = any(n == min(len(by_depth[d]) // 2, len(by_depth[d]) - 2) for d, n in warm.items())   # all it may: still rising?
    trend, se = _trend(seq if full else kept)
    if capped:
        return Steady(warm, f"still warming after {sum(warm.values())} run(s): every leading run below the boot's "
                            f"level by more than {WARM_NEXT_Z:g} sigma", trend, by_depth)
    if trend is not None and se is not None and abs(trend) > UNSTABLE_MOVE and abs(trend) > UNSTABLE_T * se:
        return Steady(warm, f"the rate moved {trend:+.1%} across its runs ({abs(trend) / se:.1f} standard errors): "
                            "it never settled", trend, by_depth)
    return Steady(warm, None, trend, by_depth)


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

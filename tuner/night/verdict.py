"""Objectives, constraints, the noise band and verdicts. Pure functions over plain data.

An arm's *score* orders shapes: a shape that meets every constraint beats one that does not;
among shapes that miss, the smaller violation wins; among shapes that meet them, the higher
objective wins. An arm is ``better`` only when its objective beats the incumbent's by more
than max(noise band, minimum effect) — and the campaign then confirms it with a second boot.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from arms.errors import ConfigError

from arms.verdict import COMPARED, Verdict
from tuner.night.compare import MIN_EFFECT, runs_by_depth

OBJECTIVES = ("decode_geomean", "decode@DEPTH", "goodput_at_slo")


@dataclass(frozen=True)
class Objective:
    kind: str = "decode_geomean"      # decode_geomean | decode | goodput_at_slo
    depth: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Objective":
        if text == "decode_geomean" or text == "goodput_at_slo":
            return cls(text)
        if text.startswith("decode@"):
            try:
                return cls("decode", int(text.split("@", 1)[1]))
            except ValueError:
                pass
        raise ConfigError(f"objective {text!r} is not one of decode_geomean, decode@DEPTH (e.g. decode@4064), goodput_at_slo")

    def __str__(self) -> str:
        return f"decode@{self.depth}" if self.kind == "decode" else self.kind

    def value(self, measurement: dict | None) -> float | None:
        """The objective from a measurement's to_dict(); None when it cannot be computed."""
        if not measurement:
            return None
        if self.kind == "goodput_at_slo":
            sw = measurement.get("sweep") or {}
            return sw.get("goodput_at_slo")
        depths = measurement.get("depths") or {}
        if self.kind == "decode":
            d = depths.get(str(self.depth)) or depths.get(self.depth) or {}
            return d.get("median_decode_tok_s")
        vals = [d.get("median_decode_tok_s") for d in depths.values()]
        if not vals or any(v is None or v <= 0 for v in vals):
            return None
        return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass(frozen=True)
class Constraints:
    concurrency_tokens: int | None = None     # max_concurrency_at.tokens
    concurrency_min: float | None = None      # max_concurrency_at.min
    boot_seconds_max: float | None = None
    min_slots: int | None = None

    @classmethod
    def from_mapping(cls, d: dict | None, where: str) -> "Constraints":
        d = dict(d or {})
        known = {"max_concurrency_at", "boot_seconds_max", "min_slots"}
        for k in d:
            if k not in known:
                raise ConfigError(f"{where}: key 'constraints.{k}': unknown constraint (known: {', '.join(sorted(known))})")
        mc = d.get("max_concurrency_at") or {}
        if mc and (not isinstance(mc, dict) or set(mc) != {"tokens", "min"}):
            raise ConfigError(f"{where}: key 'constraints.max_concurrency_at': give {{tokens: N, min: X}}")
        try:
            return cls(concurrency_tokens=int(mc["tokens"]) if mc else None,
                       concurrency_min=float(mc["min"]) if mc else None,
                       boot_seconds_max=float(d["boot_seconds_max"]) if "boot_seconds_max" in d else None,
                       min_slots=int(d["min_slots"]) if "min_slots" in d else None)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: key 'constraints': values must be numbers") from None

    def describe(self) -> list[str]:
        out = []
        if self.concurrency_tokens:
            out.append(f"max concurrency >= {self.concurrency_min:g}x at {self.concurrency_tokens:,} tokens")
        if self.boot_seconds_max:
            out.append(f"boot <= {self.boot_seconds_max:g} s")
        if self.min_slots:
            out.append(f"arena >= {self.min_slots:,} slots")
        return out

    def unmet(self, score: "Score | None") -> list[str]:
        """The constraints (described) that a shape with this score breaks: [] when it meets
        them, when there are none, or when it has no score yet."""
        return self.describe() if score is not None and not score.feasible else []

    def _concurrency_violation(self, rep: dict) -> float:
        """Relative shortfall of the pool against ``min`` requests of ``tokens`` tokens. A window
        shorter than ``tokens`` cannot serve one such request at all: it scores 1 + the shortfall
        its pool alone would leave, so it ranks below every shape that can, and a bigger or
        denser pool (fp8 KV) still counts as progress toward the constraint (one change at a
        time, the window is usually not the first lever to move)."""
        tokens, need = self.concurrency_tokens, self.concurrency_min
        max_len = rep.get("max_concurrency_len") or rep.get("max_model_len") or 0
        conc = (rep.get("kv_pool_tokens") or 0) / tokens
        if rep.get("max_concurrency") is not None and max_len == tokens:
            conc = rep["max_concurrency"]              # the engine's own figure, as it prints it
        conc = round(conc, 2)                          # engines print %.2fx; the contract is in those units
        short = (need - conc) / need if conc + 1e-9 < need else 0.0
        return short if max_len >= tokens else 1.0 + short

    def violations(self, boot: dict) -> dict[str, float]:
        """Relative shortfall per violated constraint (0 = met) from a BootResult.to_dict()."""
        rep = boot.get("report") or {}
        out: dict[str, float] = {}
        if self.concurrency_tokens:
            v = self._concurrency_violation(rep)
            if v > 1e-9:
                out["max_concurrency_at"] = v
        if self.boot_seconds_max and (boot.get("boot_s") or 0) > self.boot_seconds_max:
            out["boot_seconds_max"] = (boot["boot_s"] - self.boot_seconds_max) / self.boot_seconds_max
        slots = (rep.get("plan") or {}).get("slots")
        if self.min_slots and slots is not None and slots < self.min_slots:
            out["min_slots"] = (self.min_slots - slots) / self.min_slots
        return out


@dataclass(frozen=True)
class Score:
    """Orders arms: (meets constraints, -violation, objective)."""

    feasible: bool
    violation: float
    objective: float | None

    def key(self) -> tuple:
        return (self.feasible, -round(self.violation, 6), self.objective or 0.0)


Z = 2.0      # how many standard deviations of a difference of two objectives a win must clear


def objective_sigma(measurement: dict | None) -> float | None:
    """Relative standard error of a decode objective from the measurement's own runs: per depth
    the sample variance of the runs' decode (relative to the median), x 1.25^2 / runs for the
    median of the runs, averaged over depths as the geometric mean does (/ depths)."""
    if not measurement:
        return None
    per = []
    kept = runs_by_depth(measurement)            # valid runs, a stalled one left out: it is not noise
    for key, d in (measurement.get("depths") or {}).items():
        med = d.get("median_decode_tok_s")
        xs = [math.exp(x) for x in kept.get(str(key), [])]
        if med and len(xs) >= 2:
            per.append(statistics.variance(xs) / med ** 2 * 1.25 ** 2 / len(xs))
    if not per:
        return None
    return math.sqrt(sum(per) / len(per) / len(per))


@dataclass(frozen=True)
class NoiseBand:
    samples: tuple[float, ...] = ()      # the incumbent's objective re-measures
    within: float = 0.0                  # pooled relative sigma of one arm's objective (its runs)
    pooled_arms: int = 0                 # how many arms the pooled sigma comes from

    @property
    def spread(self) -> float:
        """Half the relative range of the incumbent's re-measures (0 with fewer than two)."""
        if len(self.samples) < 2:
            return 0.0
        med = statistics.median(self.samples)
        return (max(self.samples) - min(self.samples)) / 2 / med if med else 0.0

    @property
    def relative(self) -> float:
        """The band an arm must clear: the re-measures' spread, or Z sigma of a difference of two
        objectives estimated from the runs of every arm measured so far, whichever is wider."""
        small = 1 + 1 / self.pooled_arms if self.pooled_arms else 1.0   # few arms: a wider band
        return max(self.spread, Z * math.sqrt(2) * self.within * small)


@dataclass(frozen=True)
class Judgement:
    verdict: str                  # better | parity | worse
    delta: float | None           # relative objective change vs the incumbent
    threshold: float
    reason: str = ""
    extra: dict = field(default_factory=dict)


VIOLATION_TIE = 0.05   # among shapes that miss the constraints, closer by less than this is a tie: the
                       # objective decides (a 262k window 1.5 % closer to the contract is not worth -8 % decode)


def judge(arm: Score, incumbent: Score, band: NoiseBand, min_effect: float = MIN_EFFECT) -> Judgement:
    threshold = max(band.relative, min_effect)
    if arm.feasible != incumbent.feasible:
        v = "better" if arm.feasible else "worse"
        return Judgement(v, None, threshold, "meets the constraints" if arm.feasible else "breaks a constraint")
    if not arm.feasible:
        gain = incumbent.violation - arm.violation
        if gain > VIOLATION_TIE:
            return Judgement("better", None, threshold, f"constraint violation {incumbent.violation:.2f} -> {arm.violation:.2f}")
        if gain < -VIOLATION_TIE:
            return Judgement("worse", None, threshold, f"constraint violation {incumbent.violation:.2f} -> {arm.violation:.2f}")
    if arm.objective is None or incumbent.objective is None or incumbent.objective <= 0:
        return Judgement("worse" if arm.objective is None else "parity", None, threshold, "no objective to compare")
    delta = arm.objective / incumbent.objective - 1
    if delta > threshold:
        return Judgement("better", delta, threshold)
    if delta < -threshold:
        return Judgement("worse", delta, threshold)
    return Judgement("parity", delta, threshold)


def by_constraint(end: dict | None) -> bool:
    """A verdict the constraints decided (from the boot report's memory arithmetic, which a second
    boot repeats exactly): no objective difference was measured."""
    end = end or {}
    return end.get("delta") is None and end.get("verdict") == Verdict.BETTER and "constraint" in str(end.get("reason", "")) \
        or "meets the constraints" in str(end.get("reason", ""))


def can_promote(comparison: dict) -> bool:
    """Whether a comparison could move the incumbent had it read ``better``: it rests on two boots of
    the challenger or more, every one bracketed by incumbent boots. Facts of when the boots ran, never
    of what they read: only these comparisons are promotion looks the night's error rate is spent on
    (``State.looks``; a look that cannot promote risks no false promotion)."""
    return (comparison.get("boots") or [0])[0] >= 2 and not comparison.get("open")


def promotes(kind: str, end: dict | None, comparison: dict | None) -> bool:
    """The promotion rule: does this arm move the incumbent to its shape?

    - a challenger compared with the incumbent: when the comparison is ``better`` at the night's
      error rate, rests on two boots of the challenger or more (a confirming boot agreed) *and*
      every one of those boots is bracketed by incumbent boots (``open`` 0: a blocked comparison,
      tuner/night/blocks.py, waits for the incumbent's next boot before it may move anything);
    - without a comparison (an objective that is not decode): a ``better`` confirming arm;
    - a probe the constraints decided (``by_constraint``): at once — a second boot repeats the
      memory arithmetic exactly.
    """
    if comparison is not None:
        return comparison["verdict"] == Verdict.BETTER and can_promote(comparison)
    return (kind == "confirm" and (end or {}).get("verdict") == Verdict.BETTER) or (kind == "probe" and by_constraint(end))


def needs_comparison(kind: str, change, rec: dict, comparable: bool) -> bool:
    """Whether the loop compares this arm with the incumbent: a measured one-change challenger (not
    a joint arm, not one pruned after its first depth) whose objective the comparison reads."""
    return bool(change) and kind != "joint" and comparable and rec.get("delta") is not None \
        and rec.get("verdict") in COMPARED and "pruned" not in str(rec.get("reason", ""))


def settle(rec: dict, comparison, required: bool = False) -> dict:
    """The arm's final verdict, decided here and nowhere else: the arm runner's judgement (boot,
    quality guard, constraints, the noise band) stands, unless the sequential comparison against
    the incumbent (tuner.night.compare.Comparison) decided the arm — then its verdict, effect,
    interval and record. ``required``: the arm needed a comparison (``needs_comparison``) but none
    could be made — every run contended, disturbed or unsettled, or no depth in common —: a
    ``better`` from the noise band alone is then ``undecided`` (a band over runs the comparison
    left out cannot promote anything)."""
    if comparison is None:
        if required and rec.get("verdict") == Verdict.BETTER:
            return {**rec, "verdict": Verdict.UNDECIDED,
                    "reason": "no runs left to compare with the incumbent (contended, disturbed or unsettled): "
                              "a noise-band reading cannot promote"}
        return rec
    return {**rec, "verdict": comparison.verdict, "delta": comparison.effect, "compare": comparison.to_dict(),
            "threshold": comparison.effect - comparison.lo}

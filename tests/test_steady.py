"""Steady state per boot (arms/steady.py): warm-up runs found by a test, a boot that never settles
called unstable, and what the comparison does with both."""
from __future__ import annotations

import math
import random

from arms.steady import steady
from tuner.night.compare import runs_by_depth

DEPTHS = (166, 1087, 4064)


def measurement(rates: dict[int, list[float]]) -> dict:
    return {"outcome": "measured", "depths": {str(d): {"median_decode_tok_s": sorted(xs)[len(xs) // 2],
                                                        "runs": [{"valid": True, "decode_tok_s": x} for x in xs]}
                                               for d, xs in rates.items()}}


def boot(rng: random.Random, runs: int = 6, sigma: float = 0.03, ramp: list[float] = (), trend: float = 0.0):
    """Request k of the boot runs at ramp[k] (then 1), times exp(trend * k / requests)."""
    out, k = {}, 0
    total = runs * len(DEPTHS)
    for d in DEPTHS:
        xs = []
        for _ in range(runs):
            f = ramp[k] if k < len(ramp) else 1.0
            xs.append(30.0 * (1 - d / 20000) * f * math.exp(trend * k / total + rng.gauss(0, sigma)))
            k += 1
        out[d] = xs
    return measurement(out)


def test_a_ramp_of_leading_runs_is_warm_up_and_is_left_out_of_the_comparison():
    rng = random.Random(1)
    m = boot(rng, ramp=[0.80, 0.87, 0.93])
    s = steady(m)
    assert s.unstable is None
    assert set(s.warmup) == {"166"} and 1 <= s.warmup["166"] <= 3
    kept = runs_by_depth(m)
    assert len(kept["166"]) == 6 - s.warmup["166"] and len(kept["1087"]) == 6
    assert min(math.exp(x) for x in kept["166"]) > 30.0 * (1 - 166 / 20000) * 0.88


def test_a_steady_boot_has_almost_never_warm_up():
    rng = random.Random(2)
    left = sum(steady(boot(rng)).warmup_runs for _ in range(300))
    assert left <= 20          # a first run 2 sigma low by chance: ~2 % of boots


def test_a_boot_whose_rate_keeps_moving_is_unstable_and_gives_no_evidence():
    rng = random.Random(3)
    m = boot(rng, runs=8, trend=-0.5)          # -40 % from its first run to its last
    s = steady(m)
    assert s.unstable and "never settled" in s.unstable and s.trend < -0.25
    assert runs_by_depth(m) == {}
    assert steady(boot(random.Random(4), runs=8, trend=0.0)).unstable is None


def test_steady_boots_are_almost_never_called_unstable():
    """A night boots ~60 shapes: a boot called unstable by chance costs a shape its chance."""
    rng = random.Random(6)
    called = sum(steady(boot(rng, runs=r)).unstable is not None for r in (3, 6, 12) for _ in range(300))
    assert called == 0


def test_a_boot_still_warming_at_half_its_runs_is_unstable():
    rng = random.Random(5)
    s = steady(boot(rng, ramp=[0.4 + 0.05 * k for k in range(12)], runs=6))
    assert s.unstable and ("still warming" in s.unstable or "never settled" in s.unstable)


def test_too_few_runs_say_nothing():
    assert steady(measurement({166: [10.0, 30.0]})).unstable is None
    assert steady(None).warmup == {}

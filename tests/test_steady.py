"""Steady state per boot (arms/steady.py): warm-up runs found by a test, a boot that never settles
called unstable, and what the comparison does with both."""
from __future__ import annotations

import math
import random
import statistics

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


def test_a_chance_low_first_run_is_seldom_taken_for_warm_up():
    """A cut is one-sided: each steady boot whose first run it takes for warm-up reads higher than
    its runs did. With three runs per depth the level is the median of two, and a bar of 2.5
    sigmas of the run alone took the first run of 6 % of steady boots (a zero-effect challenger
    then promoted at 1.23x its stated rate, bench/results/realbox.md stop 41)."""
    rng = random.Random(8)
    cut = sum(steady(boot(rng, runs=3)).warmup_runs > 0 for _ in range(2000))
    assert cut <= 50                 # ~1.5 %: 2.5 % at most


def test_a_noisy_shape_keeps_its_runs_and_a_stall_still_goes():
    """A shape whose runs spread 40 % moves one run threefold now and then: cut at x3 alone, its
    kept runs spread ~0.9 of its runs, and every test of it read a standard error too small. Its
    own spread keeps them; a run at 1 % of its siblings' rate is still a stall."""
    rng = random.Random(9)
    kept_var, cut = [], 0
    for _ in range(600):
        m = boot(rng, runs=3, sigma=0.40)
        runs = runs_by_depth(m)
        cut += sum(len(r["runs"]) for r in m["depths"].values()) - sum(len(x) for x in runs.values())
        kept_var += [statistics.variance(xs) for xs in runs.values() if len(xs) == 3]
    assert cut <= 40                                       # of 5400 runs (x3 alone: 81)
    assert 0.9 < math.sqrt(statistics.fmean(kept_var)) / 0.40 < 1.1
    m = boot(random.Random(10), runs=3, sigma=0.40)
    m["depths"]["1087"]["runs"][1]["decode_tok_s"] = 0.01 * m["depths"]["1087"]["runs"][0]["decode_tok_s"]
    assert len(runs_by_depth(m)["1087"]) == 2

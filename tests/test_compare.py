"""Sequential, paired comparisons: each side's own variance, a night-wide error rate."""
from __future__ import annotations

import math
import random

import pytest

from tuner.compare import Side, compare, estimate_drift, look_alpha

DEPTHS = {"166": 30.0, "1087": 28.0, "4064": 27.0}


def boot(rng, factor=1.0, sigma=0.03, runs=3):
    return {"depths": {d: {"runs": [{"valid": True, "decode_tok_s": r * factor * math.exp(rng.gauss(0, sigma))}
                                    for _ in range(runs)]} for d, r in DEPTHS.items()}}


def test_a_clear_gain_is_better_and_a_clear_loss_worse():
    rng = random.Random(1)
    inc = Side.of([boot(rng, runs=9), boot(rng, runs=9)])
    up = compare(Side.of([boot(rng, 1.08, runs=9), boot(rng, 1.08, runs=9)]), inc, alpha=0.001)
    assert up.verdict == "better" and up.lo > 0 and 0.05 < up.effect < 0.11
    assert up.runs == (54, 54) and up.boots == (2, 2)
    down = compare(Side.of([boot(rng, 0.9, runs=9)]), inc, alpha=0.001)
    assert down.verdict == "worse" and down.hi < 0


def test_a_noisy_challenger_is_judged_by_its_own_spread_not_the_incumbents():
    """Twice the noise and a lucky +5 %: a band pooled from quiet arms would promote it."""
    rng = random.Random(7)
    inc = Side.of([boot(rng, sigma=0.01, runs=9) for _ in range(3)])
    noisy = Side.of([boot(rng, 1.0, sigma=0.40, runs=9) for _ in range(2)])
    c = compare(noisy, inc, alpha=0.001)
    assert c.sigma[0] > 10 * c.sigma[1]
    assert c.verdict == "undecided" and c.lo < 0 < c.hi


def test_no_effect_is_parity_once_the_interval_is_tight():
    rng = random.Random(3)
    inc = Side.of([boot(rng, runs=12) for _ in range(3)])
    c = compare(Side.of([boot(rng, runs=12) for _ in range(3)]), inc, alpha=0.001, min_effect=0.03)
    assert c.verdict in ("parity", "worse") and c.hi < 0.015


def test_boot_to_boot_variance_widens_the_interval_when_it_is_larger():
    rng = random.Random(5)
    shifts = [0.94, 1.06, 0.95, 1.05]
    inc = Side.of([boot(rng, s, sigma=0.005, runs=6) for s in shifts[:2]])
    ch = Side.of([boot(rng, 1.0 + 0.05 * (s - 1) / 0.06 + 0.04, sigma=0.005, runs=6) for s in shifts[2:]])
    c = compare(ch, inc, alpha=0.01)
    assert c.boot_level and c.verdict != "better"


@pytest.mark.parametrize("planned", [1, 10, 300])
def test_the_looks_of_a_night_spend_at_most_its_error_rate(planned):
    total = sum(look_alpha(0.05, k, planned) for k in range(1, 200000))
    assert total <= 0.05 and total > 0.049
    assert look_alpha(0.05, 1, planned) > look_alpha(0.05, 50, planned)


def test_no_shared_depth_is_no_comparison():
    rng = random.Random(0)
    assert compare(Side.of([boot(rng)]), Side.of([]), alpha=0.01) is None


def test_a_drift_over_the_night_is_fitted_and_no_longer_reads_as_an_effect():
    """Every shape's rate rises 3 % an hour; the incumbent measured at 0-2 h, a challenger of no
    effect at 3 h: pooled as if at once it reads +6 %, moved along the fitted drift it does not."""
    rng = random.Random(11)
    drift = 0.03

    def at(t, factor=1.0):
        return boot(rng, factor * math.exp(drift * t), sigma=0.01, runs=6)

    t_inc = [0.0, 1.0, 2.0]
    inc = Side.of([at(t) for t in t_inc], times=t_inc)
    other = Side.of([at(t, 1.1) for t in (0.5, 2.5)], times=[0.5, 2.5])      # another shape, seen twice
    t_ch = [3.0, 3.1]
    ch = Side.of([at(t) for t in t_ch], times=t_ch)
    d = estimate_drift([inc, other, ch])
    assert d is not None and d.per_h == pytest.approx(drift, abs=0.006) and abs(d.per_h) > 3 * d.se
    naive = compare(ch, inc, alpha=0.01)
    fixed = compare(ch, inc, alpha=0.01, drift=d)
    assert naive.effect > 0.04 and naive.verdict != "parity"      # the drift reads as +6 %
    assert fixed.verdict != "better" and abs(fixed.effect) < 0.02
    assert fixed.drift_per_h == pytest.approx(math.expm1(d.per_h))
    assert fixed.se < naive.se       # the drift no longer inflates the incumbent's boot-to-boot spread
    assert "drift_per_h" in fixed.to_dict() and "drift_per_h" not in naive.to_dict()


def test_no_drift_fitted_from_noise_changes_nothing():
    rng = random.Random(12)
    sides = [Side.of([boot(rng) for _ in range(3)], times=[0.0, 1.0, 2.0]) for _ in range(3)]
    d = estimate_drift(sides)
    assert d is not None and abs(d.per_h) < 3 * d.se
    a, b = compare(sides[0], sides[1], alpha=0.01), compare(sides[0], sides[1], alpha=0.01, drift=d)
    assert a == b
    assert estimate_drift([Side.of([boot(rng)], times=[0.0])]) is None        # nothing repeated: no fit


def test_t_quantiles_and_few_runs_need_more_than_the_normal_bound():
    from tuner.compare import t_quantile

    for df, want in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(want, rel=0.01)
    assert t_quantile(0.9997, 8) > t_quantile(0.9997, 40) > t_quantile(0.9997, 1e9) == pytest.approx(3.43, abs=0.01)
    # three runs a side on one depth, a +4 % reading: z would call it at 1e-3, t (df ~4) does not
    inc = Side.of([{"depths": {"166": {"runs": [{"valid": True, "decode_tok_s": x} for x in (30.0, 30.3, 29.7)]}}}])
    ch = Side.of([{"depths": {"166": {"runs": [{"valid": True, "decode_tok_s": x} for x in (31.2, 31.5, 30.9)]}}}])
    c = compare(ch, inc, alpha=0.001)
    z_lo = math.expm1(math.log1p(c.effect) - 3.09 * c.se)
    assert z_lo > 0 and c.verdict != "better"

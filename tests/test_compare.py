"""Sequential, paired comparisons: each side's own variance, a night-wide error rate."""
from __future__ import annotations

import math
import random

import pytest

from tuner.compare import Side, compare, look_alpha

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

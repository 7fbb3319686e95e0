"""The arithmetic of a blocked comparison (tuner/night/power.py): the contrast's variance against a
simulation of the design itself, and the boots a move needs against the effect those boots show."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from tuner.night.power import BoxNoise, boots_for, contrast_var, shown_at


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_the_contrast_variance_is_the_alternating_designs_own(n):
    """A B A B ... A with independent boots of variance s2: each challenger boot against its two
    neighbours' mean, averaged; the variance of that over many nights is ``contrast_var``."""
    rng = random.Random(n)
    s = 0.02
    xs = []
    for _ in range(20000):
        a = [rng.gauss(0, s) for _ in range(n + 1)]
        bs = [rng.gauss(0, s) for _ in range(n)]
        xs.append(statistics.fmean(b - (a[i] + a[i + 1]) / 2 for i, b in enumerate(bs)))
    assert statistics.variance(xs) == pytest.approx(contrast_var(n, s * s), rel=0.04)


@pytest.mark.parametrize("effect, sigma, alpha", [(0.035, 0.02, 1e-5), (0.05, 0.02, 0.0025), (0.085, 0.0, 1e-4),
                                                  (0.02, 0.04, 7e-6), (0.2, 0.068, 4.6e-5)])
def test_the_boots_a_move_needs_are_the_fewest_that_show_it(effect, sigma, alpha):
    s2 = sigma ** 2 + 0.01 ** 2
    n = boots_for(effect, s2, alpha)
    assert n is not None
    assert shown_at(n, s2, alpha) <= effect + 1e-12
    if n > 1:
        assert shown_at(n - 1, s2, alpha) > effect


def test_a_spread_box_makes_small_moves_cost_many_boots():
    quiet, spread = 0.01 ** 2, 0.02 ** 2 + 0.01 ** 2
    assert boots_for(0.035, spread, 1e-5) > 3 * boots_for(0.035, quiet, 1e-5)
    assert boots_for(0.02, 0.04 ** 2 + 0.036 ** 2, 7e-6) > 200          # the real llama-server box
    assert boots_for(0.0, quiet, 0.01) is None and boots_for(-0.01, quiet, 0.01) is None
    assert boots_for(0.001, 0.05 ** 2, 1e-6) is None                       # past any night


def test_the_box_noise_is_read_from_a_blocked_comparison_only():
    blocked = {"boot_sigma": 0.021, "spread_pairs": 40, "sigma": [0.031, 0.029], "runs": [60, 90], "boots": [5, 10],
               "alpha": 1.2e-5}
    n = BoxNoise.of(blocked)
    assert (n.boot_sigma, n.pairs, n.run_sigma, n.runs_per_boot, n.alpha) == (0.021, 40, 0.029, 9.0, 1.2e-5)
    assert n.s2 == pytest.approx(0.021 ** 2 + 0.029 ** 2 / 9)
    assert BoxNoise.of({k: v for k, v in blocked.items() if k not in ("boot_sigma", "spread_pairs")}) is None
    assert math.isclose(BoxNoise.of({**blocked, "sigma": [0.031, None]}).run_sigma, 0.031)


def test_a_spread_from_few_pairs_reads_the_t_bound_the_night_reads():
    """The night's test reads Student's t at the Welch degrees of freedom: a spread from 6 pairs
    makes the bound far wider than the normal one, and the boots a move needs far more."""
    few = BoxNoise(0.02, 6, 0.03, 9.0, 1e-5)
    many = BoxNoise(0.02, 600, 0.03, 9.0, 1e-5)
    assert 6 < few.df < 10 and many.df > 500
    assert BoxNoise(0.0, 3, 0.03, 9.0, 1e-5).df > 1e5          # no spread: the runs' many degrees of freedom
    assert shown_at(7, few.s2, few.alpha, few.df) > 1.5 * shown_at(7, many.s2, many.alpha, many.df)
    assert boots_for(0.05, few.s2, few.alpha, df=few.df) > 2 * boots_for(0.05, many.s2, many.alpha, df=many.df)

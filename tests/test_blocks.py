"""Comparisons blocked in time (tuner/night/blocks.py): what a drift, a step and boot-to-boot
spread do to them, against the pooled test they replace."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from tuner.night.blocks import MIN_SPREAD_PAIRS, Boot, Spread, boot_spread, compare_blocked, drift_of
from tuner.night.compare import Side, compare
from tuner.night.verdict import promotes

DEPTHS = ("166", "1087", "4064")


def boot(arm: int, t: float, rate: float, rng: random.Random, sigma: float = 0.03, runs: int = 6,
         boot_sigma: float = 0.0) -> Boot:
    off = rng.gauss(0, boot_sigma)
    return Boot(arm, t, {d: [math.log(rate) + off + rng.gauss(0, sigma) for _ in range(runs)] for d in DEPTHS})


def night(pattern: str, effect: float, per_h: float, rng: random.Random, boot_sigma: float = 0.0,
          dt: float = 0.25, step_at: float | None = None, step: float = 1.0):
    """Boots in ``pattern`` order (A: incumbent, B: challenger), one every ``dt`` hours, on a box
    whose rate drifts by ``per_h`` per hour (and drops by ``step`` at ``step_at`` hours)."""
    inc, chal = [], []
    for n, who in enumerate(pattern):
        t = n * dt
        box = math.exp(per_h * t) * (step if step_at is not None and t >= step_at else 1.0)
        b = boot(n, t, 30.0 * box * ((1 + effect) if who == "B" else 1.0), rng, boot_sigma=boot_sigma)
        (chal if who == "B" else inc).append(b)
    return chal, inc


def blocked(chal, inc, alpha=0.01):
    series = [chal, inc]
    drift = drift_of(series)
    return compare_blocked(chal, inc, spread=boot_spread(series, drift), alpha=alpha, drift=drift)


def test_a_linear_drift_cancels_inside_closed_blocks_and_biases_the_pooled_test():
    """+8 %/h, no effect: the incumbent's boots spread over the night (pooled) make the challenger
    read the drift; bracketed (A A A B B A), it reads ~0."""
    rng = random.Random(1)
    effs_blocked, effs_pooled = [], []
    for _ in range(40):
        chal, inc = night("AAABBA", 0.0, 0.08, rng)
        c = blocked(chal, inc)
        assert c.open == 0 and all(b["closed"] for b in c.blocks)
        effs_blocked.append(c.effect)
        p = compare(Side(tuple(b.runs for b in chal)), Side(tuple(b.runs for b in inc)), alpha=0.01)
        effs_pooled.append(p.effect)
    mean_b = sum(effs_blocked) / len(effs_blocked)
    mean_p = sum(effs_pooled) / len(effs_pooled)
    assert abs(mean_b) < 0.003
    assert mean_p > 0.015                # the pooled test reads most of an hour's drift as an effect


def test_an_open_block_may_read_better_but_never_promotes_until_the_incumbent_boots_after_it():
    rng = random.Random(2)
    chal, inc = night("AAAAABB", 0.12, 0.0, rng)
    c = blocked(chal, inc, alpha=0.05)
    assert c.verdict == "better" and c.open == 2 and c.boots[0] == 2
    assert "not yet bracketed" in c.why
    assert not promotes("confirm", None, c.to_dict())
    chal, inc = night("AAAAABBA", 0.12, 0.0, random.Random(2))
    c2 = blocked(chal, inc, alpha=0.05)
    assert c2.open == 0 and c2.verdict == "better" and promotes("confirm", None, c2.to_dict())
    assert c2.to_dict()["blocks"][0]["ref"] == [3, 4, 7]       # up to BRACKET boots each side, the line through them


def test_a_boot_spread_measured_from_a_pair_or_two_is_taken_at_its_upper_bound():
    """A spread from a pair or two can come out near zero by chance; the runs' many degrees of
    freedom must not then speak for it. Below MIN_SPREAD_PAIRS pairs it is taken at its upper
    confidence bound: +4 % waits, +30 % is clear even so (a night of a few arms can promote a
    large effect), and with enough pairs the estimate itself is used."""
    chal, inc = night("AABBA", 0.04, 0.0, random.Random(2))
    few = Spread(0.0, 2, 0.02 ** 2)
    c = compare_blocked(chal, inc, spread=few, alpha=0.01)
    assert c.open == 0 and c.verdict == "undecided" and "upper bound 2.0%" in c.why
    assert not promotes("confirm", None, c.to_dict())
    many = compare_blocked(chal, inc, spread=Spread(0.0, MIN_SPREAD_PAIRS, 0.02 ** 2), alpha=0.01)
    assert many.verdict == "better"
    big_c, big_i = night("AABBA", 0.30, 0.0, random.Random(2))
    big = compare_blocked(big_c, big_i, spread=few, alpha=0.01)
    assert big.verdict == "better" and promotes("confirm", None, big.to_dict())
    # the bound itself: two pairs that agree to their runs' noise, E[q] at the chi-square's 10 % quantile
    sp = boot_spread([chal, inc])
    assert sp.pairs < MIN_SPREAD_PAIRS and sp.upper > 4 * sp.var and sp.upper > 0


def test_boots_measured_longer_because_they_read_close_do_not_understate_the_spread():
    """The loop measures a boot longer while its comparison is undecided, so long-measured boots
    are the ones whose offset came out small. Weighted by their runs' noise alone, their pairs
    would speak for the night; weighted by the variance of a pair's square, they do not."""
    rng = random.Random(11)
    ests = []
    for _ in range(200):
        series, arm = [], 0
        for _ in range(10):
            boots = []
            for _ in range(3):
                off = rng.gauss(0, 0.02)
                runs = 24 if abs(off) < 0.01 else 3           # read close: kept measuring
                boots.append(Boot(arm, float(arm), {d: [math.log(30) + off + rng.gauss(0, 0.03) for _ in range(runs)]
                                                    for d in DEPTHS}))
                arm += 1
            series.append(boots)
        ests.append(boot_spread(series).var)
    assert 0.8 * 0.02 < math.sqrt(sum(ests) / len(ests)) < 1.2 * 0.02


def test_a_step_inside_a_block_is_called_jumped_and_cannot_promote():
    """The incumbent drops 30 % between its two boots (another tenant arrived): interpolating
    across the step cancels nothing, the block is not counted as closed."""
    rng = random.Random(3)
    chal, inc = night("AABA", 0.0, 0.0, rng, step_at=0.6, step=0.7)
    history = [boot(100 + k, k * 0.5, 40.0, rng) for k in range(8)]      # another shape, steady all night
    series = [chal, inc, history]
    drift = drift_of(series)
    c = compare_blocked(chal, inc, spread=boot_spread(series, drift), alpha=0.05, drift=drift)
    assert c.blocks[0].get("jumped") and c.open == 1
    assert not promotes("confirm", None, c.to_dict())


def test_boot_spread_is_measured_from_successive_boots_and_widens_the_interval():
    rng = random.Random(4)
    series = [[boot(n, n * 0.2, 30.0, rng, boot_sigma=0.03) for n in range(60)]]
    sp = boot_spread(series)
    assert 0.02 < sp.sigma < 0.045 and sp.pairs == 59
    quiet = boot_spread([[boot(n, n * 0.2, 30.0, rng) for n in range(60)]])
    assert quiet.sigma < 0.008
    chal, inc = night("ABBA", 0.0, 0.0, random.Random(5))
    wide = compare_blocked(chal, inc, spread=sp, alpha=0.01)
    narrow = compare_blocked(chal, inc, spread=quiet, alpha=0.01)
    assert wide.se > 2 * narrow.se


@pytest.mark.parametrize("per_h,boot_sigma", [(0.04, 0.0), (-0.04, 0.0), (0.0, 0.02), (0.03, 0.02)])
def test_zero_effect_challengers_promote_at_most_at_the_stated_rate(per_h, boot_sigma):
    """600 zero-effect challengers, each A B B A on a drifting / spread box, tested at 5 %: the
    closed blocks' false `better` rate stays within the rate (binomial slack: 3 sigma)."""
    rng = random.Random(int(1000 * per_h + 100 * boot_sigma) + 7)
    alpha, n, wins = 0.05, 600, 0
    for _ in range(n):
        chal, inc = night("AABBAA", 0.0, per_h, rng, boot_sigma=boot_sigma, dt=0.3)
        history = [boot(100 + k, 10 + k * 0.3, 40.0, rng, boot_sigma=boot_sigma) for k in range(6)]
        series = [chal, inc, history]
        c = compare_blocked(chal, inc, spread=boot_spread(series), alpha=alpha)
        wins += c.verdict == "better" and promotes("confirm", None, c.to_dict())
    assert wins / n <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / n)


def test_a_real_effect_is_still_found_on_a_drifting_box():
    rng = random.Random(8)
    found = 0
    for _ in range(30):
        chal, inc = night("AAABBAA", 0.08, 0.03, rng)
        c = blocked(chal, inc, alpha=0.001)
        found += promotes("confirm", None, c.to_dict())
        assert c.drift_seen is not None and 0.0 < c.drift_seen < 0.07
    assert found >= 25


def test_a_step_and_an_erratic_shape_do_not_pass_for_boot_spread():
    """Six shapes booted in turn, six rounds; one of them has runs that spread 40 %. On a quiet box
    (no spread beyond the runs) the erratic shape's pairs weigh next to nothing; with the box 5 %
    slower from round 3 on, the pairs across the step are trimmed against a robust scale (the
    spread reads well under half the step); a real 2 % spread is read through both."""
    def spread(true_sigma: float, step_on: bool) -> float:
        rng = random.Random(12)
        ests = []
        for _ in range(40):
            series = [[] for _ in range(6)]
            for k in range(6):
                for s in range(6):
                    arm = 6 * k + s
                    rate = 30.0 * (0.95 if step_on and arm >= 18 else 1.0)
                    series[s].append(boot(arm, float(arm), rate, rng, sigma=0.40 if s == 5 else 0.03, runs=3,
                                          boot_sigma=true_sigma))
            ests.append(boot_spread(series).var)
        return math.sqrt(sum(ests) / len(ests))
    assert spread(0.0, False) < 0.008
    assert spread(0.0, True) < 0.025 / 1.8
    assert 0.016 < spread(0.02, False) < 0.024 and 0.016 < spread(0.02, True) < 0.03


def test_a_shape_met_again_hours_later_says_nothing_about_the_boot_spread():
    """Two boots of one shape 30 arms apart differ by whatever the box did in between: no pair."""
    rng = random.Random(13)
    far = [[boot(0, 0.0, 30.0, rng), boot(30, 30.0, 27.0, rng)] for _ in range(8)]
    assert boot_spread(far).pairs == 0
    near = [[boot(0, 0.0, 30.0, rng), boot(3, 3.0, 30.0, rng)] for _ in range(8)]
    assert boot_spread(near).pairs == 8


def test_a_night_of_one_second_arms_writes_its_drift_capped_not_an_overflow():
    """A test night of a real llama-server boots an arm a second: an incumbent step of 30 % across
    a block 0.0005 h wide is a per-hour log rate of ~500, whose expm1 overflows. The comparison is
    still made and the block's drift written capped (e^20 - 1; a drop: -1)."""
    from tuner.night.compare import GROWTH_CAP, growth

    rng = random.Random(5)
    chal, inc = night("AABA", 0.0, 0.0, rng, dt=1 / 3600, step_at=2.5 / 3600, step=1.3)
    c = blocked(chal, inc)
    assert c is not None and c.blocks[0]["drift_per_h"] == round(math.expm1(GROWTH_CAP), 5)
    chal, inc = night("AABA", 0.0, 0.0, rng, dt=1 / 3600, step_at=2.5 / 3600, step=0.7)
    assert blocked(chal, inc).blocks[0]["drift_per_h"] == round(math.expm1(-GROWTH_CAP), 5)
    assert growth(-1e4) == math.expm1(-GROWTH_CAP) and growth(0.01) == math.expm1(0.01)


@pytest.mark.parametrize("pairs", [5, 7, 9])
def test_a_few_pairs_of_a_wide_spread_are_read_whole_not_cut_as_jumps(pairs):
    """Early in a night on a box whose boots spread 5 %, the spread rests on a handful of pairs.
    None of them is a jump: the estimate must not be biased low (cutting the largest squares
    against the median of a few read 1.2 % for 5 % and a zero-effect lever was promoted); it is
    read whole, and comes out under half the truth no more often than a chi-square allows."""
    from tuner.night.blocks import boot_spread

    rng = random.Random(pairs)
    sig = []
    for _ in range(400):
        series = [[boot(2 * k, float(2 * k), 30.0, rng, runs=3, boot_sigma=0.05),
                   boot(2 * k + 1, float(2 * k + 1), 30.0, rng, runs=3, boot_sigma=0.05)] for k in range(pairs)]
        sig.append(boot_spread(series).sigma)
    assert 0.85 * 0.05 < math.sqrt(statistics.fmean(s * s for s in sig)) < 1.15 * 0.05
    low = sum(s < 0.5 * 0.05 for s in sig) / len(sig)
    assert low < {5: 0.12, 7: 0.06, 9: 0.03}[pairs]      # P(chi2_k / k < 1/4), with room for the runs' noise

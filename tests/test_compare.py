"""Sequential, paired comparisons: each side's own variance, a night-wide error rate."""
from __future__ import annotations

import math
import random

import pytest

from arms.steady import steady

from tuner.night.compare import Side, compare, estimate_drift, look_alpha

DEPTHS = {"166": 30.0, "1087": 28.0, "4064": 27.0}


def boot(rng, factor=1.0, sigma=0.03, runs=3):
    return {"depths": {d: {"runs": [{"valid": True, "decode_tok_s": r * factor * math.exp(rng.gauss(0, sigma))}
                                    for _ in range(runs)]} for d, r in DEPTHS.items()}}


def warm(ms) -> int:
    """Leading runs arms.steady leaves out as warm-up (a first run 2.5 sigma low, by chance here)."""
    return sum(steady(m).warmup_runs for m in ms)


def test_a_clear_gain_is_better_and_a_clear_loss_worse():
    rng = random.Random(1)
    mi = [boot(rng, runs=9), boot(rng, runs=9)]
    inc = Side.of(mi)
    mc = [boot(rng, 1.08, runs=9), boot(rng, 1.08, runs=9)]
    up = compare(Side.of(mc), inc, alpha=0.001)
    assert up.verdict == "better" and up.lo > 0 and 0.05 < up.effect < 0.11
    assert up.runs == (54 - warm(mc), 54 - warm(mi)) and up.boots == (2, 2)
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
    from tuner.night.compare import t_quantile

    for df, want in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(want, rel=0.01)
    assert t_quantile(0.9997, 8) > t_quantile(0.9997, 40) > t_quantile(0.9997, 1e9) == pytest.approx(3.43, abs=0.01)
    # three runs a side on one depth, a +4 % reading: z would call it at 1e-3, t (df ~4) does not
    inc = Side.of([{"depths": {"166": {"runs": [{"valid": True, "decode_tok_s": x} for x in (30.0, 30.3, 29.7)]}}}])
    ch = Side.of([{"depths": {"166": {"runs": [{"valid": True, "decode_tok_s": x} for x in (31.2, 31.5, 30.9)]}}}])
    c = compare(ch, inc, alpha=0.001)
    z_lo = math.expm1(math.log1p(c.effect) - 3.09 * c.se)
    assert z_lo > 0 and c.verdict != "better"


def test_a_looks_rate_is_split_over_every_test_of_its_growing_boot():
    """The loop tests a boot after every batch of runs and stops once it is decided: each of
    those tests may stop it on a better reading, so each runs at the look's rate over the cap."""
    from tuner.night.judging import EXTEND_CAP

    for k in (1, 7, 40):
        whole = look_alpha(0.01, k, 60)
        assert look_alpha(0.01, k, 60, peeks=EXTEND_CAP) == pytest.approx(whole / EXTEND_CAP)
    total = sum(look_alpha(0.01, k, 60, peeks=EXTEND_CAP) * EXTEND_CAP for k in range(1, 200000))
    assert total <= 0.01


def test_each_sides_variance_is_pooled_over_its_depths():
    """Three runs per depth give each depth's variance 2 degrees of freedom, and a sum of such
    estimates has tails far heavier than a t quantile; the side's relative sigma pooled over its
    depths has runs - depths: the test reads t at the Welch degrees of freedom of the two pooled
    variances."""
    from tuner.night.compare import t_quantile

    rng = random.Random(21)
    inc_m = [boot(rng, runs=6) for _ in range(2)]
    ch_m = [boot(rng, 1.0, runs=3)]
    c = compare(Side.of(ch_m), Side.of(inc_m), alpha=0.001)
    D = len(DEPTHS)

    def pooled(ms, runs):
        logs = {d: [math.log(x["decode_tok_s"]) for m in ms for x in m["depths"][d]["runs"]] for d in DEPTHS}
        ss = sum(sum((x - sum(xs) / len(xs)) ** 2 for x in xs) for xs in logs.values())
        dof = sum(len(xs) - 1 for xs in logs.values())
        return ss / dof * D / runs / D ** 2, dof

    (vc, dc), (vi, di) = pooled(ch_m, 3), pooled(inc_m, 12)
    assert (dc, di) == (6, 33)
    assert c.se == pytest.approx(math.sqrt(vc + vi), rel=1e-9)
    df = (vc + vi) ** 2 / (vc * vc / dc + vi * vi / di)
    t_used = (math.log1p(c.effect) - math.log1p(c.lo)) / c.se
    assert t_used == pytest.approx(t_quantile(0.999, df), rel=1e-6)
    assert c.sigma[0] == pytest.approx(Side.of(ch_m).spread())


def test_a_run_something_else_stalled_is_left_out_and_counted():
    """A real llama-server night on a shared host: one run of 64 tokens took two minutes (0.53
    tok/s against its siblings' 72); kept, its log is a variance no effect clears and every
    comparison of the night ended undecided. Left out (x3 from its boot's median), a clear
    -40 % is worse again, and the comparison says how many runs it left out."""
    rng = random.Random(31)
    inc = [boot(rng, runs=4) for _ in range(3)]
    inc[1]["depths"]["1087"]["runs"][3]["decode_tok_s"] = 0.53
    ms = [boot(rng, 0.6, runs=4) for _ in range(3)]
    slow = Side.of(ms)
    c = compare(slow, Side.of(inc), alpha=0.001)
    assert c.verdict == "worse" and c.disturbed == (0, 1) and c.to_dict()["disturbed"] == [0, 1]
    assert c.runs == (36 - warm(ms), 35 - warm(inc))
    kept = Side(tuple({d: [math.log(x["decode_tok_s"]) for x in r["runs"]] for d, r in m["depths"].items()}
                      for m in inc))
    assert compare(slow, kept, alpha=0.001).se > 4 * c.se      # what the stalled run did to the interval
    # two runs, or a 2x spread: nothing is left out
    assert Side.of([{"depths": {"166": {"runs": [{"valid": True, "decode_tok_s": x} for x in (30.0, 0.5)]}}}]).disturbed == 0
    assert Side.of([{"depths": {"166": {"runs": [{"valid": True, "decode_tok_s": x} for x in (30.0, 31.0, 16.0)]}}}]).disturbed == 0
    assert "disturbed" not in compare(slow, slow, alpha=0.001).to_dict()


def test_a_run_another_process_held_the_box_for_is_left_out_and_counted_on_its_own():
    """Issue 19, Build 4: an incumbent boot measured while a tenant slowed the box 20 % (its runs
    marked ``contended`` by the measurement) makes a zero-effect challenger read +8 % (and the
    boot-to-boot spread it adds leaves the comparison undecided); left out, the effect is ~0
    again, and the comparison counts what it left out apart from the disturbed runs. A record without the mark (every old journal) is unchanged."""
    rng = random.Random(41)
    inc = [boot(rng, runs=6) for _ in range(2)] + [boot(rng, 0.8, runs=6)]
    for d in inc[2]["depths"].values():
        for r in d["runs"]:
            r["contended"] = "foreign CPU load 1.50 cores >= 0.5"
            r["conditions"] = {"source": "simulated", "foreign_cores": 1.5}
    ch = [boot(rng, runs=6) for _ in range(2)]
    inc[0]["depths"]["166"]["runs"][0]["decode_tok_s"] = 0.4          # and one stalled run as well
    c = compare(Side.of(ch), Side.of(inc), alpha=0.001)
    assert c.contended == (0, 18) and c.disturbed == (0, 1) and c.boots == (2, 2)
    assert c.runs == (36 - warm(ch), 35 - warm(inc))
    assert c.to_dict()["contended"] == [0, 18] and abs(c.effect) < 0.03
    unmarked = [{"depths": {d: {"runs": [{k: v for k, v in r.items() if k not in ("contended", "conditions")}
                                         for r in x["runs"]]} for d, x in m["depths"].items()}} for m in inc]
    seen = compare(Side.of(ch), Side.of(unmarked), alpha=0.001)
    assert seen.contended == (0, 0) and "contended" not in seen.to_dict() and seen.boots == (2, 3)
    assert seen.effect > c.effect + 0.05                               # what the tenant's boot did
    # an old record and the same record probed on a quiet box compare identically
    quiet = [{"depths": {d: {"runs": [{**r, "conditions": {"source": "psutil", "foreign_cores": 0.02}}
                                      for r in x["runs"]]} for d, x in m["depths"].items()}} for m in unmarked]
    assert compare(Side.of(ch), Side.of(quiet), alpha=0.001).to_dict() == seen.to_dict()
    assert Side.of([inc[2]]).boots == () and Side.of([inc[2]]).contended == 18

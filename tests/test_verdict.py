"""Objectives, constraints, noise band and verdicts (pure)."""
from __future__ import annotations

import pytest

from arms.errors import ConfigError
from tuner.night.verdict import Constraints, NoiseBand, Objective, Score, judge

M = {"depths": {"166": {"median_decode_tok_s": 40.0}, "1087": {"median_decode_tok_s": 37.0},
                "4064": {"median_decode_tok_s": 37.5}}}


@pytest.mark.parametrize("text,value", [
    ("decode_geomean", (40 * 37 * 37.5) ** (1 / 3)),
    ("decode@1087", 37.0),
    ("goodput_at_slo", None),
])
def test_objectives(text, value):
    got = Objective.parse(text).value(M)
    assert got == (pytest.approx(value) if value is not None else None)


def test_bad_objective_names_the_choices():
    with pytest.raises(ConfigError, match="decode@DEPTH"):
        Objective.parse("tok/s")


def test_geomean_is_none_when_a_depth_failed():
    assert Objective.parse("decode_geomean").value({"depths": {"166": {"median_decode_tok_s": None}}}) is None


def test_concurrency_constraint_from_the_kv_pool():
    c = Constraints.from_mapping({"max_concurrency_at": {"tokens": 200704, "min": 1.99}}, "c.yaml")
    ok = {"report": {"kv_pool_tokens": 399131, "max_concurrency_len": 200704}}
    short = {"report": {"kv_pool_tokens": 272000, "max_concurrency_len": 200704}}
    window = {"report": {"kv_pool_tokens": 900000, "max_concurrency_len": 32768}}   # cannot serve 200k at all
    assert c.violations(ok) == {}
    assert c.violations(short)["max_concurrency_at"] == pytest.approx((1.99 - round(272000 / 200704, 2)) / 1.99)
    assert c.violations(window)["max_concurrency_at"] == pytest.approx(1.0)


def test_short_window_ranks_below_any_window_that_fits_but_a_denser_pool_is_progress():
    """Seed 002's path one change at a time: fp8 KV at 32k (window still short) must score as
    progress over bf16 at 32k, and any 200k window beats any 32k one."""
    c = Constraints.from_mapping({"max_concurrency_at": {"tokens": 200704, "min": 1.99}}, "c.yaml")
    bf16_32k = {"report": {"kv_pool_tokens": 116_600, "max_concurrency_len": 32768}}
    fp8_32k = {"report": {"kv_pool_tokens": 177_900, "max_concurrency_len": 32768}}
    fp8_200k = {"report": {"kv_pool_tokens": 272_000, "max_concurrency_len": 200704, "max_concurrency": 1.36}}
    v = [c.violations(x)["max_concurrency_at"] for x in (bf16_32k, fp8_32k, fp8_200k)]
    assert v[0] == pytest.approx(1 + (1.99 - 0.58) / 1.99) and v[0] > v[1] > 1.0 > v[2]
    assert v[2] == pytest.approx((1.99 - 1.36) / 1.99)
    scores = [Score(False, x, 30.0) for x in v]
    assert judge(scores[1], scores[0], NoiseBand()).verdict == "better"
    assert judge(scores[1], scores[0], NoiseBand()).reason == f"constraint violation {v[0]:.2f} -> {v[1]:.2f}"
    assert judge(scores[0], scores[2], NoiseBand()).verdict == "worse"


@pytest.mark.parametrize("arm,inc,samples,verdict", [
    (Score(True, 0, 41.0), Score(True, 0, 40.0), (40.0,), "better"),          # +2.5 % > 2 % floor
    (Score(True, 0, 40.6), Score(True, 0, 40.0), (40.0,), "parity"),          # +1.5 %
    (Score(True, 0, 41.0), Score(True, 0, 40.0), (38.0, 42.0), "parity"),     # band ±5 % swallows it
    (Score(True, 0, 37.0), Score(True, 0, 40.0), (40.0,), "worse"),
    (Score(True, 0, 20.0), Score(False, 0.5, 40.0), (), "better"),            # meets the constraint
    (Score(False, 0.2, 20.0), Score(False, 0.5, 40.0), (), "better"),         # smaller shortfall
    (Score(False, 0.7, 80.0), Score(False, 0.5, 40.0), (), "worse"),
    (Score(True, 0, None), Score(True, 0, 40.0), (), "worse"),
])
def test_judge(arm, inc, samples, verdict):
    assert judge(arm, inc, NoiseBand(samples)).verdict == verdict


def test_noise_band_is_half_the_relative_range():
    assert NoiseBand((38.0, 40.0, 42.0)).relative == pytest.approx(0.05)
    assert NoiseBand((40.0,)).relative == 0.0


def test_a_sliver_closer_to_the_constraint_does_not_buy_a_slower_shape():
    """Seed 002's 262k trap: a 262,144 window prices the mamba state over more tokens and comes
    0.015 closer to the contract than 200,704, at -8 % decode: the objective decides."""
    inc, longer = Score(False, 0.3166, 43.8), Score(False, 0.3015, 40.2)
    assert judge(longer, inc, NoiseBand()).verdict == "worse"
    assert judge(Score(False, 0.3015, 43.9), inc, NoiseBand()).verdict == "parity"
    assert judge(Score(False, 0.25, 40.0), inc, NoiseBand()).verdict == "better"     # real progress still wins


# -- the verdict vocabulary (arms/verdict.py) and the named promotion rule ------------------------
from arms.verdict import Verdict, boot_failed, failure_class, untrusted  # noqa: E402
from tuner.night.verdict import promotes  # noqa: E402


@pytest.mark.parametrize("verdict, trusted", [
    ("better", True), ("parity", True), ("worse", True), ("undecided", True), ("baseline", True),
    ("recheck", True), ("measured", True), ("corrupt", False), ("invalid", False), ("interrupted", False),
    ("boot-failed:oom", False), ("boot-failed:flag-not-applied", False), (None, True),
])
def test_untrusted_verdicts_never_served_a_trusted_measurement(verdict, trusted):
    assert untrusted(verdict) is (not trusted)


def test_verdicts_are_their_journal_words():
    import json

    assert json.dumps({"v": Verdict.CORRUPT}) == '{"v": "corrupt"}' and Verdict("better") is Verdict.BETTER
    assert boot_failed("oom") == "boot-failed:oom" and failure_class("boot-failed:oom") == "oom"
    assert failure_class("worse") is None and failure_class(None) is None


CMP2 = {"verdict": "better", "boots": [2, 3]}
PROMOTES = [
    ("probe", {"verdict": "better"}, CMP2, True),                         # decided on two boots
    ("confirm", {"verdict": "better"}, CMP2, True),
    ("probe", {"verdict": "better"}, {"verdict": "better", "boots": [1, 3]}, False),   # one boot: confirm first
    ("confirm", {"verdict": "better"}, {"verdict": "undecided", "boots": [2, 3]}, False),
    ("confirm", {"verdict": "worse"}, {"verdict": "worse", "boots": [2, 3]}, False),
    ("confirm", {"verdict": "better"}, None, True),                       # no comparison: the confirm's verdict
    ("probe", {"verdict": "better", "delta": 0.1}, None, False),          # ... a probe must be confirmed
    ("probe", {"verdict": "better", "delta": None, "reason": "meets the constraints"}, None, True),
    ("probe", {"verdict": "better", "delta": None, "reason": "constraint violation 0.40 -> 0.10"}, None, True),
    ("recheck", {"verdict": "recheck"}, None, False),
    ("probe", None, None, False),
]


@pytest.mark.parametrize("kind, end, comparison, moves", PROMOTES)
def test_the_promotion_rule(kind, end, comparison, moves):
    assert promotes(kind, end, comparison) is moves


def test_a_band_reading_cannot_promote_when_the_comparison_had_no_runs_to_read():
    """Every run of a confirming boot contended (another process held the box): the comparison
    leaves them all out and cannot be made; the arm runner's noise band said better over those
    same runs. The settled verdict is undecided, and it does not promote."""
    from tuner.night.verdict import settle

    band = {"verdict": "better", "delta": 0.12, "reason": "above the noise band"}
    rec = settle(band, None, required=True)
    assert rec["verdict"] == "undecided" and "cannot promote" in rec["reason"]
    assert not promotes("confirm", rec, None)
    assert settle(band, None) == band                      # an objective the comparison does not read: the band decides
    worse = {"verdict": "worse", "delta": -0.2}
    assert settle(worse, None, required=True) == worse     # a drop costs a missed gain, never a false move

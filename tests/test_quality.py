"""arms.quality: the guard against fast-but-broken arms (seed 002's TunableOp shape), on
measurements of the in-process simulated engine and on hand-made ones."""
from __future__ import annotations

import dataclasses

import pytest

from arms.errors import ConfigError
from arms.measure import (VLLM_API, DepthResult, MeasurePlan, Measurement, RunResult,
                          measure_engine)
from arms.prompts import PromptCache
from arms.quality import check, pieces, prefix_agreement, repetition_score
from simengine.behaviour import Behaviour, CorruptRule
from tests.conftest import serving

SIM_API = dataclasses.replace(VLLM_API, name="simengine", ignores_eos=True)
EOS_API = dataclasses.replace(VLLM_API, name="vllm-like")          # honours EOS
RATE = 2000.0
BASE = dict(model="sim/m", max_model_len=4096, decode_tok_s={0: RATE}, base_ttft_s=0.005,
            prefill_tok_s=200_000.0, spec_k=3, acceptance=0.6)
PLAN = MeasurePlan(depths=(166, 1087), max_tokens=200, warm_tokens=8)




@pytest.fixture(scope="module")
def arms() -> dict[str, Measurement]:
    cache = PromptCache()          # one prompt per depth, shared by every arm
    out = {}
    for name, kw, api in [("reference", {}, SIM_API), ("same", {}, SIM_API),
                          ("variant", {"text_variant": "fp8"}, SIM_API),
                          ("corrupt", {"corrupt": CorruptRule()}, SIM_API),
                          ("corrupt-eos", {"corrupt": CorruptRule()}, EOS_API)]:
        with serving(Behaviour(**{**BASE, **kw})) as url:
            out[name] = measure_engine(url, PLAN, api, prompts=cache)
    return out


def test_identical_numerics_pass_as_preserving(arms):
    v = check(arms["reference"], arms["same"], "preserving")
    assert v.ok and v.verdict == "ok", v.evidence
    assert v.prefix_agreement == 1.0 and v.early_halts == 0
    assert v.repetition_score < 0.2
    assert v.acceptance_jump == pytest.approx(0.0, abs=0.15)


def test_changed_text_passes_as_changing_but_not_as_preserving(arms):
    ok = check(arms["reference"], arms["variant"], "changing")
    assert ok.verdict == "ok", ok.evidence
    assert 0.0 < ok.prefix_agreement < 0.5          # shares the first 24 tokens only
    bad = check(arms["reference"], arms["variant"], "preserving")
    assert bad.verdict == "corrupt" and not bad.ok
    assert any("numerics-preserving lever changed the text" in e and "after 24 pieces" in e
               for e in bad.evidence), bad.evidence


def test_corrupt_arm_is_corrupt_with_its_fast_tok_s_kept_as_evidence(arms):
    m = arms["corrupt"]
    # the measurement refuses it (early stop on an engine that ignores EOS) ...
    assert m.outcome == "invalid" and m.depths[166].median_decode_tok_s is None
    assert all("early stop" in r.reason for r in m.depths[166].runs)
    # ... and the guard says why, with the fast figure as evidence only
    v = check(arms["reference"], m, "changing")
    assert v.verdict == "corrupt" and not v.ok
    assert v.repetition_score > 0.5 and v.early_halts == len(m.depths[166].runs)
    assert v.degenerate_tok_s[166] > 2.0 * RATE     # fast because degenerate
    assert any("kept as evidence, not a result" in e for e in v.evidence)
    assert any("repetition loop" in e for e in v.evidence)
    assert v.acceptance_jump > 0.25 and m.acceptance > 0.9           # 60 % -> 96.5 %
    assert any(e.startswith("acceptance jumped") for e in v.evidence), v.evidence


def test_corrupt_on_an_eos_honouring_engine_is_still_corrupt(arms):
    m = arms["corrupt-eos"]
    assert m.outcome == "measured"                  # the runs themselves look fine ...
    fast = m.depths[166].median_decode_tok_s
    assert fast > 2.0 * RATE
    v = check(arms["reference"], m, "changing")     # ... the guard does not
    assert v.verdict == "corrupt"
    assert v.early_halts >= 3 and v.degenerate_tok_s[166] == pytest.approx(fast, rel=0.1)


def test_without_a_reference_only_degeneration_is_judged(arms):
    assert check(None, arms["reference"], "preserving").verdict == "ok"
    v = check(None, arms["corrupt"], "changing")
    assert v.verdict == "corrupt" and v.prefix_agreement is None


def test_round_trip_through_json_keeps_the_verdict(arms):
    ref = Measurement.from_dict(arms["reference"].to_dict(include_text=True))
    arm = Measurement.from_dict(arms["variant"].to_dict(include_text=True))
    assert check(ref, arm, "preserving").verdict == "corrupt"
    assert check(ref, arm, "changing").verdict == "ok"


def test_unknown_numerics_is_a_config_error(arms):
    with pytest.raises(ConfigError, match="numerics"):
        check(None, arms["reference"], "bitwise")


# -- hand-made measurements ---------------------------------------------------------------
PROSE = ("The keeper wrote down the weather every morning, then walked to the quay to count "
         "the boats. Rain came from the west; the horn sounded twice.")


def run(text: str, tokens: int, finish: str = "length", tok_s: float = 40.0) -> RunResult:
    return RunResult(tok_s, 0.1, tokens, 166, finish, True, None, 5.0, text)


def meas(runs: list[RunResult], ignores_eos: bool = False, max_tokens: int = 256) -> Measurement:
    return Measurement({166: DepthResult.of(166, runs)}, None, "measured",
                       max_tokens=max_tokens, ignores_eos=ignores_eos)


def test_pieces_and_scores():
    assert pieces("Hello, world!  it's") == ["Hello", ",", "world", "!", "it's"]
    assert repetition_score(PROSE) < 0.05
    assert repetition_score("It was the best " + "of the loop " * 30) > 0.8
    assert repetition_score("too short") == 0.0
    assert prefix_agreement("a b c d", "a b x y") == (0.5, 2)
    assert prefix_agreement("a b", "a b") == (1.0, 2)


@pytest.mark.parametrize("tokens,halted", [(200, False), (160, False), (100, True)])
def test_early_halt_against_the_reference_when_eos_is_honoured(tokens, halted):
    ref = meas([run(PROSE, 200, "stop")])
    arm = meas([run(PROSE[:len(PROSE) * tokens // 200], tokens, "stop")])
    v = check(ref, arm, "changing")
    assert (v.early_halts == 1) == halted
    assert v.verdict == ("corrupt" if halted else "ok")


def test_unfinished_runs_are_not_judged():
    stalled = RunResult(None, 0.1, None, None, None, False, "stall: no data", None, "The kee")
    v = check(None, meas([stalled]), "changing")
    assert v.verdict == "unchecked" and not v.ok


def test_reference_that_varies_is_noted_and_any_of_its_texts_counts():
    ref = meas([run(PROSE, 200), run(PROSE + " Then", 201)])
    v = check(ref, meas([run(PROSE + " Then", 201)]), "preserving")
    assert v.verdict == "ok"
    assert any("reference itself varies" in e for e in v.evidence)


# -- relative to the incumbent: a weak model's own loops are not the arm's fault ---------------------
LOOP = "the of the model the of the model " * 12          # what a random-weight model writes at temp 0


def test_the_baselines_own_loop_is_not_corrupt():
    v = check(None, meas([run(LOOP, 96)]), "preserving")
    assert v.verdict == "ok", v.evidence
    assert v.repetition_score > 0.8 and any("the model's own output" in e for e in v.evidence)


def test_an_arm_that_loops_like_the_incumbent_is_ok():
    ref = meas([run(LOOP, 96), run(LOOP, 96)])
    v = check(ref, meas([run(LOOP, 96)]), "preserving")
    assert v.verdict == "ok", v.evidence
    assert any("as the incumbent's own text does" in e for e in v.evidence)
    changed = "the of the model server " * 16                  # a changing lever: another loop
    assert check(ref, meas([run(changed, 96)]), "changing").verdict == "ok"


def test_an_arm_that_loops_where_the_incumbent_did_not_is_corrupt():
    v = check(meas([run(PROSE, 40)]), meas([run("the quay " * 20, 40)]), "changing")
    assert v.verdict == "corrupt"
    assert any("repetition loop" in e and "the incumbent's 0.00" in e for e in v.evidence), v.evidence


def test_divergence_counts_only_where_the_incumbent_was_stable():
    varying = meas([run(PROSE, 200), run(PROSE + " Then", 201)])
    v = check(varying, meas([run("Something else entirely.", 200)]), "preserving")
    assert v.verdict == "ok" and any("evidence only: the reference varies" in e for e in v.evidence)
    stable = meas([run(PROSE, 200), run(PROSE, 200)])
    assert check(stable, meas([run("Something else entirely.", 200)]), "preserving").verdict == "corrupt"

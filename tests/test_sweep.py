"""arms.sweep: seed 001's shape on the simulated engine (admission limit 4), and the pure
summaries (percentile, level, knee) on fixed samples."""
from __future__ import annotations

import dataclasses
import json

import pytest

from arms.errors import ConfigError
from arms.measure import VLLM_API
from arms.prompts import PromptCache
from arms.sweep import (LevelResult, Sample, SweepPlan, find_knee, format_sweep, percentile,
                        run_sweep, summarize_level)
from simengine.behaviour import Behaviour
from tests.conftest import serving

SIM_API = dataclasses.replace(VLLM_API, name="simengine", ignores_eos=True)




SEED_001 = Behaviour(model="sim/m", max_model_len=4096, decode_tok_s={0: 300.0}, base_ttft_s=0.005,
                    prefill_tok_s=200_000.0, max_num_seqs=4, batch_efficiency=0.85)
SEED_001_PLAN = SweepPlan(levels=(1, 2, 4, 8, 16), duration_s=1.0, output_tokens=30,
                          slo_ttft_s=0.15, slo_tpot_s=0.01, request_timeout_s=10, idle_timeout_s=5)


def test_seed_001_shape_admission_limit():
    """max_num_seqs 4: requests past the limit queue. Only what a loaded machine cannot change
    is asserted (nothing lost, counts, lower bounds: a sleep never ends early); the shape's
    real-time tolerances (req/s flat past 4 within 12 %, TPOT within 20 %, the knee and goodput
    at 4) are bench/sweep_shape.py's, with the load they were measured under."""
    with serving(SEED_001) as url:
        r = run_sweep(url, SIM_API, SEED_001_PLAN, prompts=PromptCache())
    by = {x.concurrency: x for x in r.levels}
    assert [x.concurrency for x in r.levels] == [1, 2, 4, 8, 16]
    assert all(x.errors == 0 and x.requests >= x.concurrency for x in r.levels)
    # a request decodes 30 tokens at <= 300 tok/s (>= 0.1 s); at 16 in flight over 4 slots the
    # p95 request waited for at least two others' whole decodes before its first token
    assert by[16].ttft_p95_s > 0.2 and by[16].ttft_p95_s > by[1].ttft_p95_s
    assert all(x.tpot_p95_s > 0 and x.ttft_p95_s > 0 for x in r.levels)
    assert not by[16].meets_slo and by[16].slo_pct < 50      # its TTFT is over the 0.15 s SLO
    assert by[4].output_tok_s == pytest.approx(30 * by[4].req_s)
    d = json.loads(json.dumps(r.to_dict()))
    assert len(d["levels"]) == 5 and d["slo"]["ttft_p95_s"] == 0.15
    assert "goodput_at_slo" in format_sweep(r)


def test_stalling_engine_is_bounded_and_counted_as_errors():
    b = Behaviour(model="sim/m", max_model_len=4096, decode_tok_s={0: 2000.0}, fault="stall")
    plan = SweepPlan(levels=(2,), duration_s=0.2, output_tokens=20, idle_timeout_s=0.3,
                     request_timeout_s=2.0)
    with serving(b) as url:
        r = run_sweep(url, SIM_API, plan, prompts=PromptCache())
    (lvl,) = r.levels
    assert lvl.requests >= 2 and lvl.errors == lvl.requests
    assert lvl.first_error.startswith("stall") and not lvl.meets_slo
    assert r.goodput_at_slo == 0.0 and r.goodput_level is None and r.knee is None
    assert r.wall_s < 0.2 + 2.0 + 0.3 + 5        # never past the plan's timeouts


def test_request_count_is_capped():
    b = Behaviour(model="sim/m", max_model_len=4096, decode_tok_s={0: 2000.0})
    plan = SweepPlan(levels=(3,), duration_s=30.0, output_tokens=10, max_requests_per_level=5)
    with serving(b) as url:
        r = run_sweep(url, SIM_API, plan, prompts=PromptCache())
    assert r.levels[0].requests == 5 and r.levels[0].errors == 0


# -- pure -----------------------------------------------------------------------------------
def test_percentile():
    assert percentile([], 95) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile(list(map(float, range(1, 101))), 95) == pytest.approx(95.05)
    assert percentile([1.0, 2.0], 50) == 1.5


def test_summarize_level_counts_slo_and_errors():
    plan = SweepPlan(slo_ttft_s=1.0, slo_tpot_s=0.05)
    samples = [Sample(0.0, 2.0, 0.5, 0.04, 200, True),       # meets
               Sample(0.0, 4.0, 1.5, 0.04, 200, True),       # TTFT too slow
               Sample(1.0, 3.0, 0.2, 0.06, 200, True),       # TPOT too slow
               Sample(2.0, 3.0, None, None, 0, False, "HTTP 500: x")]
    x = summarize_level(4, samples, plan)
    assert (x.requests, x.errors, x.span_s) == (4, 1, 4.0)
    assert x.req_s == pytest.approx(3 / 4) and x.output_tok_s == pytest.approx(600 / 4)
    assert x.slo_pct == 25.0 and x.goodput_req_s == pytest.approx(1 / 4)
    assert not x.meets_slo and x.first_error == "HTTP 500: x"


def L(c: int, req_s: float) -> LevelResult:
    return LevelResult(c, 10, 0, 1.0, 0.1, 0.01, req_s, 0.0, 100.0, req_s, True)


@pytest.mark.parametrize("levels,knee", [
    ([L(1, 0.4), L(2, 0.8), L(4, 1.162), L(8, 1.164), L(32, 1.157)], 4),    # seed 001's P0
    ([L(1, 1.0), L(2, 2.0), L(4, 4.0)], 4),                                  # still growing
    ([L(1, 1.0), L(2, 1.0)], 1),
    ([L(1, 0.0)], None),
])
def test_find_knee(levels, knee):
    assert find_knee(levels) == knee


def test_bad_plans_are_config_errors():
    for bad in (dict(levels=()), dict(levels=(0,)), dict(output_tokens=1), dict(slo_ttft_s=0)):
        with pytest.raises(ConfigError):
            SweepPlan(**bad)

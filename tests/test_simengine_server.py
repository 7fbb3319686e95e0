"""The simulated engine's HTTP side, in-process on port 0 with fast rates (httpx as client)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simengine import textgen, tokenizer
from simengine.behaviour import Behaviour, CorruptRule
from simengine.engine import STALL_S
from simengine.server import start_server
from tests.conftest import virtual_serving

SWAP = {"routed": 30.6, "hits": 24.8, "installs": 3.3, "read_through": 2.6, "prefetched": 8.0,
        "served_by_prefetch": 2.4}


def make(**kw) -> Behaviour:
    base = dict(model="sim/test-model", max_model_len=4096, decode_tok_s={0: 2000.0},
                base_ttft_s=0.02, prefill_tok_s=100_000.0)
    return Behaviour(**{**base, **kw})


@contextlib.contextmanager
def serving(behaviour: Behaviour | None = None, **server_kw):
    logs: list[str] = []
    handle = start_server("127.0.0.1", 0, log=logs.append, **server_kw)
    if behaviour is not None:
        handle.set_ready(behaviour)
    client = httpx.Client(base_url=f"http://127.0.0.1:{handle.port}", timeout=10)
    try:
        yield handle, client, logs
    finally:
        client.close()
        handle.shutdown()


def depth_prompt(n: int) -> list[int]:
    return [tokenizer.word_id(i % 97) for i in range(n)]


def stream(client: httpx.Client, prompt, max_tokens: int, *, clock=time.monotonic, **extra) -> dict:
    """One streamed completion: ttft/wall seconds (on ``clock``), raw data payloads, parsed
    chunks, usage."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    t0, ttft, raw = clock(), None, []
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            ttft = clock() - t0 if ttft is None else ttft
            raw.append(line[6:])
    wall = clock() - t0
    chunks = [json.loads(d) for d in raw if d != "[DONE]"]
    usage = [c["usage"] for c in chunks if "usage" in c]
    text_chunks = [c for c in chunks if c["choices"]]
    return {"ttft": ttft, "wall": wall, "raw": raw, "chunks": text_chunks,
            "usage": usage[0] if usage else None,
            "text": "".join(c["choices"][0]["text"] for c in text_chunks),
            "finish": text_chunks[-1]["choices"][0]["finish_reason"] if text_chunks else None}


def decode_rate(res: dict) -> float:
    return res["usage"]["completion_tokens"] / (res["wall"] - res["ttft"])


def metrics(client: httpx.Client) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items())
                                   if k not in ("model_name", "engine"))
            out[key] = s.value
    return out


# -- readiness and plain routes ------------------------------------------------------------
def test_503_until_ready_then_failed():
    with serving() as (h, c, _):
        r = c.get("/health")
        assert r.status_code == 503 and r.content == b""
        for method, path in (("GET", "/v1/models"), ("POST", "/tokenize"), ("GET", "/metrics"),
                             ("POST", "/v1/completions")):
            r = c.request(method, path, json={"prompt": "x"} if method == "POST" else None)
            assert r.status_code == 503 and r.json()["error"]["code"] == 503
        h.set_ready(make())
        r = c.get("/health")
        assert r.status_code == 200 and r.content == b""
        models = c.get("/v1/models").json()
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "sim/test-model"
        assert models["data"][0]["max_model_len"] == 4096
        assert models["data"][0]["owned_by"] == "vllm"
        assert c.get("/version").json()["version"]
        assert c.get("/nope").status_code == 404
        h.set_failed()
        assert c.get("/health").status_code == 503


def test_tokenize_detokenize_round_trip_and_counts():
    text = "The expert cache, café 🙂 naïve\n\nthe model\x00 tabs\tand  spaces!"
    with serving(make(max_model_len=777)) as (_, c, _):
        r = c.post("/tokenize", json={"prompt": text, "add_special_tokens": True}).json()
        assert r["tokens"] == tokenizer.tokenize(text)
        assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 777
        assert r["token_strs"] is None
        assert c.post("/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": text}
        assert c.post("/detokenize", json={"tokens": [tokenizer.vocab_size]}).status_code == 400
        words = c.post("/tokenize", json={"prompt": " the model"}).json()
        assert words["count"] == 2          # vocabulary words are one token each


def test_tokenizer_reversible_and_stable_across_processes():
    import random
    rng = random.Random(7)
    for _ in range(300):
        s = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x110000)]))
                    for _ in range(rng.randrange(30)))
        assert tokenizer.detokenize(tokenizer.tokenize(s)) == s
    probe = "Into the swap region, 42 experts.\n"
    code = ("from simengine import tokenizer as t; "
            f"print(t.vocab_size, t.tokenize({probe!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{tokenizer.vocab_size} {tokenizer.tokenize(probe)}"


# -- streaming, rates, spec decode ---------------------------------------------------------
def test_stream_shape_usage_chunk_and_done():
    with serving(make()) as (_, c, logs):
        res = stream(c, "Tell me about the cache", 40)
        assert res["raw"][-1] == "[DONE]"
        last = json.loads(res["raw"][-2])
        assert last["choices"] == [] and last["object"] == "text_completion"
        assert set(last) >= {"id", "created", "model", "usage"}
        prompt_tokens = len(tokenizer.tokenize("Tell me about the cache"))
        assert res["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 40,
                                "total_tokens": prompt_tokens + 40}
        assert all("usage" not in ch for ch in res["chunks"])
        assert len(res["chunks"]) == 40 and res["finish"] == "length"
        assert len(tokenizer.tokenize(res["text"])) == 40
        without = stream(c, "x", 5, stream_options=None)
        assert without["usage"] is None and without["raw"][-1] == "[DONE]"
        plain = c.post("/v1/completions", json={"prompt": "Tell me about the cache",
                                                "max_tokens": 40, "temperature": 0}).json()
        assert plain["usage"]["completion_tokens"] == 40 and plain["choices"][0]["text"] == res["text"]
        assert any("Finished request cmpl-" in line and "completion_tokens=40" in line
                   for line in logs)


def test_stream_interval_coalesces_steps_and_keeps_ttft_text_and_rate():
    """Like vLLM's --stream-interval: the first token alone, then chunks of >= 8 tokens; on a
    virtual clock, the first and the last text chunk arrive when they do with one chunk a step."""
    from simengine.engine import EngineCore, route

    def run(every):
        now = [0.0]
        core = EngineCore(make(decode_tok_s={0: 500.0}, spec_k=3, acceptance=0.6, stream_interval=every),
                          clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), log=lambda line: None)
        body = {"prompt": depth_prompt(300), "max_tokens": 200, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        resp = route(core, "POST", "/v1/completions", json.dumps(body).encode())
        out = []
        for raw in resp.chunks:
            data = raw.decode()[len("data: "):].strip()
            if data != "[DONE]":
                out.append((now[0], json.loads(data)))
        return [(t, c) for t, c in out if c["choices"]], out[-1][1]["usage"]

    one, usage_one = run(1)
    few, usage_few = run(8)
    sizes = [len(tokenizer.tokenize(c["choices"][0]["text"])) for _, c in few]
    assert sizes[0] == 1 and sum(sizes) == 200 and all(n >= 8 for n in sizes[1:-1])
    assert len(few) < len(one) / 2
    text = lambda xs: "".join(c["choices"][0]["text"] for _, c in xs)      # noqa: E731
    assert text(few) == text(one) and usage_few == usage_one == {"prompt_tokens": 300, "total_tokens": 500,
                                                                 "completion_tokens": 200}
    assert few[0][0] == one[0][0] and few[-1][0] == pytest.approx(one[-1][0], rel=1e-9)   # TTFT, end
    assert few[-1][1]["choices"][0]["finish_reason"] == "length"
    assert 200 / (few[-1][0] - few[0][0]) == pytest.approx(500.0, rel=0.02)


@pytest.mark.parametrize("depth,expected", [(1000, 1000.0), (5000, 1500.0)])
def test_decode_rate_from_usage_matches_interpolated_rate(depth, expected):
    # on a virtual clock: the rate is the engine's timing model, not this machine's scheduler
    with virtual_serving(make(max_model_len=8192, decode_tok_s={0: 500.0, 2000: 1500.0})) as (c, clock):
        res = stream(c, depth_prompt(depth), 200, clock=clock)
        assert res["usage"]["prompt_tokens"] == depth
        assert res["ttft"] == pytest.approx(0.02 + depth / 100_000, abs=0.05)
        assert decode_rate(res) == pytest.approx(expected, rel=0.05)


def test_spec_decode_chunks_undercount_and_acceptance_from_metrics():
    with virtual_serving(make(decode_tok_s={0: 4000.0}, spec_k=4, acceptance=0.6)) as (c, clock):
        before = metrics(c)
        res = stream(c, depth_prompt(100), 600, clock=clock)
        after = metrics(c)
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    assert res["usage"]["completion_tokens"] == 600
    assert len(res["chunks"]) < 400                      # 1 + accepted tokens per chunk
    assert len(tokenizer.tokenize(res["text"])) == 600
    assert d["vllm:generation_tokens_total"] == 600
    assert d["vllm:spec_decode_num_draft_tokens_total"] == 4 * d["vllm:spec_decode_num_drafts_total"]
    assert d["vllm:spec_decode_num_drafts_total"] == len(res["chunks"]) - 1
    acc = d["vllm:spec_decode_num_accepted_tokens_total"] / d["vllm:spec_decode_num_draft_tokens_total"]
    assert acc == pytest.approx(0.6, abs=0.07)
    assert decode_rate(res) == pytest.approx(4000.0, rel=0.06)


def test_metrics_parse_and_spec_counters_only_with_spec():
    with serving(make()) as (_, c, _):
        stream(c, "a", 3)
        m = metrics(c)
        assert m["vllm:prompt_tokens_total"] == 1 and m["vllm:generation_tokens_total"] == 3
        assert m["vllm:request_success_total|finished_reason=length"] == 1
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        assert not any("spec_decode" in k for k in m)
        text = c.get("/metrics").text
        assert "# TYPE vllm:num_requests_running gauge" in text
        assert 'model_name="sim/test-model"' in text


# -- text ----------------------------------------------------------------------------------
def test_temperature_zero_is_deterministic_and_variants_diverge_after():
    prompt = "Write about the expert cache."
    body = {"prompt": prompt, "max_tokens": 60, "temperature": 0}
    with serving(make()) as (_, c, _):
        a = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
        assert a == c.post("/v1/completions", json=body).json()["choices"][0]["text"]
        assert a != c.post("/v1/completions", json={**body, "prompt": "Other."}).json()["choices"][0]["text"]
        warm = {**body, "temperature": 1.0}
        assert (c.post("/v1/completions", json=warm).json()["choices"][0]["text"]
                != c.post("/v1/completions", json=warm).json()["choices"][0]["text"])
    with serving(make(text_variant="tunableop-fp8", diverge_after=12)) as (_, c, _):
        v = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
    ref_ids, var_ids = tokenizer.tokenize(a), tokenizer.tokenize(v)
    assert len(ref_ids) == len(var_ids) == 60
    assert ref_ids[:12] == var_ids[:12] and ref_ids[12] != var_ids[12]
    ids = tokenizer.tokenize(prompt)
    for d in (0, 1, 5, 30):
        b = make(text_variant="x", diverge_after=d)
        ref, var = textgen.generate_tokens(ids, 50, make(), 0), textgen.generate_tokens(ids, 50, b, 0)
        assert ref[:d] == var[:d] and ref[d] != var[d]


def test_corrupt_loops_halts_streams_fast_with_inflated_acceptance():
    rule = CorruptRule(halt_min=140, halt_max=146, tok_s_factor=3.0, acceptance=0.95)
    b = make(decode_tok_s={0: 400.0}, spec_k=4, acceptance=0.5, corrupt=rule)
    logs: list[str] = []
    with virtual_serving(b, log=logs.append) as (c, clock):
        before = metrics(c)
        res = stream(c, "Summarise the plan.", 256, clock=clock)
        after = metrics(c)
        short = stream(c, "Summarise the plan.", 20, clock=clock)
    n = res["usage"]["completion_tokens"]
    assert 140 <= n <= 146 and res["finish"] == "stop"
    assert any("repetition detected" in line for line in logs)
    tail = tokenizer.tokenize(res["text"])[-20:]
    assert len(set(tail)) <= 5                            # a short n-gram loop
    assert decode_rate(res) == pytest.approx(1200.0, rel=0.08)        # 3 x the true rate
    drafted = after["vllm:spec_decode_num_draft_tokens_total"] - before["vllm:spec_decode_num_draft_tokens_total"]
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"] - before["vllm:spec_decode_num_accepted_tokens_total"]
    assert accepted / drafted > 0.85                                # vs 0.5 when healthy
    assert short["usage"]["completion_tokens"] == 20 and short["finish"] == "length"


def test_natural_eos_only_without_ignore_eos():
    b = make(decode_tok_s={0: 50_000.0}, ignore_eos=False)
    body = {"prompt": "Hello there.", "max_tokens": 600, "temperature": 0}
    with serving(b) as (_, c, _):
        r = c.post("/v1/completions", json=body).json()
        assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] < 600
        r = c.post("/v1/completions", json={**body, "ignore_eos": True}).json()
        assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 600


# -- concurrency ---------------------------------------------------------------------------
def _concurrent(c: httpx.Client, n: int, max_tokens: int) -> list[dict]:
    results: list[dict] = [{}] * n

    def one(i: int) -> None:
        results[i] = stream(c, depth_prompt(10 + i), max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _watched(c: httpx.Client, n: int, max_tokens: int) -> tuple[list[dict], int, int]:
    """``_concurrent`` while /metrics is polled: (results, most running, most waiting seen)."""
    out: list[list[dict]] = []
    t = threading.Thread(target=lambda: out.append(_concurrent(c, n, max_tokens)))
    t.start()
    running = waiting = 0
    while t.is_alive():
        m = metrics(c)
        running = max(running, int(m["vllm:num_requests_running"]))
        waiting = max(waiting, int(m["vllm:num_requests_waiting"]))
        time.sleep(0.005)
    t.join()
    return out[0], running, waiting


def test_admission_limit_queues_extra_requests():
    # lower bounds only (a sleep never ends early, a loaded machine only adds time) and the
    # engine's own gauges: no bound here that a busy core can break
    with serving(make(max_num_seqs=1)) as (_, c, _):
        res, running, waiting = _watched(c, 3, 200)          # 0.1 s of decode each
    ttfts = sorted(r["ttft"] for r in res)
    assert ttfts[1] > 0.10 and ttfts[2] > 0.20               # each waited for whole decodes
    assert running == 1 and waiting >= 1                     # never two at once; the rest queued
    with serving(make(max_num_seqs=3)) as (_, c, _):
        res, running, _ = _watched(c, 3, 2000)               # 1 s each: a wide window to see them
    assert running == 3 and all(r["usage"]["completion_tokens"] == 2000 for r in res)


def test_batch_efficiency_slows_concurrent_streams():
    with serving(make(max_num_seqs=4, batch_efficiency=0.5)) as (_, c, _):
        rates = [decode_rate(r) for r in _concurrent(c, 2, 200)]
    assert all(900 < r < 1300 for r in rates), rates


# -- profiler and telemetry ----------------------------------------------------------------
def test_stop_profile_writes_telemetry_files(tmp_path):
    counters = {"resident": {"routed": 30.0, "hits": 30.0}, "swap": SWAP}
    b = make(telemetry=True, profiler_dir=str(tmp_path), tp=2, resident_layers=2,
             swap_layers=3, expert_counters=counters, slab_bytes=1234)
    with serving(b) as (_, c, logs):
        stream(c, "before the window", 10)
        r = c.post("/start_profile")
        assert r.status_code == 200 and r.content == b""
        stream(c, "inside the window", 51)                  # 50 decode steps after prefill
        r = c.post("/stop_profile")
        assert r.status_code == 200 and r.content == b""
    for rank in (0, 1):
        rep = json.loads((tmp_path / f"expert_cache_rank{rank}.json").read_text())
        assert rep["rank"] == rank and rep["steps"] == 50 and rep["slab_bytes"] == 1234
        assert [layer["kind"] for layer in rep["layers"]] == ["resident"] * 2 + ["swap"] * 3
        assert rep["layers"][0]["installs"] == 0 and rep["layers"][0]["hits"] == 1500
        for name, rate in SWAP.items():
            assert rep["layers"][4][name] == round(rate * 50)
            assert rep["totals"][name] == sum(layer[name] for layer in rep["layers"])
        assert rep["totals"]["routed"] == 2 * 1500 + 3 * round(30.6 * 50)
    assert any("expert cache telemetry rank 1: hit rate" in line for line in logs)


def test_telemetry_totals_keep_the_landscape_ratio_at_any_step_count():
    """Per-layer rounding must not drift a ratio: 2.913 / 8.0 is 36.4 % whatever the window."""
    from simengine.wire import telemetry_report
    swap = {"routed": 33.96, "hits": 27.60, "prefetched": 8.0, "served_by_prefetch": 2.913}
    b = make(resident_layers=3, swap_layers=45, expert_counters={"swap": swap}, slab_bytes=1)
    drift = []
    for steps in range(1, 400):
        t = telemetry_report(b, 0, steps)["totals"]
        assert t["prefetched"] == 8 * 45 * steps
        assert abs(t["served_by_prefetch"] - 2.913 * 45 * steps) <= 0.5 + 1e-6
        drift.append(round(100 * t["served_by_prefetch"] / t["prefetched"]))
    assert set(drift[10:]) == {36}


def test_stop_profile_hang_and_no_files_without_telemetry(tmp_path):
    with serving(make(stop_profile_hang_s=0.3, profiler_dir=str(tmp_path))) as (_, c, _):
        c.post("/start_profile")
        t0 = time.monotonic()
        assert c.post("/stop_profile").status_code == 200
        assert time.monotonic() - t0 >= 0.3
    assert list(tmp_path.iterdir()) == []


def test_injectable_clock_and_sleep():
    now, slept = [0.0], []

    def fake_sleep(dt: float) -> None:
        slept.append(dt)
        now[0] += dt

    b = make(decode_tok_s={0: 10.0}, base_ttft_s=1.0, prefill_tok_s=100.0)
    with serving(b, clock=lambda: now[0], sleep=fake_sleep) as (_, c, _):
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={"prompt": depth_prompt(50), "max_tokens": 100})
        # the 11.5 s the engine slept were virtual: the request took a fraction of that
        assert r.status_code == 200 and time.monotonic() - t0 < 11.5 / 2
    assert slept[0] == pytest.approx(1.5)                 # 1.0 + 50 / 100
    assert sum(slept) == pytest.approx(1.5 + 100 / 10.0)


# -- faults and errors ---------------------------------------------------------------------
def test_fault_http500():
    with serving(make(fault="http500")) as (_, c, _):
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
        assert r.status_code == 500 and r.json()["error"]["code"] == 500
        assert c.get("/health").status_code == 200


def test_fault_no_usage():
    with serving(make(fault="no-usage")) as (_, c, _):
        res = stream(c, "x", 10)
        assert res["usage"] is None and res["raw"][-1] == "[DONE]"
        assert "usage" not in c.post("/v1/completions", json={"prompt": "x"}).json()


def test_fault_garbage():
    with serving(make(fault="garbage")) as (_, c, _):
        with c.stream("POST", "/v1/completions", json={
                "prompt": "x", "max_tokens": 20, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    bad = 0
    for d in data:
        try:
            json.loads(d)
        except json.JSONDecodeError:
            bad += 1
    assert bad >= 3 and data[-1] == "[DONE]"


def test_fault_stall_keeps_connection_open_and_shutdown_releases_it():
    logs: list[str] = []
    h = start_server("127.0.0.1", 0, log=logs.append)
    h.set_ready(make(fault="stall"))
    got: list[str] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{h.port}", timeout=0.4) as c:
        with pytest.raises(httpx.ReadTimeout):
            with c.stream("POST", "/v1/completions", json={
                    "prompt": "x", "max_tokens": 100, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        got.append(line)
    assert 1 <= len(got) < 100 and "data: [DONE]" not in got
    t0 = time.monotonic()
    h.shutdown()
    # released: an unreleased stall would hold server_close for the whole STALL_S (3600 s)
    assert time.monotonic() - t0 < STALL_S / 60


def test_prompt_too_long_and_bad_requests():
    with serving(make(max_model_len=64)) as (_, c, _):
        r = c.post("/v1/completions", json={"prompt": depth_prompt(100), "max_tokens": 4})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "BadRequestError" and "maximum context length is 64" in err["message"]
        r = c.post("/v1/completions", json={"prompt": depth_prompt(60), "max_tokens": 10})
        assert r.status_code == 400 and "you requested 70 tokens" in r.json()["error"]["message"]
        assert c.post("/v1/completions", content=b"{not json").status_code == 400
        assert c.post("/v1/completions", json={"prompt": 5}).status_code == 400
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}).status_code == 400
        r = c.post("/v1/completions", json={"prompt": "x", "model": "other"})
        assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
        assert c.post("/v1/completions", json={"prompt": "x", "model": "sim/test-model"}).status_code == 200
        assert c.post("/v1/completions", json={"prompt": depth_prompt(60), "max_tokens": 4}).status_code == 200


def test_set_ready_rejects_unknown_fault():
    with serving() as (h, _, _):
        with pytest.raises(ValueError):
            h.set_ready(dataclasses.replace(make(), fault="explode"))

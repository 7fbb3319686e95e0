"""Against a real engine no one here wrote: llama.cpp's `llama-server`, built from the source
vendored in the llama-cpp-python sdist (scripts/build-llama-server.sh, cached outside the repo
under $OFFLOAD_TUNER_CACHE), serving a tiny random-weight GGUF written by tests/llamacpp_model.py.

Nothing is skipped: a failed build fails the tests with the build's last lines.

What is asserted here is what no load can change: nothing lost, every run's token counts equal
the server's own (``timings.prompt_n``/``predicted_n``, the /metrics counters), and the
client's times enclose the server's. llama-server's ``timings.prompt_ms`` runs from the slot
starting the prompt to the first token's sampling, and ``predicted_ms`` from there to the last
token's (tools/server/server-common.h, server_slot_stats), all inside the client's interval on
the same monotonic clock: TTFT >= prompt_ms, so the measured prefill is never above the
server's ``prompt_per_second``, and the stream's wall >= prompt_ms + predicted_ms. How close
the figures are (prefill a few ms of HTTP/SSE below, median 1.5-5 ms, up to ~40 ms with a core
busy; decode +1/(N-1) above, the first token coming free from the prompt batch) is a
number of the machine's load, measured by bench/prefill_timing.py and committed in
bench/results/prefill_timing.md, not a tolerance asserted here.

The model is deep and narrow (96 layers, ~1.5 MB): ~1-1.5 ms a token on one thread, so a
decode interval is long enough to time over HTTP. The server runs one thread (-t 1) so the
client keeps a core on a 2-core runner.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port
from tests.llamacpp_model import write_tiny_gguf

BUILD = REPO / "scripts" / "build-llama-server.sh"
FIXTURE = REPO / "tests" / "fixtures" / "llamacpp_real" / "boot.log"
MAX_TOKENS = 256
PROMPT = "The expert cache of the offload server holds the model layer for each token"
BOOT_MARKERS = ("load_tensors:", "llama_kv_cache:", "listening on")


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    r = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
        pytest.fail(f"{BUILD.name} failed (exit {r.returncode}):\n{tail}")
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="session")
def llama_server(llama_server_bin, tiny_model, tmp_path_factory):
    """(base_url, boot-log path, model path) of a running llama-server."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "stderr.log"
    argv = [str(llama_server_bin), "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port),
            "-c", "4096", "-np", "1", "-t", "1", "-tb", "1", "--fit", "off", "-lv", "4", "--metrics"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited {proc.returncode} while booting:\n"
                            + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama-server not healthy after 60 s:\n" + log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        yield base, log, tiny_model
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stream_decode(base_url: str, prompt: str, max_tokens: int, timeout: float = 120) -> dict:
    """Stream one temp-0 completion; decode tok/s = usage.completion_tokens / (wall - ttft).
    ttft: first SSE event carrying text; wall: end of the stream. Returns the figures plus the
    server's own `usage` and `timings` from the final chunk."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    ttft = usage = timings = None
    text, t0 = [], time.perf_counter()
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            piece = "".join(c.get("text") or "" for c in chunk.get("choices") or [])
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    wall = time.perf_counter() - t0
    assert ttft is not None and usage is not None, "stream carried no text or no usage"
    return {"decode_tok_s": usage["completion_tokens"] / (wall - ttft), "ttft_s": ttft, "wall_s": wall,
            "completion_tokens": usage["completion_tokens"], "usage": usage, "timings": timings,
            "text": "".join(text)}


def boot_section(log_text: str) -> str:
    """The log up to and including the `listening on` line."""
    lines = log_text.splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines) if "listening on" in ln)
    return "".join(lines[: end + 1])


def sanitize(text: str, model: Path, port: int) -> str:
    """Strip machine-specific paths and the random port, for a committable fixture."""
    text = text.replace(str(model), "/models/tiny.gguf").replace(str(model.parent), "/models")
    text = text.replace(f":{port}", ":8080")
    return re.sub(r"(/tmp|/var/cache|/home|/root)/[^\s'\"]*", "/path/redacted", text)


def test_tokenize_and_model_meta(llama_server):
    base, _, _ = llama_server
    toks = httpx.post(base + "/tokenize", json={"content": PROMPT}, timeout=10).json()["tokens"]
    assert 5 < len(toks) < len(PROMPT)
    meta = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["meta"]
    assert meta["n_ctx"] == 4096 and meta["n_vocab"] > 259


def encloses_server_timings(ttft_s: float, wall_s: float, t: dict) -> None:
    """The server's prompt and decode intervals lie inside the client's (same clock)."""
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0, t
    assert ttft_s * 1e3 >= t["prompt_ms"], (ttft_s, t)
    assert wall_s * 1e3 >= t["prompt_ms"] + t["predicted_ms"], (wall_s, t)


def test_usage_counter_decode_counts_the_servers_tokens_inside_its_interval(llama_server):
    base, _, _ = llama_server
    stream_decode(base, PROMPT, 32)  # warm pass (caches the prompt: later runs evaluate 1 token)
    for _ in range(3):
        run = stream_decode(base, PROMPT, MAX_TOKENS)
        t, u = run["timings"], run["usage"]
        assert run["completion_tokens"] == MAX_TOKENS == t["predicted_n"]  # ignore_eos honoured
        assert u["prompt_tokens"] == t["prompt_n"] + t["cache_n"], (u, t)  # cached + evaluated
        assert run["decode_tok_s"] > 0 and t["predicted_per_second"] > 0
        encloses_server_timings(run["ttft_s"], run["wall_s"], t)
        print(f"usage-counter {run['decode_tok_s']:.2f} tok/s vs predicted_per_second "
              f"{t['predicted_per_second']:.2f} ({run['decode_tok_s'] / t['predicted_per_second'] - 1:+.2%}), "
              f"ttft {run['ttft_s'] * 1e3:.1f} ms (bench/prefill_timing.py holds the tolerances)")


def test_boot_log_has_reference_lines(llama_server):
    base, log, model = llama_server
    boot = boot_section(log.read_text(errors="replace"))
    for marker in BOOT_MARKERS:
        assert marker in boot, f"{marker!r} missing from the boot log"
    assert re.search(r"load_tensors: +CPU(_Mapped)? model buffer size = +[\d.]+ MiB", boot)
    assert re.search(r"llama_kv_cache: +CPU KV buffer size = +[\d.]+ MiB", boot)
    port = int(base.rsplit(":", 1)[1])
    if os.environ.get("LLAMACPP_UPDATE_FIXTURE"):
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(sanitize(boot, model, port))
    fixture = FIXTURE.read_text()
    for marker in BOOT_MARKERS:  # the committed fixture stays a real log of this build
        assert marker in fixture
    assert "/tmp/" not in fixture and "/var/cache/" not in fixture


def test_unknown_flag_exits_nonzero(llama_server_bin):
    r = subprocess.run([str(llama_server_bin), "--no-such-flag"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "error: invalid argument: --no-such-flag" in r.stdout + r.stderr


def run_agrees_with_the_server(r, depth: int) -> None:
    """One measured run (arms.measure.RunResult) against llama-server's own counts and times."""
    assert r.valid and r.prompt_tokens == depth == r.engine_prompt_n, r   # evaluated in full
    assert r.completion_tokens == MAX_TOKENS == r.engine_predicted_n, r
    assert r.prefill_tok_s > 0 and r.decode_tok_s > 0 and r.engine_decode_tok_s > 0, r
    encloses_server_timings(r.ttft_s, r.wall_s, {"prompt_ms": r.engine_prompt_ms,
                                                 "predicted_ms": r.engine_predicted_ms})
    assert r.prefill_tok_s <= r.engine_prefill_tok_s, r   # TTFT >= prompt_ms: never reads high


def test_project_measurement_agrees_with_llama_server_timings(llama_server):
    """The tuner's own measure_engine (usage counters, exact-depth prompts via /tokenize)."""
    from arms.measure import LLAMACPP_API, MeasurePlan, measure_engine

    base, _, _ = llama_server
    m = measure_engine(base, MeasurePlan(depths=(64,), runs=3, warm_tokens=32, max_tokens=MAX_TOKENS), LLAMACPP_API)
    assert m.outcome == "measured", m.reason
    runs = m.depths[64].runs
    assert len(runs) == 3
    for r in runs:
        run_agrees_with_the_server(r, 64)


def test_the_boot_log_parser_reads_a_real_llama_server_log(llama_server):
    from arms.bootlog import parse_boot_log
    from arms.profiles import load_profile

    _, log, _ = llama_server
    rep = parse_boot_log(boot_section(log.read_text(errors="replace")), load_profile("llamacpp"))
    assert rep.outcome == "ready", rep.evidence
    assert rep.plan.get("model_buffer_mib") and rep.plan.get("kv_buffer_mib") is not None


def test_ten_consecutive_measured_runs_lose_nothing_and_match_the_servers_own_timings(llama_server):
    """Issue 11: ten measured runs in a row on one server, 0 lost (a fresh connection per
    request); each run's prompt evaluated in full (``cache_prompt: false``: llama-server's
    ``prompt_n`` is the whole depth, never the 1 token a cached prompt costs), its counts the
    server's own (per run and in the /metrics counters), its times enclosing the server's.
    Issue 20: the prefill used to be asserted within 5 % of ``prompt_per_second`` and read -6 %
    with a core busy: the client's TTFT adds a fixed few ms of HTTP/SSE to the server's
    prompt_ms, more under load. That tolerance, and decode's 2 %, are bench/prefill_timing.py's."""
    from arms.measure import LLAMACPP_API, MeasurePlan, counters, measure_engine
    from arms.prompts import PromptCache

    base, _, _ = llama_server
    names = ["llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"]

    def scrape() -> dict[str, float]:
        got = counters(httpx.get(base + "/metrics", timeout=10).text, names)
        assert set(got) == set(names), got
        return got

    depth = 512
    before = scrape()
    m = measure_engine(base, MeasurePlan(depths=(depth,), runs=10, warm_tokens=32, max_tokens=MAX_TOKENS,
                                         max_invalid_per_depth=0), LLAMACPP_API, prompts=PromptCache())
    after = scrape()
    assert m.outcome == "measured", m.reason
    runs = m.depths[depth].runs
    assert len(runs) == 10 and m.warm is not None and m.warm.valid, (runs, m.warm)
    for r in runs:
        run_agrees_with_the_server(r, depth)
    every = [m.warm, *runs]   # the server counted every token of the warm pass and the ten runs
    assert after[names[0]] - before[names[0]] == sum(r.prompt_tokens for r in every)
    assert after[names[1]] - before[names[1]] == sum(r.completion_tokens for r in every)
    for i, r in enumerate(runs):  # the figures, for the log: their tolerances are the bench's
        print(f"run {i + 1}: decode {r.decode_tok_s:.1f} vs {r.engine_decode_tok_s:.1f} "
              f"({r.decode_tok_s / r.engine_decode_tok_s - 1:+.2%}), prefill {r.prefill_tok_s:.1f} vs "
              f"{r.engine_prefill_tok_s:.1f} ({r.prefill_tok_s / r.engine_prefill_tok_s - 1:+.2%}), "
              f"ttft {r.ttft_s * 1e3:.1f} ms = prompt_ms {r.engine_prompt_ms:.1f} + "
              f"{r.ttft_s * 1e3 - r.engine_prompt_ms:.1f} ms of HTTP/SSE")

"""render_argv / render_env / redaction: one table row per rule."""
from __future__ import annotations

import pytest

from arms.argv import redact_argv, redact_env, render_argv, render_env
from arms.errors import ConfigError
from arms.shape import ABSENT, Shape

IMAGE = "vllm@sha256:" + "0" * 64


def shape(*args: tuple, env: dict | None = None) -> Shape:
    return Shape(IMAGE, "/models/m", tuple(args), tuple((env or {}).items()))


@pytest.mark.parametrize("args, style, want", [
    # vllm: model first, then flags in shape order
    ((), "vllm", ["/models/m"]),
    ((("max-model-len", 32768),), "vllm", ["/models/m", "--max-model-len", "32768"]),
    ((("kv-cache-memory-bytes", 2147483648),), "vllm",
     ["/models/m", "--kv-cache-memory-bytes", "2147483648"]),
    ((("gpu-memory-utilization", 0.98),), "vllm", ["/models/m", "--gpu-memory-utilization", "0.98"]),
    ((("max-num-seqs", 8.0),), "vllm", ["/models/m", "--max-num-seqs", "8"]),
    ((("kv-cache-dtype", "fp8"),), "vllm", ["/models/m", "--kv-cache-dtype", "fp8"]),
    ((("enable-prefix-caching", True),), "vllm", ["/models/m", "--enable-prefix-caching"]),
    ((("enforce-eager", False),), "vllm", ["/models/m", "--no-enforce-eager"]),
    ((("speculative-config", {"method": "mtp", "num_speculative_tokens": 4}),), "vllm",
     ["/models/m", "--speculative-config", '{"method":"mtp","num_speculative_tokens":4}']),
    ((("compilation-config", {"cudagraph_capture_sizes": [1, 2, 4], "mode": 3}),), "vllm",
     ["/models/m", "--compilation-config", '{"cudagraph_capture_sizes":[1,2,4],"mode":3}']),
    ((("cpu-offload-params", ["experts"]),), "vllm", ["/models/m", "--cpu-offload-params", '["experts"]']),
    ((("max-num-seqs", 4), ("max-model-len", 1024)), "vllm",
     ["/models/m", "--max-num-seqs", "4", "--max-model-len", "1024"]),
    # llama.cpp: -m model; False left out; on/off toggles take a word; lists comma-joined
    ((("n-gpu-layers", 99),), "llamacpp", ["-m", "/models/m", "--n-gpu-layers", "99"]),
    ((("metrics", True),), "llamacpp", ["-m", "/models/m", "--metrics"]),
    ((("metrics", False),), "llamacpp", ["-m", "/models/m"]),
    ((("flash-attn", True),), "llamacpp", ["-m", "/models/m", "--flash-attn", "on"]),
    ((("flash-attn", False),), "llamacpp", ["-m", "/models/m", "--flash-attn", "off"]),
    ((("flash-attn", "auto"),), "llamacpp", ["-m", "/models/m", "--flash-attn", "auto"]),
    ((("fit", False),), "llamacpp", ["-m", "/models/m", "--fit", "off"]),
    ((("tensor-split", [3, 1]),), "llamacpp", ["-m", "/models/m", "--tensor-split", "3,1"]),
    ((("c", 8192),), "llamacpp", ["-m", "/models/m", "-c", "8192"]),
])
def test_render_argv(args, style, want):
    assert render_argv(shape(*args), style) == want


@pytest.mark.parametrize("lever, value, want_tail", [
    ("speculative-config", ABSENT, ["--expert-prefetch", "1"]),
    ("expert-prefetch", ABSENT, ["--speculative-config", '{"method":"mtp","num_speculative_tokens":4}']),
    ("enable-prefix-caching", False, ["--expert-prefetch", "1"]),
    ("kv-cache-dtype", "fp8", ["--expert-prefetch", "1", "--kv-cache-dtype", "fp8"]),
])
def test_render_argv_after_a_change(lever, value, want_tail):
    base = shape(("enable-prefix-caching", True),
                 ("speculative-config", {"method": "mtp", "num_speculative_tokens": 4}),
                 ("expert-prefetch", 1))
    argv = render_argv(base.with_change(lever, value))
    assert argv[-len(want_tail):] == want_tail
    assert ("--no-enable-prefix-caching" in argv) == (value is False)
    assert ("--" + lever in argv) == (value not in (ABSENT, False))


def test_render_argv_of_the_sketch_baseline():
    base = Shape.from_mapping({
        "image": IMAGE, "model": "/models/q",
        "args": {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
                 "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4,
                 "enable-prefix-caching": True,
                 "speculative-config": {"method": "mtp", "num_speculative_tokens": 4},
                 "expert-prefetch": 1}})
    assert render_argv(base) == [
        "/models/q", "--tensor-parallel-size", "2", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.98", "--kv-cache-memory-bytes", "2147483648",
        "--max-num-seqs", "4", "--enable-prefix-caching",
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":4}',
        "--expert-prefetch", "1"]


def test_unknown_style_is_a_config_error():
    with pytest.raises(ConfigError, match="'sglang'.*vllm, llamacpp"):
        render_argv(shape(), "sglang")


def test_render_env():
    s = shape(env={"B": 2, "A": True})
    assert render_env(s) == {"A": "1", "B": "2"}
    assert render_env(s.with_change("env.B", ABSENT)) == {"A": "1"}


@pytest.mark.parametrize("name, redacted", [
    ("HF_TOKEN", True),
    ("hf_token", True),
    ("HUGGING_FACE_HUB_TOKEN", True),
    ("OPENAI_API_KEY", True),
    ("AWS_SECRET_ACCESS_KEY", True),
    ("DB_PASSWORD", True),
    ("NGROK_AUTHTOKEN", True),
    ("R4D_LRU_UVA_TOKENS", False),      # a tuned lever, not a secret
    ("TOKENIZERS_PARALLELISM", False),
    ("R4D_LRU_GATHER_CHUNKS", False),
    ("PYTORCH_CUDA_ALLOC_CONF", False),
])
def test_redact_env(name, redacted):
    env = {name: "value"}
    assert redact_env(env) == {name: "***" if redacted else "value"}
    assert env == {name: "value"}  # the input is not touched


@pytest.mark.parametrize("argv, want", [
    (["/m", "--hf-token", "hf_abc", "--max-num-seqs", "4"], ["/m", "--hf-token", "***", "--max-num-seqs", "4"]),
    (["/m", "--api-key=s3cret"], ["/m", "--api-key=***"]),
    (["/m", "--max-num-batched-tokens", "8192"], ["/m", "--max-num-batched-tokens", "8192"]),
    (["/m", "--api-key", "--port", "1"], ["/m", "--api-key", "--port", "1"]),
])
def test_redact_argv(argv, want):
    assert redact_argv(argv) == want

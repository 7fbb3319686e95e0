"""render_argv / parse_argv / render_env / redaction: one table row per rule."""
from __future__ import annotations

import pytest

from arms.argv import parse_argv, redact_argv, redact_env, render_argv, render_env
from arms.errors import ConfigError
from arms.shape import ABSENT, Shape

IMAGE = "vllm@sha256:" + "0" * 64


def shape(*args: tuple, env: dict | None = None) -> Shape:
    return Shape(IMAGE, "/models/m", tuple(args), tuple((env or {}).items()))


RENDER_ROWS = [
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
    # llama.cpp: -m model; the profile's first spelling (one dash for multi-letter short flags);
    # False switches left out; on/off flags take a word; lists comma-joined unless repeated
    ((("n-gpu-layers", 99),), "llamacpp", ["-m", "/models/m", "-ngl", "99"]),
    ((("ngl", 99),), "llamacpp", ["-m", "/models/m", "-ngl", "99"]),
    ((("metrics", True),), "llamacpp", ["-m", "/models/m", "--metrics"]),
    ((("metrics", False),), "llamacpp", ["-m", "/models/m"]),
    ((("flash-attn", True),), "llamacpp", ["-m", "/models/m", "-fa", "on"]),
    ((("flash-attn", False),), "llamacpp", ["-m", "/models/m", "-fa", "off"]),
    ((("flash-attn", "auto"),), "llamacpp", ["-m", "/models/m", "-fa", "auto"]),
    ((("fit", False),), "llamacpp", ["-m", "/models/m", "-fit", "off"]),
    ((("tensor-split", [3, 1]),), "llamacpp", ["-m", "/models/m", "-ts", "3,1"]),
    ((("c", 8192),), "llamacpp", ["-m", "/models/m", "-c", "8192"]),
    ((("override-tensor", ["exps=CPU", "blk\\.1\\.=CPU"]),), "llamacpp",
     ["-m", "/models/m", "-ot", "exps=CPU", "-ot", "blk\\.1\\.=CPU"]),
    ((("kv-offload", False),), "llamacpp", ["-m", "/models/m", "-nkvo"]),
    ((("mmap", False),), "llamacpp", ["-m", "/models/m", "--no-mmap"]),
    ((("no-such-flag", 1),), "llamacpp", ["-m", "/models/m", "--no-such-flag", "1"]),
]


@pytest.mark.parametrize("args, style, want", RENDER_ROWS)
def test_render_argv(args, style, want):
    assert render_argv(shape(*args), style) == want


@pytest.mark.parametrize("args, argv", [(args, want) for args, style, want in RENDER_ROWS if style == "vllm"])
def test_parse_argv_reads_back_what_render_argv_wrote(args, argv):
    """vLLM style: the one reader (FlagTable.parse with an empty table) is render_argv's inverse."""
    assert parse_argv([*argv, "--port", "8001"], "vllm") == ("/models/m", list(args), 8001)


def test_a_flag_given_twice_reads_by_its_style():
    """vLLM style keeps every flag in order; llama.cpp style keeps the last (a repeat flag collects)."""
    assert parse_argv(["/m", "--x", "1", "--x", "2"], "vllm")[1] == [("x", 1), ("x", 2)]
    assert parse_argv(["-m", "/m", "-t", "1", "--threads", "2"], "llamacpp")[1] == [("threads", 2)]
    assert parse_argv(["-m", "/m", "-ot", "a=CPU", "-ot", "b=CPU"], "llamacpp")[1] == [
        ("override-tensor", ["a=CPU", "b=CPU"])]
    with pytest.raises(ConfigError, match="no model"):
        parse_argv(["-t", "2"], "llamacpp")


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


# -- llama.cpp flag spellings: render <-> parse ----------------------------------------------------
from arms.spellings import flag_table  # noqa: E402

LLAMA = flag_table("llamacpp")


@pytest.mark.parametrize("spellings, lever, value, rendered", [
    # every spelling of a flag is the same lever; render writes the profile's first spelling
    ((["-ngl", "99"], ["--n-gpu-layers", "99"], ["--gpu-layers", "99"], ["--n_gpu_layers=99"]),
     "n-gpu-layers", 99, ["-ngl", "99"]),
    ((["-ngl", "auto"],), "n-gpu-layers", "auto", ["-ngl", "auto"]),
    ((["-ncmoe", "30"], ["--n-cpu-moe", "30"]), "n-cpu-moe", 30, ["-ncmoe", "30"]),
    ((["-cmoe"], ["--cpu-moe"]), "cpu-moe", True, ["-cmoe"]),
    ((["-ot", "exps=CPU"], ["--override-tensor", "exps=CPU"], ["--override-tensor=exps=CPU"]),
     "override-tensor", "exps=CPU", ["-ot", "exps=CPU"]),
    ((["-ot", "blk\\.[0-9]\\.ffn_.*_exps=CPU", "-ot", "exps=CUDA0"],),
     "override-tensor", ["blk\\.[0-9]\\.ffn_.*_exps=CPU", "exps=CUDA0"],
     ["-ot", "blk\\.[0-9]\\.ffn_.*_exps=CPU", "-ot", "exps=CUDA0"]),
    ((["-ot", "a=CPU,b=CPU"],), "override-tensor", "a=CPU,b=CPU", ["-ot", "a=CPU,b=CPU"]),
    ((["-fa", "on"], ["--flash-attn", "on"], ["-fa"]), "flash-attn", True, ["-fa", "on"]),
    ((["-fa", "off"], ["--flash-attn=off"]), "flash-attn", False, ["-fa", "off"]),
    ((["-fa", "auto"],), "flash-attn", "auto", ["-fa", "auto"]),
    ((["-fit", "off"], ["--fit", "off"]), "fit", False, ["-fit", "off"]),
    ((["-ub", "512"], ["--ubatch-size", "512"]), "ubatch-size", 512, ["-ub", "512"]),
    ((["-b", "2048"], ["--batch-size", "2048"]), "batch-size", 2048, ["-b", "2048"]),
    ((["-ctk", "q8_0"], ["--cache-type-k", "q8_0"]), "cache-type-k", "q8_0", ["-ctk", "q8_0"]),
    ((["-ctv", "q4_0"], ["--cache-type-v", "q4_0"]), "cache-type-v", "q4_0", ["-ctv", "q4_0"]),
    ((["-t", "8"], ["--threads", "8"]), "threads", 8, ["-t", "8"]),
    ((["-t", "-1"],), "threads", -1, ["-t", "-1"]),
    ((["-tb", "16"], ["--threads-batch", "16"]), "threads-batch", 16, ["-tb", "16"]),
    ((["-np", "1"], ["--parallel", "1"]), "parallel", 1, ["-np", "1"]),
    ((["-c", "32768"], ["--ctx-size", "32768"]), "ctx-size", 32768, ["-c", "32768"]),
    ((["-lv", "4"], ["--log-verbosity", "4"], ["--verbosity", "4"]), "log-verbosity", 4, ["-lv", "4"]),
    ((["-lm", "mmap+mlock"], ["--load-mode", "mmap+mlock"]), "load-mode", "mmap+mlock", ["-lm", "mmap+mlock"]),
    ((["--mlock"],), "mlock", True, ["--mlock"]),
    ((["--no-mmap"],), "mmap", False, ["--no-mmap"]),
    ((["-nkvo"], ["--no-kv-offload"]), "kv-offload", False, ["-nkvo"]),
    ((["-kvo"], ["--kv-offload"]), "kv-offload", True, ["-kvo"]),
    ((["-nocb"], ["--no-cont-batching"]), "cont-batching", False, ["-nocb"]),
    ((["--metrics"],), "metrics", True, ["--metrics"]),
    ((["-ts", "3,1"], ["--tensor-split", "3,1"]), "tensor-split", "3,1", ["-ts", "3,1"]),
    ((["--some-future-flag", "7"],), "some-future-flag", 7, ["--some-future-flag", "7"]),
    ((["--some-future-switch"],), "some-future-switch", True, ["--some-future-switch"]),
])
def test_llamacpp_spellings_round_trip(spellings, lever, value, rendered):
    for words in spellings:
        model, args, port = LLAMA.parse(["-m", "/q.gguf", *words, "--port", "8080"])
        assert (model, port) == ("/q.gguf", 8080)
        assert args == [(lever, value)], words
    assert LLAMA.render(lever, value) == rendered
    assert LLAMA.parse(["-m", "/q.gguf", *rendered])[1] == [(lever, value)]   # and back


def test_a_typical_llamacpp_command_line_round_trips_word_for_word():
    argv = ["-m", "/models/q.gguf", "-ngl", "99", "-ot", "blk\\.(1[0-9])\\.ffn_.*_exps=CPU", "-ot", "exps=CUDA0",
            "-fa", "on", "-ub", "512", "-b", "2048", "-ctk", "q8_0", "-ctv", "q8_0", "-t", "8", "-tb", "16",
            "-np", "1", "-c", "32768", "-ncmoe", "12", "-cmoe", "-nkvo", "-fit", "off", "-lv", "4", "--metrics"]
    model, args, port = LLAMA.parse(argv)
    assert render_argv(Shape(IMAGE, model, tuple(args)), "llamacpp") == argv


@pytest.mark.parametrize("env, lever", [
    ("LLAMA_ARG_N_GPU_LAYERS", "n-gpu-layers"), ("LLAMA_ARG_N_CPU_MOE", "n-cpu-moe"),
    ("LLAMA_ARG_OVERRIDE_TENSOR", "override-tensor"), ("LLAMA_ARG_FLASH_ATTN", "flash-attn"),
    ("LLAMA_ARG_UBATCH", "ubatch-size"), ("LLAMA_ARG_CTX_SIZE", "ctx-size"), ("LLAMA_ARG_THREADS", "threads"),
    ("LLAMA_ARG_NO_SUCH", None),
])
def test_llamacpp_env_equivalents(env, lever):
    assert LLAMA.env_lever(env) == lever


def test_one_lever_name_per_flag_in_a_campaign(tmp_path):
    from tuner.night.campaign import load_campaign

    path = tmp_path / "c.yaml"
    path.write_text(f"""name: spell
engine: llamacpp
baseline: {{image: "{IMAGE}", model: /q.gguf, args: {{ngl: 99, -fa: true, ot: [a=CPU, b=CPU], nkvo: true}}}}
levers:
  n-gpu-layers: [0, 99]
  -ub: [256, 512]
  no-mmap: [true, false]
""")
    camp = load_campaign(path)
    assert dict(camp.baseline.args) == {"n-gpu-layers": 99, "flash-attn": True,
                                        "override-tensor": ("a=CPU", "b=CPU"), "kv-offload": False}
    assert set(camp.levers) == {"n-gpu-layers", "ubatch-size", "mmap"}
    assert camp.levers["mmap"].values == (False, True)               # no-mmap: true is mmap false
    arm = camp.baseline.with_change("n-gpu-layers", 0)
    assert render_argv(arm, "llamacpp").count("-ngl") == 1
    path.write_text(path.read_text().replace("levers:", "levers:\n  gpu-layers: [1]"))
    with pytest.raises(ConfigError, match="n-gpu-layers again"):
        load_campaign(path)
    path.write_text(path.read_text().replace("ngl: 99,", "ngl: 99, n-gpu-layers: 9,"))
    with pytest.raises(ConfigError, match="same flag"):
        load_campaign(path)


def test_check_names_a_missing_model_before_any_boot(tmp_path, capsys):
    from tuner import cli

    path = tmp_path / "c.yaml"
    path.write_text(f"""name: nomodel
engine: llamacpp
baseline: {{image: "{IMAGE}", model: /models/not-here.gguf, args: {{ngl: 0}}}}
levers: {{threads: [1, 2]}}
""")
    assert cli.main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "model /models/not-here.gguf does not exist on this host" in err and len(err.strip().splitlines()) == 1

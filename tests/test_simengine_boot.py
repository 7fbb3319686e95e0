"""The simulated engine's boot as a process: each failure rule exits non-zero with the
documented log text (simengine/LOG_FORMAT.md); a good boot honours the compile cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import FAST_ENV, REPO, run_engine

BASE = ["serve", "/models/sim", "--port", "0", "--tensor-parallel-size", "2", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.98", "--kv-cache-memory-bytes", "2147483648", "--max-num-seqs", "4",
        "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 4}), "--expert-prefetch", "1"]


def with_flag(flag: str, value: str | None = None) -> list[str]:
    args = list(BASE)
    if flag in args:
        i = args.index(flag)
        if value is None:
            del args[i:i + 2]
        else:
            args[i + 1] = value
    else:
        args += [flag] + ([value] if value is not None else [])
    return args


FAILURES = [
    ("util-0.99", with_flag("--gpu-memory-utilization", "0.99"), {},
     "ValueError: Free memory on device cuda:1 (31.29/31.86 GiB) on startup is less than desired GPU memory utilization (0.99, 31.54 GiB)"),
    ("seqs-2", with_flag("--max-num-seqs", "2"), {},
     "ConstraintViolationError: Constraints violated (L['query_start_loc'].size()[0])"),
    ("seqs-6", with_flag("--max-num-seqs", "6"), {},
     "ValueError: max_num_seqs (6) exceeds available Mamba cache blocks (5)"),
    ("kv-too-small", with_flag("--max-model-len", "262144"), {},
     "To serve at least one request with the model's max seq len (262144)"),
    ("oom-3x262144-bf16", ["serve", "/models/sim", "--port", "0", "--tensor-parallel-size", "2", "--max-model-len",
                           "262144", "--gpu-memory-utilization", "0.98", "--kv-cache-memory-bytes", "11047010304",
                           "--max-num-seqs", "3"], {},
     "torch.OutOfMemoryError: HIP out of memory. Tried to allocate"),
    ("ngram", with_flag("--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4})), {},
     "RuntimeError: PLE inputs were not prepared"),
]


@pytest.mark.parametrize("name,args,env,text", FAILURES, ids=[f[0] for f in FAILURES])
def test_failure_rule_exits_nonzero_with_documented_text(name, args, env, text, tmp_path):
    r = run_engine(args, env={"VLLM_CACHE_ROOT": str(tmp_path), **env})
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert text in r.stdout
    assert "EngineCore failed to start." in r.stdout
    assert "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}" in r.stdout
    assert "Application startup complete." not in r.stdout


def test_unknown_flag_is_an_argparse_error_exit_2():
    r = run_engine(BASE + ["--expert-prefetch-depth", "2"])
    assert r.returncode == 2
    assert "usage: vllm" in r.stderr and "unrecognized arguments: --expert-prefetch-depth" in r.stderr


def boot_until_ready(args, env, timeout=60.0) -> tuple[str, float]:
    full = {**os.environ, **FAST_ENV, **env}
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "simengine", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=full, cwd=REPO)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if "Application startup complete." in line:
                return "".join(lines), time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                break
        raise AssertionError("engine did not become ready:\n" + "".join(lines[-20:]))
    finally:
        p.kill()
        p.wait()


def test_second_boot_of_the_same_shape_hits_the_compile_cache(tmp_path):
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "SIMENGINE_TIME_SCALE": "0.01"}
    cold, t_cold = boot_until_ready(BASE, env)
    warm, t_warm = boot_until_ready(BASE, env)
    assert "Compiling a graph for compile range (1, 1024) takes" in cold
    assert "Directly load the compiled graph(s)" not in cold
    assert "Directly load the compiled graph(s) for compile range (1, 1024) from the cache" in warm
    assert "Compiling a graph" not in warm
    assert t_warm < t_cold - 1.0          # ~176 s of compile x 0.01 saved
    # a different compile range is a miss, never a wrong answer
    other, _ = boot_until_ready(with_flag("--max-num-batched-tokens", "2048"), env)
    assert "Compiling a graph for compile range (1, 2048)" in other


def test_ignored_flag_is_dropped_from_non_default_args(tmp_path):
    land = tmp_path / "drop.yaml"
    from simengine.landscape import DEFAULT_LANDSCAPE

    land.write_text(DEFAULT_LANDSCAPE.read_text() + "\nignored_flags: [expert-precise-memory]\n")
    out, _ = boot_until_ready(BASE + ["--expert-precise-memory"], {"SIMENGINE_LANDSCAPE": str(land),
                                                                     "VLLM_CACHE_ROOT": str(tmp_path)})
    nda = next(line for line in out.splitlines() if "non-default args:" in line)
    assert "expert_precise_memory" not in nda and "'max_num_seqs': 4" in nda
    assert "runtime overhead 7.60 GiB" in out          # and the flag had no effect

"""The `tuner` command line: bad input is one stderr line and exit 2 before anything starts;
`tuner measure` reports decode from usage counters."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import FAST_ENV, REPO, free_port

GOOD = {"name": "cli-test", "engine": "vllm-expert-offload",
        "baseline": {"image": "localhost/offload-tuner-simengine:latest", "model": "/models/sim",
                     "args": {"max-num-seqs": 4}, "port": 18999},
        "levers": {"expert-prefetch": ["absent", 1, 2], "max-num-seqs": [2, 3, 4]}}


def tuner(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def write(tmp_path, data, name="c.yaml") -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(p)


def one_line_exit_2(r):
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), r.stderr
    return lines[0]


BAD = [
    ("malformed-yaml", "name: x\nbaseline: {image: [\n", r"c.yaml:\d+: not valid YAML"),
    ("unknown-key", {**GOOD, "levres": {}}, r"c.yaml:\d+: levres: unknown key"),
    ("bad-name", {**GOOD, "name": "has space"}, r"c.yaml:\d+: name: "),
    ("lever-no-values", {**GOOD, "levers": {"max-num-seqs": []}}, r"c.yaml:\d+: levers.max-num-seqs: "),
    ("missing-mount", {**GOOD, "baseline": {**GOOD["baseline"], "mounts": ["/no/such/dir:/models:ro"]}},
     "mount source /no/such/dir"),
    ("missing-device", {**GOOD, "baseline": {**GOOD["baseline"], "devices": ["/dev/no-such-gpu"]}},
     "device /dev/no-such-gpu does not exist"),
    ("bad-measure", {**GOOD, "measure": {"depths": "166"}}, r"c.yaml:\d+: measure.depths: "),
]


@pytest.mark.parametrize("name,data,text", BAD, ids=[b[0] for b in BAD])
def test_bad_campaign_is_one_line_exit_2(tmp_path, name, data, text):
    import re

    line = one_line_exit_2(tuner("boot", write(tmp_path, data), env={"CONTAINER_HOST": "unix:///nonexistent.sock"}))
    assert re.search(text, line), line


@pytest.mark.parametrize("change,text", [
    ("no-such-lever=1", "unknown lever 'no-such-lever'"),
    ("max-num-seqs=abc", "max-num-seqs"),
    ("max-num-seqs", "LEVER=VALUE"),
])
def test_bad_change_is_refused_before_anything_starts(tmp_path, change, text):
    line = one_line_exit_2(tuner("boot", write(tmp_path, GOOD), "--change", change,
                                 env={"CONTAINER_HOST": "unix:///nonexistent.sock"}))
    assert text in line


def test_a_podman_socket_that_does_not_answer(tmp_path):
    line = one_line_exit_2(tuner("boot", write(tmp_path, GOOD), env={"CONTAINER_HOST": "unix:///nonexistent.sock"}))
    assert "does not answer" in line and "nonexistent.sock" in line


@pytest.mark.podman
def test_an_image_that_is_not_present(tmp_path, podman_host):
    data = {**GOOD, "baseline": {**GOOD["baseline"], "image": "localhost/not-built-here:v1"}}
    line = one_line_exit_2(tuner("boot", write(tmp_path, data)))
    assert "localhost/not-built-here:v1 is not present" in line


@pytest.fixture
def local_engine():
    """The simulated engine as a local process, at 4x decode speed (measured rates are / 4)."""
    port = free_port()
    env = {**os.environ, **FAST_ENV, "SIMENGINE_DECODE_SCALE": "4", "VLLM_CACHE_ROOT": "/tmp/simengine-cli-cache"}
    p = subprocess.Popen([sys.executable, "-m", "simengine", "serve", "/models/sim", "--port", str(port),
                          "--max-num-seqs", "4", "--expert-prefetch", "1", "--kv-cache-memory-bytes", "2147483648",
                          "--gpu-memory-utilization", "0.98", "--speculative-config",
                          '{"method":"mtp","num_speculative_tokens":4}'], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    p.kill()
    p.wait()


def test_measure_a_running_engine_as_json(local_engine):
    r = tuner("measure", "--url", local_engine, "--profile", "vllm", "--depths", "166,1087", "--runs", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for depth, want in (("166", 26.80 * 0.96 * 4), ("1087", 25.15 * 4)):
        d = out["depths"][depth]
        assert set(d) >= {"median_decode_tok_s", "mad_decode_tok_s", "median_ttft_s", "runs"}
        assert len(d["runs"]) == 2 and all(r["valid"] for r in d["runs"])
        assert set(d["runs"][0]) >= {"decode_tok_s", "ttft_s", "completion_tokens", "valid", "reason"}
    # the default landscape's incumbent at 166 / 1087 tokens (x4 decode scale), usage-counter figure
    assert out["depths"]["166"]["median_decode_tok_s"] == pytest.approx(26.80 * 4, rel=0.03)
    assert out["depths"]["1087"]["median_decode_tok_s"] == pytest.approx(25.15 * 4, rel=0.03)
    assert 0.5 < out["acceptance"] < 0.66


def test_measure_table_for_a_running_engine(local_engine):
    r = tuner("measure", "--url", local_engine, "--profile", "vllm", "--depths", "166", "--runs", "1")
    assert r.returncode == 0, r.stderr
    assert "decode tok/s" in r.stdout and "acceptance" in r.stdout and "quality: ok" in r.stdout

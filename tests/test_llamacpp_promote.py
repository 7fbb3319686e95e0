"""Promotion of a llama.cpp winner: a Quadlet, a plain unit (systemd-analyze verify), an env file
of LLAMA_ARG_* variables; each read back to the same shape or the same settings."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from arms.shape import Shape
from arms.spellings import flag_table
from tuner.production.envfile import check_mapping, parse_env_file, render_env_file
from tuner.production.units import parse_quadlet, parse_service, render_quadlet, render_service

LLAMA = flag_table("llamacpp")
BASE = Shape.from_mapping({
    "image": "localhost/offload-tuner-llama-server@sha256:" + "2" * 64, "model": "/srv/models/q.gguf",
    "args": {"n-gpu-layers": 99, "override-tensor": [r"blk\.(1[0-9])\.ffn_.*_exps=CPU", "exps=CUDA0"],
             "flash-attn": True, "ubatch-size": 512, "threads": 8, "kv-offload": False, "fit": False},
    "mounts": ["/srv/models/q.gguf:/srv/models/q.gguf:ro"], "devices": ["nvidia.com/gpu=all"], "port": 8080})
WINNER = BASE.with_change("n-cpu-moe", 12).with_change("threads", 16).with_change("flash-attn", False)


def test_the_quadlet_and_the_unit_round_trip_with_short_flags():
    q = render_quadlet(WINNER, style="llamacpp", container_name="llama", podman_version="5.0", timeout_s=600,
                       label="llamacpp-cpu/arm9")
    assert "-ncmoe 12" in q and "-ot " in q and "--n-cpu-moe" not in q and "--ot" not in q
    assert parse_quadlet(q, "llamacpp").shape == WINNER
    unit = render_service(WINNER, style="llamacpp", container_name="llama", timeout_s=600, label="llamacpp-cpu/arm9")
    assert parse_service(unit, "llamacpp").shape == WINNER


def test_the_plain_unit_passes_systemd_analyze_verify(tmp_path):
    assert shutil.which("podman") == "/usr/bin/podman", "the unit runs /usr/bin/podman: install podman"
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze is missing: apt-get install -y systemd"
    path = tmp_path / "llama.service"
    path.write_text(render_service(WINNER, style="llamacpp", container_name="llama", timeout_s=600,
                                   label="llamacpp-cpu/arm9"))
    r = subprocess.run([exe, "verify", str(path)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr + r.stdout


def test_an_env_file_of_llama_arg_variables():
    mapping = LLAMA.env_mapping(["n-cpu-moe", "threads", "flash-attn", "ubatch-size"])
    assert mapping == {"n-cpu-moe": "LLAMA_ARG_N_CPU_MOE", "threads": "LLAMA_ARG_THREADS",
                       "flash-attn": "LLAMA_ARG_FLASH_ATTN", "ubatch-size": "LLAMA_ARG_UBATCH"}
    check_mapping(BASE, WINNER, mapping)
    text = render_env_file(WINNER, mapping, label="llamacpp-cpu/arm9", existing="LLAMA_ARG_THREADS=8\nOTHER=x\n")
    env = parse_env_file(text)
    # llama-server reads 1/0 for on/off and switches (common/arg.cpp is_truthy / is_falsey)
    assert env == {"LLAMA_ARG_THREADS": "16", "OTHER": "x", "LLAMA_ARG_N_CPU_MOE": "12",
                   "LLAMA_ARG_FLASH_ATTN": "0", "LLAMA_ARG_UBATCH": "512"}
    with pytest.raises(Exception, match="n-cpu-moe"):
        check_mapping(BASE, WINNER, {"threads": "LLAMA_ARG_THREADS"})

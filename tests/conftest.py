"""Shared fixtures. Integration tests talk to the real podman API service named by
CONTAINER_HOST (scripts/test.sh and .ci/run start one); without it they fail, never skip."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FAST_ENV = {"SIMENGINE_TIME_SCALE": "0.002", "SIMENGINE_NOISE": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_engine(args: list[str], env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the simulated engine as a local process (boot failures exit on their own)."""
    full_env = {**os.environ, **FAST_ENV, **(env or {})}
    return subprocess.run([sys.executable, "-m", "simengine", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def podman_host():
    from host.podman_host import PodmanHost

    if not os.environ.get("CONTAINER_HOST"):
        pytest.fail("CONTAINER_HOST is not set: run the suite with scripts/test.sh, which starts "
                    "a podman API service for it")
    return PodmanHost()


@pytest.fixture(scope="session")
def sim_image(podman_host):
    from host.simimage import ensure_image

    return ensure_image(podman_host.client)


@contextlib.contextmanager
def serving(behaviour):
    """The simulated engine's HTTP server in-process, ready with ``behaviour``; yields its URL."""
    from simengine.server import start_server

    handle = start_server("127.0.0.1", 0, log=lambda line: None)
    handle.set_ready(behaviour)
    try:
        yield f"http://127.0.0.1:{handle.port}"
    finally:
        handle.shutdown()

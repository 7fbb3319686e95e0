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


def sigterm_once_booting(host, campaign: str, *tuner_args: str, timeout: float = 60) -> tuple[int, str]:
    """Start ``tuner *tuner_args``, send it SIGTERM once it has a container of ``campaign`` (or
    after ``timeout``); (its exit status, its stderr). A container of that campaign left on
    this podman by an earlier run is removed first: it is not the one this tuner starts."""
    import signal
    import time

    from arms.host import LABEL_CAMPAIGN
    from arms.lifecycle import sweep_orphans

    sweep_orphans(host, campaign)
    p = subprocess.Popen([sys.executable, "-m", "tuner.cli", *tuner_args], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not host.list_managed({LABEL_CAMPAIGN: campaign}):
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    # a guard against a hang, not a timing: a fresh clone's run beside two benches on two cores took
    # more than 60 s from this SIGTERM to the tuner's exit (the container's teardown through podman)
    _, err = p.communicate(timeout=300)
    return p.returncode, err


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


@contextlib.contextmanager
def virtual_serving(behaviour, log=lambda line: None):
    """The simulated engine's core on a virtual clock behind an in-process httpx client:
    yields (client, clock). A streamed body is pulled chunk by chunk as the client reads it, and
    the engine's wait before each chunk advances the clock, so a client stamping arrivals with
    ``clock`` sees the engine's timing model exactly, whatever the machine's load."""
    import httpx

    from simengine.engine import EngineCore, route

    now = [0.0]
    core = EngineCore(behaviour, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + max(s, 0.0)),
                      log=log)

    class Pulled(httpx.SyncByteStream):
        def __init__(self, chunks):
            self.chunks = chunks

        def __iter__(self):
            yield from self.chunks

    def handler(request):
        resp = route(core, request.method, request.url.raw_path.decode(), request.content)
        headers = {"content-type": resp.ctype} if resp.ctype else {}
        if resp.chunks is None:
            return httpx.Response(resp.status, headers=headers, content=resp.body)
        return httpx.Response(resp.status, headers=headers, stream=Pulled(resp.chunks))

    with httpx.Client(base_url="http://sim.test", transport=httpx.MockTransport(handler)) as client:
        yield client, lambda: now[0]


def assert_plan_matches(report, want) -> None:
    """A parsed boot report carries the planner's numbers for the seed-002 incumbent shape."""
    p = report.plan
    assert p["slots"] == want.slots
    assert p["expert_cache_gib"] == pytest.approx(want.arena_gib, abs=0.006)
    assert p["swap_slots"] == want.swap_slots
    assert p["kv_reserve_gib"] == pytest.approx(want.kv_reserve_gib, abs=0.006)
    assert p["graphs_gib"] == pytest.approx(want.graphs_gib, abs=0.006)
    assert report.kv_pool_tokens == want.kv_tokens
    assert report.max_concurrency == pytest.approx(round(want.max_concurrency, 2))
    assert report.non_default_args["max_num_seqs"] == 4
    assert report.compile_cache_hit is False


@pytest.fixture(scope="session")
def pg():
    """A real PostgreSQL server for the shared-campaign tests (Debian's binaries, a private data
    directory and port, started here; scripts/test.sh installs the package). Each test shares it
    under its own campaign name."""
    import shutil
    import tempfile

    from host.pgserver import PgServer

    folder = Path(tempfile.mkdtemp(prefix="offload-tuner-pg-", dir="/tmp"))   # a path the postgres user can reach
    srv = PgServer(folder)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(folder, ignore_errors=True)

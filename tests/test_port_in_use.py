"""Readiness proves identity: a port already held is refused before booting, with its holder
named (class ``port-in-use``); an engine whose log says it could not bind is never "ready",
even while something else answers on its port. Unit level on FakeHost with a real listener
and the fault engine as the "production" server; end to end with `tuner boot` and `tuner run`
on the real podman service."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from arms.boot import BootLimits, boot_arm
from arms.profiles import load_profile
from arms.readiness import bind_failure
from arms.shape import Shape
from host.fake import FakeHost, FakeRun
from tests.conftest import REPO, free_port
from tests.faultengine import FaultEngine

DIGEST = "sha256:" + "ef" * 32
IMAGE = f"localhost/engine@{DIGEST}"
FAST = BootLimits(timeout_s=5, hang_s=5, poll_s=0.05)


def shape(port: int) -> Shape:
    return Shape(image=IMAGE, model="/models/m", port=port, args={"max-num-seqs": 4})


@pytest.fixture
def listener():
    """A real TCP listener on a free port: (port, this process's pid)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", free_port()))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_a_held_port_is_refused_before_booting_and_the_holder_named(listener, tmp_path):
    host = FakeHost(images={"localhost/engine:1": DIGEST})
    with boot_arm(host, shape(listener), load_profile("vllm"), campaign="piu", arm=1, folder=tmp_path,
                  limits=FAST) as (result, booted):
        assert booted is None
    assert result.outcome == "port-in-use" and not result.ready
    ev = result.report.evidence[0]
    assert f"port {listener} is already held by pid {os.getpid()} (" in ev and "python" in ev, ev
    assert not any(call == "start" for call, _ in host.calls)                   # nothing booted
    assert json.loads((tmp_path / "boot.json").read_text())["outcome"] == "port-in-use"


def test_a_free_port_has_no_holder_and_our_own_running_container_is_named(tmp_path):
    host = FakeHost(images={"localhost/engine:1": DIGEST})
    port = free_port()
    assert host.port_holder(port) is None
    from arms.lifecycle import container_spec

    cid = host.start(container_spec(shape(port), campaign="piu", arm=2))
    assert host.port_holder(port) == f"container tuner-piu-arm2 ({cid[:12]})"


class Blind(FakeHost):
    """A host that cannot see the holder (another network namespace): the log must tell."""

    def port_holder(self, port: int) -> str | None:
        return None


@pytest.mark.parametrize("line", [
    "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', {port}): address already in use",
    "main: couldn't bind HTTP server socket, hostname: 0.0.0.0, port: {port}",
    "OSError: [Errno 98] Address already in use",
])
def test_an_engine_that_could_not_bind_is_never_ready_while_another_server_answers(tmp_path, line):
    with FaultEngine() as production:                   # answers /health and completions
        port = int(production.url.rsplit(":", 1)[1])
        host = Blind(images={"localhost/engine:1": DIGEST},
                     program=lambda spec: FakeRun(["INFO starting", line.format(port=port)]))
        with boot_arm(host, shape(port), load_profile("vllm"), campaign="piu", arm=3, folder=tmp_path,
                      limits=FAST) as (result, booted):
            pass
    assert result.outcome == "port-in-use", result.report
    assert result.report.evidence[0] == line.format(port=port) and booted.ready.outcome == "port-in-use"
    assert production.bodies == []                      # never measured, not even probed


@pytest.mark.parametrize("args,served,ours", [
    ({}, "other/model", False),                                  # another engine, another model
    ({}, "/models/m", True),                                     # the model path, as vLLM reports it
    ({"served-model-name": "frank"}, "frank", True),            # vLLM --served-model-name
    ({"served-model-name": "frank"}, "/models/other", False),
    ({"alias": "tiny"}, "tiny", True),                           # llama-server --alias
])
def test_readiness_proves_identity_by_the_served_model(tmp_path, args, served, ours):
    with FaultEngine(model=served) as other:            # answers /health, /v1/models, completions
        port = int(other.url.rsplit(":", 1)[1])
        host = Blind(images={"localhost/engine:1": DIGEST},     # no holder seen, no bind failure logged
                     program=lambda spec: FakeRun(["INFO starting", "INFO loading weights"]))
        s = Shape(image=IMAGE, model="/models/m", port=port, args={"max-num-seqs": 4, **args})
        with boot_arm(host, s, load_profile("vllm"), campaign="piu", arm=4, folder=tmp_path,
                      limits=FAST) as (result, booted):
            pass
    if ours:
        assert result.ready and len(other.bodies) == 1, result.report   # the readiness completion
        return
    assert result.outcome == "port-in-use" and booted.ready.outcome == "port-in-use"
    ev = result.report.evidence[0]
    assert f"serves model {served!r}" in ev and "another engine holds the port" in ev, ev
    assert (args.get("served-model-name") or "/models/m") in ev
    assert other.bodies == []                           # not even a readiness completion
    assert json.loads((tmp_path / "boot.json").read_text())["report"]["evidence"] == [ev]


def test_served_names_of_vllm_and_llama_server_answers():
    from arms.readiness import served_names
    vllm = {"object": "list", "data": [{"id": "frank", "root": "/models/q", "max_model_len": 8}]}
    llama = {"models": [{"name": "/m.gguf", "model": "/m.gguf"}],
             "data": [{"id": "tiny", "aliases": ["tiny", "t2"], "owned_by": "llamacpp"}]}
    assert served_names(vllm) == ["frank", "/models/q"]
    assert served_names(llama) == ["tiny", "tiny", "t2", "/m.gguf", "/m.gguf"]
    assert served_names({"data": "x"}) == [] and served_names([1]) == []


def test_bind_failure_finds_the_line():
    log = "a\nb [Errno 98] Address already in use\nc\n"
    assert bind_failure(log) == "b [Errno 98] Address already in use"
    assert bind_failure("INFO listening on port 8000\n") is None


# -- end to end: `tuner boot` and `tuner run` on podman ----------------------------------------
def tuner(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.podman
def test_tuner_boot_and_run_refuse_a_held_port_and_measure_nothing(tmp_path, listener, sim_image, podman_host):
    data = {"name": "piu-e2e", "engine": "simengine",
            "baseline": {"image": sim_image.tag, "model": "/models/sim", "port": listener,
                         "args": {"max-num-seqs": 4}, "env": {"SIMENGINE_TIME_SCALE": 0.002}},
            "levers": {"max-num-seqs": [2, 4]},
            "measure": {"depths": [166], "runs": 1, "warm_tokens": 8, "max_tokens": 16, "quiet_wait_s": 0},
            "boot": {"timeout_s": 30, "hang_s": 30, "poll_s": 0.2}, "journal": str(tmp_path / "journal")}
    path = tmp_path / "piu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))

    boot = tuner("boot", str(path), "--json")
    assert boot.returncode == 1, boot.stderr[-2000:]
    rep = json.loads(boot.stdout)
    assert rep["outcome"] == "port-in-use"
    assert f"already held by pid {os.getpid()}" in rep["report"]["evidence"][0]

    run = tuner("run", str(path), "--quiet")
    journal = (tmp_path / "journal" / "piu-e2e" / "journal.jsonl").read_text()
    assert "port-in-use" in journal and f"pid {os.getpid()}" in journal, (run.stderr[-2000:], journal[-2000:])
    arms = [r for r in map(json.loads, filter(str.strip, journal.splitlines())) if r.get("op") == "arm_end"]
    assert arms and all(a.get("verdict") == "boot-failed:port-in-use" for a in arms), arms
    assert not any(a.get("measurement") for a in arms)                 # nothing measured
    assert not podman_host.list_managed({"tuner.campaign": "piu-e2e"})  # nothing left running

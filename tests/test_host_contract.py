"""One contract, three hosts: the in-memory FakeHost, PodmanHost on the real podman service
and SimHost (the simulated engine booted in-process, in virtual time).

The podman side boots the simulated engine image by digest; the fake side runs a scripted
program that prints the same first lines; the sim side runs the engine's own boot. All must
behave the same for every case.
"""
from __future__ import annotations

import re
import time

import pytest

from arms.errors import ConfigError, HostError
from arms.host import LABEL_ARM, LABEL_CAMPAIGN, LABEL_MANAGED, ContainerSpec
from host.fake import FakeHost, FakeRun
from host.simhost import SimHost
from tests.conftest import FAST_ENV, free_port

FILE_IN_IMAGE = "/opt/simengine/simengine/behaviour.py"
FAKE_DIGEST = "sha256:" + "ab" * 32
SIM_DIGEST = "sha256:" + "cd" * 32


def _fake_program(spec: ContainerSpec) -> FakeRun:
    if "--bogus-flag" in spec.command:
        unknown = " ".join(spec.command[spec.command.index("--bogus-flag"):])
        return FakeRun(["usage: vllm serve [model_tag] [options]",
                        f"vllm: error: unrecognized arguments: {unknown}"], exit_code=2)
    echo = {"model_tag": "/models/sim"}
    if "--hf-token" in spec.command:                       # vLLM echoes its non-default args, secrets included
        echo["hf_token"] = spec.command[spec.command.index("--hf-token") + 1]
    return FakeRun([f"(APIServer pid=1) INFO 11-29 21:30:00 [utils.py:278] non-default args: {echo}"],
                   files={FILE_IN_IMAGE: b'"""What a booted simulated engine does"""\n'})


@pytest.fixture(params=["fake", "podman", "sim"])
def env(request, tmp_path):
    """(host, image tag, image digest ref) for each implementation."""
    if request.param == "fake":
        host = FakeHost(images={"localhost/fake-engine:1": FAKE_DIGEST}, program=_fake_program)
        yield host, "localhost/fake-engine:1", f"localhost/fake-engine@{FAKE_DIGEST}"
    elif request.param == "sim":
        with SimHost(images={"localhost/sim-engine:1": SIM_DIGEST}) as host:
            yield host, "localhost/sim-engine:1", f"localhost/sim-engine@{SIM_DIGEST}"
    else:
        host = request.getfixturevalue("podman_host")
        img = request.getfixturevalue("sim_image")
        yield host, img.tag, img.ref
        for cid, _ in host.list_managed({LABEL_CAMPAIGN: "contract"}):
            host.remove(cid)


def spec(image: str, name: str, *extra: str) -> ContainerSpec:
    return ContainerSpec(image=image, command=("/models/sim", "--port", str(free_port()), *extra),
                         name=name, env=tuple(FAST_ENV.items()),
                         labels=((LABEL_MANAGED, "1"), (LABEL_CAMPAIGN, "contract"), (LABEL_ARM, name[-1])))


def wait_for(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_resolve_image_by_tag_and_by_digest(env):
    host, tag, ref = env
    by_tag = host.resolve_image(tag)
    assert by_tag.ref == ref and by_tag.digest == ref.split("@", 1)[1]
    assert host.resolve_image(ref).ref == ref


def test_resolve_missing_image_is_a_host_error(env):
    host, _, _ = env
    with pytest.raises(ConfigError, match="not present on this host"):
        host.resolve_image("localhost/no-such-engine:never")


def test_running_container_logs_kill_and_remove(env, tmp_path):
    host, _, ref = env
    cid = host.start(spec(ref, "tuner-contract-arm1"))
    try:
        follower = host.follow_logs(cid, tmp_path / "boot.log")
        assert wait_for(lambda: "non-default args" in follower.text())
        assert host.state(cid).running
        assert [c for c, lab in host.list_managed({LABEL_CAMPAIGN: "contract"}) if c == cid]
        host.kill(cid, "SIGKILL")
        st = host.wait(cid, timeout=20)
        assert st.exited and st.exit_code == 137
    finally:
        host.remove(cid)
    assert host.state(cid).status == "missing"
    assert not [c for c, _ in host.list_managed({LABEL_CAMPAIGN: "contract"}) if c == cid]
    host.remove(cid)      # removing twice is not an error


def test_container_that_exits_reports_its_code_and_log(env, tmp_path):
    host, _, ref = env
    cid = host.start(spec(ref, "tuner-contract-arm2", "--bogus-flag"))
    try:
        st = host.wait(cid, timeout=30)
        assert st.exited and st.exit_code == 2
        follower = host.follow_logs(cid, tmp_path / "bad.log")
        assert wait_for(lambda: "unrecognized arguments: --bogus-flag" in follower.text())
    finally:
        host.remove(cid)


def test_a_log_line_longer_than_a_log_frame_is_copied_whole(env, tmp_path):
    """podman sends a line longer than its 8 KiB buffer as several frames: the copy joins them
    (a newline after each frame cut such a line in two, and a boot-log rule then missed it)."""
    host, _, ref = env
    long = "y" * 20000
    cid = host.start(spec(ref, "tuner-contract-arm8", "--bogus-flag", long))
    try:
        assert host.wait(cid, timeout=30).exit_code == 2
        follower = host.follow_logs(cid, tmp_path / "long.log")
        assert wait_for(lambda: long in follower.text())
        follower.stop(5.0)
        lines = follower.text().splitlines()
        assert [ln for ln in lines if ln.endswith("unrecognized arguments: --bogus-flag " + long)], \
            [ln[:80] for ln in lines]
        assert not [ln for ln in lines if set(ln) == {"y"}]          # no piece of it on a line of its own
    finally:
        host.remove(cid)


def test_copy_out_a_file(env, tmp_path):
    host, _, ref = env
    cid = host.start(spec(ref, "tuner-contract-arm3"))
    try:
        got = host.copy_out(cid, FILE_IN_IMAGE, tmp_path / "out")
        assert [p.name for p in got] == ["behaviour.py"]
        assert "What a booted simulated engine does" in got[0].read_text()
        with pytest.raises(HostError, match="not found"):
            host.copy_out(cid, "/no/such/file.json", tmp_path / "out")
    finally:
        host.remove(cid)


def test_duplicate_name_is_refused(env):
    host, _, ref = env
    cid = host.start(spec(ref, "tuner-contract-arm4"))
    try:
        with pytest.raises(HostError):
            host.start(spec(ref, "tuner-contract-arm4"))
    finally:
        host.remove(cid)


def test_probes_around_a_container_and_the_wall_clock(env):
    """Host.probes and Host.wall: every host reports the container's end in ProbeSampler's shape
    (the real host samples the machine, a simulated or fake one only its container)."""
    host, _, ref = env
    w0 = host.wall()
    cid = host.start(spec(ref, "tuner-contract-probes"))
    try:
        with host.probes(cid, interval_s=0.2) as probes:
            host.kill(cid, "SIGKILL")
            assert host.wait(cid, timeout=20).exit_code == 137
        summary = probes.to_dict()["summary"]
        assert summary["container"]["exit_code"] == 137
        assert [k for k in summary["oom_kills"] if k["source"] == "container"]
        assert {"ram_available_min_bytes", "engine_rss_peak_bytes", "vram", "kernel_log"} <= set(summary)
    finally:
        host.remove(cid)
    assert 1.6e9 < w0 <= host.wall()


def test_conditions_around_a_run_in_one_shape(env):
    """Host.conditions: every host reports the box around a run in the shape arms.conditions
    reads; the real host finds the container's own cgroup counter (its CPU is never foreign),
    a simulated or fake one reports only its model (no tenant here: no foreign load). One probe
    serves every run of the container."""
    from arms.conditions import contention

    host, _, ref = env
    cid = host.start(spec(ref, "tuner-contract-cond"))
    try:
        probe = host.conditions(cid)
        for _ in range(2):
            probe.start()
            host.sleep(0.3)
            d = probe.stop()
            assert {"source", "wall_s", "foreign_cores", "load_avg", "cpu_freq_mhz"} <= set(d), d
            assert isinstance(d["foreign_cores"], float) and d["foreign_cores"] >= 0 and d["wall_s"] > 0
            if d["source"] == "psutil":
                assert d["container_cpu"] == "cgroup" and len(d["load_avg"]) == 3
            else:
                assert d["foreign_cores"] == 0.0 and contention(d) is None
    finally:
        host.remove(cid)


def test_the_box_at_rest_in_one_shape(env):
    """Host.rest_load: every host reads the box's load with no engine running, in one shape: the
    real one over the seconds asked (this process's own CPU time not counted), a simulated or
    fake one its model (no tenant, no scripted load: an idle box)."""
    host, _, _ = env
    d = host.rest_load(0.4)
    assert {"source", "cores", "samples", "seconds"} <= set(d), d
    assert d["cores"] is None or (isinstance(d["cores"], float) and d["cores"] >= 0)
    if d["source"] == "psutil":
        assert d["seconds"] == 0.4 and len(d["samples"]) >= 2 and d["cores"] == min(x for x in d["samples"] if x is not None)
    else:
        assert d["cores"] == 0.0


def test_port_holder_names_our_running_container_and_a_free_port_has_none(env):
    host, _, ref = env
    s = spec(ref, "tuner-contract-arm5")
    port = int(s.command[s.command.index("--port") + 1])
    assert host.port_holder(free_port()) is None
    cid = host.start(s)
    try:      # podman: once the engine in it listens (host networking); the others at once
        assert wait_for(lambda: (host.port_holder(port) or "").startswith("container tuner-contract-arm5"),
                        timeout=60), host.port_holder(port)
    finally:
        host.remove(cid)
    assert wait_for(lambda: host.port_holder(port) is None)


def test_follow_logs_writes_each_line_through_redact(env, tmp_path):
    """An engine that echoes its argv (vLLM's non-default args): the line on disk is redacted
    as it is written, by every host."""
    from arms.secrets import Sealer

    host, _, ref = env
    secret = "plainFlagPassw0rd"
    s = spec(ref, "tuner-contract-arm5", "--hf-token", secret)
    cid = host.start(s)
    try:
        follower = host.follow_logs(cid, tmp_path / "secret.log", Sealer.of_container(s.env, s.command).text)
        assert wait_for(lambda: "non-default args" in follower.text())
        if callable(follower.stop):
            follower.stop(0.0)
    finally:
        host.remove(cid)
    text = (tmp_path / "secret.log").read_text()
    assert secret not in text and "'hf_token': '***'" in text, text[:1000]


def test_capabilities_are_declared_not_guessed(env):
    """Issue 21: the optional parts of a host are declared by every implementation (the loop and
    promote read them directly, never through getattr): simulated, write_only, the podman version,
    a clock that a resumed night may move on."""
    host, _, _ = env
    assert isinstance(host.simulated, bool) and isinstance(host.write_only, bool)
    assert host.write_only is False                      # only `tuner promote --write-only`'s host writes files only
    version = host.podman_version()
    t0 = host.now()
    moved = host.continue_clock(host.wall() + 60)
    if host.simulated:
        assert version is None and moved == pytest.approx(60) and host.now() == pytest.approx(t0 + 60)
    else:
        assert moved == 0.0
        if isinstance(host, FakeHost):
            assert version is None
        else:
            assert re.fullmatch(r"\d+\.\d+(\.\d+)?", version), version


def test_the_promotion_hosts_declare_what_they_touch():
    from host.systemd import SystemdHost, WriteOnlyHost

    assert SystemdHost().write_only is False and WriteOnlyHost().write_only is True
    assert SystemdHost().simulated is False and WriteOnlyHost().continue_clock(1e12) == 0.0


def test_warm_files_reads_the_model_once(env, tmp_path):
    """A new night reads its model's files before the first boot (host/pagecache.py); a simulated
    host warms its simulated page cache instead of the machine's."""
    host, _, _ = env
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\0" * 1_048_577)
    got = host.warm_files([str(model)], 60.0)
    assert got["complete"] is True and got["seconds"] >= 0
    if host.simulated:
        assert got.get("simulated") is True and got["bytes"] == 0
    else:
        assert got["files"] == 1 and got["bytes"] == 1_048_577

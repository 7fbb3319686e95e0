"""SimHost (issue 8 item 2): the same arm code in virtual time, and its agreement with podman.

(a) boots through ``arms.boot.boot_arm``: plan numbers, failure classes, compile cache and the
virtual cost of a cold boot; (b) ``measure_engine`` through ``SimHost.http_client`` with
``clock=host.now`` reproduces the landscape's decode; (c) the same shapes booted and measured
on the real podman host give the same outcome and decode.
"""
from __future__ import annotations

import dataclasses
import json
import time

import httpx
import pytest

from tests.conftest import assert_plan_matches

from arms.boot import BootLimits, boot_arm
from arms.host import LABEL_CAMPAIGN, BindMount, ContainerSpec
from arms.lifecycle import container_spec
from arms.measure import MeasurePlan, api_from_profile, measure_engine
from arms.profiles import load_profile
from arms.shape import ABSENT, Shape
from host.simhost import SimHost
from simengine import planner
from simengine.cli import prepare
from simengine.landscape import DEFAULT_LANDSCAPE
from tests.test_boot_podman import ARGS, ENV, FAILING

PROFILE = load_profile("vllm-expert-offload")
API = api_from_profile(PROFILE)
LIMITS = BootLimits(timeout_s=1200, hang_s=600, poll_s=1.0)
MTP6 = {"method": "mtp", "num_speculative_tokens": 6}


@pytest.fixture
def host():
    with SimHost() as h:
        yield h


def make_shape(image: str, tmp_path, env: dict | None = None, port: int = 8000) -> Shape:
    (tmp_path / "cache").mkdir(parents=True, exist_ok=True)
    return Shape.from_mapping({"image": image, "model": "/models/sim", "args": ARGS,
                               "env": {**ENV, **(env or {})}, "compile_cache": str(tmp_path / "cache"),
                               "port": port})


def boot(host, shape: Shape, tmp_path, name: str, changes: dict | None = None, limits=LIMITS, measure=None):
    """Boot one arm (and measure it while it serves); returns (BootResult, Measurement or None)."""
    m = None
    with boot_arm(host, shape, PROFILE, campaign="sim-tests", arm=name, folder=tmp_path / name,
                  changes=changes or {}, limits=limits) as (result, b):
        if measure is not None and result.ready:
            with host.http_client(b.cid, timeout=300) as http:
                m = measure_engine(b.base_url, measure, API, http=http, clock=host.now)
        cid = b.cid
    assert host.state(cid).status == "missing", "the container outlived its arm"
    return result, m


def engine_view(shape: Shape):
    """What the engine makes of this shape (its own parser and landscape): (values, plan, land)."""
    spec = container_spec(shape, campaign="x", arm="x", style=PROFILE.family)
    p = prepare(["serve", *spec.command], dict(spec.env))
    return p.values, planner.make_plan(p.land, p.values), p.land


# -- (a) boots ----------------------------------------------------------------------------------
def test_cold_boot_is_ready_with_the_plan_in_virtual_time(host, tmp_path):
    shape = make_shape(host.image_ref, tmp_path, {"SIMENGINE_TIME_SCALE": "1.0"})
    t0 = time.perf_counter()
    r, _ = boot(host, shape, tmp_path, "cold")
    wall = time.perf_counter() - t0
    assert r.outcome == "ready", r.report.evidence
    _, want, _ = engine_view(shape)
    assert want.slots == 6576
    assert_plan_matches(r.report, want)
    assert r.report.compile_s == pytest.approx(184.19, abs=0.01)
    assert 462.0 <= r.boot_s <= 464.0          # 240 + 184.19 + 12 + 24 + 2 = 462.19 s, polled at 1 s
    assert wall < r.boot_s / 20, wall   # virtual: minutes of engine time in seconds of wall, under any load
    log = r.log_path.read_text()
    assert "21:07:42" in log and "Application startup complete." in log   # virtual stamps


@pytest.mark.parametrize("name,lever,value,cls", FAILING, ids=[f[0] for f in FAILING])
def test_each_failing_shape_is_classified_as_on_podman(host, tmp_path, name, lever, value, cls):
    r, _ = boot(host, make_shape(host.image_ref, tmp_path).with_change(lever, value), tmp_path, name,
                {lever: value})
    assert r.outcome == cls, (r.report.outcome, r.report.evidence)
    assert r.report.exit_code == (2 if cls == "bad-argument" else 1)
    assert r.report.evidence


def test_second_boot_hits_the_compile_cache_and_is_shorter(host, tmp_path):
    shape = make_shape(host.image_ref, tmp_path, {"SIMENGINE_TIME_SCALE": "1.0"})
    cold, _ = boot(host, shape, tmp_path, "cold")
    warm, _ = boot(host, shape, tmp_path, "warm")
    assert list((tmp_path / "cache").rglob("artifact.json")), "the artifact lands in the host folder"
    assert cold.report.compile_cache_hit is False and warm.report.compile_cache_hit is True
    assert "Directly load the compiled graph(s)" in warm.log_path.read_text()
    assert warm.report.compile_s < cold.report.compile_s
    assert warm.boot_s == pytest.approx(cold.boot_s - 180.4, abs=1.5)       # 184.19 -> 3.94 s
    assert warm.report.init_engine_s == pytest.approx(39.9, abs=0.5)       # seed: warm init ~41 s
    other, _ = boot(host, shape.with_change("max-num-batched-tokens", 2048), tmp_path, "other")
    assert other.report.compile_cache_hit is False                          # another graph: a miss


def test_no_cache_without_the_mount_and_killed_boot_saves_nothing(host, tmp_path):
    shape = make_shape(host.image_ref, tmp_path, {"SIMENGINE_TIME_SCALE": "1.0"})
    bare = dataclasses.replace(shape, mounts=())
    a, _ = boot(host, bare, tmp_path, "a")
    b, _ = boot(host, bare, tmp_path, "b")
    assert a.report.compile_cache_hit is False and b.report.compile_cache_hit is False
    real_sleep = host.sleep

    def sleep(s):                  # the kernel's OOM killer strikes 100 s into the boot
        real_sleep(s)
        for cid, _ in host.list_managed({LABEL_CAMPAIGN: "sim-tests"}):
            if host.now() - host.containers[cid].started > 100:
                host.kill(cid, "SIGKILL")

    host.sleep = sleep
    r, _ = boot(host, shape, tmp_path, "killed")
    assert r.report.exit_code == 137 and r.outcome == "host-oom-killed", r.report.evidence
    assert "Dynamo bytecode transform" not in r.log_path.read_text()     # it said nothing more
    assert not list((tmp_path / "cache").rglob("artifact.json"))          # nor compiled


def test_hang_rule_runs_silently_and_never_gets_ready(host, tmp_path):
    land = tmp_path / "hang.yaml"
    land.write_text(DEFAULT_LANDSCAPE.read_text().replace(
        "rules:\n", "rules:\n  - name: hang\n    when: {max-num-seqs: 3}\n    hang: true\n", 1))
    spec = ContainerSpec(image=host.image_ref, name="hang", env=(("SIMENGINE_LANDSCAPE", "/l.yaml"),),
                         command=("/models/sim", "--max-num-seqs", "3"),
                         mounts=(BindMount(str(land), "/l.yaml", True),))
    cid = host.start(spec)
    follower = host.follow_logs(cid, tmp_path / "hang.log")
    st = host.wait(cid, 3000)
    assert st.running and host.now() == pytest.approx(3000)
    assert follower.text().splitlines()[-1].endswith("Waiting for core engine processes to start...")
    with host.http_client(cid) as http:
        assert http.get(host.base_url(cid, 8000) + "/health").status_code == 503
        with pytest.raises(httpx.ConnectError):
            http.get(host.base_url(cid, 8001) + "/health")
    host.kill(cid, "SIGTERM")
    assert host.state(cid).exit_code == 143
    with host.http_client(cid) as http, pytest.raises(httpx.ConnectError):
        http.get(host.base_url(cid, 8000) + "/health")
    host.remove(cid)


# -- (b) measurement in virtual time -------------------------------------------------------------
SHAPES = {"incumbent": {}, "prefetch-off": {"expert-prefetch": ABSENT}, "mtp6": {"speculative-config": MTP6}}


@pytest.mark.parametrize("name", list(SHAPES))
def test_measure_reproduces_the_landscape_decode(host, tmp_path, name):
    shape = make_shape(host.image_ref, tmp_path, {"SIMENGINE_NOISE": "0"})
    for lever, value in SHAPES[name].items():
        shape = shape.with_change(lever, value)
    values, plan, land = engine_view(shape)
    want = planner.decode_rates(land, values, plan)
    if name == "incumbent":
        assert want == pytest.approx({166: 26.80, 1087: 25.15, 4064: 26.81})
    t0, v0 = time.perf_counter(), host.now()
    r, m = boot(host, shape, tmp_path, name, SHAPES[name], measure=MeasurePlan())
    assert r.ready and m.outcome == "measured", (r.outcome, m and m.reason)
    for depth in (166, 1087, 4064):
        assert m.depths[depth].median_decode_tok_s == pytest.approx(want[depth], rel=0.01), depth
        assert all(x.valid and x.completion_tokens == 256 for x in m.depths[depth].runs)
    assert m.depths[4064].median_ttft_s == pytest.approx(0.05 + 4064 / 3100, rel=0.01)
    if name != "prefetch-off":
        assert m.acceptance == pytest.approx(planner.acceptance(land, values), abs=0.06)
    assert m.wall_s > 60                            # 10 runs of 64..256 tokens at ~13-40 tok/s
    # virtual: the real time taken is a fraction of the > 60 s simulated (load only slows it)
    assert time.perf_counter() - t0 < m.wall_s / 4 and host.now() - v0 > m.wall_s


def test_whole_measurement_is_virtual_time(host, tmp_path):
    shape = make_shape(host.image_ref, tmp_path)           # the landscape's noise (~ +-1 tok/s)
    with boot_arm(host, shape, PROFILE, campaign="sim-tests", arm="m", folder=tmp_path / "m",
                  limits=LIMITS) as (result, b):
        assert result.ready
        with host.http_client(b.cid, timeout=300) as http:
            t0, v0 = time.perf_counter(), host.now()
            m = measure_engine(b.base_url, MeasurePlan(), API, http=http, clock=host.now)
            wall = time.perf_counter() - t0
    assert m.outcome == "measured"
    assert host.now() - v0 == pytest.approx(m.wall_s)
    assert 85 < m.wall_s < 120                      # ~256 tokens at ~27 tok/s, 9 times, + warm
    assert wall < m.wall_s / 8, wall                # a fraction of the virtual 85-120 s
    for depth, true in {166: 26.80, 1087: 25.15, 4064: 26.81}.items():
        assert m.depths[depth].median_decode_tok_s == pytest.approx(true, abs=1.5)


def test_telemetry_window_files_and_stop_profile_hang_hit_the_read_timeout(host, tmp_path):
    pc = {"profiler": "torch", "torch_profiler_dir": "/profiles", "torch_profiler_with_stack": False}
    cmd = ("/models/sim", "--tensor-parallel-size", "2", "--max-num-seqs", "4", "--profiler-config", json.dumps(pc))
    env = (("R4D_LRU_TELEMETRY", "1"), ("SIMENGINE_TIME_SCALE", "0.01"))
    cid = host.start(ContainerSpec(image=host.image_ref, name="tel", command=cmd, env=env))
    host.wait(cid, 10)
    url = host.base_url(cid, 8000)
    with host.http_client(cid, timeout=120) as http:
        assert http.get(url + "/health").status_code == 200
        assert http.post(url + "/start_profile").status_code == 200
        assert http.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 41}).status_code == 200
        assert http.post(url + "/stop_profile").status_code == 200
    got = sorted(p.name for p in host.copy_out(cid, "/profiles", tmp_path / "out"))
    assert got == ["expert_cache_rank0.json", "expert_cache_rank1.json"]
    rep = json.loads((tmp_path / "out" / "profiles" / "expert_cache_rank1.json").read_text())
    assert rep["steps"] == 40 and rep["rank"] == 1
    host.remove(cid)
    stacked = ContainerSpec(image=host.image_ref, name="stack", env=(("SIMENGINE_TIME_SCALE", "1"),),
                            command=("/models/sim", "--max-num-seqs", "4",
                                     "--profiler-config", json.dumps({**pc, "torch_profiler_with_stack": True})))
    cid = host.start(stacked)
    host.wait(cid, 600)
    url = host.base_url(cid, 8000)
    with host.http_client(cid, timeout=120) as http:
        t0 = host.now()
        with pytest.raises(httpx.ReadTimeout):           # the 660 s hang of with_stack
            http.post(url + "/stop_profile")
        assert host.now() - t0 == pytest.approx(120)
    host.remove(cid)


def test_stall_fault_is_a_stall_after_the_idle_timeout(host, tmp_path):
    shape = make_shape(host.image_ref, tmp_path, {"SIMENGINE_FAULT": "stall"})
    r, m = boot(host, shape, tmp_path, "stall", measure=MeasurePlan(depths=(166,), runs=2, idle_timeout_s=60))
    assert r.ready and m.outcome == "invalid" and not m.warm.valid
    assert all(x.reason.startswith("stall: no data for 60 s") for x in m.depths[166].runs)
    assert m.wall_s == pytest.approx(3 * (60 + 0.05 + 166 / 3100 + 8 / 26.80), rel=0.05)


# -- (c) agreement with the real podman host ------------------------------------------------------
AGREE = {"incumbent": ({}, "ready"), "prefetch-off": ({"expert-prefetch": ABSENT}, "ready"),
         "seqs-2": ({"max-num-seqs": 2}, "constraint-violation"),
         "util-0.99": ({"gpu-memory-utilization": 0.99}, "insufficient-memory-for-utilization")}
AGREE_ENV = {"SIMENGINE_TIME_SCALE": "0.002", "SIMENGINE_DECODE_SCALE": "4", "SIMENGINE_NOISE": "0",
             "SIMENGINE_NOISE_SEED": "7"}    # the same draws (spec acceptance) on both hosts
REPORT_FIELDS = ("outcome", "exit_code", "evidence", "plan", "kv_pool_tokens", "max_concurrency",
                 "compile_cache_hit", "non_default_args", "model_load_s", "dynamo_s", "compile_graph_s",
                 "graph_capture_s", "failure_detail")


@pytest.mark.podman
@pytest.mark.parametrize("name", list(AGREE))
def test_simhost_agrees_with_podman(podman_host, sim_image, tmp_path, name):
    from tests.conftest import free_port

    changes, cls = AGREE[name]
    plan = MeasurePlan(depths=(166,), runs=1, max_tokens=64)
    got = {}
    port = free_port()
    with SimHost() as sim:
        for which, h, image in (("podman", podman_host, sim_image.ref), ("sim", sim, sim.image_ref)):
            shape = make_shape(image, tmp_path / which, AGREE_ENV, port=port)
            for lever, value in changes.items():
                shape = shape.with_change(lever, value)
            limits = BootLimits(timeout_s=60, hang_s=20, poll_s=0.2)
            got[which] = boot(h, shape, tmp_path / which, name, changes, limits=limits, measure=plan)
    (pr, pm), (sr, sm) = got["podman"], got["sim"]
    assert pr.outcome == sr.outcome == cls, (pr.report.evidence, sr.report.evidence)
    for f in REPORT_FIELDS:
        assert getattr(sr.report, f) == getattr(pr.report, f), f
    if cls == "ready":
        p, s = pm.depths[166].median_decode_tok_s, sm.depths[166].median_decode_tok_s
        assert s == pytest.approx(p, rel=0.03), (p, s)
        assert sm.acceptance == pytest.approx(pm.acceptance, abs=0.02) if pm.acceptance else sm.acceptance is None


def test_a_simulated_night_never_probes_the_real_machine_and_keeps_simulated_time(tmp_path, monkeypatch):
    """The Host seam: probes and the clock go through the host. A simulated night must not sample
    this machine's RAM/VRAM nor scan its kernel log, and its journal times are the simulation's."""
    import host.probes as probes
    from host.simhost import EPOCH
    from tests.test_campaign_sim import campaign
    from tuner.night.campaign import load_campaign
    from tuner.night.readback import read_records
    from tuner.night.loop import CampaignLoop

    def forbidden(*a, **k):
        raise AssertionError("a simulated night touched the real machine's probes")

    monkeypatch.setattr(probes.ProbeSampler, "__init__", forbidden)
    monkeypatch.setattr(probes, "kernel_oom_kills", forbidden)
    monkeypatch.setattr(probes, "detect_vram_reader", forbidden)
    camp, host = SimHost.pinned(load_campaign(campaign(tmp_path, "seam", budget={"max_arms": 3})))
    t0 = time.time()
    CampaignLoop(camp, host, load_profile("simengine"), max_arms=3).run()
    wall = time.time() - t0
    recs = read_records(camp.folder / "journal.jsonl")
    ends = [r for r in recs if r["op"] == "arm_end"]
    assert len(ends) == 3 and all(e["probes"]["summary"]["kernel_log"] == "not scanned (simulated host)" for e in ends)
    assert all(e["probes"]["summary"]["container"]["status"] for e in ends)       # the simulated container's state
    ts = [r["t"] for r in recs]
    assert ts == sorted(ts) and EPOCH.timestamp() <= ts[0]
    assert ts[-1] - ts[0] > max(600.0, 10 * wall)          # hours of simulated boots, not the seconds it took
    assert abs((ts[-1] - ts[0]) - host.now()) < 1.0

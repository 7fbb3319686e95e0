"""Equal conditions for every boot (issue 19, Build 4, the run-level part): each measured run
records the box during it; a run taken while another process held the box is marked
``contended`` and the night's comparisons leave it out, counting it."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from arms.conditions import FOREIGN_CORES_LIMIT, NoConditions, contention, foreign_cores, rest_load
from arms.measure import Measurement, MeasurePlan
from host import conditions as hc
from host.simhost import SimHost
from simengine import realbox
from simengine.cli import known_flags
from simengine.landscape import DEFAULT_LANDSCAPE, LandscapeError, load_landscape
from tests.test_simhost import boot, make_shape

QUIET = {"SIMENGINE_NOISE": "0"}
ONE_DEPTH = MeasurePlan(depths=(166,), runs=4, warm_tokens=0, max_tokens=64)

# -- the marking, a pure function -------------------------------------------------------------
MARKS = [
    ({"foreign_cores": 0.0}, False),
    ({"foreign_cores": 0.03, "load_avg": [0.4, 0.3, 0.2]}, False),      # an idle box: kernel threads
    ({"foreign_cores": 0.49}, False),
    ({"foreign_cores": 0.5}, True),                                     # the limit itself marks
    ({"foreign_cores": 1.02}, True),                                    # a core-burner
    ({"foreign_cores": None}, False),                                   # unreadable never marks
    ({"foreign_cores": True}, False),                                   # not a figure
    ({"foreign_cores": 0.1, "foreign_gpu": []}, False),
    ({"foreign_cores": 0.1, "foreign_gpu": [[4711, "python3"]]}, True),  # somebody else on the GPU
    ({}, False),
    (None, False),                                                      # not probed: an old record
]


@pytest.mark.parametrize("cond, marked", MARKS, ids=[str(m[0])[:40] for m in MARKS])
def test_which_runs_are_marked_contended(cond, marked):
    why = contention(cond)
    assert (why is not None) == marked
    if cond and cond.get("foreign_gpu"):
        assert "pid 4711 (python3)" in why
    elif marked:
        assert f">= {FOREIGN_CORES_LIMIT:g}" in why


BACKGROUND = [          # (foreign cores in the run, the box's load at rest, marked)
    (1.02, 0.0, True),      # a core-burner that came after the night began
    (1.02, 1.0, False),     # ... one that was there at rest: the box's own load, on both sides
    (1.49, 1.0, False),
    (1.5, 1.0, True),       # the limit above the background marks
    (2.0, 1.0, True),       # a second process on top of the box's own
    (0.6, -0.2, True),      # a negative background (a counter's granularity) is 0
]


@pytest.mark.parametrize("cores, rest, marked", BACKGROUND)
def test_a_run_is_contended_only_above_the_boxs_load_at_rest(cores, rest, marked):
    why = contention({"foreign_cores": cores}, background=rest)
    assert (why is not None) == marked
    if marked and rest > 0:
        assert f">= {FOREIGN_CORES_LIMIT + rest:g}" in why and f"{rest:.2f} at rest" in why


def test_the_load_at_rest_is_the_quietest_window():
    assert rest_load([1.1, 0.98, 2.7, 1.02]) == 0.98        # a burst in one window is not the box's load
    assert rest_load([None, 0.04]) == 0.04
    assert rest_load([None, None]) is None and rest_load([]) is None


def test_the_real_box_at_rest_reads_a_core_burner_started_before_it(tmp_path):
    """A process busy on one core before the night: the real reading sees about one core (this
    process's own CPU time is not counted); an idle wait in this process adds nothing."""
    import subprocess
    import sys

    idle = hc.read_rest_load(0.4, windows=2)
    assert idle["source"] == "psutil" and len(idle["samples"]) == 2
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        busy = hc.read_rest_load(1.0, windows=2)
    finally:
        burner.kill()
        burner.wait()
    assert busy["cores"] is not None and busy["cores"] >= 0.6          # the burner's core (it shares 2 cores)
    assert busy["cores"] > (idle["cores"] or 0.0) + 0.4 or (idle["cores"] or 0.0) > 0.6   # a loaded CI box


def test_foreign_load_is_the_box_less_the_container_and_the_tuner():
    assert foreign_cores(busy_s=3.0, container_s=1.9, own_s=0.1, wall_s=1.0) == pytest.approx(1.0)
    assert foreign_cores(2.0, 1.99, 0.02, 1.0) == 0.0           # counter granularity: never below 0
    assert foreign_cores(1.0, 0.0, 0.0, 0.0) is None


def test_throttle_reasons_by_name():
    assert hc.throttle_names(0) == []
    assert hc.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert hc.throttle_names(0x1 | 0x10000) == ["gpu_idle", "0x10000"]


# -- the real box's readings -------------------------------------------------------------------
def _tree(tmp_path, cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return proc, root


def test_the_containers_cgroup_counter_v1_v2_and_the_root_cgroup(tmp_path):
    """cgroup v1 (runc + cgroupfs, as this project's podman service runs) and v2 (systemd's
    libpod scope); a process in the root cgroup has no counter of its own (it would be the box's)."""
    proc, root = _tree(tmp_path / "v1", "2:cpuacct:/libpod_parent/libpod-abc\n1:cpu:/libpod_parent/libpod-abc\n0::/\n",
                       {"cpuacct/libpod_parent/libpod-abc/cpuacct.usage": "2500000000\n"})
    f = hc.cgroup_cpu_file(42, root, proc)
    assert f is not None and hc.read_cgroup_cpu_s(f) == pytest.approx(2.5)
    proc, root = _tree(tmp_path / "v2", "0::/user.slice/libpod-abc.scope/container\n",
                       {"user.slice/libpod-abc.scope/container/cpu.stat": "usage_usec 1250000\nuser_usec 1000000\n"})
    f = hc.cgroup_cpu_file(42, root, proc)
    assert f is not None and hc.read_cgroup_cpu_s(f) == pytest.approx(1.25)
    proc, root = _tree(tmp_path / "root", "2:cpuacct:/\n0::/\n", {"cpuacct/cpuacct.usage": "99\n"})
    assert hc.cgroup_cpu_file(42, root, proc) is None
    assert hc.cgroup_cpu_file(7, root, proc) is None            # no such process


def test_the_real_probe_reads_this_machine(tmp_path):
    """No container (the tuner alone): every figure this machine has, none of them invented.
    The tuner's own CPU time is not foreign: a busy loop in this process stays out of it."""
    c = hc.BoxConditions(lambda: None, nvml=None)
    c.start()
    x = 0
    for i in range(300_000):                  # this process's own CPU time
        x += i * i
    d = c.stop()
    assert d["source"] == "psutil" and d["container_cpu"] == "none"
    assert isinstance(d["foreign_cores"], float) and d["foreign_cores"] >= 0
    assert d["load_avg"] is None or len(d["load_avg"]) == 3
    assert "gpu" not in d and "foreign_gpu" not in d             # no NVML asked: absent, not failed
    assert contention(d) in (None, contention(d))                # judged without error either way


def test_without_nvidia_ml_py_the_gpu_fields_are_absent_not_an_error():
    c = hc.BoxConditions(lambda: os.getpid(), nvml="auto")
    c.start()
    d = c.stop()
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert "gpu" not in d and "foreign_gpu" not in d
    assert d["source"] == "psutil"


class StandInNvml:
    """NVML's calls as nvidia-ml-py names them, for a box with no NVIDIA GPU (as gpu_holders'
    test does): GPU 0 runs the engine's process and, from the second reading on, a stranger's."""
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, engine_pid: int, stranger_pid: int):
        self.engine_pid, self.stranger_pid, self.reads = engine_pid, stranger_pid, 0

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetClockInfo(self, h, which): return {1: 1980, 2: 2619}[which]
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return 0x4
    def nvmlDeviceGetTemperature(self, h, sensor): return 51

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self.reads += 1
        procs = [self.engine_pid] + ([self.stranger_pid] if self.reads > 1 else [])
        return [type("P", (), {"pid": p, "usedGpuMemory": 1 << 30})() for p in procs]


def test_gpu_clocks_throttle_and_a_strangers_gpu_process(tmp_path):
    """The engine's own GPU process is not foreign; one outside its container marks the run."""
    import subprocess

    engine = subprocess.Popen(["sleep", "30"])
    try:
        nv = StandInNvml(engine.pid, stranger_pid=1)
        c = hc.BoxConditions(lambda: engine.pid, nvml=nv)
        c.start()
        d = c.stop()
        quiet = hc.BoxConditions(lambda: engine.pid, nvml=StandInNvml(engine.pid, stranger_pid=engine.pid))
        quiet.start()
        alone = quiet.stop()
    finally:
        engine.kill()
        engine.wait()
    assert d["gpu"] == [{"index": 0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "throttle": ["sw_power_cap"], "temp_c": 51}]
    assert [p for p, _ in d["foreign_gpu"]] == [1] and d["container_cpu"] in ("cgroup", "process tree")
    assert "another process holds the GPU: pid 1" in contention(d)
    assert alone["foreign_gpu"] == [] and contention({**alone, "foreign_cores": 0.0}) is None


# -- the landscape's tenant --------------------------------------------------------------------
BAD = [
    ("tenant: {at_hours: 1, cores: 1}\n", "tenant", "a mapping {at_hours: H, until_hours: U, cores: C, factor: F}"),
    ("tenant: {at_hours: -1, until_hours: 2, cores: 1, factor: 0.8}\n", "tenant.at_hours", "hours >= 0"),
    ("tenant: {at_hours: 2, until_hours: 1, cores: 1, factor: 0.8}\n", "tenant.until_hours", "hours after at_hours"),
    ("tenant: {at_hours: 1, until_hours: 2, cores: 'two', factor: 0.8}\n", "tenant.cores", "CPU cores >= 0"),
    ("tenant: [{at_hours: 1, until_hours: 2, cores: 1, factor: 0}]\n", "tenant[0].factor", "a positive factor"),
    ("tenant: 3\n", "tenant", "expected"),
]


@pytest.mark.parametrize("extra, key, why", BAD, ids=[b[1] for b in BAD])
def test_a_malformed_tenant_is_one_line_with_file_line_and_key(tmp_path, extra, key, why):
    p = tmp_path / "box.yaml"
    p.write_text(DEFAULT_LANDSCAPE.read_text() + "\n" + extra)
    line = len(DEFAULT_LANDSCAPE.read_text().splitlines()) + 2
    with pytest.raises(LandscapeError) as ei:
        load_landscape(p, known_flags())
    msg = str(ei.value)
    assert "\n" not in msg and f"box.yaml:{line}: key '{key}'" in msg and why in msg, msg


def test_the_tenant_as_functions():
    t = realbox.tenants({"tenant": [{"at_hours": 2, "until_hours": 3, "cores": 1.0, "factor": 0.5},
                                    {"at_hours": 1, "until_hours": 2.5, "cores": 2.0, "factor": 0.8}]})
    assert t == ((3600.0, 9000.0, 2.0, 0.8), (7200.0, 10800.0, 1.0, 0.5))
    assert [realbox.tenant_factor(t, h * 3600) for h in (0.5, 1, 2.2, 2.5, 3)] == [1.0, 0.8, pytest.approx(0.4), 0.5, 1.0]
    assert realbox.tenant_cores(t, 0, 3600) == 0.0
    assert realbox.tenant_cores(t, 1800, 5400) == pytest.approx(1.0)     # half the span, 2 cores
    assert realbox.tenant_cores(t, 7200, 7200) == 3.0                     # over no time: at t0
    assert realbox.tenants({}) == ()


def _land(tmp_path, extra: str = "") -> Path:
    p = tmp_path / "landscape-tenant.yaml"
    p.write_text(DEFAULT_LANDSCAPE.read_text() + "\n" + extra)
    return p


def _measure(host, shape, tmp_path, name):
    """One boot measured with the host's conditions probe (what the night's arm runner passes)."""
    from arms.boot import boot_arm
    from arms.measure import measure_engine
    from tests.test_simhost import API, PROFILE

    with boot_arm(host, shape, PROFILE, campaign="cond", arm=name, folder=tmp_path / name, changes={}) as (r, b):
        assert r.outcome == "ready", r.report.evidence
        with host.http_client(b.cid, timeout=300) as http:
            return measure_engine(b.base_url, ONE_DEPTH, API, http=http, clock=host.now,
                                  conditions=host.conditions(b.cid))


def test_the_simulated_tenant_slows_the_runs_and_is_reported_as_foreign_load(tmp_path):
    p = _land(tmp_path, "tenant: {at_hours: 1, until_hours: 2, cores: 1.5, factor: 0.8}\n")
    with SimHost(landscape=str(p)) as host:
        shape = make_shape(host.image_ref, tmp_path, QUIET)
        before = _measure(host, shape, tmp_path, "before")
        host.sleep(3600 - host.now() + 60)
        during = _measure(host, shape, tmp_path, "during")
        host.sleep(7200 - host.now() + 60)
        after = _measure(host, shape, tmp_path, "after")
    runs = lambda m: m.depths[166].runs                                        # noqa: E731
    assert all(r.conditions["foreign_cores"] == 0 and r.contended is None for r in runs(before) + runs(after))
    assert all(r.conditions["foreign_cores"] == 1.5 and r.conditions["source"] == "simulated" for r in runs(during))
    assert all("foreign CPU load 1.50 cores" in r.contended for r in runs(during))
    ratio = during.depths[166].median_decode_tok_s / before.depths[166].median_decode_tok_s
    assert ratio == pytest.approx(0.8, rel=0.01)
    assert after.depths[166].median_decode_tok_s == pytest.approx(before.depths[166].median_decode_tok_s, rel=0.005)
    d = during.to_dict()["depths"]["166"]["runs"][0]
    assert d["contended"] and d["conditions"]["foreign_cores"] == 1.5
    back = Measurement.from_dict(json.loads(json.dumps(during.to_dict())))
    assert back.depths[166].runs[0].contended == runs(during)[0].contended


def test_without_a_probe_a_run_carries_no_conditions_and_its_record_keeps_the_old_shape(tmp_path):
    with SimHost() as host:
        shape = make_shape(host.image_ref, tmp_path, QUIET)
        _, m = boot(host, shape, tmp_path, "plain", measure=ONE_DEPTH)
    run = m.to_dict()["depths"]["166"]["runs"][0]
    assert "conditions" not in run and "contended" not in run
    assert NoConditions().stop()["foreign_cores"] is None and contention(NoConditions().stop()) is None


# -- a simulated night with a tenant -----------------------------------------------------------
def test_a_night_leaves_out_the_runs_a_tenant_held_and_the_journal_counts_them(tmp_path):
    """A tenant on the box from hour 1 to hour 2 (1.5 cores, every rate x 0.8): every run in its
    hour is marked contended, the comparisons that pool those boots leave them out and say how
    many, and no run outside the hour is marked."""
    from arms.profiles import load_profile
    from arms.steady import steady
    from tests.test_campaign_sim import campaign
    from tuner.night.campaign import load_campaign
    from tuner.night.loop import CampaignLoop

    land = _land(tmp_path, "tenant: {at_hours: 1, until_hours: 2, cores: 1.5, factor: 0.8}\n")
    path = campaign(tmp_path, "tenant", noise={"recheck_every": 3})    # an incumbent recheck in the hour
    camp, host = SimHost.pinned(load_campaign(path), landscape=str(land), noise_seed=3)
    CampaignLoop(camp, host, load_profile("simengine"), deadline=host.now() + 3 * 3600).run()
    recs = [json.loads(x) for x in (camp.folder / "journal.jsonl").read_text().splitlines()]
    assert host.now() > 2.5 * 3600
    marked = clean = 0
    for r in recs:
        if r["op"] != "arm_end" or not r.get("measurement"):
            continue
        for dep in r["measurement"]["depths"].values():
            for run in dep["runs"]:
                f = run["conditions"]["foreign_cores"]
                assert (run.get("contended") is not None) == (f >= FOREIGN_CORES_LIMIT)
                marked += f >= FOREIGN_CORES_LIMIT
                clean += f == 0
    assert marked >= 10 and clean > marked
    rechecks = [r for r in recs if r["op"] == "arm_end" and r.get("kind") == "recheck"
                and all(run.get("contended") for d in r["measurement"]["depths"].values() for run in d["runs"])]
    assert rechecks                                             # the incumbent measured while the tenant held the box
    counted = [r["comparison"] for r in recs if r["op"] == "compare" and "contended" in r["comparison"]]
    # the incumbent boot the tenant held: its runs left out and counted (a challenger boot it held
    # counts on the other side, so not every such comparison is the incumbent's)
    assert counted and any(c["contended"][1] >= 18 for c in counted)
    # a boot the tenant held replaced its runs up to the cap; the night then waited for the box, journaled
    from tuner.night.judging import EXTEND_CAP
    from arms.conditions import QUIET_WAIT_S
    from tuner.night.opening import BUSY_NOTE

    runs = 3 * 3                                               # the campaign's 3 depths x 3 runs
    for r in rechecks:
        assert sum(len(d["runs"]) for d in r["measurement"]["depths"].values()) == EXTEND_CAP * runs
    waits = [r for r in recs if r["op"] == "note" and r.get("text") == BUSY_NOTE]
    held = {r["arm"] for r in recs if r["op"] == "arm_end" and r.get("measurement") and any(
        run.get("contended") for d in r["measurement"]["depths"].values() for run in d["runs"])}
    assert waits and {w["after_arm"] for w in waits} <= held
    assert all(w["waited_s"] <= QUIET_WAIT_S and w["cores"] == 1.5 and not w["quiet"] for w in waits)   # the hour outlasts it
    first = min(held)
    nxt = next(r for r in recs if r["op"] == "arm_start" and r["arm"] == first + 1)
    assert nxt["t"] - next(r for r in recs if r["op"] == "arm_end" and r["arm"] == first)["t"] >= QUIET_WAIT_S
    shape_of = {r["arm"]: r["identity"] for r in recs if r["op"] == "arm_start"}
    for r in recs:                  # the incumbent's valid runs so far = compared + contended + disturbed
        if r["op"] != "compare" or "contended" not in r["comparison"]:
            continue
        c = r["comparison"]
        refs = [a for b in c["blocks"] for a in b["ref"]]       # the incumbent boots its blocks span
        span = [e for e in recs if e["op"] == "arm_end" and min(refs) <= e["arm"] <= max(refs)
                and shape_of[e["arm"]] == r["incumbent"] and (e.get("measurement") or {}).get("outcome") == "measured"]
        valid = sum(run["valid"] for e in span for d in e["measurement"]["depths"].values() for run in d["runs"])
        warm = sum(steady(e["measurement"]).warmup_runs for e in span)
        assert c["runs"][1] + c["contended"][1] + (c.get("disturbed") or [0, 0])[1] + warm == valid


def test_a_load_there_all_night_is_the_boxs_own_and_no_run_is_left_out(tmp_path):
    """A tenant on the box from before the night to its end (1.0 core, rates x 0.9): the night
    reads it at rest, journals it once (a resume reads it back, never again), and judges every run
    against it: none is marked contended, the comparisons leave nothing out, and the night moves
    the incumbent as a quiet box's would. The same tenant arriving at hour 1 is still a tenant."""
    from arms.profiles import load_profile
    from tests.test_campaign_sim import campaign
    from tuner.night.campaign import load_campaign
    from tuner.night.loop import CampaignLoop

    def night(extra: str, name: str, hours: float) -> list[dict]:
        folder = tmp_path / name
        folder.mkdir()
        land = _land(folder, extra)
        path = campaign(folder, name)
        camp, host = SimHost.pinned(load_campaign(path), landscape=str(land), noise_seed=5)
        CampaignLoop(camp, host, load_profile("simengine"), deadline=host.now() + hours * 3600).run()
        camp, host = SimHost.pinned(load_campaign(path), landscape=str(land), noise_seed=6)   # a resume
        CampaignLoop(camp, host, load_profile("simengine"), deadline=host.now() + hours * 3600 + 1800).run()
        return [json.loads(x) for x in (camp.folder / "journal.jsonl").read_text().splitlines()]

    def runs(recs):
        return [run for r in recs if r["op"] == "arm_end" and r.get("measurement")
                for d in r["measurement"]["depths"].values() for run in d["runs"]]

    allnight = night("tenant: {at_hours: 0, until_hours: 99, cores: 1.0, factor: 0.9}\n", "allnight", 2)
    rest = [r for r in allnight if r["op"] == "note" and r.get("text") == "box at rest"]
    assert len(rest) == 1 and rest[0]["cores"] == 1.0 and rest[0]["source"] == "simulated"
    assert all(r.get("text") != "box at rest" or r["seq"] == rest[0]["seq"] for r in allnight)
    got = runs(allnight)
    assert len(got) >= 30 and all(run["conditions"]["foreign_cores"] == 1.0 for run in got)
    assert not any(run.get("contended") for run in got)
    assert not [r for r in allnight if r["op"] == "compare" and "contended" in r["comparison"]]
    assert [r for r in allnight if r["op"] == "incumbent"]          # the night still decides

    later = night("tenant: {at_hours: 1, until_hours: 99, cores: 1.0, factor: 0.9}\n", "later", 2)
    rest = [r for r in later if r["op"] == "note" and r.get("text") == "box at rest"]
    assert len(rest) == 1 and rest[0]["cores"] == 0.0
    assert any(run.get("contended") for run in runs(later))         # it came after the box was read at rest


def test_a_passing_tenant_is_waited_out_and_the_next_boot_is_clean(tmp_path):
    """A tenant for 15 minutes (1.5 cores): the boot it met replaces the runs it held while it
    stays (more than the plan's runs); the night then reads the box, waits until it is quiet
    (journaled, ``quiet: true``, under the cap) and the next boot measures with nothing left out."""
    from arms.profiles import load_profile
    from tests.test_campaign_sim import campaign
    from tuner.night.campaign import load_campaign
    from tuner.night.loop import CampaignLoop
    from arms.conditions import QUIET_WAIT_S
    from tuner.night.opening import BUSY_NOTE

    land = _land(tmp_path, "tenant: {at_hours: 0.9, until_hours: 1.15, cores: 1.5, factor: 0.8}\n")
    path = campaign(tmp_path, "passing")
    camp, host = SimHost.pinned(load_campaign(path), landscape=str(land), noise_seed=3)
    CampaignLoop(camp, host, load_profile("simengine"), deadline=host.now() + 2 * 3600).run()
    recs = [json.loads(x) for x in (camp.folder / "journal.jsonl").read_text().splitlines()]
    ends = {r["arm"]: r for r in recs if r["op"] == "arm_end" and r.get("measurement")}

    def held(e):
        return sum(bool(run.get("contended")) for d in e["measurement"]["depths"].values() for run in d["runs"])

    waits = [r for r in recs if r["op"] == "note" and r.get("text") == BUSY_NOTE]
    assert len(waits) == 1 and waits[0]["quiet"] and 0 < waits[0]["waited_s"] < QUIET_WAIT_S
    met = waits[0]["after_arm"]
    assert held(ends[met]) > 0 and sum(len(d["runs"]) for d in ends[met]["measurement"]["depths"].values()) > 2 * 9
    assert held(ends[met + 1]) == 0 and sum(held(e) for n, e in ends.items() if n != met) == 0


def test_a_night_told_not_to_wait_goes_on_at_once_after_a_held_boot(tmp_path):
    """``measure.quiet_wait_s: 0`` (a test night on a shared machine, a demo): the boot the tenant
    met still replaces its held runs, but the night journals no wait and boots the next arm at once."""
    from arms.profiles import load_profile
    from tests.test_campaign_sim import campaign
    from tuner.night.campaign import load_campaign
    from tuner.night.loop import CampaignLoop
    from tuner.night.opening import BUSY_NOTE, QUIET_POLL_S

    land = _land(tmp_path, "tenant: {at_hours: 0.9, until_hours: 1.15, cores: 1.5, factor: 0.8}\n")
    path = campaign(tmp_path, "nowait", measure={"quiet_wait_s": 0})
    camp = load_campaign(path)
    assert camp.quiet_wait_s == 0 and load_campaign(campaign(tmp_path, "default")).quiet_wait_s == 600
    camp, host = SimHost.pinned(camp, landscape=str(land), noise_seed=3)
    CampaignLoop(camp, host, load_profile("simengine"), deadline=host.now() + 2 * 3600).run()
    recs = [json.loads(x) for x in (camp.folder / "journal.jsonl").read_text().splitlines()]
    held = [r["arm"] for r in recs if r["op"] == "arm_end" and r.get("measurement") and any(
        run.get("contended") for d in r["measurement"]["depths"].values() for run in d["runs"])]
    assert held and not [r for r in recs if r["op"] == "note" and r.get("text") == BUSY_NOTE]
    end = next(r["t"] for r in recs if r["op"] == "arm_end" and r["arm"] == held[0])
    nxt = next(r["t"] for r in recs if r["op"] == "arm_start" and r["arm"] == held[0] + 1)
    assert nxt - end < QUIET_POLL_S

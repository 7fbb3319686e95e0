"""Host probes: the background sampler, VRAM readers, OOM detection, the link probe."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from arms.host import ContainerState
from host.fake import FakeHost
from host.linkprobe import link_probe_gbs
from host.probes import (ProbeSampler, SysfsReader, detect_vram_reader, for_container,
                         kernel_oom_kills, parse_oom_lines, tree_rss)

GIB = 1 << 30
SEED_OOM = ("[Mon Sep 29 03:12:44 2026] Out of memory: Killed process 48211 (VLLM::EngineCor) "
            "total-vm:180123456kB, anon-rss:95200000kB, file-rss:1024kB, shmem-rss:0kB, UID:1000 "
            "pgtables:190000kB oom_score_adj:0")


def fake_sysfs(root, cards):
    for i, (used, total) in enumerate(cards):
        d = root / f"card{i}" / "device"
        d.mkdir(parents=True)
        (d / "mem_info_vram_used").write_text(f"{used}\n")
        (d / "mem_info_vram_total").write_text(f"{total}\n")
    (root / "renderD128").mkdir()                             # not a card: ignored


def run_for(sampler: ProbeSampler, seconds: float) -> ProbeSampler:
    with sampler:
        time.sleep(seconds)
    return sampler


def test_samples_carry_timestamps_ram_swap_and_the_process_tree_rss(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        s = run_for(ProbeSampler(os.getpid, interval_s=0.05, kernel_log=False,
                                 sysfs_root=tmp_path), 0.6)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    ss = s.samples()
    assert len(ss) >= 4
    assert all(b.t > a.t for a, b in zip(ss, ss[1:]))
    assert abs(ss[0].t - time.time()) < 60                    # epoch seconds by default
    assert all(x.ram_available_bytes > 0 and x.swap_used_bytes >= 0 for x in ss)
    assert all(x.engine_rss_bytes and x.engine_procs >= 2 for x in ss)   # this process + the child
    assert all(x.vram is None for x in ss)
    sm = s.summary()
    assert sm["samples"] == len(ss) and sm["vram"] == "n/a" and sm["vram_source"] == "n/a"
    assert sm["engine_rss_peak_bytes"] >= max(x.engine_rss_bytes for x in ss[:1])
    assert sm["ram_available_min_bytes"] <= sm["ram_available_first_bytes"]
    # the sampler measures its own CPU time; a loose sanity bound only (it is reported, not tuned)
    assert 0 <= sm["sampler_cpu_percent_of_core"] < 50 and sm["sampler_cpu_s"] > 0
    d = s.to_dict()
    json.dumps(d)
    assert d["samples"][0]["vram"] == "n/a" and d["samples"][0]["t"] == ss[0].t


def test_no_pid_gives_no_rss_and_a_failing_provider_never_breaks_the_sampler(tmp_path):
    s = run_for(ProbeSampler(lambda: None, interval_s=0.05, kernel_log=False, sysfs_root=tmp_path), 0.2)
    assert s.samples() and all(x.engine_rss_bytes is None for x in s.samples())
    assert s.summary()["engine_rss_peak_bytes"] is None

    def boom():
        raise RuntimeError("podman went away")
    s = run_for(ProbeSampler(boom, interval_s=0.05, kernel_log=False, sysfs_root=tmp_path), 0.2)
    assert s.samples() and s.samples()[0].engine_rss_bytes is None
    assert tree_rss(2 ** 22 + 12345) == (None, 0)             # no such process


def test_sysfs_vram_reader_and_peaks(tmp_path):
    fake_sysfs(tmp_path, [(5 * GIB, 32 * GIB), (7 * GIB, 32 * GIB)])
    r = detect_vram_reader(tmp_path)
    assert isinstance(r, SysfsReader) and [g.used_bytes for g in r.read()] == [5 * GIB, 7 * GIB]
    with ProbeSampler(None, interval_s=0.05, kernel_log=False, sysfs_root=tmp_path) as s:
        time.sleep(0.15)
        (tmp_path / "card1" / "device" / "mem_info_vram_used").write_text(f"{30 * GIB}\n")
        time.sleep(0.15)
    sm = s.summary()
    assert sm["vram_source"] == "sysfs"
    assert sm["vram"]["gpu0"] == {"used_peak_bytes": 5 * GIB, "total_bytes": 32 * GIB}
    assert sm["vram"]["gpu1"]["used_peak_bytes"] == 30 * GIB
    assert detect_vram_reader(tmp_path / "nothing") is None   # no NVML/AMD SMI here either


def test_container_oom_killed_and_exit_137_are_reported(tmp_path):
    states = iter([ContainerState("exited", 137, oom_killed=True, pid=None)])
    s = run_for(ProbeSampler(None, interval_s=0.05, kernel_log=False, sysfs_root=tmp_path,
                             state_provider=lambda: next(states)), 0.1)
    sm = s.summary()
    assert sm["container"] == {"status": "exited", "exit_code": 137, "oom_killed": True}
    assert [k["source"] for k in sm["oom_kills"]] == ["container"] and sm["oom_kills"][0]["line"] == "OOMKilled"
    s = run_for(ProbeSampler(None, interval_s=0.05, kernel_log=False, sysfs_root=tmp_path,
                             state_provider=lambda: ContainerState("exited", 137)), 0.1)
    assert "exit 137" in s.summary()["oom_kills"][0]["line"]
    s = run_for(ProbeSampler(None, interval_s=0.05, kernel_log=False, sysfs_root=tmp_path,
                             state_provider=lambda: ContainerState("running", pid=None)), 0.1)
    assert s.summary()["oom_kills"] == []


def test_for_container_reads_pid_and_state_from_the_host(tmp_path):
    host = FakeHost(images={"sim:1": "sha256:" + "a" * 64})
    from arms.host import ContainerSpec
    cid = host.start(ContainerSpec(image="sim@sha256:" + "a" * 64, command=(), name="x"))
    s = run_for(for_container(host, cid, interval_s=0.05, kernel_log=False, sysfs_root=tmp_path), 0.1)
    assert s.summary()["container"]["status"] == "running"   # FakeHost pid 4242 is not a real process
    assert all(x.engine_rss_bytes is None or x.engine_procs >= 1 for x in s.samples())


def test_oom_lines_parse_and_the_kernel_scan_never_fails(tmp_path, monkeypatch):
    kills = parse_oom_lines("noise\n" + SEED_OOM + "\nmore noise", "journalctl")
    assert len(kills) == 1
    k = kills[0]
    assert (k.pid, k.comm, k.anon_rss_kb, k.source) == (48211, "VLLM::EngineCor", 95200000, "journalctl")
    assert parse_oom_lines("Out of memory: Killed process 7 (x)", "dmesg")[0].anon_rss_kb is None
    found, source = kernel_oom_kills(time.time() - 60)        # whatever this box allows
    assert isinstance(found, list) and isinstance(source, str)
    monkeypatch.setenv("PATH", str(tmp_path))                 # no journalctl, no dmesg, no kmsg
    found, source = kernel_oom_kills(time.time(), kmsg=str(tmp_path / "no-kmsg"))
    assert found == [] and source.startswith("unreadable: ") and "journalctl" in source


def test_kernel_scan_runs_at_stop(tmp_path):
    s = run_for(ProbeSampler(None, interval_s=0.05, sysfs_root=tmp_path), 0.1)
    assert s.summary()["kernel_log"] != "not scanned"


def test_link_probe_returns_none_without_a_gpu_runtime_or_a_rate():
    gbs = link_probe_gbs(iters=20)
    assert gbs is None or gbs > 0

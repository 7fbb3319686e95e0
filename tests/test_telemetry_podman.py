"""The telemetry window on the simulated engine in podman: the real /start_profile and
/stop_profile, the real file copy out of the container (issue 5)."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from arms.boot import BootLimits, boot_arm
from arms.profiles import load_profile
from arms.prompts import PromptCache, api_from_profile
from arms.shape import ABSENT, Shape
from arms.telemetry import (TELEMETRY_ENV, apply_telemetry, expected_ranks, slab_bytes_from_plan,
                            telemetry_window)
from host.probes import for_container
from tests.conftest import free_port

pytestmark = pytest.mark.podman
PROFILE = load_profile("simengine")
API = api_from_profile(PROFILE)
LIMITS = BootLimits(timeout_s=120, hang_s=60, poll_s=0.2)
ARGS = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
        "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4, "enable-prefix-caching": True,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
ENV = {"R4D_LRU_GATHER_CHUNKS": "8", "R4D_LRU_GATHER_LANES": "16", "SIMENGINE_TIME_SCALE": "0.002",
       "SIMENGINE_DECODE_SCALE": "8", "SIMENGINE_NOISE": "0"}
SLAB = 2_457_862
LANDSCAPE_WASTE_GB = 45 * (8.0 - 2.913) * SLAB / 1e9      # seed-002.yaml prefetch_on, per step and rank


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("compile-cache")


@pytest.fixture
def base(sim_image, cache) -> Shape:
    return Shape.from_mapping({"image": sim_image.ref, "model": "/models/sim", "args": ARGS,
                               "env": ENV, "compile_cache": str(cache), "port": free_port()})


def run_arm(host, shape, tmp_path, name, **window_kw):
    """Boot, sample the host, run one telemetry window, tear down; (result, boot, sampler, cid)."""
    with boot_arm(host, shape, PROFILE, campaign="telemetry-tests", arm=name,
                  folder=tmp_path / name, limits=LIMITS) as (boot, b):
        assert boot.ready, boot.report.evidence
        with for_container(host, b.cid, interval_s=0.5) as probes, \
                host.http_client(b.cid, timeout=30) as http:
            t0 = time.monotonic()
            res = telemetry_window(host, b.cid, b.base_url, http, API, PROFILE, depth=166,
                                   requests=3, max_tokens=64, dest_dir=tmp_path / name / "telemetry",
                                   ranks=expected_ranks(shape),
                                   slab_bytes=slab_bytes_from_plan(boot.report.plan),
                                   prompts=PromptCache(), **window_kw)
            res.wall = time.monotonic() - t0
        cid = b.cid
    return res, boot, probes, cid


def test_prefetch_on_arm_reports_36_percent_and_the_waste(podman_host, base, tmp_path):
    shape = apply_telemetry(base, PROFILE)
    res, boot, probes, cid = run_arm(podman_host, shape, tmp_path, "tel-on", stop_timeout_s=30)
    assert podman_host.state(cid).status == "missing"
    assert res.status == "ok", res.reason
    assert [p.rsplit("/", 1)[-1] for p in res.files] == ["expert_cache_rank0.json", "expert_cache_rank1.json"]
    rep = res.report
    assert sorted(rep.ranks) == [0, 1] and rep.ranks[0].steps > 10
    assert rep.ranks[0].slab_bytes == pytest.approx(slab_bytes_from_plan(boot.report.plan), abs=2)
    assert round(rep.totals.precision * 100) == 36
    assert rep.wasted_gb_per_step_per_rank == pytest.approx(LANDSCAPE_WASTE_GB, rel=0.03)
    assert res.findings()[0].startswith("prefetch precision 36 %: ~0.56 GB per step wasted per rank")
    assert [x.layer for x in rep.ranks[1].kind("resident")] == [0, 1, 2]
    assert res.decode_tok_s and res.acceptance is not None
    sm = probes.summary()
    assert sm["samples"] >= 2 and all(s.t for s in probes.samples())
    assert sm["engine_rss_peak_bytes"] and sm["engine_rss_peak_bytes"] > 1 << 20   # the container's tree
    assert sm["container"]["status"] == "running" and sm["oom_kills"] == []
    print(f"\n[tel-on] {rep.findings()[0]} | sampler {sm['sampler_cpu_percent_of_core']} % of a core")


def test_prefetch_off_arm_reports_no_prefetch_traffic(podman_host, base, tmp_path):
    shape = apply_telemetry(base.with_change("expert-prefetch", ABSENT), PROFILE)
    res, _, _, cid = run_arm(podman_host, shape, tmp_path, "tel-off", stop_timeout_s=30)
    assert res.status == "ok", res.reason
    assert res.report.totals.prefetched == 0 and res.report.totals.served_by_prefetch == 0
    assert res.report.findings()[0] == "no prefetch traffic: 0 slabs prefetched (prefetch off)"
    assert podman_host.state(cid).status == "missing"


def test_hanging_stop_profile_ends_at_its_timeout_and_the_container_goes(podman_host, base, tmp_path):
    # torch_profiler_with_stack true (apply_telemetry refuses it): the stop hangs 660 s x scale
    scale = 30 / 660
    shape = base.with_change("env." + TELEMETRY_ENV, "1").with_change(
        "profiler-config", {"profiler": "torch", "torch_profiler_dir": "/profiles",
                            "torch_profiler_with_stack": True})
    shape = replace(shape, env=tuple(sorted({**dict(shape.env), "SIMENGINE_TIME_SCALE": f"{scale:.5f}"}.items())))
    res, _, _, cid = run_arm(podman_host, shape, tmp_path, "tel-hang", stop_timeout_s=3)
    assert res.status == "stop-timeout", (res.status, res.reason)
    assert "did not answer within 3 s" in res.reason
    assert 2.5 <= res.stop_s < 10                              # ended at its timeout, not the ~30 s hang
    assert res.wall < 25
    assert res.report is None
    assert podman_host.state(cid).status == "missing"

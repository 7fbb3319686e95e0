"""Booting arms on the real podman service with the simulated engine (issue 3)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import yaml

from arms.boot import BootLimits, boot_arm
from arms.host import LABEL_CAMPAIGN
from arms.lifecycle import sweep_orphans
from arms.profiles import load_profile
from arms.shape import Mount, Shape
from simengine import planner
from simengine.cli import build_parser, known_flags, shape_values
from simengine.landscape import DEFAULT_LANDSCAPE, load_landscape
from tests.conftest import REPO, assert_plan_matches, free_port, sigterm_once_booting

pytestmark = pytest.mark.podman
PROFILE = load_profile("vllm-expert-offload")
LIMITS = BootLimits(timeout_s=60, hang_s=20, poll_s=0.2)
ARGS = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
        "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4, "enable-prefix-caching": True,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
ENV = {"R4D_LRU_GATHER_CHUNKS": "8", "R4D_LRU_GATHER_LANES": "16", "SIMENGINE_TIME_SCALE": "0.002"}


@pytest.fixture
def base(sim_image, tmp_path) -> Shape:
    (tmp_path / "cache").mkdir()
    return Shape.from_mapping({"image": sim_image.ref, "model": "/models/sim", "args": ARGS, "env": ENV,
                               "compile_cache": str(tmp_path / "cache"), "port": free_port()})


def boot(podman_host, shape, tmp_path, name, changes=None):
    with boot_arm(podman_host, shape, PROFILE, campaign="boot-tests", arm=name, folder=tmp_path / name,
                  changes=changes or {}, limits=LIMITS) as (result, b):
        cid = b.cid
    assert podman_host.state(cid).status == "missing", "the container outlived its arm"
    return result


def test_good_shape_boots_and_its_plan_parses_to_the_landscape_numbers(podman_host, base, tmp_path):
    r = boot(podman_host, base, tmp_path, "good")
    assert r.outcome == "ready", r.report.evidence
    parser = build_parser()
    argv = ["serve", "/models/sim"] + [x for k, v in ARGS.items() for x in
                                       ([f"--{k}"] if v is True else [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)])]
    land = load_landscape(None, known_flags(parser))
    want = planner.make_plan(land, shape_values(parser.parse_args(argv), parser, ENV))
    assert_plan_matches(r.report, want)


FAILING = [
    ("util-0.99", "gpu-memory-utilization", 0.99, "insufficient-memory-for-utilization"),
    ("seqs-2", "max-num-seqs", 2, "constraint-violation"),
    ("seqs-6", "max-num-seqs", 6, "kv-too-small"),
    ("262144-on-2gib", "max-model-len", 262144, "kv-too-small"),
    ("pool-11g-oom", "kv-cache-memory-bytes", 31000000000, "oom"),
    ("ngram", "speculative-config", {"method": "ngram", "num_speculative_tokens": 4}, "engine-init-failed"),
    ("bad-flag", "expert-prefetch-depth", 2, "bad-argument"),
]


@pytest.mark.parametrize("name,lever,value,cls", FAILING, ids=[f[0] for f in FAILING])
def test_each_failing_shape_is_classified(podman_host, base, tmp_path, name, lever, value, cls):
    r = boot(podman_host, base.with_change(lever, value), tmp_path, name, {lever: value})
    assert r.outcome == cls, (r.report.outcome, r.report.evidence)
    assert r.report.exit_code in (1, 2)
    assert r.report.evidence


def test_sigkill_from_outside_mid_boot_is_host_oom_killed_and_removed(podman_host, base, tmp_path):
    import threading

    slow = replace(base, env=tuple(sorted({**dict(base.env), "SIMENGINE_TIME_SCALE": "0.05"}.items())))
    killed = []

    def killer():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not killed:
            for cid, lab in podman_host.list_managed({LABEL_CAMPAIGN: "kill-tests"}):
                podman_host.kill(cid, "SIGKILL")      # what the kernel OOM killer does
                killed.append(cid)
            time.sleep(0.3)

    t = threading.Thread(target=killer)
    t.start()
    with boot_arm(podman_host, slow, PROFILE, campaign="kill-tests", arm="killed", folder=tmp_path / "k",
                  limits=LIMITS) as (result, b):
        cid = b.cid
    t.join()
    assert killed == [cid]
    assert result.report.exit_code == 137
    assert result.outcome == "host-oom-killed", result.report.evidence
    assert podman_host.state(cid).status == "missing"


def test_dropped_flag_is_flagged(podman_host, base, tmp_path):
    land = tmp_path / "drop.yaml"
    land.write_text(DEFAULT_LANDSCAPE.read_text() + "\nignored_flags: [expert-precise-memory]\n")
    shape = replace(base, mounts=base.mounts + (Mount(str(land), "/landscape.yaml", True),),
                    env=tuple(sorted({**dict(base.env), "SIMENGINE_LANDSCAPE": "/landscape.yaml"}.items())))
    r = boot(podman_host, shape.with_change("expert-precise-memory", True), tmp_path, "dropped",
             {"expert-precise-memory": True})
    assert r.report.outcome == "ready"
    assert r.outcome == "flag-not-applied" and r.not_applied == ["expert-precise-memory"]
    ok = boot(podman_host, shape.with_change("max-num-batched-tokens", 2048), tmp_path, "landed",
              {"max-num-batched-tokens": 2048})
    assert ok.outcome == "ready" and ok.report.non_default_args["max_num_batched_tokens"] == 2048


def test_second_boot_hits_the_compile_cache_and_is_faster(podman_host, base, tmp_path):
    slow = {**dict(base.env), "SIMENGINE_TIME_SCALE": "0.01"}
    shape = replace(base, env=tuple(sorted(slow.items())))
    cold = boot(podman_host, shape, tmp_path, "cold")
    warm = boot(podman_host, shape, tmp_path, "warm")
    assert cold.report.compile_cache_hit is False and warm.report.compile_cache_hit is True
    assert "Directly load the compiled graph(s)" in warm.log_path.read_text()
    assert warm.report.compile_s < cold.report.compile_s
    assert warm.boot_s < cold.boot_s - 1.0


def test_kill_9_of_the_tuner_mid_boot_leaves_an_orphan_the_next_start_removes(podman_host, sim_image, tmp_path):
    camp = tmp_path / "c.yaml"
    camp.write_text(yaml.safe_dump({
        "name": "orphan-test", "engine": "vllm-expert-offload",
        "baseline": {"image": sim_image.ref, "model": "/models/sim", "port": free_port(),
                     "args": {"max-num-seqs": 4}, "env": {"SIMENGINE_TIME_SCALE": "1.0"}},
        "boot": {"timeout_s": 600, "hang_s": 600, "poll_s": 0.2}, "journal": str(tmp_path / "journal")}))
    env = {**os.environ}
    p = subprocess.Popen([sys.executable, "-m", "tuner.cli", "boot", str(camp)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not podman_host.list_managed({LABEL_CAMPAIGN: "orphan-test"}):
            time.sleep(0.2)
        assert podman_host.list_managed({LABEL_CAMPAIGN: "orphan-test"}), "the boot never started"
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    orphans = podman_host.list_managed({LABEL_CAMPAIGN: "orphan-test"})
    assert len(orphans) == 1                                   # kill -9 cannot clean up...
    removed = sweep_orphans(podman_host, "orphan-test")        # ...the next start does
    assert removed == [orphans[0][0]]
    assert podman_host.list_managed({LABEL_CAMPAIGN: "orphan-test"}) == []


def test_sigterm_of_the_tuner_mid_boot_tears_down(podman_host, sim_image, tmp_path):
    camp = tmp_path / "c.yaml"
    camp.write_text(yaml.safe_dump({
        "name": "sigterm-test", "baseline": {"image": sim_image.ref, "model": "/models/sim", "port": free_port(),
                                             "env": {"SIMENGINE_TIME_SCALE": "1.0"}},
        "journal": str(tmp_path / "journal")}))
    rc, err = sigterm_once_booting(podman_host, "sigterm-test", "boot", str(camp))
    assert rc != 0
    assert "TEARDOWN" in err
    assert podman_host.list_managed({LABEL_CAMPAIGN: "sigterm-test"}) == []

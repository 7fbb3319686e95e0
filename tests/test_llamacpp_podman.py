"""llama.cpp's real llama-server as a campaign engine, in podman, by digest (issue 13).

The image is built locally from the cached binary (host/llamaimage.py); the model is a tiny
random-weight qwen3moe GGUF (tests/llamacpp_model.py) mounted read-only. Boot failures of the
real binary are reproduced one by one, and a short campaign runs end to end: baseline, a probe
that wins and its confirmation (a confirmed move: one active expert instead of four), a lever
this build rejects (bad-argument, with the engine's own line), the memory plan in the report.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from arms.boot import BootLimits, boot_arm
from arms.host import LABEL_CAMPAIGN
from arms.profiles import load_profile
from arms.shape import Shape
from tests.conftest import REPO, free_port
from tests.llamacpp_model import write_tiny_gguf

pytestmark = pytest.mark.podman
PROFILE = load_profile("llamacpp")
LIMITS = BootLimits(timeout_s=90, hang_s=60, poll_s=0.2)
BASE_ARGS = {"ctx-size": 1024, "parallel": 1, "threads": 1, "threads-batch": 1, "fit": False,
             "log-verbosity": 4, "cache-ram": 0}


@pytest.fixture(scope="session")
def llama_image(podman_host):
    from host.llamaimage import ensure_image

    return ensure_image(podman_host.client)


@pytest.fixture(scope="session")
def moe_model(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf", "qwen3moe")


@pytest.fixture(scope="session")
def moe_small(tmp_path_factory) -> Path:
    """A MoE slow enough per token (~3-7 ms on one thread) that decode timing over HTTP is
    meaningful and its experts' matmuls are most of a token's work; an echo model (greedy decoding
    repeats the prompt's last token, whatever the blocks add), so a lever that changes numerics
    leaves its text as the incumbent's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_moe_gguf", REPO / "scripts" / "make_moe_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_moe_gguf"] = mod
    spec.loader.exec_module(mod)
    return mod.write_moe_gguf(tmp_path_factory.mktemp("moe-small") / "moe-small.gguf",
                              mod.MoeSpec(layers=8, embd=512, ff=512, experts=16, used=4, dtype="q4_0", echo=True))


def shape(image, model: Path, **args) -> Shape:
    return Shape.from_mapping({"image": image.ref, "model": str(model), "args": {**BASE_ARGS, **args},
                               "mounts": [f"{model}:{model}:ro"], "port": free_port()})


def boot(podman_host, s: Shape, tmp_path, name: str):
    with boot_arm(podman_host, s, PROFILE, campaign="llama-boot", arm=name, folder=tmp_path / name,
                  limits=LIMITS) as (result, b):
        cid = b.cid
        spec = b.spec
    assert podman_host.state(cid).status == "missing", "the container outlived its arm"
    return result, spec


def test_the_image_is_addressed_by_digest_and_labelled(llama_image, podman_host):
    assert "@sha256:" in llama_image.ref
    img = podman_host.client.images.get(llama_image.ref)
    assert img.attrs["Config"]["Entrypoint"] == ["/usr/local/bin/llama-server"]
    assert img.labels.get("tuner.llama-input-hash")


def test_boots_ready_with_its_memory_plan_and_overrides(podman_host, llama_image, moe_model, tmp_path):
    s = shape(llama_image, moe_model, **{"override-tensor": ["blk\\.[0-3]\\.ffn_.*_exps=CPU", "exps=CPU"],
                                          "log-verbosity": 5})
    result, spec = boot(podman_host, s, tmp_path, "ready")
    assert result.outcome == "ready", result.report.evidence
    assert spec.command[:2] == ("-m", str(moe_model)) and spec.command.count("-ot") == 2
    assert any(m.read_only and m.target == str(moe_model) for m in s.mounts)
    plan = result.report.plan
    assert plan["model_buffers_mib"] and all(k.startswith("CPU") for k in plan["model_buffers_mib"])
    assert plan["kv_buffers_mib"] == {"CPU": pytest.approx(plan["kv_buffer_mib"])}
    assert plan["n_ctx"] == 1024 and plan["n_slots"] == 1 and plan["kv_cells"] == 1024
    # 32 layers x gate/up/down experts; at -lv 5 the log comes in bursts that podman sends as 8 KiB
    # frames, a line cut across two of them: the copy joins them (host.podman_host.whole_lines)
    assert plan["tensor_overrides"] == {"CPU": 32 * 3}
    assert plan["n_threads"] == 1


@pytest.mark.parametrize("change, model, cls, line", [
    ({"mlock": True}, None, "bad-argument", "error: invalid argument: --mlock"),
    ({"cache-type-k": "q9_9"}, None, "bad-argument", "Unsupported cache type: q9_9"),
    ({}, "/models/missing.gguf", "model-load-failed", "failed to load model"),
    ({"ctx-size": 2**27}, None, "oom", "allocate"),
])
def test_boot_failures_of_the_real_binary(podman_host, llama_image, moe_model, tmp_path, change, model, cls, line):
    s = shape(llama_image, moe_model, **change)
    if model:
        s = dataclasses.replace(s, model=model)
    result, _ = boot(podman_host, s, tmp_path, cls)
    assert result.outcome == cls, (result.outcome, result.report.evidence)
    assert any(line in e for e in result.report.evidence), result.report.evidence


# -- a campaign ---------------------------------------------------------------------------------
def tuner(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout)


def test_a_campaign_on_the_real_llama_server(tmp_path, podman_host, llama_image, moe_small):
    name = "llama-e2e"
    data = {"name": name, "engine": "llamacpp",
            "baseline": {"image": llama_image.tag, "model": str(moe_small), "port": free_port(),
                         # one decode thread: a 2-core box shared with the client and whatever
                         # else runs (more threads win or lose with the machine's load)
                         "args": {**BASE_ARGS, "ngl": 0, "-ub": 512, "threads": 1}},
            "levers": {
                # the move: one active expert of 16 instead of the model's 4, a quarter of the
                # expert matmuls each token (x2.1 measured on one thread, loaded or not); numerics
                # change, and the quality guard finds the incumbent's text
                "override-kv": {"values": ["qwen3moe.expert_used_count=int:1"], "numerics": "changing"},
                "mlock": [True],                                   # removed in this build: bad-argument
                "flash-attn": {"values": [False], "numerics": "changing"},   # another summation order
                "-ot": ["exps=CPU"],                               # parity without a GPU
                # n-gram drafts of a repeated token: accepted, a few tokens a step
                "spec-type": {"values": ["ngram-mod"], "numerics": "changing"},
            },
            "measure": {"depths": [64], "runs": 2, "warm_tokens": 16, "max_tokens": 96, "quiet_wait_s": 0},
            "noise": {"recheck_every": 6, "min_effect": 0.05},
            "budget": {"max_arms": 24},   # a move: probe, confirm, the incumbent boot that brackets them (more on a spread box)
            "boot": {"timeout_s": 90, "hang_s": 60, "poll_s": 0.2}, "journal": str(tmp_path / "journal")}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    r = tuner("run", str(path), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "journal" / name / "journal.jsonl").read_text().splitlines() if x.strip()]
    ends = {x["arm"]: x for x in recs if x["op"] == "arm_end"}
    assert len(ends) >= 6
    assert all("@sha256:" in x["shape"]["image"] for x in recs if x["op"] == "arm_start")
    change = {x["arm"]: x.get("change") for x in recs if x["op"] == "arm_start"}
    summary = "\n".join(f"#{e['arm']} {e.get('kind')} {change.get(e['arm'])} {e['verdict']} "
                        f"{(e.get('score') or {}).get('objective')} {e.get('reason') or ''} "
                        f"{(e.get('quality') or {}).get('evidence') or ''}" for e in ends.values())
    bad = [e for e in ends.values() if e["verdict"] == "boot-failed:bad-argument"]
    assert bad, summary
    assert any("error: invalid argument: --mlock" in line for line in bad[0]["boot"]["evidence"])
    moves = [x for x in recs if x["op"] == "incumbent" and x.get("change")]
    assert moves, summary                                                # a confirmed move
    assert all(len(m.get("confirmed_arms") or []) >= 2 for m in moves), summary   # each on two boots or more
    assert ["override-kv", "qwen3moe.expert_used_count=int:1"] in [m["change"] for m in moves], summary
    assert podman_host.list_managed({LABEL_CAMPAIGN: name}) == []
    rep = tuner("report", str(path))
    assert rep.returncode == 0, rep.stderr[-2000:]
    text = (tmp_path / "journal" / name / "REPORT.md").read_text()
    assert "model buffers" in text and "KV buffers" in text and "CPU_" in text
    assert "bad-argument" in text and "--mlock" in text


def test_init_from_a_running_llama_server_container_round_trips_to_the_identical_argv(
        tmp_path, podman_host, llama_image, moe_model):
    from arms.lifecycle import container_spec
    from tuner import cli
    from tuner.night.campaign import load_campaign

    port = free_port()
    cmd = ["-m", str(moe_model), "-c", "1024", "-np", "1", "-t", "1", "-tb", "1", "-ot", r"blk\.[0-3]\.ffn_.*_exps=CPU",
           "-ot", "exps=CPU", "-fa", "off", "-ub", "256", "-ctk", "f16", "-fit", "off", "-nkvo", "--port", str(port)]
    env = {"LLAMA_ARG_CACHE_RAM": "0", "LLAMA_ARG_N_PARALLEL": "1"}
    name = "tuner-llama-init-original"
    ctr = podman_host.client.containers.run(
        llama_image.ref, cmd, name=name, detach=True, environment=env, network_mode="host",
        mounts=[{"type": "bind", "source": str(moe_model), "target": str(moe_model), "read_only": True}],
        labels={LABEL_CAMPAIGN: "llama-init"})
    out = tmp_path / "from-container.yaml"
    try:
        assert cli.main(["init", "--from-container", name, "-o", str(out)]) == 0
        inspected = podman_host.client.containers.get(name).attrs["Config"]
    finally:
        ctr.remove(force=True)
    camp = load_campaign(out)
    assert camp.engine == "llamacpp" and camp.baseline.image == llama_image.ref
    spec = container_spec(camp.baseline, campaign="llama-init", arm=0, style="llamacpp")
    assert list(spec.command) == cmd == list(inspected["Cmd"])
    assert dict(spec.env) == env
    assert {"n-cpu-moe", "override-tensor", "threads"} <= set(camp.levers)

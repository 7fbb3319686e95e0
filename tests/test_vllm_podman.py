"""The CPU build of vLLM as a campaign engine, in podman, by digest (issue 22).

The image is built locally (host/vllmimage.py) from the environment and Debian rootfs that
scripts/build-vllm-image.sh caches outside the repo; the model is the tiny Qwen3-MoE that
scripts/make_vllm_moe.py makes from a seed, mounted read-only. One boot reads the real memory
plan, one measured run reads decode from the usage counters, a second boot on the same compile
cache says whether the saved compiled model was used. One vLLM at a time: a boot peaks ~3-4 GB.
Wall time here: ~3.5 min (a cold boot ~125 s with the measurement, the second ~85 s), after the
image is built once (~5-14 min on first use, from the cached inputs).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from arms.boot import BootLimits, boot_arm
from arms.profiles import load_profile
from arms.shape import Shape
from tests.conftest import REPO, free_port

pytestmark = pytest.mark.podman
PROFILE = load_profile("vllm")
LIMITS = BootLimits(timeout_s=300, hang_s=240, poll_s=1.0)


@pytest.fixture(scope="session")
def vllm_image(podman_host):
    from host.vllmimage import ensure_image

    return ensure_image(podman_host.client)


@pytest.fixture(scope="session")
def vllm_model() -> Path:
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_vllm_moe.py")], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return Path(r.stdout.strip().splitlines()[-1])


def shape(image, model: Path, cache: Path, **args) -> Shape:
    return Shape.from_mapping({
        "image": image.ref, "model": str(model),
        "args": {"max-model-len": 2048, "served-model-name": "tiny-moe", **args},
        "env": {"VLLM_CPU_KVCACHE_SPACE": 1},
        "mounts": [f"{model}:{model}:ro"], "compile_cache": str(cache),
        "options": {"shm_size": "1g", "ulimits": {"nofile": 16384, "nproc": 16384}},
        "port": free_port()})


def test_the_image_is_addressed_by_digest_and_labelled(vllm_image, podman_host):
    from host.vllmimage import LABEL, REPO as IMAGE_REPO

    assert "@sha256:" in vllm_image.ref and vllm_image.tag.startswith(IMAGE_REPO + ":")
    img = podman_host.client.images.get(vllm_image.ref)
    assert img.attrs["Config"]["Entrypoint"] == ["/usr/local/bin/vllm-serve"]
    assert img.attrs["Config"]["Labels"][LABEL] == vllm_image.tag.rsplit(":", 1)[1]


def test_the_model_is_the_same_bytes_from_the_same_seed(vllm_model, tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_vllm_moe.py"), "--out", str(tmp_path / "again")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    digest = lambda text: text.strip().splitlines()[-1].rsplit(" ", 1)[1]      # noqa: E731 "...: digest HEX"
    cached = subprocess.run([sys.executable, str(REPO / "scripts" / "make_vllm_moe.py")], capture_output=True,
                            text=True, timeout=600)
    assert digest(r.stderr) == digest(cached.stderr)


def boot(podman_host, s: Shape, tmp_path, name: str, measure: bool = False):
    """One boot (and, asked, one measured run at depth 128 while it serves); the container is
    gone afterwards."""
    from arms.measure import MeasurePlan, measure_engine
    from arms.prompts import api_from_profile

    m = None
    with boot_arm(podman_host, s, PROFILE, campaign="vllm-boot", arm=name, folder=tmp_path / name,
                  limits=LIMITS) as (result, b):
        cid = b.cid if b is not None else None
        if measure and result.ready:
            m = measure_engine(b.base_url, MeasurePlan(depths=(128,), runs=1, warm_tokens=8, max_tokens=32),
                               api_from_profile(PROFILE))
    if cid:
        assert podman_host.state(cid).status == "missing", "the container outlived its arm"
    return result, m


def test_a_real_vllm_boots_with_its_memory_plan_measures_and_boots_again_on_its_compile_cache(
        podman_host, vllm_image, vllm_model, tmp_path):
    cache = tmp_path / "compile-cache"
    cache.mkdir()
    s = shape(vllm_image, vllm_model, cache)
    cold, m = boot(podman_host, s, tmp_path, "cold", measure=True)
    rep = cold.report
    assert cold.outcome == "ready", (cold.outcome, rep.evidence)
    assert rep.engine_version == "0.32.0"
    # the memory plan of the CPU build: 1 GiB (VLLM_CPU_KVCACHE_SPACE) of bf16 KV at 2 KiB a token
    # (4 layers x K and V x 2 heads x 64 x 2 bytes), 2,048 tokens a request
    assert rep.plan["kv_pool_gib"] == 1.0 and rep.plan["total_gib"] > 1.0
    assert rep.kv_pool_tokens == 524288 and rep.max_concurrency_len == 2048
    assert rep.max_concurrency == 256.0 and rep.init_engine_s > 0
    assert rep.non_default_args["max_model_len"] == 2048 and rep.non_default_args["served_model_name"] == ["tiny-moe"]
    assert rep.compile_cache_hit is False                  # an empty cache: compiled and saved
    assert list(cache.glob("vllm/torch_compile_cache/torch_aot_compile/*/rank_0_0/model"))
    # one measured run: decode from the usage counters (completion tokens over the stream's decode time)
    assert m is not None and m.outcome == "measured", m and m.reason
    run = m.depths[128].runs[0]
    assert run.valid and run.completion_tokens == 32 and run.prompt_tokens >= 128, run
    assert run.decode_tok_s and run.decode_tok_s > 1.0, run
    assert run.text.strip(), "greedy text of the bigram head is never empty"
    warm, _ = boot(podman_host, s, tmp_path, "warm")
    assert warm.outcome == "ready", (warm.outcome, warm.report.evidence)
    # vllm-cpu 0.32.0 with torch 2.13: the AOT artifact saved by the cold boot does not load
    # ("Compiling model again due to a load failure ... 'finalize_loading'"), so the second boot
    # compiles again: the compile-cache win the issue asked to measure is none on this build
    assert warm.report.compile_cache_hit is False, warm.report.evidence
    assert "finalize_loading" in warm.report.plan["compile_cache_load_error"]
    assert warm.report.plan["compile_cache_saved"] is True        # ... and saves it again

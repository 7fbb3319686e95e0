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

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from arms.boot import BootLimits, boot_arm
from arms.profiles import load_profile
from arms.shape import Shape
from tuner.night.campaign import load_campaign
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


def boot(podman_host, s: Shape, tmp_path, name: str, during=None):
    """One boot; ``during(booted)`` runs while it serves (its result returned beside the boot's);
    the container is gone afterwards."""
    out = None
    with boot_arm(podman_host, s, PROFILE, campaign="vllm-boot", arm=name, folder=tmp_path / name,
                  limits=LIMITS) as (result, b):
        cid = b.cid if b is not None else None
        if during is not None and result.ready:
            out = during(b)
    if cid:
        assert podman_host.state(cid).status == "missing", "the container outlived its arm"
    return result, out


def ten_runs(b):
    """Ten measured runs in a row at depth 512, each paired with the engine's own /metrics deltas
    around it (arms.engine_timing: one request at a time, a scrape before and after)."""
    from arms.engine_timing import ScrapePairing
    from arms.measure import MeasurePlan, measure_engine
    from arms.prompts import api_from_profile

    return measure_engine(b.base_url, MeasurePlan(depths=(512,), runs=10, warm_tokens=8, max_tokens=64,
                                                  max_invalid_per_depth=0),
                          api_from_profile(PROFILE), conditions=ScrapePairing(b.base_url))


def test_a_real_vllm_boots_with_its_memory_plan_measures_and_boots_again_on_its_compile_cache(
        podman_host, vllm_image, vllm_model, tmp_path):
    cache = tmp_path / "compile-cache"
    cache.mkdir()
    s = shape(vllm_image, vllm_model, cache)
    out = tmp_path / "from-container.yaml"

    def serving(b):       # while the cold boot serves: ten measured runs, then init --from-container
        from arms.lifecycle import container_name
        from tuner import cli

        m = ten_runs(b)
        return m, cli.main(["init", "--from-container", container_name("vllm-boot", "cold"), "-o", str(out)])

    cold, got = boot(podman_host, s, tmp_path, "cold", during=serving)
    rep = cold.report
    assert cold.outcome == "ready", (cold.outcome, rep.evidence)
    m, init_rc = got
    assert rep.engine_version == "0.32.0"
    # the memory plan of the CPU build: 1 GiB (VLLM_CPU_KVCACHE_SPACE) of bf16 KV at 2 KiB a token
    # (4 layers x K and V x 2 heads x 64 x 2 bytes), 2,048 tokens a request
    assert rep.plan["kv_pool_gib"] == 1.0 and rep.plan["total_gib"] > 1.0
    assert rep.kv_pool_tokens == 524288 and rep.max_concurrency_len == 2048
    assert rep.max_concurrency == 256.0 and rep.init_engine_s > 0
    assert rep.non_default_args["max_model_len"] == 2048 and rep.non_default_args["served_model_name"] == ["tiny-moe"]
    assert rep.compile_cache_hit is False                  # an empty cache: compiled and saved
    assert list(cache.glob("vllm/torch_compile_cache/torch_aot_compile/*/rank_0_0/model"))
    # ten measured runs in a row lose nothing: each the engine's one request between two scrapes,
    # its tokens the engine's own count, its prompt never served from the prefix cache (cache_salt)
    from arms.engine_timing import engine_run

    assert m is not None and m.outcome == "measured", m and m.reason
    runs = m.depths[512].runs
    assert len(runs) == 10 and all(r.valid for r in runs), [r.reason for r in runs]
    for i, r in enumerate([m.warm, *runs]):
        e = engine_run(r.conditions)
        assert e is not None, ("a run did not pair with exactly one request", i, r.conditions)
        assert e.generation_tokens == r.completion_tokens and e.prompt_tokens == r.prompt_tokens, (i, e, r)
        assert e.prefix_cache_hits == 0, ("the salted prompt was served from the prefix cache", i, e)
        assert e.decode_tok_s and e.ttft_s and e.ttft_s <= r.ttft_s, (i, e, r)   # the engine's interval lies inside ours
    for i, r in enumerate(runs):     # the figures, for the log: their 2 % tolerance is bench/vllm_timing.py's
        e = engine_run(r.conditions)
        print(f"run {i + 1}: decode {r.decode_tok_s:.1f} vs engine {e.decode_tok_s:.1f} "
              f"({r.decode_tok_s / e.decode_tok_s - 1:+.2%}), ttft {r.ttft_s * 1e3:.1f} ms vs {e.ttft_s * 1e3:.1f} ms")
    assert runs[0].completion_tokens == 64 and runs[0].prompt_tokens == 512, runs[0]
    assert runs[0].text.strip(), "greedy text of the bigram head is never empty"
    # tuner init --from-container on the running vLLM container: the campaign's baseline is its shape
    assert init_rc == 0
    camp = load_campaign(out)
    assert camp.engine == "vllm", camp.engine
    # nproc 16384 is also what this podman service gives every container: an API-created container
    # cannot tell the two apart, so init leaves it to the default, which runs the same limits
    defaults = podman_host.default_ulimits(s.image)
    opts, want = dict(camp.baseline.options), dict(s.options)
    assert {**defaults, **opts.pop("ulimits", {})} == {**defaults, **want.pop("ulimits")}, (defaults, camp.baseline.options)
    assert opts == want and dataclasses.replace(camp.baseline, options=s.options) == s, [c.describe() for c in s.diff(camp.baseline)]
    warm, _ = boot(podman_host, s, tmp_path, "warm")
    assert warm.outcome == "ready", (warm.outcome, warm.report.evidence)
    # vllm-cpu 0.32.0 with torch 2.13: the AOT artifact saved by the cold boot does not load
    # ("Compiling model again due to a load failure ... 'finalize_loading'"), so the second boot
    # compiles again: the compile-cache win the issue asked to measure is none on this build
    assert warm.report.compile_cache_hit is False, warm.report.evidence
    assert "finalize_loading" in warm.report.plan["compile_cache_load_error"]
    assert warm.report.plan["compile_cache_saved"] is True        # ... and saves it again

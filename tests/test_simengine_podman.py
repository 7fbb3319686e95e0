"""The simulated engine booted through podman-py on the real podman service, by digest."""
from __future__ import annotations

import json
import statistics
import time

import httpx
import pytest

from arms.host import LABEL_CAMPAIGN, ContainerSpec
from arms.lifecycle import booted
from tests.conftest import free_port

pytestmark = pytest.mark.podman

BASE_ARGS = ["--tensor-parallel-size", "2", "--max-model-len", "32768", "--gpu-memory-utilization", "0.98",
             "--kv-cache-memory-bytes", "2147483648", "--max-num-seqs", "4", "--enable-prefix-caching",
             "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 4}),
             "--expert-prefetch", "1"]
GATHER = (("R4D_LRU_GATHER_CHUNKS", "8"), ("R4D_LRU_GATHER_LANES", "16"))


def engine_spec(ref: str, name: str, port: int, args: list[str], env=(), decode_scale: float = 1.0) -> ContainerSpec:
    env = (("SIMENGINE_TIME_SCALE", "0.002"), ("SIMENGINE_NOISE", "0"),
           ("SIMENGINE_DECODE_SCALE", str(decode_scale))) + GATHER + tuple(env)
    return ContainerSpec(image=ref, command=("/models/sim", "--port", str(port), *args), name=name,
                         env=env, labels=(("tuner.managed", "1"), (LABEL_CAMPAIGN, "simengine-tests"),
                                          ("tuner.arm", name)))


def stream(client: httpx.Client, url: str, prompt, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    ttft, chunks, text = None, [], ""
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            obj = json.loads(data)
            chunks.append(obj)
            if obj["choices"] and ttft is None:
                ttft = time.monotonic() - t0
            if obj["choices"]:
                text += obj["choices"][0]["text"]
    wall = time.monotonic() - t0
    usage = chunks[-1].get("usage")
    return {"chunks": chunks, "ttft": ttft, "wall": wall, "usage": usage, "text": text,
            "decode": usage["completion_tokens"] / (wall - ttft) if usage else None}


def test_boot_by_digest_wait_health_and_stream_with_usage(podman_host, sim_image, tmp_path):
    assert "@sha256:" in sim_image.ref
    port = free_port()
    spec = engine_spec(sim_image.ref, "tuner-simengine-tests-arm1", port, BASE_ARGS)
    with booted(podman_host, spec, log_path=tmp_path / "boot.log", port=port, timeout_s=60, hang_s=30,
                poll_s=0.2) as b:
        assert b.ready.ready, b.ready.detail
        assert podman_host.state(b.cid).running
        with httpx.Client(timeout=30) as c:
            assert c.get(b.base_url + "/health").status_code == 200
            out = stream(c, b.base_url, "The expert cache", 24)
        last = out["chunks"][-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 24
        assert all("usage" not in ch or ch["usage"] is None for ch in out["chunks"][:-1])
        assert out["text"]
        log = (tmp_path / "boot.log").read_text()
        assert "Expert plan: expert cache space 15.05 GiB" in log
        cid = b.cid
    assert podman_host.state(cid).status == "missing"      # torn down on the way out


SEED_ARMS = [
    # name, extra args (replacing), env, seed 002's decode at 166 / 1087 / 4064
    ("incumbent", {}, (), (26.80, 25.15, 26.81)),
    ("prefetch-off", {"--expert-prefetch": None}, (), (40.57, 37.44, 37.57)),
    ("mtp6", {"--speculative-config": json.dumps({"method": "mtp", "num_speculative_tokens": 6})}, (),
     (19.07, 17.81, 13.54)),
]


def replace_args(args: list[str], changes: dict) -> list[str]:
    out = list(args)
    for flag, val in changes.items():
        i = out.index(flag)
        if val is None:
            del out[i:i + 2]
        else:
            out[i + 1] = val
    return out


@pytest.mark.parametrize("name,changes,env,expect", SEED_ARMS, ids=[a[0] for a in SEED_ARMS])
def test_default_landscape_reproduces_seed_arms_through_http(podman_host, sim_image, tmp_path, name, changes,
                                                             env, expect):
    scale = 4.0   # tokens stream 4x faster; measured rates are divided back
    port = free_port()
    spec = engine_spec(sim_image.ref, f"tuner-simengine-tests-{name}", port, replace_args(BASE_ARGS, changes),
                       env, decode_scale=scale)
    with booted(podman_host, spec, log_path=tmp_path / "boot.log", port=port, timeout_s=60, hang_s=30,
                poll_s=0.2) as b:
        assert b.ready.ready, b.ready.detail
        with httpx.Client(timeout=60) as c:
            for depth, want in zip((166, 1087, 4064), expect):
                prompt = [(i * 7919) % 3000 + 300 for i in range(depth)]      # exactly `depth` token ids
                runs = [stream(c, b.base_url, prompt, 96) for _ in range(2)]
                assert runs[0]["usage"]["prompt_tokens"] == depth
                got = statistics.median(r["decode"] for r in runs) / scale
                assert got == pytest.approx(want, rel=0.025), (name, depth, got)   # seed noise band: +-1 tok/s


def test_superseded_engine_images_are_pruned_unless_a_container_holds_one(podman_host, sim_image, tmp_path):
    """One image per source change would pile up (~70 MB each): a build removes the older ones,
    but never one a container still uses, nor the image just built."""
    from host.simimage import prune_superseded

    client = podman_host.client
    (tmp_path / "f").write_text("x")
    old = {}
    for h in ("old-a", "old-b"):
        (tmp_path / "Containerfile").write_text(f"FROM scratch\nCOPY f /f-{h}\n")
        img, _ = client.images.build(path=str(tmp_path), dockerfile="Containerfile", pull=False,
                                     tag=f"localhost/offload-tuner-simengine:{h}", labels={"tuner.input-hash": h})
        old[h] = img.id
    holder = client.containers.create(old["old-b"], command=["/f-old-b"], name=f"prune-holder-{free_port()}")
    try:
        removed = prune_superseded(client, keep_id=sim_image.image_id)
        assert "localhost/offload-tuner-simengine:old-a" in removed
        assert "localhost/offload-tuner-simengine:old-b" not in removed
        assert client.images.exists(old["old-b"]) and not client.images.exists(old["old-a"])
        assert client.images.exists(sim_image.image_id)
    finally:
        holder.remove(force=True)
    assert prune_superseded(client, keep_id=sim_image.image_id) == ("localhost/offload-tuner-simengine:old-b",)
    assert client.images.exists(sim_image.image_id)

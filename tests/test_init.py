"""`tuner init --from-container`: inspect data -> shape (tables), and on the real podman service a
running simulated-engine container's shape reproduced exactly: booting the generated baseline
gives the same non-default args in the engine's own boot log."""
from __future__ import annotations

from pathlib import Path

import pytest

from arms.bootlog import parse_boot_log
from arms.errors import ConfigError
from arms.shape import Shape
from tuner import cli
from tuner.night.campaign import load_campaign
from tuner.production.init import guess_profile, render_campaign, shape_from_inspect

DIGEST = "sha256:" + "7" * 64
IMAGE = {"Digest": DIGEST, "RepoDigests": ["quay.io/other/vllm@sha256:" + "1" * 64, f"docker.io/tcclaviger/vllm@{DIGEST}"],
         "Config": {"Entrypoint": ["vllm", "serve"], "Env": ["PATH=/usr/bin:/bin", "HOME=/root", "VLLM_USE_V1=1"]}}


def inspect(cmd, env=(), **hc):
    host_config = {"NetworkMode": "host", "IpcMode": "shareable", "ShmSize": 65536000,
                   "Ulimits": [{"Name": "RLIMIT_NOFILE", "Soft": 20000, "Hard": 20000},
                               {"Name": "RLIMIT_NPROC", "Soft": 16384, "Hard": 16384}], **hc}
    return {"Name": "frank-primary", "ImageName": "docker.io/tcclaviger/vllm:latest", "Image": "3322dbbbc96d",
            "Config": {"Entrypoint": "vllm serve", "Cmd": list(cmd),
                       "Env": ["container=podman", "PATH=/usr/bin:/bin", "HOME=/root", "TERM=xterm", "HOSTNAME=box",
                               "VLLM_USE_V1=1", *env]},
            "HostConfig": host_config, "Mounts": []}


SEED_CMD = ["/models/Q", "--tensor-parallel-size", "2", "--max-model-len", "32768", "--max-num-seqs", "4",
            "--enable-prefix-caching", "--speculative-config", '{"method":"mtp","num_speculative_tokens":4}',
            "--expert-prefetch", "1", "--port", "7773"]


def test_the_seed_container_becomes_its_shape():
    attrs = inspect(SEED_CMD, env=["R4D_LRU_GATHER_CHUNKS=8", "VLLM_USE_V1=0"], IpcMode="host",
                    Devices=[{"PathOnHost": "/dev/kfd"}, {"PathOnHost": "/dev/dri/card0"}, {"PathOnHost": "/dev/dri/renderD128"}],
                    Ulimits=[{"Name": "RLIMIT_MEMLOCK", "Soft": 2 ** 64 - 1, "Hard": 2 ** 64 - 1},
                             {"Name": "RLIMIT_NOFILE", "Soft": 20000, "Hard": 20000}])
    attrs["Mounts"] = [{"Type": "bind", "Source": "/home/dank/.cache/frank-primary", "Destination": "/root/.cache", "RW": True},
                       {"Type": "bind", "Source": "/home/dank/models/Q", "Destination": "/models/Q", "RW": False},
                       {"Type": "volume", "Name": "hf", "Destination": "/hf", "RW": True}]
    ins = shape_from_inspect(attrs, IMAGE)
    s = ins.shape
    assert s.image == f"docker.io/tcclaviger/vllm@{DIGEST}"          # the RepoDigest of its own repository
    assert s.model == "/models/Q" and s.port == 7773
    assert dict(s.args) == {"tensor-parallel-size": 2, "max-model-len": 32768, "max-num-seqs": 4,
                            "enable-prefix-caching": True, "expert-prefetch": 1,
                            "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}}
    assert dict(s.env) == {"R4D_LRU_GATHER_CHUNKS": "8", "VLLM_USE_V1": "0"}   # image/podman defaults gone
    assert s.devices == ("/dev/dri", "/dev/kfd") and "folded" in " ".join(ins.notes)
    assert dict(s.options) == {"ipc": "host", "ulimits": {"memlock": -1}}
    assert {(m.source, m.target, m.read_only, m.kind) for m in s.mounts} == {
        ("/home/dank/.cache/frank-primary", "/root/.cache", False, "bind"), ("/home/dank/models/Q", "/models/Q", True, "bind"),
        ("hf", "/hf", False, "volume")}
    assert ins.profile == "vllm-expert-offload"


def test_create_command_keeps_cdi_names_and_asked_ulimits():
    attrs = inspect(["/m"], Devices=[{"PathOnHost": "/dev/nvidia0"}],
                    Ulimits=[{"Name": "RLIMIT_NOFILE", "Soft": 4096, "Hard": 4096}], NetworkMode="bridge",
                    PortBindings={"8000/tcp": [{"HostPort": "8000"}]}, ShmSize=17179869184)
    attrs["Config"]["CreateCommand"] = ["podman", "run", "--device", "nvidia.com/gpu=all", "--ulimit=nofile=4096:4096"]
    ins = shape_from_inspect(attrs, IMAGE)
    assert ins.shape.devices == ("nvidia.com/gpu=all",)
    assert dict(ins.shape.options) == {"network": "bridge", "ulimits": {"nofile": 4096}, "shm_size": "16g"}
    assert ins.shape.port == 8000 and "no --port" in ins.notes[0]


@pytest.mark.parametrize("size,text", [(17179869184, "16g"), (1073741824, "1g"), (1572864000, "1500m"),
                                       (65536001, 65536001), (67584, "66k"), (2 ** 20, "1m")])
def test_a_shm_size_is_written_in_the_largest_exact_unit(size, text):
    from tuner.production.init import size_text

    assert size_text(size) == text
    ins = shape_from_inspect(inspect(["/m"], ShmSize=size), IMAGE)
    assert dict(ins.shape.options)["shm_size"] == text


# a container created through the API has no CreateCommand: nofile/nproc are kept only where they differ
# from what the same podman service gives a container that asks for none (None: not known, dropped)
@pytest.mark.parametrize("defaults,want", [
    (None, {}),
    ({"nofile": 20000, "nproc": 16384}, {}),
    ({"nofile": 65536, "nproc": 16384}, {"nofile": 20000}),
    ({"nofile": 1024, "nproc": 4096}, {"nofile": 20000, "nproc": 16384}),
])
def test_api_created_nofile_and_nproc_are_kept_where_they_differ_from_podmans_defaults(defaults, want):
    ins = shape_from_inspect(inspect(["/m"]), IMAGE, default_ulimits=defaults)
    assert dict(ins.shape.options).get("ulimits", {}) == want


def test_an_overridden_entrypoint_is_refused():
    attrs = inspect(["-c", "sleep 1"])
    attrs["Config"]["Entrypoint"] = ["/bin/sh"]
    with pytest.raises(ConfigError, match="overrides the image's entrypoint"):
        shape_from_inspect(attrs, IMAGE)


@pytest.mark.parametrize("image,entry,argv,env,want", [
    ("localhost/offload-tuner-simengine@sha256:x", ["python3", "-m", "simengine", "serve"], ["/m"], {}, "simengine"),
    ("docker.io/tcclaviger/vllm@sha256:x", ["vllm", "serve"], ["/m", "--expert-prefetch", "1"], {}, "vllm-expert-offload"),
    ("docker.io/x/fork@sha256:x", [], ["/m"], {"R4D_LRU_GATHER_CHUNKS": "8"}, "vllm-expert-offload"),
    ("docker.io/vllm/vllm-openai@sha256:x", ["vllm", "serve"], ["/m"], {}, "vllm"),
    ("ghcr.io/ggml-org/llama.cpp:server@sha256:x", ["/app/llama-server"], ["-m", "/q.gguf"], {}, "llamacpp"),
    ("example/unknown@sha256:x", [], ["/m"], {}, "vllm"),
])
def test_profile_guess(image, entry, argv, env, want):
    assert guess_profile(image, entry, argv, env)[0] == want


def test_rendered_campaign_loads_back_to_the_same_baseline(tmp_path):
    attrs = inspect(SEED_CMD, env=["R4D_LRU_GATHER_CHUNKS=8", "SECRET_KEY=x y"], IpcMode="host",
                    GroupAdd=["video"], Ulimits=[{"Name": "RLIMIT_MEMLOCK", "Soft": 2 ** 64 - 1, "Hard": 2 ** 64 - 1}])
    (tmp_path / "cache").mkdir()
    (tmp_path / "models").mkdir()
    attrs["Mounts"] = [{"Type": "bind", "Source": str(tmp_path / "cache"), "Destination": "/root/.cache", "RW": True},
                       {"Type": "bind", "Source": str(tmp_path / "models"), "Destination": "/models/Q", "RW": False}]
    ins = shape_from_inspect(attrs, IMAGE)
    path = tmp_path / "c.yaml"
    path.write_text(render_campaign(ins, name="frank primary!", container="frank-primary"))
    camp = load_campaign(path)
    assert camp.baseline == ins.shape, [c.describe() for c in ins.shape.diff(camp.baseline)]
    assert camp.name == "frank-primary" and camp.engine == "vllm-expert-offload"
    assert "expert-prefetch" in camp.levers and camp.production is None
    assert "compile_cache:" in path.read_text()


def test_cli_names_a_missing_container(capsys):
    assert cli.main(["init", "--from-container", "no-such-container-here", "-o", "/tmp/never.yaml"]) == 2
    assert "no container named 'no-such-container-here'" in capsys.readouterr().err


# -- the real thing --------------------------------------------------------------------------------
@pytest.mark.podman
def test_init_reproduces_a_running_simengine_container_exactly(tmp_path, podman_host, sim_image):
    from arms.boot import BootLimits, boot_arm
    from arms.lifecycle import container_name
    from arms.profiles import load_profile
    from tests.conftest import free_port

    (tmp_path / "cache").mkdir()
    landscape = tmp_path / "notes.txt"
    landscape.write_text("a read-only file mount\n")
    shape = Shape.from_mapping({
        "image": sim_image.ref, "model": "/models/sim", "port": free_port(),
        "args": {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.95,
                 "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 3, "enable-prefix-caching": True,
                 "speculative-config": {"method": "mtp", "num_speculative_tokens": 4},
                 "max-num-batched-tokens": 4096, "kv-cache-dtype": "fp8"},
        "env": {"SIMENGINE_TIME_SCALE": "0.002", "R4D_LRU_GATHER_CHUNKS": "32", "PYTHONDONTWRITEBYTECODE": "0"},
        "compile_cache": str(tmp_path / "cache"), "mounts": [f"{landscape}:/notes.txt:ro"],
        "options": {"ipc": "host"}})
    profile = load_profile("simengine")
    limits = BootLimits(timeout_s=60, hang_s=30, poll_s=0.2)
    out = tmp_path / "from-container.yaml"
    with boot_arm(podman_host, shape, profile, campaign="init-test", arm="original", folder=tmp_path / "original",
                  limits=limits) as (original, _):
        assert original.outcome == "ready", original.report.evidence
        assert cli.main(["init", "--from-container", container_name("init-test", "original"), "-o", str(out)]) == 0
    camp = load_campaign(out)
    assert camp.engine == "simengine"
    assert camp.baseline == shape, [c.describe() for c in shape.diff(camp.baseline)]
    with boot_arm(podman_host, camp.baseline, profile, campaign="init-test", arm="generated",
                  folder=tmp_path / "generated", limits=limits) as (generated, _):
        assert generated.outcome == "ready", generated.report.evidence
    logs = [parse_boot_log(Path(tmp_path / f / "boot.log").read_text(), profile) for f in ("original", "generated")]
    assert logs[0].non_default_args == logs[1].non_default_args
    assert logs[0].non_default_args["max_num_seqs"] == 3 and logs[0].non_default_args["kv_cache_dtype"] == "fp8"


# -- llama.cpp: short flags, several -ot, LLAMA_ARG_* env ------------------------------------------
LLAMA_IMAGE = {"Digest": DIGEST, "RepoDigests": [f"ghcr.io/ggml-org/llama.cpp@{DIGEST}"],
               "Config": {"Entrypoint": ["/app/llama-server"], "Env": ["PATH=/usr/bin:/bin", "LLAMA_ARG_HOST=0.0.0.0"]}}
LLAMA_CMD = ["-m", "/models/q.gguf", "-ngl", "99", "-ot", r"blk\.(1[0-9])\.ffn_.*_exps=CPU", "-ot", "exps=CUDA0",
             "-fa", "on", "-ub", "512", "-b", "2048", "-ctk", "q8_0", "-ctv", "q8_0", "-t", "8", "-tb", "16",
             "-np", "1", "-c", "32768", "-nkvo", "-fit", "off", "--metrics", "--port", "8080"]


def llama_inspect(cmd, env=()):
    return {"Name": "llama-primary", "ImageName": "ghcr.io/ggml-org/llama.cpp:server-cuda", "Image": "9a9a",
            "Config": {"Entrypoint": ["/app/llama-server"], "Cmd": list(cmd),
                       "Env": ["container=podman", "PATH=/usr/bin:/bin", "LLAMA_ARG_HOST=0.0.0.0", "HOSTNAME=box", *env]},
            "HostConfig": {"NetworkMode": "host", "Devices": [{"PathOnHost": "/dev/nvidia0"}]},
            "Mounts": [{"Type": "bind", "Source": "/srv/models/q.gguf", "Destination": "/models/q.gguf", "RW": False}]}


def test_a_llamacpp_container_round_trips_to_the_identical_argv(tmp_path):
    from arms.lifecycle import container_spec

    attrs = llama_inspect(LLAMA_CMD, env=["LLAMA_ARG_N_CPU_MOE=4", "LLAMA_ARG_CACHE_RAM=0"])
    attrs["Mounts"][0]["Source"] = str(tmp_path / "q.gguf")
    (tmp_path / "q.gguf").write_bytes(b"GGUF")
    ins = shape_from_inspect(attrs, LLAMA_IMAGE)
    assert ins.profile == "llamacpp"
    assert dict(ins.shape.args)["override-tensor"] == (r"blk\.(1[0-9])\.ffn_.*_exps=CPU", "exps=CUDA0")
    assert dict(ins.shape.args)["kv-offload"] is False and dict(ins.shape.args)["n-gpu-layers"] == 99
    assert any("LLAMA_ARG_N_CPU_MOE sets the flag n-cpu-moe" in n for n in ins.notes)
    path = tmp_path / "c.yaml"
    path.write_text(render_campaign(ins, name="llama-primary", container="llama-primary"))
    camp = load_campaign(path)
    assert camp.baseline == ins.shape, [c.describe() for c in ins.shape.diff(camp.baseline)]
    assert {"n-cpu-moe", "override-tensor", "threads", "ubatch-size"} <= set(camp.levers)
    spec = container_spec(camp.baseline, campaign="c", arm=0, style="llamacpp")
    assert list(spec.command) == LLAMA_CMD                       # word for word, -ot twice, one dash
    assert dict(spec.env) == {"LLAMA_ARG_N_CPU_MOE": "4", "LLAMA_ARG_CACHE_RAM": "0"}
    arm = camp.baseline.with_change(camp.lever("n-cpu-moe"), 16)
    assert container_spec(arm, campaign="c", arm=1, style="llamacpp").command[-4:] == ("-ncmoe", "16", "--port", "8080")

"""Production files from shapes (tuner/production/units.py, envfile.py, unitsyntax.py): tables of shapes,
podman versions and env-file values; every rendered unit passes `systemd-analyze verify`."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from arms.argv import parse_argv as parse_engine_argv
from arms.errors import ConfigError
from arms.shape import ABSENT, Mount, Shape
from tuner.production.envfile import (
    check_mapping,
    env_text,
    parse_env_file,
    redact_text,
    render_env_file,
)
from tuner.night.guard import Production
from tuner.production.units import (
    parse_quadlet,
    parse_service,
    render_quadlet,
    render_service,
    timeout_start_s,
    version_tuple,
)
from tuner.production.unitsyntax import join_words, parse_ini, split_words

DIGEST = "docker.io/tcclaviger/vllm@sha256:" + "da40" * 16
SEED_ARGS = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
             "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4, "enable-prefix-caching": True,
             "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
SEED = Shape.from_mapping({
    "image": DIGEST, "model": "/home/dank/models/Qwen3.8-Flash-Next-Uncensored-FP8", "args": SEED_ARGS,
    "env": {"R4D_LRU_GATHER_CHUNKS": 8, "R4D_LRU_GATHER_LANES": 16}, "devices": ["/dev/kfd", "/dev/dri"],
    "mounts": ["/home/dank/models/Qwen3.8-Flash-Next-Uncensored-FP8:/home/dank/models/Qwen3.8-Flash-Next-Uncensored-FP8:ro"],
    "compile_cache": "/home/dank/.cache/frank-primary", "port": 7773, "options": {"ipc": "host"}})
# seed 002's deployed shape E (2026-10-02)
SHAPE_E = SEED.with_change("expert-prefetch", ABSENT).with_change("speculative-config", ABSENT) \
    .with_change("max-model-len", 200704).with_change("max-num-seqs", 3) \
    .with_change("kv-cache-memory-bytes", 3150000000).with_change("kv-cache-dtype", "fp8") \
    .with_change("max-num-batched-tokens", 1024).with_change("expert-precise-memory", True) \
    .with_change("env.R4D_LRU_GATHER_CHUNKS", 32).with_change("env.R4D_LRU_GATHER_LANES", 64)
AWKWARD = Shape.from_mapping({
    "image": "localhost/x@sha256:" + "0" * 64, "model": "/models/with space",
    "args": {"served-model-name": "a b %n $HOME \"q\" 'x'", "enforce-eager": False, "seed": -1,
             "override-generation-config": {"temperature": 0.0, "top_k": -1}, "tensor-split": [3, 1],
             "swap-space": 4.5},
    "env": {"HF_TOKEN": "hf_sec ret$%", "PLAIN": "a\"b\\c", "EMPTY": ""},
    "devices": ["nvidia.com/gpu=all"], "mounts": [{"source": "models", "target": "/m", "kind": "volume"}],
    "port": 18000,
    "options": {"network": "pasta", "ulimits": {"memlock": -1, "stack": 67108864}, "shm_size": "16g",
                "group_add": ["video", "render"]}})
LLAMA = Shape.from_mapping({"image": "ghcr.io/ggml-org/llama.cpp@sha256:" + "1" * 64, "model": "/m/q.gguf",
                            "args": {"flash-attn": True, "n-gpu-layers": 99, "ctx-size": 8192}, "port": 8080})

SHAPES = [("seed-002-incumbent", SEED, "vllm"), ("seed-002-shape-E", SHAPE_E, "vllm"),
          ("awkward-values", AWKWARD, "vllm"), ("llama.cpp", LLAMA, "llamacpp")]


def quadlet(shape, version="5.0", style="vllm", **kw):
    return render_quadlet(shape, style=style, container_name="frank-primary", podman_version=version,
                          timeout_s=1100, label="night/arm6", **kw)


def service(shape, style="vllm"):
    return render_service(shape, style=style, container_name="frank-primary", timeout_s=1100, label="night/arm6")


@pytest.mark.parametrize("version", ["4.6", "4.7.2", "5.0", "5.6.1"])
@pytest.mark.parametrize("name,shape,style", SHAPES, ids=[s[0] for s in SHAPES])
def test_quadlet_round_trips_to_the_same_shape(name, shape, style, version):
    parsed = parse_quadlet(quadlet(shape, version, style), style)
    assert parsed.shape == shape, [c.describe() for c in shape.diff(parsed.shape)]
    assert parsed.container_name == "frank-primary"
    assert parsed.timeout_start_s == 1100


@pytest.mark.parametrize("name,shape,style", SHAPES, ids=[s[0] for s in SHAPES])
def test_plain_unit_round_trips_to_the_same_shape(name, shape, style):
    parsed = parse_service(service(shape, style), style)
    assert parsed.shape == shape, [c.describe() for c in shape.diff(parsed.shape)]
    assert parsed.container_name == "frank-primary"


def keys(text: str) -> list[str]:
    return [k for section, k, _ in parse_ini(text) if section == "Container"]


def values(text: str, key: str) -> list[str]:
    return [v for section, k, v in parse_ini(text) if section in ("Container", "Service") and k == key]


# (shape options, podman version) -> Quadlet lines expected (key, value) and keys that must be absent
KEYSET = [
    ({"ipc": "host"}, "4.6", [("PodmanArgs", "--ipc=host"), ("Network", "host")], ["Ulimit", "ShmSize"]),
    ({}, "4.4", [("Network", "host")], ["PodmanArgs"]),
    ({"ulimits": {"memlock": -1}}, "4.7", [("Ulimit", "memlock=-1:-1")], ["PodmanArgs"]),
    ({"ulimits": {"memlock": -1, "stack": 8}}, "4.9", [("PodmanArgs", "--ulimit=memlock=-1:-1"),
                                                       ("PodmanArgs", "--ulimit=stack=8:8")], ["Ulimit"]),
    ({"ulimits": {"memlock": "unlimited", "stack": 8}}, "5.0", [("Ulimit", "memlock=-1:-1"),
                                                                ("Ulimit", "stack=8:8")], ["PodmanArgs"]),
    ({"shm_size": "16g"}, "4.6", [("PodmanArgs", "--shm-size=16g")], ["ShmSize"]),
    ({"shm_size": "16g"}, "4.7", [("ShmSize", "16g")], ["PodmanArgs"]),
    ({"network": "bridge"}, "5.0", [("Network", "bridge"), ("PublishPort", "7773:7773")], []),
]


@pytest.mark.parametrize("options,version,want,absent", KEYSET)
def test_quadlet_keys_follow_the_podman_version(options, version, want, absent):
    shape = Shape.from_mapping({**SEED.to_dict(), "args": SEED_ARGS, "mounts": [], "options": options})
    text = quadlet(shape, version)
    pairs = [(k, v) for s, k, v in parse_ini(text) if s == "Container"]
    for kv in want:
        assert kv in pairs, (kv, pairs)
    for k in absent:
        assert k not in keys(text)
    assert values(text, "Image") == [DIGEST]
    assert values(text, "TimeoutStartSec") == ["1100"]
    assert ("Label", "tuner.promoted=night/arm6") in pairs


def test_quadlet_devices_are_never_prefixed_and_cdi_names_pass_as_is():
    text = quadlet(AWKWARD) + quadlet(SEED)
    devices = values(text, "AddDevice")
    assert devices == ["nvidia.com/gpu=all", "/dev/dri", "/dev/kfd"]
    assert not any(d.startswith("-") for d in devices)


@pytest.mark.parametrize("version,needle", [("4.3.1", "no Quadlet"), ("4.5", "PodmanArgs"), ("x", "not a version")])
def test_quadlet_refuses_what_the_podman_version_cannot_express(version, needle):
    with pytest.raises(ConfigError, match=needle):
        quadlet(SEED, version)        # ipc=host needs PodmanArgs= (4.6)


def test_unknown_container_option_is_refused_by_name():
    shape = Shape.from_mapping({**SEED.to_dict(), "args": SEED_ARGS, "options": {"privileged": True}})
    with pytest.raises(ConfigError, match="privileged"):
        service(shape)


def test_existing_unit_and_install_sections_are_carried_over():
    old = "[Unit]\nDescription=old\nAfter=mnt-models.mount\n[Container]\nImage=x\n[Install]\nWantedBy=default.target\n"
    from tuner.production.units import kept_sections

    text = quadlet(SEED, kept=kept_sections(old))
    pairs = parse_ini(text)
    assert ("Unit", "After", "mnt-models.mount") in pairs and ("Install", "WantedBy", "default.target") in pairs
    assert ("Unit", "Description", "old") not in pairs


@pytest.mark.parametrize("boot_s,want", [(None, 900), (0, 900), (420.0, 960), (490.2, 1101), (1.3, 123), (-1, 900)])
def test_timeout_start_sec_is_twice_the_measured_boot_plus_margin(boot_s, want):
    assert timeout_start_s(boot_s) == want


def test_version_parsing():
    assert version_tuple("4.3.1") == (4, 3, 1) and version_tuple("v5.0") == (5, 0, 0) and version_tuple("") is None


# -- systemd-analyze verify ------------------------------------------------------------------------
def systemd_verify(path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze is missing: install Debian's `systemd` package (apt-get install -y systemd)"
    return subprocess.run([exe, "verify", str(path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"}, check=False)


@pytest.mark.parametrize("name,shape,style", SHAPES, ids=[s[0] for s in SHAPES])
def test_rendered_plain_unit_passes_systemd_analyze_verify(tmp_path, name, shape, style):
    assert shutil.which("podman") == "/usr/bin/podman", "the unit runs /usr/bin/podman: install podman"
    unit = tmp_path / "frank-primary.service"
    unit.write_text(service(shape, style))
    r = systemd_verify(unit)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr + r.stdout


def test_a_broken_unit_is_caught_by_the_same_check(tmp_path):
    unit = tmp_path / "frank-primary.service"
    unit.write_text(service(SEED).replace("TimeoutStopSec=70", "TimeoutStopSecs=70"))
    r = systemd_verify(unit)
    assert "Unknown key" in r.stderr


GENERATOR = Path("/usr/lib/systemd/system-generators/podman-system-generator")


@pytest.mark.skipif(not GENERATOR.exists(), reason="podman < 4.4 here (Debian 12 ships 4.3.1): no Quadlet "
                    "generator to expand the .container; its round trip and key set are tested above")
def test_quadlet_generator_output_passes_systemd_analyze_verify(tmp_path):
    src = tmp_path / "src"
    out = tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "frank-primary.container").write_text(quadlet(SEED, subprocess.run(
        ["podman", "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]))
    r = subprocess.run([str(GENERATOR), str(out)], env={**os.environ, "QUADLET_UNIT_DIRS": str(src)},
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    generated = out / "frank-primary.service"
    assert generated.exists(), r.stderr
    text = generated.read_text()
    assert "--ipc=host" in text and "TimeoutStartSec=1100" in text
    v = systemd_verify(generated)
    assert v.returncode == 0, v.stderr


# -- env file --------------------------------------------------------------------------------------
ENV_VALUES = [  # (value, text in the variable, as the line writes it)
    (True, "1", "V=1"), (False, "0", "V=0"), (ABSENT, "", "V="), (3, "3", "V=3"),
    (3150000000, "3150000000", "V=3150000000"), (0.98, "0.98", "V=0.98"), ("fp8", "fp8", "V=fp8"),
    ({"method": "mtp", "num_speculative_tokens": 4}, '{"method":"mtp","num_speculative_tokens":4}',
     """V='{"method":"mtp","num_speculative_tokens":4}'"""),
    ([3, 1], "[3,1]", "V='[3,1]'"), ("two words", "two words", "V='two words'"),
    ("it's $HOME", "it's $HOME", 'V="it\'s \\$HOME"'),
]


@pytest.mark.parametrize("value,text,line", ENV_VALUES, ids=[str(v[1]) or "absent" for v in ENV_VALUES])
def test_env_file_value_rules(value, text, line):
    assert env_text(value) == text
    shape = SEED.with_change("max-num-seqs", value)
    rendered = render_env_file(shape, {"max-num-seqs": "V"}, label="night/arm6")
    assert line in rendered.splitlines()
    assert parse_env_file(rendered)["V"] == text


SEED_MAPPING = {"max-model-len": "FRANK_PRIMARY_MAXLEN", "max-num-seqs": "FRANK_PRIMARY_SEQS",
                "kv-cache-memory-bytes": "FRANK_PRIMARY_KV_BYTES", "kv-cache-dtype": "FRANK_PRIMARY_KV_DTYPE",
                "max-num-batched-tokens": "FRANK_PRIMARY_MNBT", "expert-precise-memory": "FRANK_PRIMARY_PRECISE_MEMORY",
                "expert-prefetch": "FRANK_PRIMARY_PREFETCH", "speculative-config": "FRANK_PRIMARY_SPEC",
                "env.R4D_LRU_GATHER_CHUNKS": "R4D_LRU_GATHER_CHUNKS", "env.R4D_LRU_GATHER_LANES": "R4D_LRU_GATHER_LANES"}


def test_seed_002_shape_E_as_the_frank_primary_env_file():
    existing = ("# frank-primary serve settings\nFRANK_PRIMARY_MAXLEN=262144\nFRANK_PRIMARY_GPU_MAX_HW_QUEUES=2\n"
                "FRANK_PRIMARY_CACHE_DIR=/home/dank/.cache/frank-primary\nFRANK_PRIMARY_SEQS=4\nFRANK_PRIMARY_SEQS=5\n")
    check_mapping(SEED, SHAPE_E, SEED_MAPPING)
    text = render_env_file(SHAPE_E, SEED_MAPPING, label="night/arm6", existing=existing)
    env = parse_env_file(text)
    assert env == {"FRANK_PRIMARY_MAXLEN": "200704", "FRANK_PRIMARY_GPU_MAX_HW_QUEUES": "2",
                   "FRANK_PRIMARY_CACHE_DIR": "/home/dank/.cache/frank-primary", "FRANK_PRIMARY_SEQS": "3",
                   "FRANK_PRIMARY_KV_BYTES": "3150000000", "FRANK_PRIMARY_KV_DTYPE": "fp8",
                   "FRANK_PRIMARY_MNBT": "1024", "FRANK_PRIMARY_PRECISE_MEMORY": "1", "FRANK_PRIMARY_PREFETCH": "",
                   "FRANK_PRIMARY_SPEC": "", "R4D_LRU_GATHER_CHUNKS": "32", "R4D_LRU_GATHER_LANES": "64"}
    lines = text.splitlines()
    assert lines[0].startswith("# Written by `tuner promote`") and lines[1] == "# frank-primary serve settings"
    assert lines.index("FRANK_PRIMARY_MAXLEN=200704") == 2          # replaced in place
    assert text.count("FRANK_PRIMARY_SEQS=") == 1                   # a repeated line collapses
    again = render_env_file(SHAPE_E, SEED_MAPPING, label="night/arm7", existing=text)
    assert again.splitlines()[1:] == lines[1:]                      # idempotent; one header


@pytest.mark.parametrize("change,needle", [
    (("expert-prefetch", 2), "expert-prefetch 1 → 2"),
    (("env.R4D_LRU_UVA_TOKENS", 8192), "env.R4D_LRU_UVA_TOKENS absent → 8192"),
    (("enforce-eager", True), "enforce-eager absent → true"),
])
def test_env_file_refuses_a_changed_lever_without_mapping_and_names_it(change, needle):
    mapping = {k: v for k, v in SEED_MAPPING.items() if k != "expert-prefetch"}
    with pytest.raises(ConfigError, match="production.mapping has no variable") as e:
        check_mapping(SEED, SEED.with_change(*change), mapping)
    assert needle in str(e.value)


def test_env_file_refuses_mounts_and_accepts_mapped_image():
    moved = Shape.from_mapping({**SEED.to_dict(), "args": SEED_ARGS, "mounts": []})
    with pytest.raises(ConfigError, match="mount:"):
        check_mapping(SEED, moved, SEED_MAPPING)
    new_image = Shape.from_mapping({**SEED.to_dict(), "args": SEED_ARGS, "image": "a/b@sha256:" + "2" * 64})
    with pytest.raises(ConfigError, match="image"):
        check_mapping(SEED, new_image, SEED_MAPPING)
    m = check_mapping(SEED, new_image, {**SEED_MAPPING, "image": "FRANK_PRIMARY_IMAGE"})
    assert parse_env_file(render_env_file(new_image, m, label="x"))["FRANK_PRIMARY_IMAGE"] == new_image.image


# -- redaction, word syntax, argv --------------------------------------------------------------------
def test_secrets_stay_in_the_files_but_never_in_redacted_text():
    for text in (quadlet(AWKWARD), service(AWKWARD),
                 render_env_file(AWKWARD, {"env.HF_TOKEN": "HF_TOKEN", "seed": "SEED"}, label="x")):
        assert "hf_sec" in text
        red = redact_text(text)
        assert "hf_sec" not in red and "HF_TOKEN=***" in red
        assert red.count("\n") == text.count("\n")
    tame = "Environment=R4D_LRU_UVA_TOKENS=2048\nExec=--api-key abc --max-num-batched-tokens 1024\n"
    assert redact_text(tame) == "Environment=R4D_LRU_UVA_TOKENS=2048\nExec=--api-key *** --max-num-batched-tokens 1024\n"


WORDS = ["plain", "", "two words", 'q"uote', "back\\slash", "%n", "$HOME", "$$", "tab\there", "{\"a\":[1,2]}",
         "new\nline", ";", "-1", "x=y z"]


@pytest.mark.parametrize("dollars", [True, False])
def test_systemd_words_round_trip(dollars):
    assert split_words(join_words(WORDS, dollars), dollars) == WORDS


def test_parse_ini_joins_continuations_and_skips_comments():
    text = "[A]\n# c\nX=1 \\\n  # inside\n  2 \\\n  3\n; other\nY = v \n[B]\nX=4\n"
    assert parse_ini(text) == [("A", "X", "1  2  3"), ("A", "Y", "v"), ("B", "X", "4")]
    with pytest.raises(ConfigError, match="neither"):
        parse_ini("[A]\nnonsense\n")


ARGV = [
    (["/m", "--max-num-seqs", "4", "--enable-prefix-caching", "--no-enforce-eager", "--port", "7773"], "vllm",
     ("/m", [("max-num-seqs", 4), ("enable-prefix-caching", True), ("enforce-eager", False)], 7773)),
    (["--model", "/m", "--gpu-memory-utilization=0.98", "--seed", "-1"], "vllm",
     ("/m", [("gpu-memory-utilization", 0.98), ("seed", -1)], None)),
    (["-m", "/q.gguf", "--flash-attn", "on", "-c", "8192", "--tensor-split", "3,1"], "llamacpp",
     ("/q.gguf", [("flash-attn", True), ("ctx-size", 8192), ("tensor-split", "3,1")], None)),
    (["/m", "--speculative-config", '{"method":"mtp"}', "--kv-cache-dtype", "fp8"], "vllm",
     ("/m", [("speculative-config", {"method": "mtp"}), ("kv-cache-dtype", "fp8")], None)),
]


@pytest.mark.parametrize("argv,style,want", ARGV)
def test_engine_argv_reads_back(argv, style, want):
    assert parse_engine_argv(argv, style) == want


@pytest.mark.parametrize("argv,needle", [(["--max-num-seqs", "4"], "no model"), (["/m", "stray", "x"], "stands alone")])
def test_engine_argv_refuses_what_a_shape_cannot_hold(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_engine_argv(argv, "vllm")


# -- the production section's promotion keys ---------------------------------------------------------
@pytest.mark.parametrize("extra,needle", [
    ({"promote_as": "rpm"}, "promote_as"), ({"promote_as": "env-file"}, "env_file"),
    ({"promote_as": "env-file", "env_file": "/x"}, "mapping"),
    ({"mapping": {"max-num-seqs": "not a var"}}, "mapping.max-num-seqs"),
    ({"smoke_depth": 0}, "smoke_depth"), ({"scope": "both"}, "scope"),
])
def test_production_section_promotion_keys_are_checked(extra, needle):
    with pytest.raises(ConfigError, match=needle):
        Production.from_mapping({"unit": "frank-primary.service", **extra}, "c.yaml")


def test_quadlet_unit_must_be_a_service_and_the_seed_sketch_parses():
    with pytest.raises(ConfigError, match="NAME.service"):
        Production.from_mapping({"unit": "frank-primary", "promote_as": "quadlet"}, "c.yaml")
    import yaml

    sketch = Path(__file__).resolve().parents[2] / "shared" / "examples" / "operator-campaign-sketch.yaml"
    raw = yaml.safe_load(sketch.read_text()) if sketch.exists() else None
    prod = Production.from_mapping(raw["production"] if raw else {
        "unit": "frank-primary.service", "promote_as": "env-file", "env_file": "/e", "mapping": SEED_MAPPING}, "sketch")
    assert prod.promote_as == "env-file" and prod.mapping


def test_mount_kinds_round_trip_through_both_forms():
    shape = Shape.from_mapping({**SEED.to_dict(), "args": SEED_ARGS,
                                "mounts": [Mount("cache-vol", "/root/.cache").to_dict() | {"kind": "volume"}]})
    assert parse_quadlet(quadlet(shape)).shape == shape and parse_service(service(shape)).shape == shape

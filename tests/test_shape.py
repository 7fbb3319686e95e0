"""Shape, Lever, Change and parse_change: one table row per rule."""
from __future__ import annotations

import copy
import json
import pickle

import pytest

from arms.errors import ConfigError
from arms.shape import ABSENT, Change, FrozenDict, Lever, Mount, Shape, parse_change

DIGEST = "docker.io/tcclaviger/vllm@sha256:" + "da4029666668b90a0386c1ed23ea370c79916ad4e1a6ad1dd9db098b9fa069ea"
MTP4 = {"method": "mtp", "num_speculative_tokens": 4}

# The baseline of examples/operator-campaign-sketch.yaml, as yaml.safe_load gives it.
SKETCH = {
    "image": DIGEST,
    "model": "/models/qwen",
    "args": {
        "tensor-parallel-size": 2,
        "max-model-len": 32768,
        "gpu-memory-utilization": 0.98,
        "kv-cache-memory-bytes": 2147483648,
        "max-num-seqs": 4,
        "enable-prefix-caching": True,
        "speculative-config": MTP4,
        "expert-prefetch": 1,
    },
    "env": {"R4D_LRU_GATHER_CHUNKS": 8, "R4D_LRU_GATHER_LANES": 16},
    "devices": ["/dev/kfd", "/dev/dri"],
    "compile_cache": "/home/dank/.cache/frank-primary",
    "port": 7773,
}
BASE = Shape.from_mapping(SKETCH)
ARG_NAMES = [n for n, _ in BASE.args]


def names(shape: Shape) -> list[str]:
    return [n for n, _ in shape.args]


# ---------------------------------------------------------------- with_change
@pytest.mark.parametrize("lever, value, want_names, name, want", [
    # add: a new flag goes at the end
    ("kv-cache-dtype", "fp8", ARG_NAMES + ["kv-cache-dtype"], "kv-cache-dtype", "fp8"),
    # replace: in place, order kept
    ("max-num-seqs", 8, ARG_NAMES, "max-num-seqs", 8),
    ("speculative-config", {"method": "ngram", "num_speculative_tokens": 4}, ARG_NAMES,
     "speculative-config", {"method": "ngram", "num_speculative_tokens": 4}),
    ("enable-prefix-caching", False, ARG_NAMES, "enable-prefix-caching", False),
    # remove: ABSENT, the string "absent", None
    ("expert-prefetch", ABSENT, [n for n in ARG_NAMES if n != "expert-prefetch"],
     "expert-prefetch", ABSENT),
    ("speculative-config", "absent", [n for n in ARG_NAMES if n != "speculative-config"],
     "speculative-config", ABSENT),
    ("max-num-seqs", None, [n for n in ARG_NAMES if n != "max-num-seqs"], "max-num-seqs", ABSENT),
    # removing what is not there changes nothing
    ("expert-precise-memory", ABSENT, ARG_NAMES, "expert-precise-memory", ABSENT),
    # names are normalised like the YAML form
    ("--max_num_seqs", 2, ARG_NAMES, "max-num-seqs", 2),
    # a Lever object works as well as its name
    (Lever("max-num-batched-tokens", (512, 1024)), 1024,
     ARG_NAMES + ["max-num-batched-tokens"], "max-num-batched-tokens", 1024),
    # env: stringified, kept sorted, args untouched
    ("env.R4D_LRU_GATHER_CHUNKS", 32, ARG_NAMES, "env.R4D_LRU_GATHER_CHUNKS", "32"),
    ("env.R4D_LRU_UVA_TOKENS", 2048, ARG_NAMES, "env.R4D_LRU_UVA_TOKENS", "2048"),
    ("env.R4D_LRU_GATHER_LANES", ABSENT, ARG_NAMES, "env.R4D_LRU_GATHER_LANES", ABSENT),
    ("env.CLAV_TUNABLEOP_WITH_OFFLOAD", True, ARG_NAMES, "env.CLAV_TUNABLEOP_WITH_OFFLOAD", "1"),
])
def test_with_change(lever, value, want_names, name, want):
    changed = BASE.with_change(lever, value)
    assert names(changed) == want_names
    assert changed.value_of(name) == want
    assert [k for k, _ in changed.env] == sorted(k for k, _ in changed.env)
    assert BASE == Shape.from_mapping(SKETCH)  # the incumbent is never mutated


def test_with_change_keeps_the_position_of_a_replaced_flag():
    changed = BASE.with_change("max-num-seqs", 8)
    assert changed.args[ARG_NAMES.index("max-num-seqs")] == ("max-num-seqs", 8)


@pytest.mark.parametrize("value", [object(), {1, 2}, float("nan"), {1: "a"}, b"x"])
def test_with_change_refuses_values_that_are_not_json(value):
    with pytest.raises(ConfigError, match="max-num-seqs"):
        BASE.with_change("max-num-seqs", value)


# ---------------------------------------------------------------- diff / describe
@pytest.mark.parametrize("other, want", [
    (BASE, []),
    (BASE.with_change("expert-prefetch", ABSENT), ["expert-prefetch 1 → absent"]),
    (BASE.with_change("env.R4D_LRU_GATHER_CHUNKS", 32), ["env.R4D_LRU_GATHER_CHUNKS 8 → 32"]),
    (BASE.with_change("speculative-config", ABSENT),
     ['speculative-config {"method":"mtp","num_speculative_tokens":4} → absent']),
    (BASE.with_change("kv-cache-dtype", "fp8"), ["kv-cache-dtype absent → fp8"]),
    (BASE.with_change("enable-prefix-caching", False), ["enable-prefix-caching true → false"]),
    (BASE.with_change("gpu-memory-utilization", 0.9), ["gpu-memory-utilization 0.98 → 0.9"]),
    (BASE.with_change("env.R4D_LRU_UVA_TOKENS", 2048), ["env.R4D_LRU_UVA_TOKENS absent → 2048"]),
    (Shape.from_mapping({**SKETCH, "image": "vllm@sha256:" + "0" * 64}),
     [f"image {DIGEST} → vllm@sha256:{'0' * 64}"]),
    (Shape.from_mapping({**SKETCH, "port": 7774}), ["port 7773 → 7774"]),
    (Shape.from_mapping({**SKETCH, "compile_cache": None}),
     ["mount:/root/.cache /home/dank/.cache/frank-primary:/root/.cache → absent"]),
    (Shape.from_mapping({**SKETCH, "devices": ["/dev/kfd"]}),
     ['devices ["/dev/dri","/dev/kfd"] → ["/dev/kfd"]']),
    (Shape.from_mapping({**SKETCH, "options": {"shm_size": "16g"}}),
     ["option:shm_size absent → 16g"]),
    (BASE.with_change("max-num-seqs", 8).with_change("env.R4D_LRU_GATHER_LANES", 64),
     ["max-num-seqs 4 → 8", "env.R4D_LRU_GATHER_LANES 16 → 64"]),
])
def test_diff_and_describe(other, want):
    assert [c.describe() for c in BASE.diff(other)] == want


def test_diff_values_are_absent_when_missing():
    (change,) = BASE.diff(BASE.with_change("expert-prefetch", ABSENT))
    assert change == Change("expert-prefetch", 1, ABSENT)


@pytest.mark.parametrize("change", [
    Change("expert-prefetch", 1, ABSENT),
    Change("speculative-config", FrozenDict(MTP4), ABSENT),
    Change("kv-cache-dtype", ABSENT, "fp8"),
])
def test_change_round_trips_through_json(change):
    assert Change.from_dict(json.loads(json.dumps(change.to_dict()))) == change


# ---------------------------------------------------------------- identity
def test_key_is_short_hex_and_stable():
    key = BASE.key()
    assert len(key) == 12 and int(key, 16) >= 0
    assert Shape.from_mapping(SKETCH).key() == key
    small = Shape("img@sha256:" + "a" * 64, "/m", (("max-num-seqs", 4),))
    # pinned: sha256 of {"args":[["max-num-seqs",4]],"devices":[],"env":{},"image":...,
    # "model":"/m","mounts":[],"options":{},"port":8000} (sorted keys, compact); the journal
    # keys on it across versions
    assert small.key() == "18ef388c9681"


@pytest.mark.parametrize("a, b", [
    (BASE, BASE.with_change("max-num-seqs", 8)),
    (BASE, BASE.with_change("env.R4D_LRU_GATHER_CHUNKS", 16)),
    (BASE.with_change("expert-precise-memory", True), BASE.with_change("expert-precise-memory", 1)),
    (BASE.with_change("max-num-seqs", 4), BASE.with_change("max-num-seqs", "4")),
    (BASE, Shape.from_mapping({**SKETCH, "port": 7774})),
])
def test_different_shapes_have_different_keys(a, b):
    assert a != b and a.key() != b.key()


@pytest.mark.parametrize("a, b", [
    # one config reached by two paths: args order does not count
    (BASE.with_change("kv-cache-dtype", "fp8").with_change("max-num-batched-tokens", 512),
     BASE.with_change("max-num-batched-tokens", 512).with_change("kv-cache-dtype", "fp8")),
    # nor dict key order, env order, device order
    (BASE.with_change("speculative-config", {"num_speculative_tokens": 4, "method": "mtp"}), BASE),
    (Shape.from_mapping({**SKETCH, "env": {"R4D_LRU_GATHER_LANES": 16, "R4D_LRU_GATHER_CHUNKS": 8}}),
     BASE),
    (Shape.from_mapping({**SKETCH, "devices": ["/dev/dri", "/dev/kfd"]}), BASE),
    # 8.0 boots exactly like 8
    (BASE.with_change("max-num-seqs", 8.0), BASE.with_change("max-num-seqs", 8)),
    # a change and its undo
    (BASE.with_change("max-num-seqs", 8).with_change("max-num-seqs", 4), BASE),
])
def test_equal_shapes_share_key_and_hash(a, b):
    assert a == b and a.key() == b.key() and hash(a) == hash(b)


def test_shapes_dedupe_in_a_set():
    arms = {BASE.with_change("max-num-seqs", v) for v in (4, 8, 8, 16)}
    arms |= {BASE.with_change("env.R4D_LRU_GATHER_CHUNKS", v) for v in (8, "8", 32)}
    assert len(arms) == 4  # 4 (= BASE), 8, 16, CHUNKS=32


def test_shape_is_frozen():
    with pytest.raises(AttributeError):
        BASE.port = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        BASE.value_of("speculative-config")._d = {}


@pytest.mark.parametrize("shape", [
    BASE,
    BASE.with_change("speculative-config", {"method": "ngram", "prompt_lookup_max": [4, 5]}),
    Shape("img@sha256:" + "b" * 64, "/m", (("compilation-config", {"mode": 3}), ("enforce-eager", False)),
          (("HF_TOKEN", "x"),), (Mount("/a", "/b", True),), ("nvidia.com/gpu=all",), 8000,
          (("ulimits", {"memlock": -1}), ("group_add", ["video", "render"]), ("ipc", "host"))),
])
def test_to_dict_from_dict_round_trip(shape):
    data = json.loads(json.dumps(shape.to_dict()))
    back = Shape.from_dict(data)
    assert back == shape and back.args == shape.args and back.to_dict() == shape.to_dict()
    assert pickle.loads(pickle.dumps(shape)) == shape


def test_absent_is_a_singleton_everywhere():
    assert pickle.loads(pickle.dumps(ABSENT)) is ABSENT
    assert copy.deepcopy(ABSENT) is ABSENT and str(ABSENT) == "absent"


# ---------------------------------------------------------------- from_mapping
@pytest.mark.parametrize("mapping, attr, want", [
    ({"args": {"--max_model_len": 1024}}, "args", (("max-model-len", 1024),)),
    ({"args": {"max_num_seqs": 2, "kv-cache-dtype": "fp8"}}, "args",
     (("max-num-seqs", 2), ("kv-cache-dtype", "fp8"))),
    ({"args": {"compilation_config.cudagraph_mode": "FULL"}}, "args",
     (("compilation-config.cudagraph_mode", "FULL"),)),
    ({"args": {"enforce-eager": True, "x": None, "y": "absent"}}, "args", (("enforce-eager", True),)),
    ({"args": {"speculative-config": MTP4}}, "args", (("speculative-config", FrozenDict(MTP4)),)),
    ({"env": {"B": 8, "A": 0.5, "C": True, "D": None, "E": "absent"}}, "env",
     (("A", "0.5"), ("B", "8"), ("C", "1"))),
    ({"compile_cache": "/cache"}, "mounts", (Mount("/cache", "/root/.cache"),)),
    ({"compile_cache": {"source": "/c", "target": "/root/.triton"}}, "mounts",
     (Mount("/c", "/root/.triton"),)),
    ({"mounts": ["/models:/models:ro", {"source": "/x", "target": "/y"}]}, "mounts",
     (Mount("/models", "/models", True), Mount("/x", "/y"))),
    ({"devices": "nvidia.com/gpu=all"}, "devices", ("nvidia.com/gpu=all",)),
    ({"devices": ["/dev/kfd", "/dev/dri", "/dev/kfd"]}, "devices", ("/dev/dri", "/dev/kfd")),
    ({}, "port", 8000),
    ({"options": {"shm-size": "16g", "ipc": "host", "ulimits": {"memlock": -1}}}, "options",
     (("ipc", "host"), ("shm_size", "16g"), ("ulimits", FrozenDict({"memlock": -1})))),
])
def test_from_mapping_normalises(mapping, attr, want):
    shape = Shape.from_mapping({"image": DIGEST, "model": "/m", **mapping})
    assert getattr(shape, attr) == want


@pytest.mark.parametrize("mapping, match", [
    ({"image": DIGEST}, "needs 'model'"),
    ({"model": "/m"}, "needs 'image'"),
    ({"image": DIGEST, "model": "/m", "flags": {}}, "unknown shape key 'flags'"),
    ({"image": DIGEST, "model": "/m", "args": ["--x"]}, "args must be a mapping"),
    ({"image": DIGEST, "model": "/m", "args": {"max_num_seqs": 1, "max-num-seqs": 2}}, "twice"),
    ({"image": DIGEST, "model": "/m", "env": {"BAD-NAME": 1}}, "BAD-NAME"),
    ({"image": DIGEST, "model": "/m", "mounts": ["relative"]}, "relative"),
    ({"image": DIGEST, "model": "/m", "mounts": ["/a:/c", "/b:/c"]}, "repeat"),
    ({"image": DIGEST, "model": "/m", "port": "80"}, "port"),
    ({"image": DIGEST, "model": "/m", "args": {"x": {1, 2}}}, "not JSON-able"),
])
def test_from_mapping_errors(mapping, match):
    with pytest.raises(ConfigError, match=match):
        Shape.from_mapping(mapping)


# ---------------------------------------------------------------- image digest
@pytest.mark.parametrize("image", [DIGEST, "localhost/sim:dev@sha256:" + "f" * 64])
def test_digest_images_pass(image):
    Shape(image, "/m").validate_image()


@pytest.mark.parametrize("image", [
    "docker.io/tcclaviger/vllm:latest", "vllm", "vllm@sha256:" + "A" * 64, "vllm@sha256:abc",
])
def test_tags_are_refused_with_the_fix(image):
    with pytest.raises(ConfigError) as err:
        Shape(image, "/m").validate_image()
    message = str(err.value)
    assert image in message and "\n" not in message
    assert "resolve it with `tuner check`, which records the digest" in message


# ---------------------------------------------------------------- Lever
@pytest.mark.parametrize("name, spec, want", [
    ("expert-prefetch", ["absent", 1, 2], ("expert-prefetch", (ABSENT, 1, 2), "preserving", "flag")),
    ("kv-cache-dtype", {"values": ["auto", "fp8"], "numerics": "changing"},
     ("kv-cache-dtype", ("auto", "fp8"), "changing", "flag")),
    ("env.CLAV_TUNABLEOP_WITH_OFFLOAD", {"values": ["absent", 1]},
     ("env.CLAV_TUNABLEOP_WITH_OFFLOAD", (ABSENT, 1), "preserving", "env")),
    ("--max_num_batched_tokens", [512, 1024], ("max-num-batched-tokens", (512, 1024), "preserving", "flag")),
    ("speculative-config", [None, MTP4], ("speculative-config", (ABSENT, FrozenDict(MTP4)), "preserving", "flag")),
    ("expert-precise-memory", ["absent", True, 1], ("expert-precise-memory", (ABSENT, True, 1), "preserving", "flag")),
])
def test_lever_from_spec(name, spec, want):
    lever = Lever.from_spec(name, spec)
    assert (lever.name, lever.values, lever.numerics, lever.kind) == want
    assert lever.target == lever.name.removeprefix("env.")
    hash(lever)


@pytest.mark.parametrize("name, spec, match", [
    ("max-num-seqs", [], "'max-num-seqs' has no values"),
    ("max-num-seqs", {"values": []}, "'max-num-seqs' has no values"),
    ("kv-cache-dtype", {"values": ["fp8"], "numerics": "exact"}, "'kv-cache-dtype': numerics 'exact'"),
    ("max-num-seqs", [4, 8, 4], "'max-num-seqs' lists the value 4 twice"),
    ("expert-prefetch", ["absent", None], "lists the value absent twice"),
    ("speculative-config", [MTP4, {"num_speculative_tokens": 4, "method": "mtp"}], "twice"),
    ("max-num-seqs", {"value": [4]}, "'max-num-seqs': unknown keys"),
    ("max-num-seqs", {"numerics": "changing"}, "'max-num-seqs' needs values"),
    ("max-num-seqs", 4, "'max-num-seqs': values must be a list"),
    ("env.BAD-NAME", [1], "BAD-NAME"),
])
def test_lever_from_spec_errors(name, spec, match):
    with pytest.raises(ConfigError, match=match):
        Lever.from_spec(name, spec)


# ---------------------------------------------------------------- parse_change
LEVERS = {name: Lever.from_spec(name, spec) for name, spec in {
    "expert-prefetch": ["absent", 1, 2],
    "speculative-config": ["absent", {"method": "mtp", "num_speculative_tokens": 3}],
    "env.R4D_LRU_GATHER_CHUNKS": [8, 16, 32, 64],
    "gpu-memory-utilization": [0.9, 0.95],
    "kv-cache-dtype": {"values": ["auto", "fp8"], "numerics": "changing"},
    "expert-precise-memory": ["absent", True],
}.items()}


@pytest.mark.parametrize("text, levers, want", [
    ("max-num-seqs=8", None, ("max-num-seqs", 8)),
    ("--max_num_seqs=8", None, ("max-num-seqs", 8)),
    ("anything=abc", None, ("anything", "abc")),
    ("expert-prefetch=2", LEVERS, ("expert-prefetch", 2)),
    ("expert-prefetch=absent", LEVERS, ("expert-prefetch", ABSENT)),
    ("expert-prefetch=5", LEVERS, ("expert-prefetch", 5)),  # not listed, same type: allowed
    ("speculative-config={method: ngram, num_speculative_tokens: 4}", LEVERS,
     ("speculative-config", FrozenDict({"method": "ngram", "num_speculative_tokens": 4}))),
    ('speculative-config={"method":"mtp","num_speculative_tokens":6}', LEVERS,
     ("speculative-config", FrozenDict({"method": "mtp", "num_speculative_tokens": 6}))),
    ("env.R4D_LRU_GATHER_CHUNKS=128", LEVERS, ("env.R4D_LRU_GATHER_CHUNKS", 128)),
    ("gpu-memory-utilization=1", LEVERS, ("gpu-memory-utilization", 1)),  # int for a float lever
    ("kv-cache-dtype=fp8_e5m2", LEVERS, ("kv-cache-dtype", "fp8_e5m2")),
    ("expert-precise-memory=false", LEVERS, ("expert-precise-memory", False)),
])
def test_parse_change(text, levers, want):
    assert parse_change(text, levers) == want


@pytest.mark.parametrize("text, match", [
    ("nolever=1", r"unknown lever 'nolever'; known levers: env\.R4D_LRU_GATHER_CHUNKS, expert-precise"),
    ("expert-prefetch=abc", "expected a int .*got a string"),
    ("env.R4D_LRU_GATHER_CHUNKS=1.5", "expected a int"),
    ("kv-cache-dtype=8", "expected a string"),
    ("expert-precise-memory=1", "expected a bool"),
    ("speculative-config=mtp", "expected a mapping"),
    ("expert-prefetch", "is not LEVER=VALUE"),
    ("expert-prefetch=", "is not LEVER=VALUE"),
    ("=3", "is not LEVER=VALUE"),
    ("speculative-config={method: ", "value is not YAML"),
])
def test_parse_change_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_change(text, LEVERS)

"""The simulated engine models a real box (issue 19, Build 1): per-boot spread, warm-up, a cold
first boot, a drift step — each a landscape key, validated with FILE:LINE: key, and each seen in
what a measurement through the simulated host reads."""
from __future__ import annotations

import math
import statistics

import pytest

from arms.measure import MeasurePlan
from host.simhost import SimHost
from simengine import realbox
from simengine.cli import known_flags
from simengine.landscape import DEFAULT_LANDSCAPE, LandscapeError, load_landscape
from tests.test_simhost import boot, make_shape

FLAGS = known_flags()
QUIET = {"SIMENGINE_NOISE": "0"}          # no per-request noise: what is left is the box
ONE_DEPTH = MeasurePlan(depths=(166,), runs=5, warm_tokens=0, max_tokens=64)


def landscape(tmp_path, extra: str):
    p = tmp_path / "box.yaml"
    p.write_text(DEFAULT_LANDSCAPE.read_text() + "\n" + extra)
    return p


BAD = [
    ("boot_sigma: -0.1\n", "boot_sigma", "a relative sigma in"),
    ("boot_sigma: 'wide'\n", "boot_sigma", "expected"),
    ("warmup: {requests: 3}\n", "warmup", "a mapping {requests: N, factor: F}"),
    ("warmup: {requests: 2.5, factor: 0.8}\n", "warmup.requests", "a count >= 0"),
    ("warmup: {requests: 3, factor: 1.5}\n", "warmup.factor", "a factor in (0, 1]"),
    ("cold_start: {factor: 0.7}\n", "cold_start", "a mapping {factor: F, boots: K"),
    ("cold_start: {factor: 0, boots: 1}\n", "cold_start.factor", "a positive factor"),
    ("cold_start: {factor: 0.7, boots: 1, load_factor: 0.5}\n", "cold_start.load_factor", "a factor >= 1"),
    ("drift_step: {at_hours: -1, factor: 0.95}\n", "drift_step.at_hours", "hours >= 0"),
    ("drift_step: [{at_hours: 3, factor: 0.95}, {at: 4}]\n", "drift_step[1]", "a mapping {at_hours: H, factor: F}"),
]


@pytest.mark.parametrize("extra, key, why", BAD, ids=[b[1] + ":" + b[0].split(":", 1)[1].strip()[:12] for b in BAD])
def test_a_malformed_box_key_is_one_line_with_file_line_and_key(tmp_path, extra, key, why):
    p = landscape(tmp_path, extra)
    line = len(DEFAULT_LANDSCAPE.read_text().splitlines()) + 2
    with pytest.raises(LandscapeError) as ei:
        load_landscape(p, FLAGS)
    msg = str(ei.value)
    assert "\n" not in msg and f"box.yaml:{line}: key '{key}'" in msg and why in msg, msg


def test_the_terms_as_functions():
    assert [round(realbox.warmup_factor(4, 0.6, n), 3) for n in range(1, 7)] == [0.6, 0.7, 0.8, 0.9, 1.0, 1.0]
    assert realbox.warmup_factor(0, 0.5, 1) == 1.0
    steps = realbox.steps({"drift_step": [{"at_hours": 5, "factor": 0.9}, {"at_hours": 3, "factor": 0.95}]})
    assert steps == ((10800.0, 0.95), (18000.0, 0.9))
    assert [realbox.step_factor(steps, h * 3600) for h in (0, 2.99, 3, 6)] == [1.0, 1.0, 0.95, pytest.approx(0.855)]
    cold = {"cold_start": {"factor": 0.7, "boots": 2}}
    assert [realbox.boot_terms(cold, 1, i).rate_factor for i in (0, 1, 2, None)] == [0.7, 0.7, 1.0, 1.0]
    assert realbox.boot_terms(cold, 1, 0).load_factor == realbox.COLD_LOAD_FACTOR


def test_boot_sigma_is_the_spread_of_log_rate_over_boots():
    logs = [math.log(realbox.boot_terms({"boot_sigma": 0.02}, seed, 5).rate_factor) for seed in range(2000)]
    assert statistics.fmean(logs) == pytest.approx(0.0, abs=0.002)
    assert statistics.stdev(logs) == pytest.approx(0.02, rel=0.08)
    assert realbox.boot_terms({"boot_sigma": 0.02}, 7, 5) == realbox.boot_terms({"boot_sigma": 0.02}, 7, 5)


def test_the_box_counter_file_counts_boots_and_an_unknown_place_is_warm(tmp_path):
    env = {"SIMENGINE_BOX_STATE": str(tmp_path)}
    assert [realbox.boot_index(env) for _ in range(3)] == [0, 1, 2]
    assert realbox.boot_index({"SIMENGINE_BOOT_INDEX": "4", **env}) == 4
    assert realbox.boot_index({}) is None
    assert realbox.boot_index({"SIMENGINE_BOX_STATE": str(tmp_path / "missing" / "dir")}) is None


def decode_runs(host, shape, tmp_path, name):
    r, m = boot(host, shape, tmp_path, name, measure=ONE_DEPTH)
    assert r.outcome == "ready", r.report.evidence
    return r, [run.decode_tok_s for run in m.depths[166].runs]


def test_a_cold_first_boot_reads_slow_and_loads_slow_then_the_box_is_warm(tmp_path):
    p = landscape(tmp_path, "cold_start: {factor: 0.7, boots: 1, load_factor: 3}\n")
    with SimHost(landscape=str(p)) as host:
        shape = make_shape(host.image_ref, tmp_path, QUIET)
        r1, cold = decode_runs(host, shape, tmp_path, "first")
        r2, warm = decode_runs(host, shape, tmp_path, "second")
        r3, again = decode_runs(host, shape, tmp_path, "third")
    assert statistics.median(cold) / statistics.median(warm) == pytest.approx(0.7, rel=0.01)
    assert statistics.median(again) == pytest.approx(statistics.median(warm), rel=0.005)
    assert r1.report.model_load_s == pytest.approx(3 * r2.report.model_load_s, rel=0.01)
    assert r1.boot_s > r2.boot_s


def test_warmup_ramps_the_first_requests_of_every_boot(tmp_path):
    p = landscape(tmp_path, "warmup: {requests: 12, factor: 0.5}\n")
    with SimHost(landscape=str(p)) as host:
        shape = make_shape(host.image_ref, tmp_path, QUIET)
        _, a = decode_runs(host, shape, tmp_path, "a")
        _, b = decode_runs(host, shape, tmp_path, "b")
    assert a == pytest.approx(b, rel=1e-6)                  # every boot warms up the same way
    assert all(x < y for x, y in zip(a, a[1:])), a          # each run faster than the last
    assert a[0] / a[-1] < 0.9


def test_boot_sigma_spreads_boots_of_one_shape(tmp_path):
    p = landscape(tmp_path, "boot_sigma: 0.05\n")
    with SimHost(landscape=str(p)) as host:
        shape = make_shape(host.image_ref, tmp_path, QUIET)
        medians = [statistics.median(decode_runs(host, shape, tmp_path, f"b{i}")[1]) for i in range(6)]
    logs = [math.log(m) for m in medians]
    assert statistics.stdev(logs) > 0.01                    # boots differ; without the key they would not
    assert max(logs) - min(logs) < 0.05 * 8


def test_a_drift_step_moves_every_later_request(tmp_path):
    p = landscape(tmp_path, "drift_step: {at_hours: 1, factor: 0.9}\n")
    with SimHost(landscape=str(p)) as host:
        shape = make_shape(host.image_ref, tmp_path, QUIET)
        _, before = decode_runs(host, shape, tmp_path, "before")
        host.sleep(3600)
        _, after = decode_runs(host, shape, tmp_path, "after")
    assert statistics.median(after) / statistics.median(before) == pytest.approx(0.9, rel=0.01)


# -- equal conditions: the model read once before the first boot (issue 19 Build 4) -----------------
def test_reading_the_model_once_spends_the_cold_boots(tmp_path):
    p = landscape(tmp_path, "cold_start: {factor: 0.7, boots: 1}\n")
    with SimHost(landscape=str(p)) as host:
        shape = make_shape(host.image_ref, tmp_path, QUIET)
        got = host.warm_files(["/models/sim"], 60)
        _, first = decode_runs(host, shape, tmp_path, "first")
        _, second = decode_runs(host, shape, tmp_path, "second")
    assert got["complete"] and got["simulated"]
    assert statistics.median(first) == pytest.approx(statistics.median(second), rel=0.005)   # no cold boot left


def test_read_through_reads_every_file_once_within_its_budget(tmp_path):
    from host.pagecache import read_through

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.gguf").write_bytes(b"x" * 3_000_000)
    (tmp_path / "m" / "sub").mkdir()
    (tmp_path / "m" / "sub" / "b.safetensors").write_bytes(b"y" * 1000)
    got = read_through([str(tmp_path / "m"), str(tmp_path / "missing")], budget_s=60)
    assert got["files"] == 2 and got["bytes"] == 3_001_000 and got["complete"]
    ticks = iter(range(0, 1000, 100))                   # a clock that passes the budget at once
    cut = read_through([str(tmp_path / "m")], budget_s=50, clock=lambda: next(ticks))
    assert not cut["complete"] and cut["files"] == 0 and cut["bytes"] > 0


def test_the_model_paths_are_the_host_model_and_the_read_only_mounts(tmp_path):
    from arms.lifecycle import model_paths
    from arms.shape import Shape

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    (tmp_path / "weights").mkdir()
    (tmp_path / "cache").mkdir()
    shape = Shape.from_mapping({"image": "localhost/x@sha256:" + "0" * 64, "model": str(gguf),
                                "mounts": [f"{tmp_path / 'weights'}:/w:ro", f"{tmp_path / 'cache'}:/root/.cache"]})
    assert model_paths(shape) == [str(gguf), str(tmp_path / "weights")]
    assert model_paths(Shape.from_mapping({"image": "localhost/x@sha256:" + "0" * 64, "model": "/models/sim"})) == []


def test_a_new_night_warms_the_page_cache_once_and_a_resume_does_not(tmp_path):
    from tests.test_campaign_sim import campaign, night

    path = campaign(tmp_path, "warm", budget={"max_arms": 2})
    _, recs, _ = night(path)
    warmed = [r for r in recs if r["op"] == "note" and r.get("text") == "page cache warmed"]
    assert len(warmed) == 1 and warmed[0]["complete"] is True
    assert [r["op"] for r in recs].index("note") < [r["op"] for r in recs].index("arm_start")
    _, again, _ = night(path, max_arms=3)                # resumed: the cache is warm already
    assert sum(1 for r in again if r.get("text") == "page cache warmed") == 1

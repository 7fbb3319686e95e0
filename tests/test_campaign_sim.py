"""Whole campaigns in simulated time (SimHost): the same campaign code, a night in seconds."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml

from arms.profiles import load_profile
from host.simhost import SimHost
from simengine.landscape import DEFAULT_LANDSCAPE
from tests.conftest import REPO
from tuner.night.campaign import load_campaign
from tuner.night.loop import CampaignLoop

BASE = {"tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.98,
        "kv-cache-memory-bytes": 2147483648, "max-num-seqs": 4,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 4}, "expert-prefetch": 1}
LEVERS = {"expert-prefetch": ["absent", 1, 2], "env.R4D_LRU_GATHER_CHUNKS": [8, 16, 32],
          "max-num-batched-tokens": [1024, 2048], "max-num-seqs": [3, 4]}


def campaign(tmp_path, name, **extra):
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({
        "name": name, "engine": "simengine",
        "baseline": {"image": "localhost/offload-tuner-simengine:sim", "model": "/models/sim", "args": BASE,
                     "env": {"R4D_LRU_GATHER_CHUNKS": 8, "R4D_LRU_GATHER_LANES": 16}, "port": 8000},
        "levers": LEVERS, "journal": str(tmp_path / "journal"), **extra}))
    return p


def night(path, seed=0, landscape=None, hours=None, max_arms=None):
    """Run a campaign file on a SimHost; (summary, journal records, host)."""
    camp, host = SimHost.pinned(load_campaign(path), landscape=str(landscape) if landscape else None,
                                noise_seed=seed)
    deadline = host.now() + hours * 3600 if hours else None
    summary = CampaignLoop(camp, host, load_profile("simengine"), deadline=deadline, max_arms=max_arms).run()
    recs = [json.loads(x) for x in (camp.folder / "journal.jsonl").read_text().splitlines()]
    return summary, recs, host


def run(tmp_path, name, landscape=None, seed=0, **extra):
    return night(campaign(tmp_path, name, **extra), seed, landscape, max_arms=40)


def test_a_flat_noisy_landscape_promotes_nothing(tmp_path):
    """sigma 5 % per request and no lever has any effect: every promotion would be false
    (bench/sim_campaigns.py runs 20 seeds; the suite keeps 3)."""
    d = yaml.safe_load(DEFAULT_LANDSCAPE.read_text())
    d.update({"effects": {}, "interactions": [], "rules": [], "numerics": {}, "noise_sigma": 0.05})
    moves = 0
    for seed in range(3):
        land = tmp_path / f"landscape{seed}.yaml"
        land.write_text(yaml.safe_dump({**d, "seed": seed}))
        summary, recs, _ = run(tmp_path, f"flat{seed}", land, seed=seed)
        deltas = [r["delta"] for r in recs if r["op"] == "arm_end" and r.get("delta") is not None]
        assert max(abs(x) for x in deltas) > 0.005          # the noise is really there
        moves += summary.moves
    assert moves == 0


def test_the_default_landscape_night_in_virtual_time(tmp_path):
    summary, recs, host = run(tmp_path, "night", seed=1)
    assert host.now() > 3600                                  # hours of virtual boots and decode...
    moves = [r for r in recs if r["op"] == "incumbent"]
    assert moves and "expert-prefetch" not in dict(moves[0]["shape"]["args"])   # the +50 % win first
    final = dict(moves[-1]["shape"]["env"])
    assert final.get("R4D_LRU_GATHER_CHUNKS") == "32"         # gather wins once prefetch is off
    assert summary.incumbent_objective > 26.8 * 1.4           # +50 % prefetch, +6 % gather, within noise


def test_tuner_run_simulated_from_the_command_line(tmp_path):
    path = campaign(tmp_path, "cli-sim", budget={"max_arms": 6})
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "run", str(path), "--simulated", "--quiet"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "arm budget of 6 reached" in r.stdout


def test_joint_mode_lets_optuna_pick_whole_shapes(tmp_path):
    summary, recs, _ = run(tmp_path, "joint", seed=2, search="joint", budget={"max_arms": 8})
    starts = [r for r in recs if r["op"] == "arm_start"]
    kinds = [r["kind"] for r in starts]
    assert kinds[0] == "baseline" and set(kinds[1:]) == {"joint"}
    assert len({json.dumps(r["shape"], sort_keys=True) for r in starts}) > 3      # whole shapes, not one change
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    import optuna

    study = optuna.load_study(study_name="joint", storage=JournalStorage(JournalFileBackend(
        str(tmp_path / "journal" / "joint" / "optuna.journal"))))
    joint = [t for t in study.get_trials() if "expert-prefetch" in t.params]
    assert len(joint) == len(starts) - 1 and set(joint[0].params) == set(LEVERS)


def test_a_lever_whose_noise_never_settles_ends_undecided_and_the_report_lists_it(tmp_path):
    """Bad input: HSA_ENABLE_SDMA=0 has no effect and 40 % request noise (small-gather.yaml).
    Judged by its own spread it stays undecided however lucky a boot is, is never promoted, the
    night goes on; the report's "How sure" names it with its spread."""
    from tuner.morning.report import build_report
    from tuner.morning.report_render import markdown as render_markdown

    land = REPO / "simengine" / "landscapes" / "small-gather.yaml"
    path = campaign(tmp_path, "unsettled", noise={"error_rate": 0.05})
    raw = yaml.safe_load(path.read_text())
    raw["levers"] = {"env.HSA_ENABLE_SDMA": ["absent", 0], "max-num-batched-tokens": [1024, 2048]}
    path.write_text(yaml.safe_dump(raw))
    summary, recs, _ = night(path, seed=4, landscape=land, max_arms=12)
    moves = [r for r in recs if r["op"] == "incumbent"]
    assert not any(m["change"][0] == "env.HSA_ENABLE_SDMA" for m in moves)
    sdma = [r["comparison"] for r in recs if r["op"] == "compare" and (r.get("change") or [""])[0] == "env.HSA_ENABLE_SDMA"]
    assert sdma and sdma[-1]["verdict"] == "undecided" and sdma[-1]["sigma"][0] > 0.2
    assert sum(1 for r in recs if r["op"] == "arm_start" and (r.get("change") or [""])[0] == "env.HSA_ENABLE_SDMA") >= 2
    md = render_markdown(build_report(tmp_path / "journal" / "unsettled"))
    assert "## How sure" in md and "Undecided" in md and "env.HSA_ENABLE_SDMA" in md.split("## How sure")[1]
    for m in moves:                                           # every move shows its runs, interval and error rate
        c = m["comparison"]
        assert f"{c['effect']:+.1%} [{c['lo']:+.1%}, {c['hi']:+.1%}]" in md


def test_the_optuna_study_is_the_search_and_its_best_trial_is_the_incumbent(tmp_path):
    """The one-change policy is the study's sampler: every arm is a trial whose user attrs say
    why; the dashboard's best trial is the arm that made the final incumbent."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from tuner.night.sampler import OneChangeSampler

    summary, recs, _ = run(tmp_path, "study", seed=1, budget={"max_arms": 10})
    study = optuna.load_study(study_name="study", storage=JournalStorage(JournalFileBackend(
        str(tmp_path / "journal" / "study" / "optuna.journal"))))
    starts = [r for r in recs if r["op"] == "arm_start"]
    trials = study.get_trials()
    assert len(trials) == len(starts) and all(t.state.is_finished() for t in trials)
    assert all(t.user_attrs.get("why") and t.user_attrs.get("kind") for t in trials)
    assert study.metric_names == ["decode_geomean"]
    moves = [r for r in recs if r["op"] == "incumbent"]
    assert moves, "seed 1 moves prefetch off within 10 arms"
    by_trial = {r["trial"]: r["arm"] for r in starts}
    assert by_trial[study.best_trial.number] == moves[-1]["arm"]
    assert isinstance(OneChangeSampler(), optuna.samplers.BaseSampler)


def test_an_error_rate_that_is_not_a_probability_is_one_clear_line(tmp_path):
    import pytest

    from arms.errors import ConfigError

    with pytest.raises(ConfigError, match=r"bad-alpha.yaml:\d+: noise.error_rate: should be less than 0.5, got 1.5"):
        load_campaign(campaign(tmp_path, "bad-alpha", noise={"error_rate": 1.5}))


def test_gpu_memory_taken_by_another_process_is_named():
    from host.probes import gpu_holders

    class Proc:
        pid, usedGpuMemory = 1, 20 * 2**30

    class FakeNvml:
        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlDeviceGetCount(self): return 2
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetComputeRunningProcesses(self, h): return [Proc()] if h == 1 else []

    got = gpu_holders(FakeNvml())
    assert got and got[0][0] == 1 and got[0][2] == 20 * 2**30
    assert gpu_holders(object()) is None            # no reader: nothing can be said


def test_an_unreachable_constraint_keeps_the_production_shape_and_exits_0(tmp_path):
    """Bad input: no reachable shape holds two 200k contexts (no lever moves the window or the
    KV dtype). A bigger pool is progress and moves the incumbent, but the night ends with
    'no shape satisfies', the report recommends the production shape, promote refuses."""
    import pytest

    from arms.errors import ConfigError
    from tuner.production.context import choose
    from tuner.night.state import replay

    levers = {"kv-cache-memory-bytes": [2147483648, 3150000000], "env.R4D_LRU_GATHER_CHUNKS": [8, 32]}
    path = campaign(tmp_path, "no-fit", budget={"max_arms": 8},
                    constraints={"max_concurrency_at": {"tokens": 200704, "min": 1.99}})
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "levers": levers}))
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "run", str(path), "--simulated", "--quiet"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verdict: no shape satisfies max concurrency >= 1.99x at 200,704 tokens" in r.stdout
    folder = tmp_path / "journal" / "no-fit"
    recs = [json.loads(x) for x in (folder / "journal.jsonl").read_text().splitlines()]
    moves = [x for x in recs if x["op"] == "incumbent"]
    assert moves and dict(moves[-1]["shape"]["args"])["kv-cache-memory-bytes"] == 3150000000    # progress, not a fit
    assert moves[-1]["score"]["feasible"] is False and 1.0 < moves[-1]["score"]["violation"] < 1.71
    assert recs[-1]["op"] == "campaign_end" and recs[-1]["verdict"].startswith("no shape satisfies")
    st = subprocess.run([sys.executable, "-m", "tuner.cli", "status", str(folder), "--json"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
    assert json.loads(st.stdout)["verdict"].startswith("no shape satisfies max concurrency"), st.stderr[-2000:]
    rep = subprocess.run([sys.executable, "-m", "tuner.cli", "report", str(folder)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    # the answer first (issue 20): keep the start, and why; "production shape" only with a production section
    assert ("**Recommendation: keep the campaign's baseline as it is** — no shape satisfies max concurrency "
            ">= 1.99x at 200,704 tokens") in rep.stdout
    with pytest.raises(ConfigError, match="no shape satisfies the campaign's constraints"):
        choose(replay(recs, load_campaign(path).baseline), None, force=False)


def test_the_one_night_example_reaches_shape_e_in_simulated_time(tmp_path):
    """examples/one-night.yaml (seed 002's three nights as one campaign, issue 8) in simulated
    time: from the 09-29 shape it ends on a shape that holds two 200k contexts, with shape E's
    levers, well inside its 10-hour budget. bench/one_night.py runs it over 20 seeds."""
    raw = yaml.safe_load((REPO / "examples" / "one-night.yaml").read_text())
    raw["journal"] = str(tmp_path / "journal")
    raw["baseline"]["compile_cache"] = str(tmp_path / "cache")
    path = tmp_path / "one-night.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    summary, recs, host = night(path, seed=3, hours=10)
    final = [r for r in recs if r["op"] == "incumbent"][-1]
    args, env = dict(final["shape"]["args"]), final["shape"]["env"]
    assert final["score"]["feasible"] and summary.verdict is None
    assert {k: args.get(k) for k in ("max-model-len", "kv-cache-dtype", "kv-cache-memory-bytes")} == \
        {"max-model-len": 200704, "kv-cache-dtype": "fp8", "kv-cache-memory-bytes": 3150000000}
    assert "expert-prefetch" not in args and "speculative-config" not in args
    assert (env["R4D_LRU_GATHER_CHUNKS"], env["R4D_LRU_GATHER_LANES"]) == ("32", "64")
    boot = next(r for r in recs if r["op"] == "arm_end" and r["arm"] == final["arm"])["boot"]["report"]
    assert boot["max_concurrency"] >= 1.99 and boot["max_concurrency_len"] == 200704
    assert summary.incumbent_objective > 26.2 * 1.5
    moved_at = sum(r.get("arm_s") or 0 for r in recs if r["op"] == "arm_end" and r["arm"] <= final["arm"])
    assert moved_at < 8 * 3600                                # E well inside the budget; the rest is spent checking
    assert not any(r.get("verdict") == "corrupt" for r in recs if r["op"] == "incumbent")

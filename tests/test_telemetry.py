"""Expert-cache telemetry: the parse (fixture files), the shape changes and check, and the
profiler window against the simulated engine's HTTP server in-process."""
from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
import yaml

from arms.errors import ConfigError, HostError
from arms.host import RealTime
from arms.profiles import load_profile
from arms.prompts import PromptCache, api_from_profile
from arms.shape import Shape
from arms.telemetry import (TELEMETRY_ENV, apply_telemetry, cap_traces, check_telemetry,
                            expected_ranks, load_report, parse_rank, report_from_texts,
                            slab_bytes_from_plan, telemetry_shape_changes, telemetry_window)
from simengine.behaviour import Behaviour
from simengine.landscape import DEFAULT_LANDSCAPE
from simengine.server import start_server

FIX = Path(__file__).parent / "fixtures" / "telemetry"
SLAB = 2_457_862                        # 2.344 MiB
SEED_WASTE_GB = (36720 - 13369) * SLAB / 102 / 1e9      # 0.5627 GB per step per rank
SIM = load_profile("simengine")
IMAGE = "localhost/sim@sha256:" + "0" * 64


# -- the parse --------------------------------------------------------------------------------
def test_full_two_rank_set_gives_the_seed_numbers():
    r = load_report(FIX / "full", ranks=2)
    assert sorted(r.ranks) == [0, 1] and r.missing_ranks == () and r.problems == []
    t = r.ranks[0].totals
    assert (t.routed, t.hits, t.installs, t.read_through, t.prefetched, t.served_by_prefetch) == \
        (166262, 137084, 15814, 13364, 36720, 13369)
    assert t.hit_rate == pytest.approx(0.8245, abs=1e-4)
    assert t.precision == pytest.approx(13369 / 36720) and round(t.precision * 100) == 36
    assert t.useless == 23351
    assert r.wasted_gb_per_step_per_rank == pytest.approx(SEED_WASTE_GB)
    assert r.wasted_gb_per_step_per_rank == pytest.approx(0.56, abs=0.005)
    assert r.moved_slabs_per_step_per_rank == pytest.approx((15814 + 13364 + 36720) / 102)
    d = r.ranks[1].to_dict()
    assert d["resident_layers"] == [0, 1, 2] and d["swap_layers"] == list(range(3, 48))
    assert all(x["hit_rate"] == 1.0 for x in d["layers"][:3])
    f = r.findings()
    assert f[0].startswith("prefetch precision 36 %: ~0.56 GB per step wasted per rank")
    assert "36,720 slabs prefetched to serve 13,369; 23,351 useless copies" in f[0]
    assert f[1].startswith("hit rate 82.45 % (137,084/166,262) per rank over 102 steps")
    assert "resident layers 0-2 at 100 %" in f[1] and "swap layers 3-47 at" in f[1]
    assert "all ranks identical" in f
    json.dumps(r.to_dict())                                    # journal-ready


def test_prefetch_off_set_reports_no_prefetch_traffic():
    r = load_report(FIX / "prefetch_off", ranks=2)
    assert r.totals.prefetched == 0 and r.totals.precision is None and not r.prefetch_on
    assert r.wasted_gb_per_step_per_rank == 0.0
    assert r.findings()[0] == "no prefetch traffic: 0 slabs prefetched (prefetch off)"
    assert r.ranks[0].totals.installs == 45 * round(6.358 * 102)


def test_truncated_rank_is_reported_and_the_other_rank_still_counts():
    r = load_report(FIX / "truncated", ranks=2)
    assert sorted(r.ranks) == [0] and r.missing_ranks == ()
    assert len(r.problems) == 1 and r.problems[0].startswith("rank 1: expert_cache_rank1.json is truncated")
    assert r.findings()[-1] == r.problems[0]
    assert r.ranks[0].totals.precision == pytest.approx(13369 / 36720)


def test_missing_rank_is_reported():
    r = load_report(FIX / "missing_rank", ranks=2)
    assert r.missing_ranks == (1,) and r.problems == ["rank 1: expert_cache_rank1.json missing"]
    only1 = {"x/expert_cache_rank1.json": (FIX / "full" / "expert_cache_rank1.json").read_text()}
    r = report_from_texts(only1)                               # TP unknown: 0..highest expected
    assert r.missing_ranks == (0,) and sorted(r.ranks) == [1]
    empty = report_from_texts({}, ranks=2)
    assert empty.missing_ranks == (0, 1) and empty.findings()[0] == "no expert-cache telemetry was parsed"


def test_tolerant_forms_slab_from_plan_and_bad_files():
    assert slab_bytes_from_plan({"slab_mib": 2.344}) == SLAB and slab_bytes_from_plan({}) is None
    totals_only = json.dumps({"rank": 0, "steps": 10, "totals": {
        "routed": 100, "hits": 80, "installs": 10, "read-through": 10, "prefetched": 40, "migrations": 10}})
    r = report_from_texts({"expert_cache_rank0.json": totals_only}, slab_bytes=SLAB)
    assert r.ranks[0].totals.read_through == 10 and r.ranks[0].totals.served_by_prefetch == 10
    assert r.wasted_gb_per_step_per_rank == pytest.approx(30 * SLAB / 10 / 1e9)
    no_slab = report_from_texts({"expert_cache_rank0.json": totals_only})
    assert no_slab.wasted_gb_per_step_per_rank is None and "n/a" in no_slab.findings()[0]
    with pytest.raises(ValueError, match="is empty"):
        parse_rank("", "expert_cache_rank0.json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        parse_rank("{nope}", "expert_cache_rank0.json")
    with pytest.raises(ValueError, match="neither 'layers' nor 'totals'"):
        parse_rank("{}", "expert_cache_rank0.json")
    no_steps = report_from_texts({"expert_cache_rank0.json": json.dumps({"totals": {"routed": 1, "hits": 1}})})
    assert "no step count" in no_steps.problems[0]


# -- the shape and the check ------------------------------------------------------------------
def test_shape_changes_and_the_check_time_error():
    env, args = telemetry_shape_changes(load_profile("vllm-expert-offload"))
    assert env == {TELEMETRY_ENV: "1"}
    assert args == {"profiler-config": {"profiler": "torch", "torch_profiler_dir": "/profiles",
                                        "torch_profiler_with_stack": False}}
    env, args = telemetry_shape_changes(SIM, style="env", profiler_dir="/p")
    assert env["VLLM_TORCH_PROFILER_WITH_STACK"] == "0" and env["VLLM_TORCH_PROFILER_DIR"] == "/p" and not args
    with pytest.raises(ConfigError) as e:
        check_telemetry(load_profile("vllm"), True)
    assert "\n" not in str(e.value) and "'vllm'" in str(e.value) and "telemetry" in str(e.value)
    check_telemetry(load_profile("vllm"), False)               # off: nothing to check
    with pytest.raises(ConfigError):
        telemetry_shape_changes(load_profile("llamacpp"))


def test_apply_telemetry_merges_and_refuses_stack_tracing():
    base = Shape(IMAGE, "/m", args=(("tensor-parallel-size", 2),
                                    ("profiler-config", {"profiler": "torch", "torch_profiler_record_shapes": True})))
    s = apply_telemetry(base, SIM)
    assert s.value_of("env.R4D_LRU_TELEMETRY") == "1" and expected_ranks(s) == 2
    pc = dict(s.value_of("profiler-config"))
    assert pc["torch_profiler_with_stack"] is False and pc["torch_profiler_record_shapes"] is True
    assert expected_ranks(Shape(IMAGE, "/m")) == 1
    stacked = base.with_change("profiler-config", {"profiler": "torch", "torch_profiler_with_stack": True})
    with pytest.raises(ConfigError, match="torch_profiler_with_stack true"):
        apply_telemetry(stacked, SIM)
    with pytest.raises(ConfigError, match="40 GB"):
        check_telemetry(SIM, True, base.with_change("env.VLLM_TORCH_PROFILER_WITH_STACK", "1"))


# -- the window against the in-process simulated server ---------------------------------------
class DirHost(RealTime):
    """Just enough Host: the 'container' filesystem is a local folder."""

    def __init__(self, root: Path):
        self.root, self.copies = root, []

    def copy_out(self, cid: str, src: str, dest: Path) -> list[Path]:
        self.copies.append(src)
        p = self.root / src.lstrip("/")
        if not p.exists():
            raise HostError(f"{src} not found in container {cid[:12]}")
        dest.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            shutil.copytree(p, dest / p.name, dirs_exist_ok=True)
            return [x for x in (dest / p.name).rglob("*") if x.is_file()]
        return [Path(shutil.copy2(p, dest / p.name))]


def counters(kind: str) -> dict:
    return yaml.safe_load(DEFAULT_LANDSCAPE.read_text())["telemetry"][kind]


@contextlib.contextmanager
def engine(tmp_path: Path, **kw):
    root = tmp_path / "ctr"
    b = Behaviour(**{**dict(model="sim/m", max_model_len=8192, decode_tok_s={0: 3000.0},
                            base_ttft_s=0.01, prefill_tok_s=200_000.0, spec_k=4, acceptance=0.58,
                            tp=2, telemetry=True, profiler_dir=str(root / "profiles"),
                            expert_counters=counters("prefetch_on")), **kw})
    h = start_server("127.0.0.1", 0, log=lambda line: None)
    h.set_ready(b)
    http = httpx.Client(timeout=10)
    try:
        yield DirHost(root), f"http://127.0.0.1:{h.port}", http
    finally:
        http.close()
        h.shutdown()


def window(host, url, http, tmp_path, **kw):
    args = dict(depth=64, requests=2, max_tokens=48, stop_timeout_s=5.0, dest_dir=tmp_path / "out",
                ranks=2, prompts=PromptCache())
    return telemetry_window(host, "c" * 64, url, http, api_from_profile(SIM), SIM, **{**args, **kw})


def test_window_reads_36_percent_through_the_endpoints(tmp_path):
    with engine(tmp_path) as (host, url, http):
        res = window(host, url, http, tmp_path)
    assert res.status == "ok", res.reason
    assert host.copies == ["/profiles/expert_cache_rank0.json", "/profiles/expert_cache_rank1.json"]
    assert len(res.runs) == 2 and all(r.valid for r in res.runs) and res.decode_tok_s
    assert res.acceptance is not None
    rep = res.report
    assert sorted(rep.ranks) == [0, 1] and rep.ranks[0].steps > 0
    assert round(rep.totals.precision * 100) == 36
    per_step = 45 * (8.0 - 2.913) * SLAB / 1e9                # the landscape's rates, unrounded
    assert rep.wasted_gb_per_step_per_rank == pytest.approx(per_step, rel=0.05)
    d = res.to_dict()
    json.dumps(d)
    assert d["findings"][0].startswith("prefetch precision 36 %")


def test_window_prefetch_off_and_trace_cap(tmp_path):
    with engine(tmp_path, expert_counters=counters("prefetch_off")) as (host, url, http):
        prof = host.root / "profiles"
        prof.mkdir(parents=True)
        (prof / "small.pt.trace.json").write_bytes(b"x" * 100)
        (prof / "huge.pt.trace.json.gz").write_bytes(b"x" * 5000)
        res = window(host, url, http, tmp_path, max_trace_bytes=1000)
    assert res.status == "ok", res.reason
    assert host.copies == ["/profiles"]                        # traces wanted: the whole folder
    assert res.report.totals.prefetched == 0 and "no prefetch traffic" in res.report.findings()[0]
    assert [Path(p).name for p, _ in res.traces_removed] == ["huge.pt.trace.json.gz"]
    assert res.trace_bytes_kept == 100 and len(res.files) == 2


def test_cap_traces_keeps_telemetry_whatever_the_budget(tmp_path):
    (tmp_path / "expert_cache_rank0.json").write_text("{}" * 1000)
    (tmp_path / "t.json").write_text("y" * 10)
    kept, removed = cap_traces([tmp_path], 0)
    assert kept == 0 and len(removed) == 1 and (tmp_path / "expert_cache_rank0.json").exists()


def test_window_hanging_stop_ends_at_its_timeout(tmp_path):
    with engine(tmp_path, stop_profile_hang_s=30.0) as (host, url, http):
        t0 = time.monotonic()
        res = window(host, url, http, tmp_path, stop_timeout_s=0.5)
        waited = time.monotonic() - t0
    assert res.status == "stop-timeout" and "did not answer within 0.5 s" in res.reason
    # not before its 0.5 s read timeout, and far from the 30 s hang (a loaded machine only adds)
    assert 0.45 <= res.stop_s <= waited < 20
    assert res.report is None and res.findings()[0].startswith("telemetry window stop-timeout")


def test_window_without_telemetry_files_and_without_profiler_routes(tmp_path):
    with engine(tmp_path, telemetry=False) as (host, url, http):
        res = window(host, url, http, tmp_path)
    assert res.status == "no-telemetry" and res.report.missing_ranks == (0, 1)

    def no_routes(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(100))})
        return httpx.Response(404, json={"detail": "Not Found"})
    with httpx.Client(transport=httpx.MockTransport(no_routes)) as http:
        res = window(DirHost(tmp_path), "http://sim", http, tmp_path)
    assert res.status == "start-failed" and "not mounted" in res.reason and not res.runs
    with pytest.raises(ConfigError):
        telemetry_window(DirHost(tmp_path), "c", "http://sim", http, None, load_profile("vllm"),
                         dest_dir=tmp_path)

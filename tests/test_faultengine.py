"""Every fault of tests/faultengine.py, measured by the tuner's own ``measure_engine`` (and a few
through ``tuner measure --url``): each ends as ``invalid`` with a one-line reason, within its
stated time, and never with a number it cannot trust. Keep-alive faults that a careful client
survives end ``measured`` with no run lost."""
from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from arms.measure import LLAMACPP_API, MeasurePlan, measure_engine
from arms.prompts import PromptCache
from tests.conftest import REPO
from tests.faultengine import FaultEngine

IDLE, RUN = 0.4, 1.0
PLAN = MeasurePlan(depths=(32, 64), runs=2, warm_tokens=4, max_tokens=16, idle_timeout_s=IDLE,
                   run_timeout_s=RUN, max_invalid_per_depth=1)
# a stall costs IDLE per run and a never-ending stream RUN: the warm run and two measured runs
# at the first depth, the second depth skipped; one more second for the rest
BOUND_STALL, BOUND_FOREVER, BOUND_FAST = 3 * IDLE + 1.5, 3 * RUN + 1.5, 3.0


def measure(fault: str, plan: MeasurePlan = PLAN):
    with FaultEngine(fault) as eng:
        t0 = time.monotonic()
        m = measure_engine(eng.url, plan, LLAMACPP_API, prompts=PromptCache())
        return m, time.monotonic() - t0, eng


@pytest.mark.parametrize("fault,why,bound", [
    ("hang-first", f"stall: no data for {IDLE:g} s", BOUND_STALL),
    ("hang-mid", f"stall: no data for {IDLE:g} s", BOUND_STALL),
    ("keepalive-forever", f"run timeout: still streaming after {RUN:g} s", BOUND_FOREVER),
    ("garbage", "malformed SSE data", BOUND_FAST),
    ("no-usage", "no usage in the stream", BOUND_FAST),
    ("tokens=0", "usage.completion_tokens is 0", BOUND_FAST),
    ("tokens=-5", "usage.completion_tokens is -5", BOUND_FAST),
    ("tokens=str", "usage.completion_tokens is not an integer: '16'", BOUND_FAST),
    ("tokens=1e6", "usage.completion_tokens 1000000 exceeds the max_tokens 16", BOUND_FAST),
    ("tokenize-double", "the two endpoints disagree", BOUND_FAST),
    ("tokenize-shrink", "/tokenize lied", BOUND_FAST),
    ("tokenize-constant", "/tokenize lied", BOUND_FAST),
    ("http500", "answered HTTP 500: '{\"error\": {\"code\": 500, \"message\": \"engine fell over\"", BOUND_FAST),
    ("reset-mid", "reset", BOUND_FAST),
    ("partial-then-close", "RemoteProtocolError", BOUND_FAST),
])
def test_each_fault_ends_invalid_with_a_one_line_reason_in_time(fault, why, bound):
    m, took, eng = measure(fault)
    assert m.outcome == "invalid", m
    assert why in m.reason and "\n" not in m.reason, m.reason
    assert took < bound, f"{fault}: {took:.2f} s (bound {bound:.2f} s)"
    for d in m.depths.values():          # nothing untrusted reaches a figure
        assert d.median_decode_tok_s is None and d.median_prefill_tok_s is None
        assert not any(r.valid for r in d.runs)
    if fault == "http500":               # the real cause, not advice about profile keys
        assert "tokenize_request_key" not in m.reason
    if fault == "partial-then-close":    # never retried
        assert len(eng.bodies) == 3 and eng.dropped == 0


def test_runs_1_whose_only_run_is_invalid_makes_the_arm_invalid():
    m, _, _ = measure("no-usage", MeasurePlan(depths=(32,), runs=1, warm_tokens=0, max_tokens=16,
                                             idle_timeout_s=IDLE, run_timeout_s=RUN))
    assert m.outcome == "invalid" and m.reason.startswith("no valid run at depth 32")


def test_a_server_that_drops_reused_connections_loses_no_run():
    """The keep-alive race made deterministic: any request on a reused connection is dropped
    unanswered. A pooled client loses it; the measurement opens a fresh connection each time."""
    with FaultEngine("drop-reused") as eng, httpx.Client() as pooled:
        assert pooled.get(eng.url + "/health").status_code == 200
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            pooled.get(eng.url + "/health")
    plan = MeasurePlan(depths=(32, 64), runs=5, warm_tokens=4, max_tokens=16, max_invalid_per_depth=0)
    m, _, eng = measure("drop-reused", plan)
    assert m.outcome == "measured", m.reason
    assert all(r.valid for d in m.depths.values() for r in d.runs)
    assert eng.dropped == 0 and eng.connections == len(eng.requests)


def test_a_fresh_connection_closed_unanswered_loses_that_run_and_is_never_retried():
    """A retry could repeat a request the engine had begun to answer (httpcore words a half
    status line and no byte alike), so the run is lost with its reason, never sent twice."""
    plan = MeasurePlan(depths=(32,), runs=3, warm_tokens=4, max_tokens=16, max_invalid_per_depth=0)
    m, _, eng = measure("drop-first", plan)
    assert m.outcome == "measured", m.reason              # the dropped one was the warm run
    assert not m.warm.valid and "without sending a response" in m.warm.reason
    assert eng.dropped == 1 and len(eng.bodies) == 1 + 3


def test_an_honest_engine_measures_and_every_figure_is_sane():
    m, took, eng = measure("none", MeasurePlan(depths=(32, 64), runs=2, warm_tokens=4, max_tokens=16))
    assert m.outcome == "measured", m.reason
    for d, r in m.depths.items():
        assert all(x.valid and x.prompt_tokens == d and x.completion_tokens == 16 for x in r.runs)
        assert r.median_decode_tok_s and r.median_decode_tok_s > 0


@pytest.mark.parametrize("fault", ["tokens=1e6", "garbage", "http500"])
def test_tuner_measure_exits_1_with_the_reason(fault):
    with FaultEngine(fault) as eng:
        r = subprocess.run([sys.executable, "-m", "tuner.cli", "measure", "--url", eng.url, "--profile",
                            "llamacpp", "--depths", "32", "--runs", "1", "--json"],
                           cwd=REPO, capture_output=True, text=True, timeout=400)
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    assert '"outcome": "invalid"' in r.stdout

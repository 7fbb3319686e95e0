"""The budget is the night's, not the process's: a kill -9 and a resume keep the deadline fixed
when the night started (journaled in campaign_start), a simulated night's clock continues from
its journal's last time, and a finished night reads back — and re-runs — to the same headline."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_campaign_sim import campaign

HOURS = 4          # a 26-arm simulated night (seed 002's landscape), about 5 s of CPU per run
# arm 0 baseline, 1 recheck, 2-4 probes, then confirms, the rechecks that bracket them and move the
# incumbent (the first move, wherever it falls: ``incumbent:*``), later arms
POINTS = ["started:3", "measuring:7", "incumbent:*", "ended:12", "container-started:20"]


def tuner(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def records(folder):
    return [json.loads(x) for x in (folder / "journal.jsonl").read_text().splitlines()]


def headlines(folder) -> tuple[str, list]:
    """The status headline (its summary line) and the report's headline section, read afresh."""
    from tuner.morning.report import build_report
    from tuner.morning.status import status_data, summary_line

    d = status_data(folder)
    return summary_line(d) + f"; deadline {d['deadline']}", build_report(folder).sections[0].blocks


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole")
    path = campaign(root, "whole", budget={"hours": HOURS})
    r = tuner("run", path, "--simulated", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    return records(root / "journal" / "whole")


def test_the_deadline_is_fixed_at_the_start_and_journaled(uninterrupted):
    start = uninterrupted[0]
    assert start["op"] == "campaign_start" and start["simulated"] is True
    assert start["deadline"] == start["t"] + HOURS * 3600
    arm_starts = [r["t"] for r in uninterrupted if r["op"] == "arm_start"]
    assert len(arm_starts) > 20 and max(arm_starts) < start["deadline"]   # no arm starts past it
    assert uninterrupted[-1]["op"] == "campaign_end" and uninterrupted[-1]["reason"] == "deadline reached"


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_at_any_point_and_resume_keeps_the_nights_budget(tmp_path, uninterrupted, point):
    name = "kill-" + point.replace(":", "-").replace("*", "first")
    path = campaign(tmp_path, name, budget={"hours": HOURS})
    folder = tmp_path / "journal" / name
    first = tuner("run", path, "--simulated", "--quiet", env={"TUNER_CRASH_AT": point})
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    killed = records(folder)
    assert killed[-1]["op"] != "campaign_end"                     # it really died mid-night
    second = tuner("run", path, "--simulated", "--quiet")
    assert second.returncode == 0, second.stderr[-2000:]
    recs = records(folder)
    n_whole = sum(r["op"] == "arm_start" for r in uninterrupted)
    n = sum(r["op"] == "arm_start" for r in recs)
    # a fresh budget would give ~twice as many; the resumed night's own decisions differ (a fresh
    # simulated box draws other noise), and a failed boot takes less of the budget than a measured one
    assert abs(n - n_whole) <= max(2, n_whole // 4), (n, n_whole)
    ts = [r["t"] for r in recs]
    assert ts == sorted(ts) and ts[0] == killed[0]["t"]            # monotone: the clock continued, never restarted
    start = recs[0]
    assert [r for r in recs if r["op"] == "campaign_start"] == [start] and start["deadline"] == ts[0] + HOURS * 3600
    assert max(r["t"] for r in recs if r["op"] == "arm_start") < start["deadline"]
    assert recs[-1]["op"] == "campaign_end" and recs[-1]["reason"] == "deadline reached"
    assert any(r["op"] == "note" and r.get("text") == "resumed" for r in recs)
    # the night has ended: re-reading it, and re-running it, leave its headlines as they were
    before = headlines(folder)
    assert "ended" in before[0] and f"{n} arms" in before[0]
    assert headlines(folder) == before
    data = (folder / "journal.jsonl").read_bytes()
    again = tuner("run", path, "--simulated", "--quiet")
    assert again.returncode == 0 and "deadline reached" in again.stdout, again.stderr[-2000:]
    assert (folder / "journal.jsonl").read_bytes() == data         # nothing to resume: nothing written
    assert headlines(folder) == before


def test_an_older_journal_without_a_deadline_reads_it_from_the_nights_start(tmp_path):
    """A journal from before the deadline was journaled: status (and a resume) take the budget
    from the night's first record, never from its latest resume."""
    from tuner.morning.status import _deadline

    start = {"op": "campaign_start", "seq": 0, "t": 1000.0, "campaign": {"budget": {"hours": 2}}}
    resumed = {"op": "note", "seq": 5, "t": 5000.0, "text": "resumed"}
    assert _deadline([start, resumed], start) == 1000.0 + 7200
    from tuner.night.campaign import Budget
    from tuner.night.ending import night_deadline

    assert night_deadline(start, Budget(hours=2), proposed_wall=9999.0) == 1000.0 + 7200
    assert night_deadline({**start, "deadline": 1500.0}, Budget(hours=2), proposed_wall=9999.0) == 1500.0
    assert night_deadline(None, Budget(hours=2), proposed_wall=9999.0) == 9999.0       # a new night


def test_a_simulated_clock_continues_and_never_goes_back():
    from host.simhost import SimHost

    h = SimHost()
    t = h.wall()
    assert h.continue_clock(t + 3600) == 3600 and h.wall() == t + 3600
    assert h.continue_clock(t) == 3600                                 # never back

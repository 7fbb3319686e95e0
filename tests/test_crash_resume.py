"""kill -9 between arms (an arm ended, its trial told, an incumbent moved, a trial asked) and a
resume, on the simulated host: the journal and the Optuna study are the same code as on podman, so
the points where no container is in flight are checked here with the podman test's assertions
(tests/test_campaign_podman.py keeps the points where a container must be found and removed)."""
from __future__ import annotations

import signal

import pytest

from tests.test_campaign_podman import SMALL, assert_resumed_whole, campaign, records, tuner

JOURNAL_POINTS = ["ended:2", "told:2", "ended:3", "incumbent:*", "asked:4"]


class _Image:               # the simulated host never pulls: the campaign's image is a name only
    tag = "localhost/offload-tuner-simengine:crash-resume"


@pytest.mark.parametrize("point", JOURNAL_POINTS)
def test_kill_9_between_arms_resumes_with_nothing_lost_or_duplicated(tmp_path, point):
    name = "crash-" + point.replace(":", "-").replace("*", "first")
    path = campaign(tmp_path, _Image, name, levers=SMALL, budget={"max_arms": 7})
    first = tuner("run", path, "--simulated", "--quiet", env={"TUNER_CRASH_AT": point})
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert records(tmp_path, name)[-1]["op"] != "campaign_end"          # it died mid-night
    second = tuner("run", path, "--simulated", "--quiet")
    assert second.returncode == 0, second.stderr[-3000:]
    assert any(r["op"] == "note" and r.get("text") == "resumed" for r in records(tmp_path, name))
    assert_resumed_whole(tmp_path, name)

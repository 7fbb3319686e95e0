"""Three `tuner run` daemons share one campaign through a real PostgreSQL, each booting its own
simulated-engine containers with podman on its own port: every arm run once, one incumbent
chain, the study's trials the union of the boxes' arms; a kill -9 of one daemon mid-arm costs only
that arm (``interrupted``, its trial failed after the grace period) and the others go on; a
``pg_ctl restart`` mid-night loses and duplicates nothing; the killed box resumes with its next arm."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import yaml

from arms.host import LABEL_CAMPAIGN
from tests.conftest import REPO, free_port
from tests.test_campaign_podman import BASE_ARGS, BASE_ENV, DEPTHS, LEVERS
from tests.test_shared import check_consistent, records

pytestmark = pytest.mark.podman

NAME = "fleet-podman"


def daemon(path, box: str, port: int, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", str(path), "--box", box, "--port", str(port),
                             "--quiet"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def wait_for(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_three_daemons_share_a_campaign_through_postgresql(tmp_path, sim_image, podman_host, pg):
    data = {"name": NAME, "engine": "simengine",
            "baseline": {"image": sim_image.tag, "model": "/models/sim", "args": BASE_ARGS,
                         "env": {**BASE_ENV, "SIMENGINE_TIME_SCALE": 0.01},
                         "compile_cache": str(tmp_path / "cache"), "port": free_port()},
            "levers": LEVERS, "measure": {"depths": DEPTHS, "runs": 2, "warm_tokens": 16, "max_tokens": 64,
                                          "quiet_wait_s": 0},
            "boot": {"timeout_s": 60, "hang_s": 30, "poll_s": 0.2}, "journal": str(tmp_path / "journal"),
            "budget": {"max_arms": 21}, "storage": {"url": pg.url, "grace_s": 6, "heartbeat_s": 1}}
    path = tmp_path / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    logs = {b: open(tmp_path / f"{b}.log", "wb") for b in "abc"}
    ports = {b: free_port() for b in "abc"}
    procs = {b: daemon(path, b, ports[b], logs[b]) for b in "abc"}
    try:
        def open_arm_of_b():
            recs = records(pg.url, NAME) if _has_records(pg) else []
            ended = {r["arm"] for r in recs if r["op"] == "arm_end"}
            mine = [r for r in recs if r["op"] == "arm_start" and r.get("box") == "b"]
            return next((r for r in mine if r["arm"] not in ended), None) if len(mine) >= 3 else None

        victim = wait_for(open_arm_of_b, 240, "box b mid-arm (its third arm)")
        procs["b"].send_signal(signal.SIGKILL)                 # kill -9 mid-arm: its container is left running
        procs["b"].wait(timeout=30)
        killed_at = len(records(pg.url, NAME))
        wait_for(lambda: len(records(pg.url, NAME)) > killed_at + 6, 240, "the other boxes to go on")
        pg.restart()                                           # mid-night: every connection cut
        # the silent box's arm is interrupted by one of the others after the grace period
        end = wait_for(lambda: next((r for r in records(pg.url, NAME) if r["op"] == "arm_end"
                                     and r["arm"] == victim["arm"]), None), 120, "the killed arm to be interrupted")
        assert end["verdict"] == "interrupted" and "box b went silent" in end["reason"], end
        procs["b"] = daemon(path, "b", ports["b"], logs["b"])  # the box resumes with its next arm
        for b, p in procs.items():
            assert p.wait(timeout=600) == 0, (tmp_path / f"{b}.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for f in logs.values():
            f.close()
    recs = check_consistent(pg.url, NAME, orphans=1)    # the restart may cut one box between its ask and its commit
    starts = [r for r in recs if r["op"] == "arm_start"]
    assert len(starts) == 21
    verdicts = Counter(r["verdict"] for r in recs if r["op"] == "arm_end")
    assert verdicts["interrupted"] == 1, verdicts                 # only the killed arm was lost
    after = [r for r in starts if r["arm"] > victim["arm"]]
    assert {r["box"] for r in after} == {"a", "b", "c"}           # the others went on; b came back
    for b in "abc":                                               # no container of any box is left behind
        assert podman_host.list_managed({LABEL_CAMPAIGN: f"{NAME}.{b}"}) == []
    # readers on the shared campaign: status from the campaign file
    got = subprocess.run([sys.executable, "-m", "tuner.cli", "status", str(path), "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert pg.password not in got.stdout + got.stderr
    for b in "abc":
        assert pg.password not in (tmp_path / f"{b}.log").read_text()


def _has_records(pg) -> bool:
    import psycopg2

    with psycopg2.connect(pg.url) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('tuner_records') IS NOT NULL")
        return bool(cur.fetchone()[0])

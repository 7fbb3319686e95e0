"""A shared campaign on a real PostgreSQL (tuner/night/shared.py): several simulated boxes, one
record, one study — every arm run once, one incumbent chain, comparisons blocked by box, a
database restarted mid-night, a silent box's arm interrupted; bad storage refused in one line."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import psycopg2
import pytest
import yaml

from host.pgserver import free_port
from simengine.landscape import DEFAULT_LANDSCAPE
from tuner.night.campaign import load_campaign
from tuner.night.shared import Fleet
from tuner.night.storage import safe_url
from tuner.night.simfleet import run_fleet

REPO = Path(__file__).resolve().parent.parent


def campaign_file(tmp: Path, name: str, url: str | None = None, max_arms: int = 30, **extra) -> Path:
    raw = yaml.safe_load((REPO / "examples" / "sim-campaign.yaml").read_text())
    raw.pop("production", None)
    raw["name"] = name
    raw["journal"] = str(tmp / "journal")
    raw["baseline"]["compile_cache"] = str(tmp / "compile-cache")
    raw["budget"] = {"max_arms": max_arms}
    if url:
        raw["storage"] = url
    raw.update(extra)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def records(url: str, campaign: str) -> list[dict]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT line FROM tuner_records WHERE campaign = %s ORDER BY seq", (campaign,))
        return [json.loads(line) for (line,) in cur.fetchall()]


def trials(url: str, campaign: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage("postgresql+psycopg2://" + url.split("://", 1)[1])
    return optuna.load_study(study_name=campaign, storage=storage).get_trials(deepcopy=False)


def check_consistent(url: str, name: str, orphans: int = 0) -> list[dict]:
    """Every arm started once and ended once, by one box; the study's trials are the arms' (but at
    most ``orphans`` asked in a transaction a database restart cut, failed); the incumbent moves
    form one chain from the baseline."""
    recs = records(url, name)
    starts = [r for r in recs if r["op"] == "arm_start"]
    ends = [r for r in recs if r["op"] == "arm_end"]
    assert [r["seq"] for r in recs] == list(range(len(recs)))
    assert len({r["arm"] for r in starts}) == len(starts), "an arm number given twice"
    assert Counter(r["arm"] for r in ends) == Counter(r["arm"] for r in starts), "an arm lost or ended twice"
    assert all(r.get("box") for r in starts)
    ts = trials(url, name)
    mine = sorted(r["trial"] for r in starts)
    assert len(set(mine)) == len(mine) and set(mine) <= {t.number for t in ts}, "an arm's trial is not in the study"
    extra = [t for t in ts if t.number not in set(mine)]
    assert len(extra) <= orphans and all(t.state == optuna.trial.TrialState.FAIL for t in extra), extra
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in ts)
    start = next(r for r in recs if r["op"] == "campaign_start")
    prev = start["baseline_identity"]
    for m in (r for r in recs if r["op"] == "incumbent"):
        assert m["previous"] == prev, "two incumbent moves from one incumbent"
        prev = m["identity"]
    return recs


def test_three_simulated_boxes_share_one_campaign(tmp_path, pg, monkeypatch):
    path = campaign_file(tmp_path, "fleet3")
    runs = run_fleet(path, pg.url, {"a": 1.0, "b": 1.03, "c": 0.97}, landscape=DEFAULT_LANDSCAPE, max_arms=30)
    assert all(r.error is None for r in runs.values()), {b: r.error for b, r in runs.items()}
    recs = check_consistent(pg.url, "fleet3")
    starts = [r for r in recs if r["op"] == "arm_start"]
    assert len(starts) == 30
    by_box = Counter(r["box"] for r in starts)
    assert set(by_box) == {"a", "b", "c"} and min(by_box.values()) >= 8, by_box
    assert sum(r["op"] == "campaign_end" for r in recs) == 1          # ended once, by the last box measuring
    # each box measured the incumbent itself before its first challenger, and again right after it
    # (sharing.probe_first: that second boot closes the challenger's block), or right after that
    # challenger's second boot when its first was called better (A B B A, sharing.CONFIRM_FIRST)
    for box in "abc":
        mine = [r for r in starts if r["box"] == box][:4]
        kinds = [r["kind"] for r in mine]
        assert kinds[0] in ("baseline", "recheck") and "recheck" in kinds[1:], kinds
        again = kinds[2] == "confirm" and mine[2]["change"] == mine[1]["change"] and kinds[3] == "recheck"
        assert kinds[1] == "recheck" or kinds[1] in ("probe", "confirm") and (kinds[2] == "recheck" or again), kinds
    # at one incumbent, a challenger runs on two boxes at once only as a declared twin (sharing.twin:
    # a second box's boot of a challenger that already reads better), never twice on one box, and
    # never on more than TWINS boxes at once
    from tuner.night.sharing import AHEAD_TWINS, JOIN, TWINS

    spans = {r["arm"]: [r["seq"], None] for r in starts}
    for r in recs:
        if r["op"] == "arm_end":
            spans[r["arm"]][1] = r["seq"]
    for b in starts:
        same = [a for a in starts if a["arm"] < b["arm"] and a["change"] and a["change"] == b["change"]
                and a["incumbent"] == b["incumbent"] and spans[a["arm"]][1] > spans[b["arm"]][0]]
        if same:
            assert b["kind"] == "confirm" and b["why"].startswith("twin of arm "), (b, same)
            assert all(a["box"] != b["box"] for a in same) and len(same) < max(TWINS, AHEAD_TWINS, JOIN), (b, same)
    twins = [r for r in starts if r["why"].startswith("twin of arm ")]
    assert twins, "the default landscape's +50 % challenger was never booted on a second box beside the first"
    # a move judged on its closed blocks alone: every boot it rests on bracketed on its own box, the
    # open ones named, and the incumbent record carries that comparison; a test on closed blocks
    # that moved nothing is journaled too (a promotion look: it spends its share of the rate)
    for c in (r for r in recs if r["op"] == "compare" and r.get("kind") == "closed"):
        cmp = c["comparison"]
        assert cmp["open"] == 0 and cmp["boots"][0] >= 2, c
        assert c["left_out"] and not set(c["left_out"]) & {b["boot"] for b in cmp["blocks"]}, c
        if cmp["verdict"] == "better":
            move = next(m for m in recs if m["op"] == "incumbent" and m["seq"] > c["seq"])
            assert move["arm"] == c["arm"] and move["comparison"] == cmp, (c, move)
    # the boxes' own folders hold their own arms' artefacts
    folder = load_campaign(str(path)).folder
    for r in starts:
        assert (folder / r["box"] / "arms" / f"{r['arm']:04d}").is_dir()
    # the morning reads the shared campaign from its folder: which box ran what, the box spread
    from tuner.morning.report import write_report
    from tuner.morning.status import status_data

    assert pg.password not in (folder / "shared.json").read_text()
    monkeypatch.setenv("PGPASSWORD", pg.password)        # a reader given the folder: libpq's own password
    md = write_report(folder)
    section = md[md.index("## Boxes"):]
    section = section[:section.index("\n## ", 5)]
    for box in "abc":
        assert f"| {box} | {by_box[box]} |" in section, section
    assert "Measured box spread:" in section
    d = status_data(folder)
    assert d["arms"] == 30 and d["state"] == "ended" and [b["box"] for b in d["boxes"]] == ["a", "b", "c"]
    assert [b["arms"] for b in d["boxes"]] == [by_box[b] for b in "abc"]
    # optuna-dashboard on the shared study, from the campaign's folder: the study and its trials
    import httpx

    port = free_port()
    env = {**os.environ, "PGPASSWORD": pg.password, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "dashboard", str(folder), "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/studies", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the dashboard did not come up"
            time.sleep(0.3)
        study = next(x for x in r.json()["study_summaries"] if x["study_name"] == "fleet3")
        detail = httpx.get(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}", timeout=10).json()
        assert len(detail["trials"]) == len(trials(pg.url, "fleet3")) >= 30
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "optuna-dashboard for postgresql://" in out and pg.password not in out, out[-2000:]


def test_comparisons_are_blocked_by_box(tmp_path, pg):
    path = campaign_file(tmp_path, "blocked", max_arms=24)
    run_fleet(path, pg.url, {"a": 1.05, "b": 0.95}, landscape=DEFAULT_LANDSCAPE, max_arms=24)
    recs = records(pg.url, "blocked")
    box = {r["arm"]: r["box"] for r in recs if r["op"] == "arm_start"}
    blocks = [b for r in recs if r["op"] == "compare" and r.get("change") for b in r["comparison"].get("blocks", [])]
    assert blocks, "no blocked comparison in the night"
    for b in blocks:
        assert b["ref"] and all(box[x] == box[b["boot"]] for x in b["ref"]), b


def test_boxes_work_ahead_of_a_pending_move_and_only_a_leader_is_moved_from(tmp_path, pg, monkeypatch):
    """Three boxes on seed 002's landscape, 64 arms: while a challenger that reads better waits for
    its blocks, a box that booted it measures its neighbours against it (``ahead``:
    tuner/night/ahead.py). Each such arm is judged against the shape it supposed, never moves the
    incumbent before that shape leads, and its trial is told by the night's end; the report counts
    them. Whether a night's arms begun ahead are of a shape that then led is the night's luck (one
    night's only such arm can be of a challenger still undecided at its end): up to four nights
    (their names seed their noise) are run until one has such an arm, each checked in full."""
    monkeypatch.setenv("PGPASSWORD", pg.password)
    from tuner.morning.report import write_report

    used = []
    for night in range(4):
        name = f"ahead-{night}"
        (tmp_path / name).mkdir()
        path = campaign_file(tmp_path / name, name, max_arms=64)
        runs = run_fleet(path, pg.url, {"a": 1.0, "b": 1.01, "c": 0.99}, landscape=DEFAULT_LANDSCAPE, max_arms=64)
        assert all(r.error is None for r in runs.values()), {b: r.error for b, r in runs.items()}
        recs = check_consistent(pg.url, name)            # every trial told, one chain of moves
        starts = {r["arm"]: r for r in recs if r["op"] == "arm_start"}
        ahead = [r for r in starts.values() if r.get("ahead") is not None]
        assert ahead, f"night {name}: no arm was begun ahead of a move"
        moves = [r for r in recs if r["op"] == "incumbent"]
        for r in ahead:
            base = starts[r["ahead"]]
            assert r["incumbent"] == base["identity"] and base["change"] and r["why"].startswith(f"ahead of arm {r['ahead']}")
            for c in (x for x in recs if x["op"] == "compare" and x["arm"] == r["arm"]):
                assert c["incumbent"] == r["incumbent"], (r, c)        # judged against the shape it supposed
        for i, m in enumerate(moves):     # a move of an arm begun ahead comes after the move of the shape it supposed
            if starts[m["arm"]].get("ahead") is not None:
                assert starts[starts[m["arm"]]["ahead"]]["identity"] in {x["identity"] for x in moves[:i]}, m
        led = {m["identity"] for m in moves}
        used = [r for r in ahead if r["incumbent"] in led]
        md = write_report(load_campaign(str(path)).folder)
        assert f"{len(ahead)} arm(s) were begun ahead of a move" in md and \
            f"{len(used)} of them were of a shape that then led" in md, md
        if used:
            break
    assert used, "in four nights no arm begun ahead was of a shape that then led"


def test_the_night_rides_out_a_database_restart(tmp_path, pg):
    path = campaign_file(tmp_path, "restart", max_arms=24)
    restarted = []

    def on_arm(box, st, end):
        if len(st.arms) >= 8 and not restarted:
            restarted.append(box)
            pg.restart()                 # every box's connection is cut; the next transaction waits and reruns

    runs = run_fleet(path, pg.url, {"a": 1.0, "b": 1.0, "c": 1.0}, landscape=DEFAULT_LANDSCAPE, max_arms=24,
                     on_arm=on_arm)
    assert restarted
    assert all(r.error is None for r in runs.values()), {b: r.error for b, r in runs.items()}
    recs = check_consistent(pg.url, "restart")
    assert sum(r["op"] == "arm_start" for r in recs) == 24


def test_a_silent_box_has_its_arm_interrupted_and_its_trial_failed(tmp_path, pg):
    path = campaign_file(tmp_path, "silent", max_arms=14)
    camp = load_campaign(str(path))
    run_fleet(path, pg.url, {"a": 1.0}, landscape=DEFAULT_LANDSCAPE, max_arms=6)
    # box "gone" began arm 6 and died: its trial RUNNING, its heartbeat an hour old
    study = optuna.load_study(study_name="silent", storage=optuna.storages.RDBStorage(
        "postgresql+psycopg2://" + pg.url.split("://", 1)[1]))
    study.enqueue_trial({"lever": "(incumbent)"})
    trial = study.ask({"lever": optuna.distributions.CategoricalDistribution(["(incumbent)"] + sorted(camp.levers))})
    recs = records(pg.url, "silent")
    last = recs[-1]
    rec = {"op": "arm_start", "seq": last["seq"] + 1, "t": last["t"] + 1, "arm": 6, "kind": "recheck",
           "shape": next(r for r in recs if r["op"] == "campaign_start")["baseline"], "incumbent": "x",
           "change": None, "trial": trial.number, "why": "test", "box": "gone"}
    with psycopg2.connect(pg.url) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO tuner_records VALUES (%s, %s, %s, %s)", ("silent", rec["seq"], "gone", json.dumps(rec)))
        cur.execute("INSERT INTO tuner_boxes (campaign, box, host, pid, heartbeat) VALUES (%s, 'gone', 'elsewhere', 1, %s)",
                    ("silent", last["t"] - 3600))
    assert camp.folder.exists()
    # a real-time box joins (grace 60 s): it notices, journals the arm interrupted, fails the trial
    from host.simhost import SimHost
    from arms.profiles import load_profile
    from tuner.night.loop import CampaignLoop

    c, host = SimHost.pinned(load_campaign(str(path)).for_box("b"))
    host.continue_clock(last["t"])
    fleet = Fleet(pg.url, "silent", "b", clock=host.wall, grace_s=60.0)
    fleet.connect()
    fleet.join(c.identity(), {"host": "simulated"})
    try:
        CampaignLoop(c, host, load_profile(c.engine), fleet=fleet, max_arms=14).run()
    finally:
        fleet.close()
    recs = records(pg.url, "silent")
    end = next(r for r in recs if r["op"] == "arm_end" and r["arm"] == 6)
    assert end["verdict"] == "interrupted" and "box gone went silent" in end["reason"]
    assert trials(pg.url, "silent")[trial.number].state == optuna.trial.TrialState.FAIL
    assert sum(r["op"] == "arm_start" for r in recs) == 14
    assert {r["box"] for r in recs if r["op"] == "arm_start"} == {"a", "b", "gone"}


# -- bad storage: one line, exit 2, nothing started, the password never printed --------------
def tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


@pytest.mark.parametrize("case", ["wrong password", "no server", "not postgres"])
def test_bad_storage_is_one_line_and_never_prints_the_password(tmp_path, pg, case):
    url = {"wrong password": pg.url.replace(pg.password, "Wr0ngSecretPw"),
           "no server": f"postgresql://tuner:Wr0ngSecretPw@127.0.0.1:{free_port()}/tuner",
           "not postgres": "mysql://tuner:Wr0ngSecretPw@127.0.0.1/tuner"}[case]
    path = campaign_file(tmp_path, "bad", url)
    got = tuner("run", str(path), "--simulated", "--box", "a", "--quiet")
    assert got.returncode == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1, got.stderr
    assert "Wr0ngSecretPw" not in got.stderr + got.stdout
    assert ("postgresql://" in lines[0] or "mysql" in lines[0]) and "***" in lines[0]
    assert not (tmp_path / "journal" / "bad" / "a" / "arms").exists()


def test_another_campaign_of_the_same_name_is_refused(tmp_path, pg):
    """... by `tuner run` and, before any night, by `tuner check`, which otherwise says what the
    database holds of the campaign (read only)."""
    first = campaign_file(tmp_path, "samename", pg.url)
    got = tuner("check", str(first), "--show", "1")
    assert f"storage {safe_url(pg.url)}: reachable; campaign 'samename' is new there" in got.stdout, got
    got = tuner("run", str(first), "--simulated", "--box", "a", "--quiet", "--max-arms", "2")
    assert got.returncode == 0, got.stderr
    got = tuner("check", str(first), "--show", "1")
    n = len(records(pg.url, "samename"))
    assert f"campaign 'samename' there: {n} records, 1 box(es) (a), live now: none" in got.stdout, got
    assert len(records(pg.url, "samename")) == n                   # check wrote nothing to the campaign
    other = tmp_path / "other"
    other.mkdir()
    second = campaign_file(other, "samename", pg.url, noise={"recheck_every": 4, "min_effect": 0.02})
    for cmd in (("check", str(second)), ("run", str(second), "--simulated", "--box", "b", "--quiet")):
        got = tuner(*cmd)
        assert got.returncode == 2 and "another campaign named 'samename'" in got.stderr, (cmd, got.stderr)
        assert pg.password not in got.stderr + got.stdout, got.stderr
        errors = [x for x in got.stderr.splitlines() if x.startswith("tuner:")]      # (check logs the image's pin)
        assert len(errors) == 1 and errors == got.stderr.splitlines()[-1:], got.stderr


def test_two_live_boxes_of_one_name_and_other_hardware_are_refused(tmp_path, pg):
    camp = load_campaign(str(campaign_file(tmp_path, "names", pg.url)))
    a = Fleet(pg.url, "names", "a", heartbeat_s=0).connect()
    a.join(camp.identity(), {"cpu": "X", "ram_gib": 64})
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with psycopg2.connect(pg.url) as conn, conn.cursor() as cur:     # box "a" is a live process on this host
            cur.execute("UPDATE tuner_boxes SET pid = %s, host = %s WHERE campaign = 'names' AND box = 'a'",
                        (sleeper.pid, socket.gethostname()))
        again = Fleet(pg.url, "names", "a", heartbeat_s=0).connect()
        with pytest.raises(Exception, match="box 'a' is already running this campaign"):
            again.join(camp.identity(), {"cpu": "X", "ram_gib": 64})
        again.close()
        other = Fleet(pg.url, "names", "b", heartbeat_s=0).connect()
        with pytest.raises(Exception, match=r"not the same hardware as box 'a' \(ram_gib: 64 there, 128 here\)"):
            other.join(camp.identity(), {"cpu": "X", "ram_gib": 128})
        other.join(camp.identity(), {"cpu": "X", "ram_gib": 128}, mixed=True)      # allowed when the campaign says so
        other.close()
    finally:
        sleeper.kill()
        a.close()


def test_the_password_never_reaches_the_journal_or_the_logs(tmp_path, pg):
    path = campaign_file(tmp_path, "secret", pg.url)
    got = tuner("run", str(path), "--simulated", "--box", "a", "--max-arms", "4")
    assert got.returncode == 0, got.stderr
    recs = records(pg.url, "secret")
    assert recs and pg.password not in json.dumps(recs)
    assert next(r for r in recs if r["op"] == "campaign_start")["campaign"]["storage"] == safe_url(pg.url)
    assert pg.password not in got.stdout + got.stderr
    for p in (tmp_path / "journal").rglob("*"):
        if p.is_file():
            assert pg.password.encode() not in p.read_bytes(), p
    assert os.environ.get("PGPASSWORD") is None


def test_a_database_gone_away_is_known_through_optunas_wrapper():
    """Optuna raises StorageInternalError ``from`` SQLAlchemy's OperationalError when a restart cuts
    its commit (CI saw one mid-ask): the daemon waits for that, and only for that."""
    import sqlalchemy.exc as sa

    from tuner.night.shared import db_down

    def wrapped(inner: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except Exception as e:
                raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
        except optuna.exceptions.StorageInternalError as outer:
            return outer

    gone = sa.OperationalError("COMMIT", {}, psycopg2.OperationalError("server closed the connection unexpectedly"))
    assert db_down(gone)
    assert db_down(wrapped(gone))
    assert not db_down(wrapped(sa.DataError("INSERT", {}, ValueError("value too long"))))
    assert not db_down(ValueError("a bug, not the database"))


def test_trials_no_arm_claims_are_failed_running_or_waiting():
    """An ask the database cut leaves a RUNNING trial without its param (or an enqueued WAITING
    one): failed by the next transaction; an arm's own running trial is left alone."""
    from types import SimpleNamespace

    from tuner.night.study import fail_unclaimed

    study = optuna.create_study(direction="maximize")
    mine, cut = study.ask().number, study.ask().number
    study.enqueue_trial({"lever": "x"})
    st = SimpleNamespace(arms={1: SimpleNamespace(trial=mine)})
    assert fail_unclaimed(study, st) == [cut, cut + 1]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {mine: optuna.trial.TrialState.RUNNING, cut: optuna.trial.TrialState.FAIL,
                      cut + 1: optuna.trial.TrialState.FAIL}
    assert fail_unclaimed(study, st) == []


def test_a_shared_study_rebuilt_by_another_box_is_followed(pg):
    """On the real PostgreSQL: the study deleted and made again under a new id (``sync_study`` on
    another box); the old handle is reopened by name, a current one kept as it is."""
    import optuna

    from tuner.night.study import followed

    from tuner.night.storage import open_storage

    storage = open_storage(pg.url)
    old = optuna.create_study(study_name="rebuilt", storage=storage, direction="maximize")
    assert followed(old, pg.url, "rebuilt") is old
    optuna.delete_study(study_name="rebuilt", storage=storage)
    again = optuna.create_study(study_name="rebuilt", storage=storage, direction="maximize")
    again.ask()
    got = followed(old, pg.url, "rebuilt")
    assert got is not old and got._study_id == again._study_id and len(got.get_trials()) == 1

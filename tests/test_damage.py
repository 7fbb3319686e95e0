"""Damage is quarantined, not fatal: each kind of damaged line → the rest of the night reads,
resumes, and the damage is reported with its line; the Optuna study is rebuilt from the arm
journal; a folder whose arms exist but whose journal is empty is refused, never overwritten."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import optuna
import pytest

from arms.errors import ConfigError
from tests.conftest import REPO
from arms.profiles import load_profile
from host.simhost import SimHost
from tests.test_campaign_sim import campaign
from tuner.night.campaign import load_campaign
from tuner.night.readback import read_records

NAME = "dmg"


def night(path, seed=0, max_arms=None):
    camp, host = SimHost.pinned(load_campaign(path), noise_seed=seed)
    from tuner.night.loop import CampaignLoop

    return CampaignLoop(camp, host, load_profile("simengine"), max_arms=max_arms).run()


@pytest.fixture(scope="module")
def first_night(tmp_path_factory):
    """One simulated night of 5 arms, its journal folder relative to the campaign file."""
    root = tmp_path_factory.mktemp("night")
    path = campaign(root, NAME, journal="journal")
    night(path, seed=3, max_arms=5)
    return root


@pytest.fixture
def copy(first_night, tmp_path):
    shutil.copytree(first_night, tmp_path, dirs_exist_ok=True)
    return tmp_path / f"{NAME}.yaml", tmp_path / "journal" / NAME


def lines(folder):
    return (folder / "journal.jsonl").read_bytes().split(b"\n")


def write_lines(folder, ls):
    (folder / "journal.jsonl").write_bytes(b"\n".join(ls))


def status(folder):
    return subprocess.run([sys.executable, "-m", "tuner.cli", "status", str(folder), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def trials(folder):
    from tuner.night.storage import open_storage

    study = optuna.load_study(study_name=NAME, storage=open_storage(folder / "optuna.journal"))
    return [(t.number, t.state.name, t.value, t.params, t.user_attrs) for t in study.get_trials()]


def resume_and_check(path, folder, bad_line: int):
    """The damaged night reads (status), resumes to 8 arms, and the bad line is in the quarantine."""
    r = status(folder)
    assert r.returncode == 0, r.stderr
    assert f"first line {bad_line}" in r.stderr and "damaged line" in r.stderr       # the one warning
    assert json.loads(r.stdout)["arms"] == 5
    before = (folder / "journal.jsonl").read_bytes()
    night(path, seed=3, max_arms=8)
    after = (folder / "journal.jsonl").read_bytes()
    assert after.startswith(before)                                              # nothing cut, nothing rewritten
    q = [json.loads(x) for x in (folder / "journal.quarantine.jsonl").read_text().splitlines()]
    assert q and q[0]["line"] == bad_line
    recs = read_records(folder / "journal.jsonl")
    starts = [r["arm"] for r in recs if r["op"] == "arm_start"]
    assert starts == sorted(set(starts)) and len(starts) == 8                  # every arm once, none re-run
    seqs = [r["seq"] for r in recs]
    assert len(seqs) == len(set(seqs))
    assert all(t[1] in ("COMPLETE", "PRUNED", "FAIL") for t in trials(folder))           # no trial left RUNNING
    return q


def test_a_power_loss_tail_of_nuls(copy):
    path, folder = copy
    n = len(lines(folder))                                   # the line number the NULs land on
    with open(folder / "journal.jsonl", "ab") as f:
        f.write(b"\0" * 4096 + b"\n")
    q = resume_and_check(path, folder, n)
    assert q[0]["why"].startswith("NUL bytes")


@pytest.mark.parametrize("bad, why", [
    (b"{not json at all", "not JSON"),
    (b"[1, 2, 3]", "not a JSON object (a list)"),
    (b'"just a string"', "not a JSON object (a str)"),
    (b'{"op":"arm_end","seq":7,"verdict":"better"}', "arm_end record without a valid 'arm'"),
    (b'{"op":"arm_start","seq":7,"arm":9,"kind":"probe","incumbent":"x"}', "arm_start record without a valid 'shape'"),
])
def test_a_damaged_line_in_the_middle(copy, bad, why):
    path, folder = copy
    ls = lines(folder)
    ls.insert(6, bad)
    write_lines(folder, ls)
    q = resume_and_check(path, folder, 7)
    assert q[0]["why"].startswith(why) and q[0]["text"] == bad.decode()


def test_an_empty_journal_beside_arms_is_refused_never_overwritten(copy):
    path, folder = copy
    (folder / "journal.jsonl").write_bytes(b"")
    arm0 = {p.name: p.read_bytes() for p in (folder / "arms" / "0000").rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"journal.jsonl has no campaign_start record but the folder holds 5 arm "
                                          r"folders .*refusing to start a new night over them"):
        night(path, seed=3, max_arms=8)
    assert (folder / "journal.jsonl").read_bytes() == b""
    assert {p.name: p.read_bytes() for p in (folder / "arms" / "0000").rglob("*") if p.is_file()} == arm0
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "run", str(path), "--simulated", "--quiet"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    err = [x for x in r.stderr.splitlines() if x.startswith("tuner: error")]
    assert r.returncode == 2 and len(err) == 1 and "no campaign_start" in err[0], r.stderr


def test_an_unreadable_journal_is_one_line_exit_2_and_nothing_deleted(copy):
    path, folder = copy
    junk = b"\0" * 64 + b"\n{broken\n"
    (folder / "journal.jsonl").write_bytes(junk)
    for cmd in ("status", "run"):
        r = subprocess.run([sys.executable, "-m", "tuner.cli", cmd, str(folder if cmd == "status" else path),
                            *(["--simulated"] if cmd == "run" else [])], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1 and err[0].startswith("tuner: error"), r.stderr
        assert "journal.jsonl: no readable record (first bad line 1: NUL bytes" in err[0]
        assert "journal.quarantine.jsonl" in err[0]
    assert (folder / "journal.jsonl").read_bytes() == junk
    assert len((folder / "journal.quarantine.jsonl").read_text().splitlines()) == 2      # the writer copied both


def test_a_torn_optuna_journal_leaves_no_trial_running(copy):
    path, folder = copy
    data = (folder / "optuna.journal").read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    assert b'"state":1' in data[last:] or b"state" in data[last:]            # the last op is a tell
    (folder / "optuna.journal").write_bytes(data[:last] + data[last:][:20])  # torn mid-tell
    night(path, seed=3, max_arms=6)
    got = trials(folder)
    assert all(t[1] in ("COMPLETE", "PRUNED", "FAIL") for t in got) and len(got) == 6


def test_garbage_in_optuna_journal_is_set_aside_and_the_study_rebuilt(copy):
    path, folder = copy
    want = trials(folder)
    data = (folder / "optuna.journal").read_bytes().split(b"\n")
    data.insert(3, b"garbage {")
    (folder / "optuna.journal").write_bytes(b"\n".join(data))
    night(path, seed=3, max_arms=5)                      # no arm left to run: only the reconcile
    assert (folder / "optuna.journal.damaged-1").exists()
    assert [t[:5] for t in trials(folder)] == want


def test_a_deleted_optuna_journal_is_rebuilt_identical_in_trials_and_values(copy):
    path, folder = copy
    want = trials(folder)
    assert len(want) == 5 and any(t[2] is not None for t in want)
    (folder / "optuna.journal").unlink()
    night(path, seed=3, max_arms=5)
    assert trials(folder) == want
    night(path, seed=3, max_arms=7)                      # and the night goes on from it
    assert len(trials(folder)) == 7

"""One writer, many readers: `tuner run` holds the campaign folder; readers never write."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.test_campaign_sim import campaign
from tuner.night.lock import CampaignBusy, CampaignLock, holder, is_held


def tuner(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    with CampaignLock(tmp_path / "c", clock=lambda: 0.0):
        h = holder(tmp_path / "c")
        assert h["pid"] == os.getpid() and h["host"] == socket.gethostname() and is_held(tmp_path / "c")
        with pytest.raises(CampaignBusy, match=rf"is being run by pid {os.getpid()} on host {socket.gethostname()} since"):
            CampaignLock(tmp_path / "c").acquire()
    assert holder(tmp_path / "c") is None and not is_held(tmp_path / "c")
    CampaignLock(tmp_path / "c").acquire().release()          # free again


def test_a_second_tuner_run_refuses_and_the_first_night_stays_intact(tmp_path):
    path = campaign(tmp_path, "twice", budget={"max_arms": 8})
    folder = tmp_path / "journal" / "twice"
    first = subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", str(path), "--simulated", "--quiet"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (folder / "journal.jsonl").exists() or not (holder(folder) or {}).get("pid"):
            assert first.poll() is None and time.monotonic() - t0 < 120, "the first run never took the lock"
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGSTOP)                    # frozen mid-night, lock held
        before = (folder / "journal.jsonl").read_bytes()
        second = tuner("run", path, "--simulated", "--quiet")
        assert second.returncode == 2
        err = second.stderr.strip().splitlines()
        assert len(err) == 1 and f"pid {first.pid} on host {socket.gethostname()}" in err[0], second.stderr
        assert (folder / "journal.jsonl").read_bytes() == before       # the refused run wrote nothing
        detached = tuner("run", path, "--simulated", "--detach")
        assert detached.returncode == 2 and f"pid {first.pid}" in detached.stderr
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    recs = [json.loads(x) for x in (folder / "journal.jsonl").read_text().splitlines()]
    seqs = [r["seq"] for r in recs]
    assert seqs == list(range(len(recs)))                     # no duplicate sequence numbers
    starts = [r["arm"] for r in recs if r["op"] == "arm_start"]
    assert starts == list(range(8))                            # every arm started once
    assert sum(r["op"] == "campaign_start" for r in recs) == 1 and recs[-1]["op"] == "campaign_end"


def test_status_leaves_a_torn_journal_byte_identical(tmp_path):
    path = campaign(tmp_path, "reader", budget={"max_arms": 3})
    assert tuner("run", path, "--simulated", "--quiet").returncode == 0
    folder = tmp_path / "journal" / "reader"
    with open(folder / "journal.jsonl", "ab") as f:
        f.write(b'{"op":"arm_start","seq":99,"arm":3,"ki')          # a writer mid-line
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    for args in (("status", folder), ("status", folder, "--json"), ("report", folder),
                 ("export", folder, "-o", tmp_path / "a.csv")):
        r = tuner(*args)
        assert r.returncode == 0, (args, r.stderr[-2000:])
    after = {name: (folder / name).read_bytes() for name in before}      # the report adds REPORT.md, nothing else
    assert after == before


def test_a_writer_killed_by_sigkill_leaves_the_folder_free(tmp_path):
    code = ("import os, signal, sys; from tuner.night.lock import CampaignLock; CampaignLock(sys.argv[1]).acquire(); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], cwd=REPO, timeout=60)
    assert r.returncode == -signal.SIGKILL
    assert holder(tmp_path / "c")["pid"] and not is_held(tmp_path / "c")       # a stale name, no live holder
    CampaignLock(tmp_path / "c").acquire().release()                              # the kernel freed the lock

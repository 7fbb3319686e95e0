"""The campaign journal: fsync'd JSON lines, torn tail repaired, secrets redacted, replay."""
from __future__ import annotations

import json

import pytest

from arms.errors import ConfigError
from arms.shape import ABSENT, Shape
from tuner.night.journal import Journal, redact, repair_tail
from arms.values import encode as encode_value
from tuner.night.state import replay

IMG = "localhost/x@sha256:" + "a" * 64
BASE = Shape.from_mapping({"image": IMG, "model": "/m", "args": {"expert-prefetch": 1, "max-num-seqs": 4}})


def test_append_and_reopen(tmp_path):
    j = Journal(tmp_path / "j.jsonl", clock=lambda: 100.0)
    j.append("campaign_start", campaign_hash="h")
    j.append("note", text="x")
    again = Journal(tmp_path / "j.jsonl")
    assert [r["op"] for r in again.records] == ["campaign_start", "note"]
    assert [r["seq"] for r in again.records] == [0, 1]
    assert again.append("note", text="y")["seq"] == 2


def test_torn_last_line_is_cut_and_appends_stay_loadable(tmp_path):
    p = tmp_path / "j.jsonl"
    j = Journal(p)
    j.append("campaign_start", campaign_hash="h")
    with open(p, "ab") as f:
        f.write(b'{"op":"arm_start","seq":1,"arm":0,"ki')       # kill -9 mid-write
    j2 = Journal(p)
    assert j2.repaired > 0 and len(j2.records) == 1
    j2.append("note", text="after")
    assert [json.loads(line)["op"] for line in p.read_text().splitlines()] == ["campaign_start", "note"]


def test_repair_tail_on_a_file_without_any_newline(tmp_path):
    p = tmp_path / "o.journal"
    p.write_bytes(b'{"torn": tr')
    assert repair_tail(p) == len(b'{"torn": tr') and p.read_bytes() == b""
    assert repair_tail(tmp_path / "missing") == 0


def test_a_corrupt_middle_line_is_quarantined_and_skipped(tmp_path):
    p = tmp_path / "j.jsonl"
    p.write_text('{"op":"note","seq":0}\nnot json\n{"op":"note","seq":2}\n')
    j = Journal(p)
    assert [r["seq"] for r in j.records] == [0, 2] and j.append("note")["seq"] == 3
    q = [json.loads(x) for x in (tmp_path / "j.quarantine.jsonl").read_text().splitlines()]
    assert [(d["line"], d["text"]) for d in q] == [(2, "not json")] and q[0]["why"].startswith("not JSON")
    assert p.read_text().splitlines()[1] == "not json"                # copied, never deleted
    Journal(p)
    assert len((tmp_path / "j.quarantine.jsonl").read_text().splitlines()) == 1      # once


def test_a_journal_with_no_readable_line_is_refused_in_one_line(tmp_path):
    p = tmp_path / "j.jsonl"
    p.write_bytes(b"\0" * 4096 + b"\n[1, 2]\n")
    with pytest.raises(ConfigError, match=r"j.jsonl: no readable record \(first bad line 1: NUL bytes.*"
                                          r"copied to .*j.quarantine.jsonl and nothing was deleted"):
        Journal(p)
    assert p.read_bytes() == b"\0" * 4096 + b"\n[1, 2]\n"


def test_secrets_are_redacted_everywhere():
    rec = redact({"shape": {"env": [["HF_TOKEN", "hf_secret"], ["R4D_LRU_UVA_TOKENS", "2048"]]},
                  "x": {"env": {"API_KEY": "k", "GPU_MAX_HW_QUEUES": "2"}}})
    assert rec["shape"]["env"] == [["HF_TOKEN", "***"], ["R4D_LRU_UVA_TOKENS", "2048"]]
    assert rec["x"]["env"] == {"API_KEY": "***", "GPU_MAX_HW_QUEUES": "2"}


def _arm(j, n, kind, shape, change=None, inc=BASE, **end):
    j.append("arm_start", arm=n, kind=kind, shape=shape.to_dict(),
             change=[change[0], encode_value(change[1])] if change else None, incumbent=inc.key(), trial=n)
    if end:
        j.append("arm_end", arm=n, kind=kind, **end)


def test_replay_rebuilds_incumbent_samples_and_open_arms(tmp_path):
    j = Journal(tmp_path / "j.jsonl")
    j.append("campaign_start", campaign_hash="h")
    sc = lambda o: {"feasible": True, "violation": 0.0, "objective": o}  # noqa: E731
    _arm(j, 0, "baseline", BASE, verdict="baseline", score=sc(26.0))
    off = BASE.with_change("expert-prefetch", ABSENT)
    _arm(j, 1, "probe", off, ("expert-prefetch", ABSENT), verdict="better", score=sc(39.0), delta=0.5)
    _arm(j, 2, "confirm", off, ("expert-prefetch", ABSENT), verdict="better", score=sc(39.4), delta=0.51)
    j.append("incumbent", arm=2, shape=off.to_dict(), score=sc(39.4), samples=[39.0, 39.4])
    _arm(j, 3, "probe", off.with_change("max-num-seqs", 3), ("max-num-seqs", 3), inc=off)   # no end: a crash
    st = replay(j.records, BASE)
    assert st.incumbent == off and st.incumbent_arm == 2 and st.samples == [39.0, 39.4]
    assert [a.n for a in st.open_arms] == [3]
    assert st.arms[1].change == ("expert-prefetch", ABSENT)
    assert st.next_n == 4


def test_incremental_replay_equals_the_full_replay_after_every_record(tmp_path):
    from tuner.night.state import Replay

    j = Journal(tmp_path / "j.jsonl")
    follower = Replay(BASE)
    sc = lambda o: {"feasible": True, "violation": 0.0, "objective": o}  # noqa: E731
    off = BASE.with_change("expert-prefetch", ABSENT)
    steps = [lambda: j.append("campaign_start", campaign_hash="h"),
             lambda: _arm(j, 0, "baseline", BASE, verdict="baseline", score=sc(26.0)),
             lambda: _arm(j, 1, "probe", off, ("expert-prefetch", ABSENT), verdict="better", score=sc(39.0)),
             lambda: _arm(j, 2, "confirm", off, ("expert-prefetch", ABSENT), verdict="better", score=sc(39.4)),
             lambda: j.append("incumbent", arm=2, shape=off.to_dict(), score=sc(39.4), samples=[39.0, 39.4]),
             lambda: _arm(j, 3, "recheck", off, inc=off, verdict="recheck", score=sc(39.2))]
    for step in steps:
        step()
        new, full = follower.follow(j), replay(j.records, BASE)
        assert (new.incumbent_key, new.incumbent_arm, new.samples, sorted(new.arms), new.incumbent_score) == \
               (full.incumbent_key, full.incumbent_arm, full.samples, sorted(full.arms), full.incumbent_score)
    assert new.incumbent == off and new.samples == [39.0, 39.4, 39.2] and follower.done == len(j)


def test_record_types_one_codec_each_way():
    from tuner.night import records as R

    shape = BASE.to_dict()
    d = R.encode("arm_start", 3, 1.5, {"arm": 0, "kind": "baseline", "shape": shape, "incumbent": BASE.key()})
    rec = R.decode(d)
    assert isinstance(rec, R.ArmStart) and (rec.arm, rec.kind, rec.change, rec.trial) == (0, "baseline", None, None)
    assert isinstance(R.decode({"op": "comparison", "seq": 4, "t": 2.0}), R.Other)   # a newer tuner's record
    assert R.decode({"op": "incumbent", "seq": 1, "arm": 2, "shape": shape, "score": {
        "feasible": True, "violation": 0, "objective": 1.0}}).samples == []             # the one place for defaults
    for bad, why in [([1], "not a JSON object"), ({"op": "note"}, "no op or seq"),
                     ({"op": "arm_end", "seq": 1, "arm": True}, "arm_end record without a valid 'arm'"),
                     ({"op": "arm_end", "seq": 1, "arm": 1, "score": {"objective": 1}}, "malformed score"),
                     ({"op": "arm_start", "seq": 1, "arm": 1, "kind": "probe", "incumbent": "k",
                       "shape": {"image": "x"}}, "unreadable shape")]:
        with pytest.raises(R.RecordError, match=why):
            R.decode(bad)
    with pytest.raises(ValueError, match="unknown journal op"):
        R.encode("nonsense", 0, 0.0, {})


def test_one_answer_to_is_the_daemon_alive(tmp_path):
    """status, promote and rollback ask tuner.night.readback.daemon_pid (issue 21: it had four
    implementations): the pid in daemon.pid when that process runs, None otherwise."""
    import os
    import subprocess
    import sys

    from tuner.night.readback import DAEMON_PID, daemon_pid, pid_alive

    assert daemon_pid(tmp_path) is None                                     # no file
    (tmp_path / DAEMON_PID).write_text("not a pid")
    assert daemon_pid(tmp_path) is None
    (tmp_path / DAEMON_PID).write_text(str(os.getpid()))
    assert daemon_pid(tmp_path) == os.getpid() and pid_alive(os.getpid())
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / DAEMON_PID).write_text(str(gone.pid))
    assert daemon_pid(tmp_path) is None and not pid_alive(gone.pid)

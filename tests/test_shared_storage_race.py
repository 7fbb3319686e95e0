"""Boxes that join a shared campaign at once each write the folder's ``shared.json``
(tuner/night/readback.py ``mark_shared``): none of them may fail, and the file is whole."""
from __future__ import annotations

import json
import multiprocessing

from tuner.night.readback import SHARED, mark_shared


def _write(folder: str) -> None:
    for _ in range(200):
        mark_shared(folder, "postgresql://tuner@db.example/campaigns", "night")


def test_boxes_joining_at_once_each_write_the_shared_record_whole(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write, args=(str(tmp_path),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]        # a shared temporary name lost the race here
    assert json.loads((tmp_path / SHARED).read_text()) == {"storage": "postgresql://tuner@db.example/campaigns",
                                                           "campaign": "night"}
    assert sorted(x.name for x in tmp_path.iterdir()) == [SHARED]     # no temporary file left behind

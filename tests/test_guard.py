"""The production guard through the Host protocol's unit control (a recording fake: CI has no systemd)."""
from __future__ import annotations

import pytest

from arms.errors import ConfigError
from host.fake import FakeHost
from tuner.night.guard import Guard, Production
from tuner.night.journal import Journal

UNIT = "frank-primary.service"


def guard(tmp_path, state, mode):
    host = FakeHost()
    host.units[UNIT] = state
    j = Journal(tmp_path / "j.jsonl")
    return host, j, Guard(Production(UNIT, mode, restore_timeout_s=10), host, j)


def test_refuse_if_active_starts_nothing(tmp_path):
    host, j, g = guard(tmp_path, "active", "refuse-if-active")
    with pytest.raises(ConfigError, match="production unit frank-primary.service is active"):
        g.enter()
    assert host.unit_calls == [(UNIT, "is-active")] and host.containers == {}


def test_inactive_unit_is_left_alone(tmp_path):
    host, j, g = guard(tmp_path, "inactive", "stop-and-restore")
    g.enter()
    g.exit()
    assert host.unit_calls == [(UNIT, "is-active")]
    assert [r["action"] for r in j.records if r["op"] == "guard"] == ["checked"]


def test_stop_and_restore_journals_every_step(tmp_path):
    host, j, g = guard(tmp_path, "active", "stop-and-restore")
    g.enter()
    assert host.units[UNIT] == "inactive+masked"
    g.exit()
    assert host.units[UNIT] == "active"
    assert [a for _, a in host.unit_calls] == ["is-active", "stop", "mask-runtime", "unmask-runtime", "start",
                                              "is-active", "is-active"]
    assert [r["action"] for r in j.records if r["op"] == "guard"] == ["stopped", "masked", "restored"]
    assert j.records[-1]["healthy"] is True


def test_a_crashed_run_leaves_the_restore_to_the_next_start(tmp_path):
    host, j, g = guard(tmp_path, "active", "stop-and-restore")
    g.enter()                       # ... and the tuner is killed here: no exit()
    host2_units = dict(host.units)
    g2 = Guard(Production(UNIT, "stop-and-restore", restore_timeout_s=10), host, Journal(tmp_path / "j.jsonl"))
    g2.enter()
    assert host.units == host2_units            # it stays stopped while the resumed run works
    g2.exit()
    assert host.units[UNIT] == "active"
    actions = [r["action"] for r in Journal(tmp_path / "j.jsonl").records if r["op"] == "guard"]
    assert actions == ["stopped", "masked", "adopted", "restored"]


@pytest.mark.parametrize("bad,text", [
    ({"guard": "stop-and-restore"}, "needs at least unit"),
    ({"unit": UNIT, "guard": "yolo"}, "'production.guard'"),
    ({"unit": UNIT, "gaurd": "x"}, "'production.gaurd': unknown key"),
])
def test_bad_production_section(bad, text):
    with pytest.raises(ConfigError, match=text):
        Production.from_mapping(bad, "c.yaml")

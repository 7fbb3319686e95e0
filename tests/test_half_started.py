"""A signal while podman creates an arm's container: the container is found by its labels and
removed, also when podman finishes the create a moment after the tuner stopped waiting for it
(on the fake host; tests/test_boot_podman.py sends the real SIGTERM to a real tuner)."""
from __future__ import annotations

import logging

import pytest

from arms.lifecycle import booted, container_spec
from arms.shape import Shape
from host.fake import FakeHost

DIGEST = "sha256:" + "ab" * 32


class _CutShort(FakeHost):
    """``start`` is interrupted (``error``); the container appears after ``late`` listings."""

    def __init__(self, error: BaseException, late: int | None):
        super().__init__(images={"img:1": DIGEST})
        self.error, self.late, self.listings, self.slept = error, late, 0, 0.0
        self._spec = None

    def start(self, spec):
        self._spec = spec
        raise self.error

    def list_managed(self, labels=None):
        self.listings += 1
        if self.late is not None and self.listings > self.late and self._spec is not None:
            FakeHost.start(self, self._spec)      # podman finished the create on its own
            self._spec = None
        return super().list_managed(labels)

    def now(self):
        return self.slept

    def sleep(self, seconds):
        self.slept += seconds


def _spec():
    shape = Shape(image=f"img@{DIGEST}", model="/models/sim", port=18080)
    return container_spec(shape, campaign="cut", arm=3)


@pytest.mark.parametrize("late", [0, 3])
def test_a_container_created_after_the_signal_is_found_and_removed(late, tmp_path, caplog):
    host = _CutShort(KeyboardInterrupt(), late=late)
    caplog.set_level(logging.INFO, logger="tuner.arms")
    with pytest.raises(KeyboardInterrupt):
        with booted(host, _spec(), log_path=tmp_path / "boot.log", port=18080, tag="arm 3"):
            pass
    assert host.list_managed() == []
    assert host.listings >= late + 1
    assert any(c[0] == "remove" for c in host.calls) or not host.containers
    assert "[arm 3 TEARDOWN] removed" in caplog.text and "interrupted while starting" in caplog.text


def test_a_signal_that_left_no_container_says_so_after_waiting_a_moment(tmp_path, caplog):
    host = _CutShort(KeyboardInterrupt(), late=None)
    caplog.set_level(logging.INFO, logger="tuner.arms")
    with pytest.raises(KeyboardInterrupt):
        with booted(host, _spec(), log_path=tmp_path / "boot.log", port=18080, tag="arm 3"):
            pass
    assert host.slept >= 2.8                       # it waited for podman to finish a create
    assert "no container of tuner-cut-arm3 was left" in caplog.text


def test_a_refused_create_does_not_wait(tmp_path, caplog):
    from arms.errors import HostError

    host = _CutShort(HostError("podman refused to create it"), late=None)
    caplog.set_level(logging.INFO, logger="tuner.arms")
    with pytest.raises(HostError):
        with booted(host, _spec(), log_path=tmp_path / "boot.log", port=18080, tag="arm 3"):
            pass
    assert host.slept == 0.0 and host.listings == 1
    assert "TEARDOWN" not in caplog.text

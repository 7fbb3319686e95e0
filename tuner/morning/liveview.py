"""The night on screen: log lines scroll, one live header stays at the bottom.

``NightView`` wraps a running campaign. On a terminal it routes the log through rich's logging
handler on the same console as a ``Live`` header, so every log line is printed once, above the
header, and scrolls; the header says the incumbent (as changes from the baseline), the
objective and its gain, elapsed time, the deadline and the ETA, and the current arm and its
phase (booting / measuring depth N / telemetry / verdict). The phase comes from the log's own
phase markers (``[arm 7 START probe]``, ``[... READY ready]``, ``[measure depth 1087]``), so
nothing else has to report it. Without a terminal (``--quiet``, a systemd service) there is no
header, but the same words go to sd_notify ``STATUS=`` and ``WATCHDOG=1`` every few seconds
(a boot of several minutes keeps the watchdog fed), and to ``phase.json`` for `tuner status`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable

from tuner.morning.status import PHASE_FILE, incumbent_changes

_START = re.compile(r"^\[arm (\d+) START (\w+)\] (.*?)(?: — .*)?$")
_BOOT = re.compile(r"^\[\S+ BOOT\] .* started as ")
_READY = re.compile(r"^\[\S+ (?:READY|BOOT) ready\]")
_DEPTH = re.compile(r"^\[measure depth (\d+)\]")
_TELEMETRY = re.compile(r"^\[\S+ TELEMETRY ")
_SWEEP = re.compile(r"^\[arm \d+ SWEEP\] concurrency (\S+)")
_VERDICT = re.compile(r"^\[arm (\d+) VERDICT (\S+)\]")


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class _PhaseWatcher(logging.Handler):
    """Reads the phase markers of the log into the view."""

    def __init__(self, view: "NightView"):
        super().__init__(logging.INFO)
        self.view = view

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not stop the night
            return
        v = self.view
        if m := _START.match(msg):
            v.arm, v.kind, v.what = int(m.group(1)), m.group(2), m.group(3)
            v.set_phase("confirming: booting" if v.kind == "confirm" else "booting", new_arm=True)
        elif _BOOT.match(msg):
            v.set_phase(("confirming: " if v.kind == "confirm" else "") + "booting")
        elif _READY.match(msg):
            v.set_phase(("confirming: " if v.kind == "confirm" else "") + "measuring")
        elif m := _DEPTH.match(msg):
            v.set_phase(("confirming: " if v.kind == "confirm" else "") + f"measuring depth {m.group(1)}")
        elif m := _SWEEP.match(msg):
            v.set_phase(f"concurrency sweep {m.group(1)}")
        elif _TELEMETRY.match(msg):
            v.set_phase("telemetry window")
        elif m := _VERDICT.match(msg):
            v.set_phase(f"verdict {m.group(2)}")


class NightView:
    def __init__(self, camp, *, deadline: float | None, max_arms: int | None, clock: Callable[[], float],
                 live: bool, notify: Callable[[str], bool] | None = None, tick_s: float | None = None,
                 console=None, simulated: bool = False):
        self.camp, self.deadline, self.max_arms, self.clock = camp, deadline, max_arms, clock
        self.live_on, self.notify, self.simulated = live, notify, simulated
        usec = os.environ.get("WATCHDOG_USEC")
        self.tick_s = tick_s or (min(10.0, int(usec) / 2e6) if usec and usec.isdigit() else 10.0)
        self.t0 = clock()
        self.arm: int | None = None
        self.kind, self.what, self.phase = "", "", "starting"
        self.arms_done = 0
        self.arm_s: list[float] = []
        self._ended = 0                  # finished arms whose arm_s is in arm_s (per arm, only the new ones)
        self.incumbent: list[str] = []
        self.objective = None
        self.base_objective = None
        self._arm_t0 = self.t0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = _PhaseWatcher(self)
        self._console = console
        self._live = None
        self._swapped: list[logging.Handler] = []
        self._notified = 0.0

    # -- state --------------------------------------------------------------------------------
    def set_phase(self, phase: str, new_arm: bool = False) -> None:
        with self._lock:
            if new_arm:
                self._arm_t0 = self.clock()
            self.phase = phase
        self._publish()

    def update(self, st) -> None:
        """After each arm: the incumbent, its objective against the baseline's, arm durations."""
        with self._lock:
            self.arms_done = len(st.arms)
            self.incumbent = incumbent_changes(st)
            self.objective = st.incumbent_value
            done = st.finished()                 # in arm order
            base = next((a for a in done if a.kind == "baseline"
                         and (a.end.get("score") or {}).get("objective") is not None), None)
            self.base_objective = base.end["score"]["objective"] if base else self.base_objective
            if len(done) < self._ended:
                self.arm_s, self._ended = [], 0
            self.arm_s += [float(a.end["arm_s"]) for a in done[self._ended:] if a.end.get("arm_s")]
            self._ended = len(done)
            self.phase = "between arms"
        self._publish(force=True)

    # -- words --------------------------------------------------------------------------------
    def eta(self) -> tuple[float | None, str]:
        """Seconds until the night ends, and why (arms left at the mean arm time, or the deadline)."""
        now = self.clock()
        left = None if self.deadline is None else max(0.0, self.deadline - now)
        if self.max_arms:
            remaining = max(0, self.max_arms - self.arms_done)
            if self.arm_s:
                mean = sum(self.arm_s) / len(self.arm_s)
                by_arms = remaining * mean
                if left is None or by_arms < left:
                    return by_arms, f"{remaining} arms left at {mean / 60:.1f} min/arm"
        if left is not None:
            return left, "the deadline"
        return None, "no deadline or arm budget"

    def _at(self, seconds_from_now: float) -> str:
        if self.simulated:
            return ""
        return time.strftime(" (%H:%M)", time.localtime(time.time() + seconds_from_now))

    def lines(self) -> list[str]:
        with self._lock:
            now = self.clock()
            obj = "n/a" if self.objective is None else f"{self.objective:.2f}"
            gain = (f" ({self.objective / self.base_objective - 1:+.1%} vs baseline)"
                    if self.objective and self.base_objective else "")
            arm = "waiting for the first arm" if self.arm is None else \
                f"arm {self.arm} {self.kind}: {self.what} — {self.phase}, {_hms(now - self._arm_t0)} into the arm"
            inc = "; ".join(self.incumbent) if self.incumbent else "the baseline"
        eta_s, why = self.eta()
        dl = "none" if self.deadline is None else f"in {_hms(self.deadline - now)}{self._at(self.deadline - now)}"
        eta = "n/a" if eta_s is None else f"in {_hms(eta_s)}{self._at(eta_s)} ({why})"
        return [f"{self.camp.name} · {arm}",
                f"{self.camp.search.objective} {obj}{gain} · incumbent: {inc}",
                f"elapsed {_hms(now - self.t0)} · deadline {dl} · ETA {eta}"]

    def status(self) -> str:
        """The sd_notify STATUS line: the header's words on one line."""
        return " | ".join(self.lines())

    def _header(self):
        from rich.console import Group
        from rich.text import Text

        styles = ("bold", "", "dim")
        return Group(*(Text(line, style=st, no_wrap=True, overflow="ellipsis") for line, st in zip(self.lines(), styles)))

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.notify and (force or now - self._notified >= 2.0):     # phase changes: at most one per 2 s
            self._notified = now
            self.notify(f"STATUS={self.status()}")
        try:
            folder = Path(self.camp.folder)
            if folder.is_dir():
                tmp = folder / f".{PHASE_FILE}.tmp"
                tmp.write_text(json.dumps({"arm": self.arm, "kind": self.kind, "what": self.what,
                                           "phase": self.phase, "t": time.time()}))
                os.replace(tmp, folder / PHASE_FILE)
        except OSError:
            pass

    # -- lifecycle ----------------------------------------------------------------------------
    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            if self.notify:
                self.notify(f"STATUS={self.status()}")
                self.notify("WATCHDOG=1")

    def __enter__(self) -> "NightView":
        root = logging.getLogger()
        root.addHandler(self._watcher)
        if self.live_on:
            from rich.console import Console
            from rich.live import Live
            from rich.logging import RichHandler

            console = self._console or Console(stderr=True)
            self._swapped = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
                             and not isinstance(h, logging.FileHandler) and h is not self._watcher]
            for h in self._swapped:
                root.removeHandler(h)
            self._rich = RichHandler(console=console, show_path=False, show_level=False, markup=False,
                                     rich_tracebacks=False, log_time_format="%H:%M:%S")
            root.addHandler(self._rich)
            self._live = Live(get_renderable=self._header, console=console, refresh_per_second=1,
                              transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        threading.Thread(target=self._tick, name="night-view", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        root = logging.getLogger()
        root.removeHandler(self._watcher)
        if self._live is not None:
            self._live.stop()
            root.removeHandler(self._rich)
            for h in self._swapped:
                root.addHandler(h)
        try:
            (Path(self.camp.folder) / PHASE_FILE).unlink()
        except OSError:
            pass

"""The `Host` protocol: every side effect an arm needs, and nothing else.

``arms/`` defines it and never imports podman, subprocess or psutil; ``host/`` implements it
with podman-py against a real ``podman system service`` (``host.podman_host.PodmanHost``),
and ``host.fake.FakeHost`` implements it in memory for unit tests. One contract suite
(``tests/test_host_contract.py``) runs against both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import httpx

    from .conditions import RunConditions

LABEL_MANAGED = "tuner.managed"
LABEL_CAMPAIGN = "tuner.campaign"
LABEL_ARM = "tuner.arm"


@dataclass(frozen=True)
class BindMount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """Everything the host needs to start one engine container (built from a Shape)."""

    image: str                                  # "name@sha256:<digest>"
    command: tuple[str, ...]                    # arguments after the image's entrypoint
    name: str
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[BindMount, ...] = ()
    devices: tuple[str, ...] = ()               # CDI names or host device paths
    labels: tuple[tuple[str, str], ...] = ()
    network_mode: str = "host"
    ipc_mode: str | None = None
    ulimits: tuple[tuple[str, int, int], ...] = ()   # (name, soft, hard)
    shm_size: str | None = None
    group_add: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerState:
    status: str                  # "running", "exited", "created", "missing", ...
    exit_code: int | None = None
    oom_killed: bool = False
    pid: int | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def exited(self) -> bool:
        return self.status in ("exited", "stopped", "missing", "dead")


@dataclass(frozen=True)
class ImageInfo:
    ref: str                     # digest reference to boot: repo@sha256:...
    digest: str                  # sha256:...
    image_id: str
    tags: tuple[str, ...] = ()


@dataclass
class LogFollower:
    """Handle of a background log copy; ``path`` grows while the container runs."""

    path: Path
    stop: object = field(default=None, repr=False)   # callable(timeout): wait for the copy to end

    def text(self, limit: int | None = None) -> str:
        """The log so far; with ``limit``, at most its first and last ``limit // 2`` bytes
        (joined by one newline) so an endless log never fills memory."""
        try:
            if limit is None or self.path.stat().st_size <= limit:
                return self.path.read_text(errors="replace")
            with self.path.open("rb") as f:
                head = f.read(limit // 2)
                f.seek(-(limit // 2), 2)
                tail = f.read(limit // 2)
            gone = self.path.stat().st_size - 2 * (limit // 2)
            return (head + f"\n[... {gone} bytes of log not read ...]\n".encode() + tail).decode("utf-8", "replace")
        except FileNotFoundError:
            return ""


@runtime_checkable
class ProbeSession(Protocol):
    def __enter__(self) -> "ProbeSession": ...

    def __exit__(self, *exc: object) -> None: ...

    def to_dict(self) -> dict: ...


class Host(Protocol):
    # Capabilities, declared (every host says them; none is guessed with getattr):
    simulated: bool     # its clock and engines are simulated (host.simhost): a night on it is never promoted unasked
    write_only: bool    # unit control writes files only, systemd is never touched (`tuner promote --write-only`)

    def resolve_image(self, ref: str) -> ImageInfo:
        """Digest reference for an image given by tag or digest; HostError if not present."""

    def start(self, spec: ContainerSpec) -> str:
        """Create and start a container; returns its id. HostError on refusal."""

    def follow_logs(self, cid: str, path: Path, redact: Callable[[str], str] | None = None) -> LogFollower:
        """Copy the container's combined output into ``path`` until it exits, each line passed
        through ``redact`` before it is written (secrets an engine echoes never reach the disk)."""

    def state(self, cid: str) -> ContainerState:
        """Current state; status "missing" when the container no longer exists."""

    def wait(self, cid: str, timeout: float) -> ContainerState:
        """Block until the container exits or ``timeout`` seconds pass; returns the state."""

    def kill(self, cid: str, signal: str = "SIGKILL") -> None:
        """Send a signal to the container's main process."""

    def copy_out(self, cid: str, src: str, dest: Path) -> list[Path]:
        """Copy a file or directory out of the container into the folder ``dest``."""

    def remove(self, cid: str) -> None:
        """Remove the container, killing it if needed; a missing container is not an error."""

    def list_managed(self, labels: dict[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
        """(id, labels) of every container of this tool, optionally filtered by more labels."""

    def base_url(self, cid: str, port: int) -> str:
        """Where the engine in this container answers HTTP (host networking: 127.0.0.1:port)."""

    def http_client(self, cid: str, timeout: float = 30.0) -> "httpx.Client":
        """An httpx client that reaches the engine (a simulated host answers in-process)."""

    def port_holder(self, port: int) -> str | None:
        """Who already listens on TCP ``port`` where the engine would bind ("container NAME
        (pid N: command)", "pid N (command)"), None when it is free. An arm is refused before
        it boots on a held port (class ``port-in-use``)."""

    def now(self) -> float:
        """The host's monotonic clock in seconds (a simulated host's clock is virtual)."""

    def sleep(self, seconds: float) -> None:
        """Wait on the host's clock."""

    def wall(self) -> float:
        """Epoch seconds for the records (journal times): a simulated host's are simulated."""

    def probes(self, cid: str, interval_s: float = 2.0) -> "ProbeSession":
        """A context manager that samples what one arm's container costs the host while it runs
        (RAM, swap, VRAM, the engine's RSS, OOM kills); ``to_dict()`` after the block. A simulated
        host samples its simulation, never the machine it runs on."""

    def conditions(self, cid: str) -> "RunConditions":
        """A probe of the box's conditions around each measured run of this container:
        ``start()`` before the run, ``stop()`` after it returns a dict (``arms.conditions``: the
        load average, the CPU time processes other than the container and the tuner used, CPU
        frequency, GPU clocks and foreign GPU processes where readable). A simulated host reports
        its simulation (a landscape's ``tenant``), never the machine it runs on."""

    def rest_load(self, seconds: float = 2.0) -> dict:
        """Other processes' CPU load on the box while no engine of ours runs, read over about
        ``seconds`` before the night's first boot: {source, cores (None: unreadable), samples,
        seconds}. A run is contended only above it (``arms.conditions``). A simulated host reports
        its landscape's tenant at this moment (0.0 without one), never the machine it runs on."""

    def warm_files(self, paths: list[str], budget_s: float) -> dict:
        """Read these host files once before the night (the page cache then holds the model, as it
        will for every boot after the first), within ``budget_s`` seconds: {files, bytes, seconds,
        complete}. A simulated host warms its simulated page cache."""

    def gpu_holders(self) -> list[tuple[int, str, int]] | None:
        """(pid, process name, bytes) of every process that holds GPU memory before a night starts
        (the production service, another tenant), None when no reader can tell."""

    def podman_version(self) -> str | None:
        """The podman version production units are written for ("4.3.1"), None when this host
        cannot tell (a fake or simulated host): a Quadlet's keys depend on it."""

    def continue_clock(self, wall: float) -> float:
        """Move a virtual clock on to the journal time ``wall`` (a resumed simulated night continues
        where its journal stopped); returns the seconds moved. A real clock never moves: 0."""

    def unit(self, name: str, action: str) -> str:
        """systemd unit control for the production guard and promotion: action is one of
        is-active (returns active/inactive/failed/activating/unknown), stop, start, restart,
        mask-runtime, unmask-runtime, daemon-reload (returns "ok"). HostError on failure."""


UNIT_ACTIONS = ("is-active", "stop", "start", "restart", "mask-runtime", "unmask-runtime", "daemon-reload")


class RealTime:
    """Wall-clock timing and a plain network client: the mixin of every real host."""

    simulated = False
    write_only = False

    def continue_clock(self, wall: float) -> float:
        return 0.0                          # the wall clock is the wall clock

    def base_url(self, cid: str, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    def http_client(self, cid: str, timeout: float = 30.0):
        from .httpio import fresh_client

        return fresh_client(timeout)         # no pooled connection a server may have closed

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

"""A `Host` in virtual time: each container is an in-process boot of the simulated engine.

``SimHost`` implements the Host protocol without podman, sockets or sleeping. ``start`` parses
the container's command with the engine's own argparse parser, runs the engine's own boot
sequence (``simengine.boot.Boot.boot``) on a virtual clock that starts at the host's now, and
keeps the boot log as (virtual time, line) pairs: ``follow_logs`` files and ``state`` reveal
only what the virtual clock has passed. A failed boot exits with the engine's code when its
last line is due; a ready boot serves from its ``Behaviour`` through ``http_client`` (an
``httpx.MockTransport`` answering from ``simengine.engine.EngineCore``), where every wait of
the engine (TTFT, each decode step, a /stop_profile hang) advances the virtual clock instead.
``now``/``sleep`` are that clock, so readiness polling, ``measure_engine`` and a campaign's
deadline all run in virtual time: a 462 s cold boot plus a measurement takes milliseconds.

Files: bind mounts, a per-container writable layer and the image's files (``host.simfs``);
a mounted compile cache persists from boot to boot, as on podman. HTTP: ``host.simhttp``.
"""
from __future__ import annotations

import bisect
import contextlib
import copy
import errno
import functools
import hashlib
import io
import itertools
import shutil
import tempfile
import threading
import traceback
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

import httpx

from arms.errors import HostError
from arms.host import ContainerSpec, ContainerState, LogFollower
from simengine import realbox
from simengine.boot import Boot
from simengine.cli import Log, PrepareError, known_flags, prepare
from simengine.engine import EngineCore
from simengine.landscape import DEFAULT_LANDSCAPE, Landscape, LandscapeError, load_landscape
from simengine.server import access_line

from .fake import FakeHost
from .simfs import ContainerFS
from .simhttp import ReadTimedOut

EPOCH = datetime(2026, 9, 29, 21, 0, 0)     # the virtual wall clock at t = 0 (log stamps)
DEFAULT_TAG = "localhost/offload-tuner-simengine:sim"
IMAGE_ENV = {"HOME": "/root", "PYTHONPATH": "/opt/simengine", "PYTHONDONTWRITEBYTECODE": "1",
             "PYTHONUNBUFFERED": "1", "PATH": "/usr/local/bin:/usr/bin:/bin"}
IMAGE_CMD = ("/models/sim",)
# decode steps coalesce into SSE chunks of this many tokens (vLLM's --stream-interval): the first
# token is its own chunk and the stream ends when the last step is due, so TTFT and decode
# (usage.completion_tokens / (wall - ttft)) are what one chunk per step gives, at a fraction of
# the simulated HTTP's cost
STREAM_INTERVAL = 16


@functools.lru_cache(maxsize=1)
def default_digest() -> str:
    """The default image's digest: a hash of the engine's sources, like the real image's tag."""
    from host.simimage import input_hash

    return "sha256:" + hashlib.sha256(f"simhost:{input_hash()}".encode()).hexdigest()


_LANDSCAPES: dict[tuple, Landscape] = {}


def cached_landscape(path: str | None, known_flags: set[str]) -> Landscape:
    """``load_landscape`` once per file version (a night boots hundreds of arms); a fresh copy
    each time, since the engine adjusts what it loaded."""
    p = Path(path) if path else DEFAULT_LANDSCAPE
    try:
        st = p.stat()
    except OSError:
        return load_landscape(path, known_flags)          # its own error message
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size, frozenset(known_flags))
    if key not in _LANDSCAPES:
        _LANDSCAPES[key] = load_landscape(path, known_flags)
    land = _LANDSCAPES[key]
    return Landscape(land.path, copy.deepcopy(land.data), land.lines)


def image_files() -> dict[str, Path]:
    from host.simimage import input_files

    return dict(input_files())


@dataclass
class _Ctr:
    cid: str
    spec: ContainerSpec
    fs: ContainerFS
    started: float
    port: int = 8000
    lines: list[tuple[float, int, str]] = field(default_factory=list)   # (time, seq, line), sorted
    writes: list[tuple[float, str, str]] = field(default_factory=list)  # deferred (time, path, text)
    end: float = float("inf")          # a failed boot exits at `end`; a ready boot serves from it
    exit_code: int | None = None       # of a failed boot
    core: EngineCore | None = None     # of a ready boot
    killed: tuple[float, int] | None = None
    followers: list[list] = field(default_factory=list)                 # [path, lines written, redact]

    def exited_at(self, now: float) -> int | None:
        if self.killed is not None:
            return self.killed[1]
        if self.exit_code is not None and now >= self.end:
            return self.exit_code
        return None


class SimHost:
    """``images``: tag or digest reference -> "sha256:..." digest (default: ``DEFAULT_TAG``);
    ``landscape``: the landscape file when a container names none (default: seed 002's);
    ``clock_start``: the virtual clock's first reading; ``env``: the image's environment,
    under each container's own; ``workdir``: where containers' writable layers live."""

    simulated = True        # journaled in campaign_start: a simulated night is never promoted unasked
    write_only = False

    def __init__(self, images: dict[str, str] | None = None, landscape: str | None = None,
                 clock_start: float = 0.0, env: dict | None = None, workdir: str | None = None,
                 noise_seed: int = 0, stream_interval: int = STREAM_INTERVAL):
        self.noise_seed = noise_seed              # with the container's name: each boot's noise stream
        self.stream_interval = stream_interval    # tokens per SSE chunk (the engine's default is 1)
        self._boots = itertools.count()
        self._model_reads = 0                     # reads of the model so far: a boot or warm_files (page cache)
        self.images = dict(images) if images is not None else {DEFAULT_TAG: default_digest()}
        self.landscape = str(landscape) if landscape else None
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.containers: dict[str, _Ctr] = {}
        self.calls: list[tuple[str, str]] = []
        self.units: dict[str, str] = {}          # systemd units, as FakeHost keeps them
        self.unit_calls: list[tuple[str, str]] = []
        self._now = float(clock_start)
        self._lock = threading.RLock()
        self._tl = threading.local()
        self._ids, self._seq, self._ports = itertools.count(1), itertools.count(), itertools.count(40000)
        self._root = Path(tempfile.mkdtemp(prefix="simhost-", dir=workdir))
        self._image_files: dict[str, Path] | None = None

    # -- time ----------------------------------------------------------------------------
    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        """The simulated wall clock (EPOCH at t = 0): a simulated night's journal times."""
        return EPOCH.timestamp() + self._now

    def continue_clock(self, wall: float) -> float:
        """Move the virtual clock on to the simulated wall time ``wall`` (a journal's last time),
        never back: a resumed simulated night continues where its journal stopped."""
        return self.advance(wall - self.wall())

    def probes(self, cid: str, interval_s: float = 2.0):
        """Simulated probes: the container's simulated state on the virtual clock; the machine
        running the simulation is never sampled and its kernel log never scanned."""
        from host.probes import StateProbes

        return StateProbes(self, cid, interval_s, source="simulated")

    def conditions(self, cid: str):
        """Simulated conditions: the container's landscape ``tenant`` cores over each run, on the
        virtual clock (``simengine.realbox.tenant_cores``); the machine running the simulation is
        never read."""
        from host.conditions import VirtualConditions

        def foreign(t0: float, t1: float) -> float:
            ctr = self.containers.get(cid)
            core = ctr.core if ctr is not None else None
            if core is None or not core.b.tenants:
                return 0.0
            return realbox.tenant_cores(core.b.tenants, t0 - core.epoch, t1 - core.epoch)

        return VirtualConditions(self.now, foreign, "simulated")

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> float:
        """Move the virtual clock forward (never back); returns the new time."""
        with self._lock:
            self._now += max(0.0, float(seconds))
            self._sync()
            return self._now

    def stamp(self, t: float | None = None) -> datetime:
        return EPOCH + timedelta(seconds=self._now if t is None else t)

    def _request_sleep(self, seconds: float) -> None:
        """An engine wait inside a request: past the client's read timeout, the client gives up."""
        limit, gap = getattr(self._tl, "read_timeout", None), getattr(self._tl, "gap_start", None)
        if limit is not None and gap is not None and self._now + seconds - gap > limit:
            self.advance(gap + limit - self._now)
            raise ReadTimedOut()
        self.advance(seconds)

    # -- images --------------------------------------------------------------------------
    # image registry, managed-container listing and unit control: exactly the fake's
    resolve_image = FakeHost.resolve_image
    list_managed = FakeHost.list_managed
    unit = FakeHost.unit

    @classmethod
    def for_campaign(cls, camp, **kw) -> SimHost:
        """A SimHost on which the campaign's baseline image (tag or digest reference) exists."""
        ref, digest = camp.baseline.image, default_digest()
        images = {DEFAULT_TAG: digest}
        if "@sha256:" in ref:
            images[ref] = ref.split("@", 1)[1]
        else:
            images[ref] = digest
        return cls(images=images, **kw)

    @classmethod
    def pinned(cls, camp, **kw):
        """(the campaign with its baseline pinned to the image's digest on a new SimHost, that host)."""
        host = cls.for_campaign(camp, **kw)
        return replace(camp, baseline=replace(camp.baseline, image=host.resolve_image(camp.baseline.image).ref)), host

    @property
    def image_ref(self) -> str:
        """A digest reference of the first registered image (what a shape boots)."""
        return self.resolve_image(next(iter(self.images))).ref

    # -- containers ----------------------------------------------------------------------
    def start(self, spec: ContainerSpec) -> str:
        self.calls.append(("start", spec.name))
        digest = spec.image.split("@", 1)[1] if "@" in spec.image else self.images.get(spec.image)
        if digest not in self.images.values():
            raise HostError(f"image {spec.image} is not present on this host")
        with self._lock:
            if any(c.spec.name == spec.name for c in self.containers.values()):
                raise HostError(f"podman refused to create {spec.name}: the container name is already in use")
            n = next(self._ids)
            cid = hashlib.sha256(f"{spec.name}:{n}".encode()).hexdigest()
            scratch = self._root / cid[:12]
            scratch.mkdir()
            ctr = _Ctr(cid=cid, spec=spec, fs=ContainerFS(spec.mounts, scratch, self._image), started=self._now)
            self.containers[cid] = ctr
            self._boot(ctr)
            self._sync()
        return cid

    def _boot(self, ctr: _Ctr) -> None:
        """Run the engine's boot on a virtual clock from now; keep its lines and its end."""
        t = [self._now]
        boot_no = next(self._boots)            # this host's boots so far (each one's noise stream)
        reads, self._model_reads = self._model_reads, self._model_reads + 1   # a fresh host's page cache is cold
        env = {**IMAGE_ENV, "SIMENGINE_NOISE_SEED": str(int(hashlib.sha256(
            f"{self.noise_seed}:{ctr.spec.name}:{boot_no}".encode()).hexdigest()[:8], 16)),
            "SIMENGINE_STREAM_INTERVAL": str(self.stream_interval), "SIMENGINE_BOOT_INDEX": str(reads),
            **self.env, **dict(ctr.spec.env)}
        out = _Lines(self, ctr, lambda: t[0])
        argv = ["serve", *(ctr.spec.command or IMAGE_CMD)]
        try:
            self._run_boot(ctr, argv, env, out, t)
        finally:
            out.write("\n" if out.pending else "")

    def _run_boot(self, ctr: _Ctr, argv: list[str], env: dict, out: _Lines, t: list[float]) -> None:
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                p = prepare(argv, env, path_map=lambda cp: str(ctr.fs.read_path(cp)),
                            default_landscape=self.landscape, load=cached_landscape)
            ctr.port = p.ns.port

            def sleep(s: float) -> None:
                t[0] += max(0.0, float(s))

            def save(cpath: str, text: str) -> None:
                if ctr.fs.read_only(cpath):
                    raise OSError(errno.EROFS, "Read-only file system", cpath)
                ctr.writes.append((t[0], str(ctr.fs.write_path(cpath)), text))

            boot = Boot(p.land, p.ns, p.values, p.nda, env=env, time_scale=p.time_scale,
                        noise_sigma=p.noise_sigma, log=Log(out, now=lambda: self.stamp(t[0])),
                        sleep=sleep, clock=lambda: t[0], save=save,
                        exists=lambda cp: ctr.fs.read_path(cp).exists())
            res = boot.boot()
        except SystemExit as e:          # argparse: usage + error on stderr, exit 2
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            ctr.exit_code, ctr.end = code, t[0]
            return
        except PrepareError as e:
            out.write(f"{e}\n")
            ctr.exit_code, ctr.end = 2, t[0]
            return
        except Exception:  # noqa: BLE001 - an engine bug: a traceback and exit 1, as in a container
            out.write(traceback.format_exc())
            ctr.exit_code, ctr.end = 1, t[0]
            return
        ctr.end = t[0]
        if res.exit_code is not None:
            ctr.exit_code = res.exit_code
        elif not res.hung:
            ctr.core = EngineCore(res.behaviour, clock=self.now, sleep=self._request_sleep,
                                  log=lambda line: ctr.killed or self._emit(ctr, line),
                                  path_map=lambda cp: str(ctr.fs.write_path(cp)),
                                  stamp=lambda: self.stamp().strftime("%m-%d %H:%M:%S"), epoch=0.0)
        else:
            ctr.end = float("inf")

    def _emit(self, ctr: _Ctr, line: str, t: float | None = None) -> None:
        with self._lock:
            bisect.insort(ctr.lines, (self._now if t is None else t, next(self._seq), line))

    def _sync(self) -> None:
        """Reveal what the clock has passed: log lines into followers, deferred file writes."""
        with self._lock:
            for ctr in self.containers.values():
                due = [w for w in ctr.writes if w[0] <= self._now]
                if due:
                    ctr.writes = [w for w in ctr.writes if w[0] > self._now]
                    for _, path, text in due:
                        Path(path).parent.mkdir(parents=True, exist_ok=True)
                        Path(path).write_text(text)
                if ctr.followers:
                    n = bisect.bisect_right(ctr.lines, (self._now, float("inf"), ""))
                    for f in ctr.followers:
                        if f[1] < n:
                            with open(f[0], "a", encoding="utf-8") as fh:
                                fh.write("".join(f[2](line) + "\n" for _, _, line in ctr.lines[f[1]:n]))
                            f[1] = n

    def follow_logs(self, cid: str, path: Path, redact=None) -> LogFollower:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        with self._lock:
            ctr = self.containers.get(cid)
            if ctr is not None:
                ctr.followers.append([path, 0, redact or str])
                self._sync()
        return LogFollower(path=path, stop=lambda timeout=0: None)

    def state(self, cid: str) -> ContainerState:
        with self._lock:
            ctr = self.containers.get(cid)
            if ctr is None:
                return ContainerState(status="missing")
            self._sync()
            code = ctr.exited_at(self._now)
            if code is not None:
                return ContainerState(status="exited", exit_code=code)
            return ContainerState(status="running")     # no pid: nothing runs on this machine

    def serving(self, cid: str) -> EngineCore | None:
        """The engine core answering HTTP now (None while booting, hung or dead)."""
        ctr = self.containers.get(cid)
        if ctr is None or ctr.core is None or ctr.exited_at(self._now) is not None:
            return None
        return ctr.core if self._now >= ctr.end else None

    def wait(self, cid: str, timeout: float) -> ContainerState:
        st = self.state(cid)
        ctr = self.containers.get(cid)
        if st.running and ctr is not None:
            self.advance(min(float(timeout), ctr.end - self._now) if ctr.exit_code is not None else timeout)
        return self.state(cid)

    def kill(self, cid: str, signal: str = "SIGKILL") -> None:
        self.calls.append(("kill", cid))
        self._kill(cid, signal)

    def _kill(self, cid: str, signal: str = "SIGKILL") -> None:
        with self._lock:
            ctr = self.containers.get(cid)
            if ctr is None or not self.state(cid).running:
                return
            ctr.killed = (self._now, 137 if signal in ("SIGKILL", "KILL", "9") else 143)
            ctr.lines = [x for x in ctr.lines if x[0] <= self._now]     # it says nothing more
            ctr.writes, ctr.core = [], None

    def remove(self, cid: str) -> None:
        self.calls.append(("remove", cid))
        with self._lock:
            self._kill(cid)
            ctr = self.containers.pop(cid, None)
        if ctr is not None:
            ctr.fs.remove()

    def close(self) -> None:
        for cid in list(self.containers):
            self.remove(cid)
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> SimHost:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def copy_out(self, cid: str, src: str, dest: Path) -> list[Path]:
        ctr = self.containers.get(cid)
        if ctr is None:
            raise HostError(f"container {cid[:12]} is gone; cannot copy {src} out of it")
        self._sync()
        out = ctr.fs.copy_out(src, Path(dest))
        if not out:
            raise HostError(f"{src} not found in container {cid[:12]}")
        return out

    def _image(self) -> dict[str, Path]:
        if self._image_files is None:
            self._image_files = image_files()
        return self._image_files

    # -- HTTP ----------------------------------------------------------------------------
    def base_url(self, cid: str, port: int) -> str:
        return f"http://sim-{cid[:12]}:{port}"

    def http_client(self, cid: str, timeout: float = 30.0) -> httpx.Client:
        from host.simhttp import EngineHandler, SimClient

        return SimClient(EngineHandler(self, cid), httpx.Timeout(timeout, connect=min(timeout, 5.0)))

    def container_at(self, url_host: str, default: str) -> _Ctr | None:
        """The container an URL's host names (``sim-<id prefix>``; loopback: ``default``)."""
        if url_host.startswith("sim-"):
            return next((c for cid, c in self.containers.items() if cid.startswith(url_host[4:])), None)
        return self.containers.get(default) if url_host in ("127.0.0.1", "localhost") else None

    def begin_read(self, read_timeout: float | None) -> None:
        """The client starts waiting for bytes now (this thread), for at most ``read_timeout``."""
        self._tl.read_timeout, self._tl.gap_start = read_timeout, self._now

    def access(self, ctr: _Ctr, method: str, path: str, status: int) -> None:
        self._emit(ctr, access_line("127.0.0.1", next(self._ports), method, path, status))

    def rest_load(self, seconds: float = 2.0) -> dict:
        """A simulated box at rest: the cores of the landscape's ``tenant`` that holds the box at
        this moment (one there from the night's start is the box's background; one that comes
        later is a tenant), no virtual time passing; the machine running the simulation is never read."""
        try:
            tens = realbox.tenants(cached_landscape(self.landscape, known_flags()).data)
        except (LandscapeError, OSError):       # a landscape that cannot load: the first boot says why
            tens = ()
        cores = float(realbox.tenant_cores(tens, self.now(), self.now()))
        return {"source": "simulated", "cores": round(cores, 3), "samples": [round(cores, 3)], "seconds": 0.0}

    def warm_files(self, paths: list[str], budget_s: float) -> dict:
        """The simulated model is read once: the page cache holds it, so the landscape's cold
        boots (``cold_start``) are spent; no virtual time passes."""
        self._model_reads += 1
        return {"files": len(paths), "bytes": 0, "seconds": 0.0, "complete": True, "simulated": True}

    def gpu_holders(self) -> list[tuple[int, str, int]] | None:
        return []                                  # a simulated box's GPU is free

    def podman_version(self) -> str | None:
        return None                                # a simulated box runs no podman

    def port_holder(self, port: int) -> str | None:
        """A running simulated container on ``port`` (the network is virtual: nothing real counts)."""
        for cid, c in list(self.containers.items()):
            if c.port == port and self.state(cid).running:
                return f"container {c.spec.name} ({cid[:12]})"
        return None


class _Lines(io.TextIOBase):
    """A text stream that files each whole line under the container at the boot's time."""

    def __init__(self, host: SimHost, ctr: _Ctr, clock):
        self.host, self.ctr, self.clock, self._buf = host, ctr, clock, ""

    @property
    def pending(self) -> bool:
        return bool(self._buf)

    def write(self, s: str) -> int:
        self._buf += s
        *whole, self._buf = self._buf.split("\n")
        for line in whole:
            self.host._emit(self.ctr, line, self.clock())
        return len(s)

    def flush(self) -> None:
        pass

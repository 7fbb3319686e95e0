"""An in-memory `Host` for unit tests: containers are scripted programs, no podman involved.

A program is a callable ``(spec) -> FakeRun``: the log lines the container prints, whether it
keeps running (``exit_code=None``) or exits, and files that can be copied out of it. The
contract suite (tests/test_host_contract.py) holds it to the same behaviour as PodmanHost.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from arms.errors import ConfigError, HostError
from arms.host import LABEL_MANAGED, RealTime, ContainerSpec, ContainerState, ImageInfo, LogFollower


@dataclass
class FakeRun:
    lines: list[str]
    exit_code: int | None = None          # None: keeps running until killed
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class _Ctr:
    spec: ContainerSpec
    run: FakeRun
    status: str = "running"
    exit_code: int | None = None
    oom_killed: bool = False
    logs: list[str] = field(default_factory=list)


class FakeHost(RealTime):
    podman_version_text: str | None = None

    def __init__(self, images: dict[str, str] | None = None,
                 program: Callable[[ContainerSpec], FakeRun] | None = None):
        # images: tag or digest reference -> "sha256:..." digest
        self.images = dict(images or {})
        self.program = program or (lambda spec: FakeRun(lines=["ready"]))
        self.containers: dict[str, _Ctr] = {}
        self.calls: list[tuple[str, str]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.units: dict[str, str] = {}          # unit -> active | inactive | failed (and "+masked")
        self.unit_calls: list[tuple[str, str]] = []
        self.foreign_cores = 0.0                 # what ``conditions`` reports as other processes' CPU load
        self.rest_cores = 0.0                    # what ``rest_load`` reports: the box's load at rest

    def resolve_image(self, ref: str) -> ImageInfo:
        self.calls.append(("resolve_image", ref))
        if "@sha256:" in ref:
            repo, digest = ref.split("@", 1)
            if digest not in self.images.values():
                raise ConfigError(f"image {ref} is not present on this host; pull or build it first (`podman pull {ref}`)")
            return ImageInfo(ref=ref, digest=digest, image_id=digest[7:19])
        if ref not in self.images:
            raise ConfigError(f"image {ref} is not present on this host; pull or build it first (`podman pull {ref}`)")
        digest = self.images[ref]
        repo = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
        return ImageInfo(ref=f"{repo}@{digest}", digest=digest, image_id=digest[7:19], tags=(ref,))

    def start(self, spec: ContainerSpec) -> str:
        self.calls.append(("start", spec.name))
        digest = spec.image.split("@", 1)[1] if "@" in spec.image else None
        if digest not in self.images.values():
            raise HostError(f"image {spec.image} is not present on this host")
        with self._lock:
            if any(c.spec.name == spec.name for c in self.containers.values()):
                raise HostError(f"podman refused to create {spec.name}: the container name is already in use")
            cid = f"{next(self._ids):064x}"
            run = self.program(spec)
            ctr = _Ctr(spec=spec, run=run, logs=list(run.lines))
            if run.exit_code is not None:
                ctr.status, ctr.exit_code = "exited", run.exit_code
            self.containers[cid] = ctr
        return cid

    def follow_logs(self, cid: str, path: Path, redact=None) -> LogFollower:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        ctr = self.containers.get(cid)
        path.write_text("".join((redact or str)(line) + "\n" for line in (ctr.logs if ctr else [])))
        return LogFollower(path=path, stop=lambda timeout=0: None)

    def state(self, cid: str) -> ContainerState:
        ctr = self.containers.get(cid)
        if ctr is None:
            return ContainerState(status="missing")
        return ContainerState(status=ctr.status, exit_code=ctr.exit_code, oom_killed=ctr.oom_killed,
                              pid=None if ctr.status != "running" else 4242)

    def wait(self, cid: str, timeout: float) -> ContainerState:
        return self.state(cid)

    def kill(self, cid: str, signal: str = "SIGKILL") -> None:
        self.calls.append(("kill", cid))
        ctr = self.containers.get(cid)
        if ctr is not None and ctr.status == "running":
            ctr.status = "exited"
            ctr.exit_code = 137 if signal in ("SIGKILL", "KILL", "9") else 143

    def copy_out(self, cid: str, src: str, dest: Path) -> list[Path]:
        ctr = self.containers.get(cid)
        if ctr is None:
            raise HostError(f"container {cid[:12]} is gone; cannot copy {src} out of it")
        prefix = src.rstrip("/") + "/"
        hits = {p: b for p, b in ctr.run.files.items() if p == src or p.startswith(prefix)}
        if not hits:
            raise HostError(f"{src} not found in container {cid[:12]}")
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        base = Path(src).name if src in hits else Path(src.rstrip("/")).name
        out = []
        for p, data in hits.items():
            rel = Path(p).name if p == src else Path(base) / p[len(prefix):]
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            out.append(target)
        return out

    def remove(self, cid: str) -> None:
        self.calls.append(("remove", cid))
        self.containers.pop(cid, None)

    def probes(self, cid: str, interval_s: float = 2.0):
        """No machine under a fake: the container's state only (``host.probes.StateProbes``)."""
        from host.probes import StateProbes

        return StateProbes(self, cid, interval_s, source="fake")

    def conditions(self, cid: str):
        """No machine under a fake: ``foreign_cores`` (set it to script another tenant)."""
        from host.conditions import VirtualConditions

        return VirtualConditions(self.now, lambda t0, t1: self.foreign_cores, "fake")

    def rest_load(self, seconds: float = 2.0) -> dict:
        """No machine under a fake: ``rest_cores`` (set it to script a box that is never idle)."""
        return {"source": "fake", "cores": self.rest_cores, "samples": [self.rest_cores], "seconds": 0.0}

    def list_managed(self, labels: dict[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
        want = {LABEL_MANAGED: "1", **(labels or {})}
        out = []
        for cid, c in self.containers.items():
            have = dict(c.spec.labels)
            if all(have.get(k) == v for k, v in want.items()):
                out.append((cid, have))
        return out

    def warm_files(self, paths: list[str], budget_s: float) -> dict:
        from host.pagecache import read_through

        return read_through(paths, budget_s)

    def gpu_holders(self) -> list[tuple[int, str, int]] | None:
        return []                                  # a fake box's GPU is free

    def podman_version(self) -> str | None:
        return self.podman_version_text            # a fake has no podman; tests may set one

    def port_holder(self, port: int) -> str | None:
        """A running fake container started with ``--port <port>``, else whatever really
        listens on the port here (a read-only look at this machine)."""
        from .ports import port_holder

        for cid, c in self.containers.items():
            cmd = list(c.spec.command)
            if c.status == "running" and any(a == "--port" and cmd[i + 1:i + 2] == [str(port)]
                                             for i, a in enumerate(cmd)):
                return f"container {c.spec.name} ({cid[:12]})"
        return port_holder(port)

    def unit(self, name: str, action: str) -> str:
        """Recorded unit control: a unit starts as whatever ``units`` says (default inactive)."""
        self.unit_calls.append((name, action))
        state = self.units.get(name, "inactive")
        masked = state.endswith("+masked")
        base = state.split("+")[0]
        if action == "is-active":
            return base
        if action == "stop":
            base = "inactive"
        elif action in ("start", "restart"):
            if masked:
                raise HostError(f"`systemctl {action} {name}` failed (1): Unit {name} is masked.")
            base = "active"
        elif action == "mask-runtime":
            masked = True
        elif action == "unmask-runtime":
            masked = False
        self.units[name] = base + ("+masked" if masked else "")
        return "ok"

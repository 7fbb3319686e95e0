"""One engine container's life: spec from a Shape, start, follow logs, wait ready, always remove.

``booted(...)`` is the context manager every arm goes through (vLLM benchmarks/sweep style):
whatever happens inside — an exception, KeyboardInterrupt, SystemExit from SIGTERM — the
container is removed on the way out. ``sweep_orphans`` removes containers a crashed run left.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .argv import render_argv, render_env
from .host import (LABEL_ARM, LABEL_CAMPAIGN, LABEL_MANAGED, BindMount, ContainerSpec, Host,
                   LogFollower)
from .readiness import ReadinessProbe, ReadyResult, wait_ready
from .secrets import Sealer
from .shape import Shape

log = logging.getLogger("tuner.arms.lifecycle")

UNLIMITED = 2 ** 64 - 1


def container_name(campaign: str, arm: int | str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", campaign).strip("-") or "campaign"
    return f"tuner-{safe}-arm{arm}"


def container_spec(shape: Shape, *, campaign: str, arm: int | str, style: str = "vllm",
                   port_flag: str | None = "--port", extra_env: dict[str, str] | None = None,
                   extra_mounts: tuple[BindMount, ...] = ()) -> ContainerSpec:
    """Pure: the podman container for one shape, with the tool's labels."""
    argv = render_argv(shape, style=style)
    if port_flag and port_flag not in argv:
        argv += [port_flag, str(shape.port)]
    env = {**render_env(shape), **(extra_env or {})}
    opts = dict(shape.options)
    ulimits = []
    for name, val in dict(opts.get("ulimits") or {}).items():
        n = UNLIMITED if val in (-1, "-1", "unlimited") else int(val)
        ulimits.append((str(name), n, n))
    mounts = tuple(BindMount(m.source, m.target, m.read_only) for m in shape.mounts) + tuple(extra_mounts)
    return ContainerSpec(
        image=shape.image, command=tuple(argv), name=container_name(campaign, arm),
        env=tuple(sorted(env.items())), mounts=mounts, devices=tuple(shape.devices),
        labels=((LABEL_MANAGED, "1"), (LABEL_CAMPAIGN, campaign), (LABEL_ARM, str(arm))),
        network_mode=str(opts.get("network", "host")), ipc_mode=opts.get("ipc"),
        ulimits=tuple(ulimits), shm_size=opts.get("shm_size"),
        group_add=tuple(opts.get("group_add") or ()),
    )


def ulimits_of(entries) -> dict[str, int]:
    """The inverse of ``container_spec``'s ulimits: podman inspect's ``HostConfig.Ulimits``
    entries as a shape's ``ulimits`` option ({name: soft}, unlimited written -1)."""
    out = {}
    for u in entries or []:
        name, soft = str(u.get("Name", "")).lower().removeprefix("rlimit_"), u.get("Soft")
        if name and soft is not None:
            out[name] = -1 if soft in (-1, UNLIMITED) else int(soft)
    return out


@dataclass
class Booted:
    cid: str
    spec: ContainerSpec
    base_url: str
    logs: LogFollower
    ready: ReadyResult
    started_at: float


def crashpoint(name: str, arm) -> None:
    """Fault injection for the crash-resume tests: ``TUNER_CRASH_AT=name:arm`` kills this process
    with SIGKILL at that point, exactly as `kill -9` would (``name:*``: the first time any arm gets
    there). Unset, it does nothing."""
    spec = os.environ.get("TUNER_CRASH_AT")
    if spec and spec in (f"{name}:{arm}", f"{name}:*"):
        log.warning("[crashpoint] %s", spec)
        os.kill(os.getpid(), signal.SIGKILL)


def sweep_orphans(host: Host, campaign: str | None = None) -> list[str]:
    """Remove every container of this tool (of one campaign, when named); returns their ids."""
    labels = {LABEL_CAMPAIGN: campaign} if campaign else None
    removed = []
    for cid, lab in host.list_managed(labels):
        log.warning("[sweep] removing orphan container %s (campaign %s, arm %s)", cid[:12],
                    lab.get(LABEL_CAMPAIGN), lab.get(LABEL_ARM))
        host.remove(cid)
        removed.append(cid)
    return removed


def _remove_half_started(host: Host, spec: ContainerSpec, tag: str, settle_s: float) -> None:
    """A signal (SIGTERM, Ctrl-C) or an error while podman was creating or starting ``spec``:
    the container may exist without our knowing its id, or appear a moment later (podman
    finishes a create its client stopped waiting for). Find it by its labels, for up to
    ``settle_s``, and remove it. A signal that left nothing is said too."""
    labels = {k: v for k, v in dict(spec.labels).items() if k != LABEL_MANAGED}
    deadline = host.now() + settle_s
    while True:
        found = host.list_managed(labels)
        for orphan, _ in found:
            host.remove(orphan)
            log.info("[%s TEARDOWN] removed %s (interrupted while starting)", tag, orphan[:12])
        if found or host.now() >= deadline:
            break
        host.sleep(0.2)
    if not found and settle_s > 0:
        log.info("[%s TEARDOWN] interrupted while starting: no container of %s was left", tag, spec.name)


@contextlib.contextmanager
def booted(host: Host, spec: ContainerSpec, *, log_path: Path, port: int, model: str | None = None,
           probe: ReadinessProbe = ReadinessProbe(), timeout_s: float = 1200.0, hang_s: float = 600.0,
           poll_s: float = 1.0, tag: str = "arm") -> Iterator[Booted]:
    """Start ``spec``, wait until ready (or dead), yield, and always remove the container."""
    t0 = host.now()
    try:
        cid = host.start(spec)
    except BaseException as e:
        # a signal may have cut the create short on our side only: wait a moment for podman
        _remove_half_started(host, spec, tag, settle_s=0.0 if isinstance(e, Exception) else 3.0)
        raise
    follower = None
    try:
        crashpoint("container-started", dict(spec.labels).get(LABEL_ARM))
        follower = host.follow_logs(cid, log_path, Sealer.of_container(spec.env, spec.command).text)   # sealed as written
        log.info("[%s BOOT] %s started as %s", tag, spec.name, cid[:12])
        url = host.base_url(cid, port)
        with host.http_client(cid, timeout=10.0) as http:
            ready = wait_ready(host, cid, url, follower, probe=probe, model=model, timeout_s=timeout_s,
                               hang_s=hang_s, poll_s=poll_s, clock=host.now, sleep=host.sleep, http=http)
        log.info("[%s READY %s] after %.1f s (%s)", tag, ready.outcome, ready.seconds, ready.detail)
        if ready.outcome == "exited" and callable(follower.stop):
            follower.stop(5.0)      # the stream ends with the container: let the file catch up
        yield Booted(cid=cid, spec=spec, base_url=url, logs=follower, ready=ready, started_at=t0)
    finally:
        try:
            if follower is not None and callable(follower.stop):
                follower.stop(5.0 if host.state(cid).exited else 0.0)   # final copy before removal
            host.remove(cid)
            log.info("[%s TEARDOWN] removed %s", tag, cid[:12])
        finally:
            if follower is not None and callable(follower.stop):
                follower.stop(0.0)


def model_paths(shape) -> list[str]:
    """The host paths the engine reads its model from: the model path when it is a host path, and
    the sources of the shape's read-only mounts (model folders; the compile cache is read-write).
    What a new night reads once before its first boot (Host.warm_files)."""
    out = [shape.model] if shape.model.startswith("/") and os.path.exists(shape.model) else []
    out += [m.source for m in shape.mounts if m.read_only and os.path.exists(m.source) and m.source not in out]
    return out

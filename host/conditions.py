"""The real box's conditions around one measured run (``arms.conditions`` says what is recorded).

Foreign CPU load = the box's busy CPU seconds (psutil.cpu_times: user, nice, system, irq,
softirq) minus the engine container's CPU seconds (its cgroup's counter: cgroup v2
``cpu.stat`` usage_usec or v1 ``cpuacct.usage``, found through ``/proc/<pid>/cgroup`` of the
container's main process; where no own cgroup is readable, the CPU times of its process tree)
minus this process's own (``time.process_time``: the tuner's client and its sampler threads),
per wall second. GPU clocks, throttle reasons and the processes holding GPU memory come from
NVML (nvidia-ml-py) where it initialises; otherwise those fields are absent. Never raises: a
figure that cannot be read is None.
"""
from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arms.conditions import foreign_cores, rest_load

log = logging.getLogger("tuner.host.conditions")

# NVML's clock event (throttle) reason bits (nvml.h, nvmlClocksEventReason*)
THROTTLE_BITS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"),
                 (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"),
                 (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown"),
                 (0x100, "display_clock_setting"))


def throttle_names(mask: int) -> list[str]:
    names = [n for bit, n in THROTTLE_BITS if mask & bit]
    rest = mask & ~sum(b for b, _ in THROTTLE_BITS)
    return names + ([f"0x{rest:x}"] if rest else [])


def busy_and_steal_s() -> tuple[float, float]:
    """(busy CPU seconds of the whole box since boot, seconds stolen by a hypervisor)."""
    import psutil

    t = psutil.cpu_times()
    busy = sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
    return busy, getattr(t, "steal", 0.0)


def cgroup_cpu_file(pid: int, root: str | Path = "/sys/fs/cgroup",
                    proc: str | Path = "/proc") -> Path | None:
    """The CPU usage counter of ``pid``'s own cgroup (v1 cpuacct.usage or v2 cpu.stat), None when
    it sits in the root cgroup (the counter would be the whole box's) or none is readable."""
    root = Path(root)
    try:
        lines = (Path(proc) / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for ln in lines:
        _, ctrls, path = (ln.split(":", 2) + ["", ""])[:3]
        if path in ("", "/"):
            continue
        if ctrls == "":
            v2 = path
        elif "cpuacct" in ctrls.split(","):
            for mount in (ctrls, "cpuacct", "cpu,cpuacct"):
                f = root / mount / path.lstrip("/") / "cpuacct.usage"
                if f.is_file():
                    return f
    if v2 is not None:
        for base in (root, root / "unified"):
            f = base / v2.lstrip("/") / "cpu.stat"
            if f.is_file():
                return f
    return None


def read_cgroup_cpu_s(f: Path) -> float | None:
    """Seconds from a v1 cpuacct.usage (ns) or a v2 cpu.stat (usage_usec)."""
    try:
        text = f.read_text()
    except OSError:
        return None
    if f.name == "cpuacct.usage":
        return int(text.strip()) / 1e9
    for ln in text.splitlines():
        k, _, v = ln.partition(" ")
        if k == "usage_usec":
            return int(v) / 1e6
    return None


def tree_cpu_s(pid: int) -> float | None:
    """User + system seconds of ``pid`` and its descendants (children that already exited lost)."""
    from host.probes import process_tree

    import psutil

    total, n = 0.0, 0
    for p in process_tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
            n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total if n else None


class BoxConditions:
    """``start()`` / ``stop() -> dict`` around each run of one container (``Host.conditions``).
    ``pid_provider``: the container's main PID (looked up once, at the first start)."""

    def __init__(self, pid_provider: Callable[[], int | None] | None, *, nvml: Any = "auto",
                 cgroup_root: str | Path = "/sys/fs/cgroup", proc: str | Path = "/proc",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pid_provider, self.nvml_arg = pid_provider, nvml
        self.cgroup_root, self.proc, self.clock = cgroup_root, proc, clock
        self._resolved = False
        self._pid: int | None = None
        self._cg: Path | None = None
        self._t0: tuple | None = None
        self._gpu0: list | None = None
        self._nv: Any | None = None

    def _resolve(self) -> None:
        if self._resolved:
            return
        self._resolved = True
        try:
            self._pid = self.pid_provider() if self.pid_provider else None
        except Exception:  # noqa: BLE001 - a host that cannot say gives "no container"
            self._pid = None
        if self._pid:
            self._cg = cgroup_cpu_file(self._pid, self.cgroup_root, self.proc)

    def _container_s(self) -> tuple[float, str]:
        if self._cg is not None:
            s = read_cgroup_cpu_s(self._cg)
            if s is not None:
                return s, "cgroup"
        if self._pid:
            s = tree_cpu_s(self._pid)
            if s is not None:
                return s, "process tree"
        return 0.0, "none"

    def _read(self) -> tuple:
        try:
            busy, steal = busy_and_steal_s()
        except Exception:  # noqa: BLE001
            busy = steal = None
        c, src = self._container_s()
        return self.clock(), busy, steal, c, time.process_time(), src

    def start(self) -> None:
        self._resolve()
        self._gpu0 = self._holders()
        self._t0 = self._read()

    def stop(self) -> dict:
        t1 = self._read()
        out: dict[str, Any] = {"source": "psutil"}
        if self._t0 is None:
            return {**out, "foreign_cores": None}
        (w0, b0, s0, c0, o0, _), (w1, b1, s1, c1, o1, src) = self._t0, t1
        wall = w1 - w0
        out["wall_s"] = round(wall, 3)
        fc = foreign_cores(b1 - b0, c1 - c0, o1 - o0, wall) if b0 is not None and b1 is not None else None
        out["foreign_cores"] = None if fc is None else round(fc, 3)
        out["steal_cores"] = round((s1 - s0) / wall, 3) if s0 is not None and s1 is not None and wall > 0 else None
        out["container_cpu"] = src
        out["container_cores"] = round((c1 - c0) / wall, 3) if wall > 0 else None
        try:
            out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            out["load_avg"] = None
        out["cpu_freq_mhz"] = _cpu_freq()
        gpu, held = self._gpu(), self._holders()
        if gpu is not None:
            out["gpu"] = gpu
        if held is not None or self._gpu0 is not None:
            mine = self._container_pids() | {os.getpid()}
            seen = {p: n for p, n in (self._gpu0 or []) + (held or []) if p not in mine}
            out["foreign_gpu"] = [[p, n] for p, n in sorted(seen.items())]
        self._t0 = None
        return out

    # -- NVML ----------------------------------------------------------------------------------
    def _nvml(self) -> Any | None:
        """The NVML module, initialised once for this probe's life (the first nvmlInit of a
        process can take a second; the runs' own calls then only count references), shut down
        when the probe is collected; None without nvidia-ml-py or a driver (never tried again)."""
        if self.nvml_arg is None or self._nv is not None:
            return self._nv
        nv = self.nvml_arg
        if nv == "auto":
            try:
                import pynvml as nv  # type: ignore[import-not-found,no-redef]
            except ImportError:
                self.nvml_arg = None
                return None
        try:
            nv.nvmlInit()
        except Exception:  # noqa: BLE001 - no GPU, no driver: absent
            self.nvml_arg = None
            return None
        self._nv = nv
        weakref.finalize(self, _try, nv.nvmlShutdown)
        return nv

    def _holders(self) -> list[tuple[int, str]] | None:
        from host.probes import gpu_holders

        nv = self._nvml()
        if nv is None:
            return None
        got = gpu_holders(nv)
        return None if got is None else [(p, n) for p, n, _ in got]

    def _gpu(self) -> list[dict] | None:
        nv = self._nvml()
        if nv is None:
            return None
        out = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                g: dict[str, Any] = {"index": i}
                for key, what in (("sm_clock_mhz", "NVML_CLOCK_SM"), ("mem_clock_mhz", "NVML_CLOCK_MEM")):
                    g[key] = _try(lambda: int(nv.nvmlDeviceGetClockInfo(h, getattr(nv, what))))
                reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                    getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
                mask = _try(lambda: int(reasons(h))) if reasons else None
                g["throttle"] = None if mask is None else throttle_names(mask)
                g["temp_c"] = _try(lambda: int(nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))))
                out.append(g)
        except Exception as e:  # noqa: BLE001
            log.debug("NVML read failed: %s", e)
        return out

    def _container_pids(self) -> set[int]:
        if self._cg is not None:
            try:
                return {int(x) for x in (self._cg.parent / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        if not self._pid:
            return set()
        from host.probes import process_tree

        return {p.pid for p in process_tree(self._pid)}


def _try(f: Callable[[], Any]) -> Any:
    try:
        return f()
    except Exception:  # noqa: BLE001 - one unreadable figure is None
        return None


def _cpu_freq() -> float | None:
    import psutil

    try:
        f = psutil.cpu_freq()
    except Exception:  # noqa: BLE001 - not every kernel or VM exposes it
        return None
    return round(f.current, 1) if f is not None and f.current else None


def read_rest_load(seconds: float = 2.0, windows: int = 4, *, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> dict:
    """Other processes' CPU load on the box while no engine of ours runs: the box's busy CPU
    seconds minus this process's own, per wall second, over ``windows`` windows of
    ``seconds / windows`` each; ``cores`` is the smallest (``arms.conditions.rest_load``).
    Never raises: ``cores`` is None when psutil cannot read the box."""
    samples: list[float | None] = []
    n = max(1, windows)
    for _ in range(n):
        try:
            b0, o0, w0 = busy_and_steal_s()[0], time.process_time(), clock()
            sleep(seconds / n)
            b1, o1, w1 = busy_and_steal_s()[0], time.process_time(), clock()
        except Exception as e:  # noqa: BLE001 - a box that cannot say has no background figure
            log.debug("rest load unreadable: %s", e)
            samples.append(None)
            continue
        fc = foreign_cores(b1 - b0, 0.0, o1 - o0, w1 - w0)
        samples.append(None if fc is None else round(fc, 3))
    return {"source": "psutil", "cores": rest_load(samples), "samples": samples, "seconds": seconds}


def for_container(host: Any, cid: str, **kw: Any) -> BoxConditions:
    """The conditions probe of one container: its PID from ``host.state``."""
    return BoxConditions(lambda: host.state(cid).pid, **kw)


class VirtualConditions:
    """The conditions probe of a host with no machine under it (simulated, fake): its own model's
    foreign load over [start, stop] on its own clock; the machine running it is never read."""

    def __init__(self, now: Callable[[], float], foreign: Callable[[float, float], float], source: str) -> None:
        self.now, self.foreign, self.source = now, foreign, source
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = self.now()

    def stop(self) -> dict:
        t1 = self.now()
        t0 = t1 if self._t0 is None else self._t0
        self._t0 = None
        return {"source": self.source, "wall_s": round(t1 - t0, 3),
                "foreign_cores": round(float(self.foreign(t0, t1)), 3), "load_avg": None, "cpu_freq_mhz": None}

"""Host probes sampled while an arm runs: what the arm cost the box.

``ProbeSampler`` is a context manager around the arm. A daemon thread takes one sample at
start, one every ``interval_s`` (2 s by default) and one at stop: available RAM and swap
(psutil), the engine's RSS (the container's main PID and all its children), and VRAM per GPU
where a reader exists (NVML via nvidia-ml-py, ``/sys/class/drm/card*/device/mem_info_vram_*``,
or AMD SMI, first that works; none -> "n/a"). At stop it reads the container state once
(``OOMKilled``, exit 137) and scans the kernel log since the start for OOM kills
(``journalctl -k``, else ``/dev/kmsg``, else ``dmesg``; best effort, never raising).
The sampler thread measures its own CPU time (``time.thread_time``): ``summary()`` reports it
as a percentage of one core.

The optional PCIe link probe lives in ``host.linkprobe`` (``link_probe_gbs``).
"""
from __future__ import annotations

import errno
import os
import re
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

OOM_RE = re.compile(r"Out of memory: Killed process (\d+) \(([^)]*)\)(?:.*?anon-rss:(\d+)kB)?")


@dataclass(frozen=True)
class GpuMem:
    index: int
    used_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class ProbeSample:
    t: float                                # the sampler clock (epoch seconds by default)
    ram_available_bytes: int
    swap_used_bytes: int
    swap_free_bytes: int
    engine_rss_bytes: int | None            # None: no PID (simulated host) or it is gone
    engine_procs: int
    vram: tuple[GpuMem, ...] | None         # None: no reader ("n/a")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["vram"] = "n/a" if self.vram is None else [asdict(g) for g in self.vram]
        return d


@dataclass(frozen=True)
class OomKill:
    pid: int | None
    comm: str
    anon_rss_kb: int | None
    source: str                             # journalctl | kmsg | dmesg | container
    line: str


def parse_oom_lines(text: str, source: str) -> list[OomKill]:
    """Pure: the kernel's ``Out of memory: Killed process ...`` lines in ``text``."""
    out = []
    for line in text.splitlines():
        m = OOM_RE.search(line)
        if m:
            out.append(OomKill(int(m.group(1)), m.group(2), int(m.group(3)) if m.group(3) else None,
                               source, line.strip()))
    return out


# -- VRAM readers ----------------------------------------------------------------------------
class NvmlReader:
    source = "nvml"

    def __init__(self) -> None:
        import pynvml                         # nvidia-ml-py

        self._n = pynvml
        pynvml.nvmlInit()
        self._h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def read(self) -> list[GpuMem]:
        return [GpuMem(i, int(m.used), int(m.total))
                for i, m in enumerate(self._n.nvmlDeviceGetMemoryInfo(h) for h in self._h)]

    def close(self) -> None:
        self._n.nvmlShutdown()


class SysfsReader:
    source = "sysfs"

    def __init__(self, root: str | Path = "/sys/class/drm") -> None:
        self._cards = sorted(p.parent for p in Path(root).glob("card*/device/mem_info_vram_total"))
        if not self._cards:
            raise FileNotFoundError(f"no mem_info_vram_total under {root}")

    def read(self) -> list[GpuMem]:
        return [GpuMem(i, int((d / "mem_info_vram_used").read_text()),
                       int((d / "mem_info_vram_total").read_text())) for i, d in enumerate(self._cards)]

    def close(self) -> None:
        pass


class AmdSmiReader:
    source = "amdsmi"                       # vram_usage is in MiB (unverified): converted to bytes

    def __init__(self) -> None:
        import amdsmi

        self._a = amdsmi
        amdsmi.amdsmi_init()
        self._h = amdsmi.amdsmi_get_processor_handles()

    def read(self) -> list[GpuMem]:
        out = []
        for i, h in enumerate(self._h):
            u = self._a.amdsmi_get_gpu_vram_usage(h)
            out.append(GpuMem(i, int(u["vram_used"]) << 20, int(u["vram_total"]) << 20))
        return out

    def close(self) -> None:
        self._a.amdsmi_shut_down()


def detect_vram_reader(sysfs_root: str | Path = "/sys/class/drm") -> Any | None:
    """The first VRAM reader that reads, or None ("n/a")."""
    for make in (NvmlReader, lambda: SysfsReader(sysfs_root), AmdSmiReader):
        try:
            r = make()
            r.read()
            return r
        except Exception:  # noqa: BLE001 - an absent or broken reader is just absent
            continue
    return None


def gpu_holders(nvml: Any = None) -> list[tuple[int, str, int]] | None:
    """(pid, process name, bytes) of every process holding GPU memory, where NVML can say;
    None when no reader can tell (no NVIDIA GPU, no nvidia-ml-py)."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no reader: nothing can be said
        return None
    out = []
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
                try:
                    import psutil

                    name = psutil.Process(p.pid).name()
                except Exception:  # noqa: BLE001 - a process in another namespace
                    name = "?"
                out.append((int(p.pid), name, int(p.usedGpuMemory or 0)))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


# -- the kernel log --------------------------------------------------------------------------
def _boot_time() -> float:
    import psutil

    return psutil.boot_time()


def kernel_oom_kills(since: float, *, timeout_s: float = 5.0,
                     kmsg: str = "/dev/kmsg") -> tuple[list[OomKill], str]:
    """OOM kills in the kernel log since the epoch ``since``: (kills, where it was read, or
    "unreadable: ..." when no source could be read). Never raises."""
    why = []
    try:
        p = subprocess.run(["journalctl", "-k", f"--since=@{int(since)}", "-g",
                            "Out of memory: Killed process", "-o", "short-unix", "--no-pager"],
                           capture_output=True, text=True, timeout=timeout_s)
        if p.returncode in (0, 1) and "No journal files" not in p.stderr:
            return parse_oom_lines(p.stdout, "journalctl"), "journalctl"
        why.append(f"journalctl: {(p.stderr.strip() or f'exit {p.returncode}')[:80]}")
    except (OSError, subprocess.SubprocessError) as e:
        why.append(f"journalctl: {type(e).__name__}")
    try:
        after = since - _boot_time()
    except Exception:  # noqa: BLE001
        after = 0.0
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
        lines = []
        try:
            while True:
                try:
                    rec = os.read(fd, 16384).decode("utf-8", "replace")
                except BlockingIOError:
                    break
                except OSError as e:              # EPIPE: a record was overwritten; go on
                    if e.errno == errno.EPIPE:
                        continue
                    raise
                head, _, msg = rec.partition(";")
                parts = head.split(",")
                if len(parts) > 2 and int(parts[2]) / 1e6 >= after:
                    lines.append(msg)
        finally:
            os.close(fd)
        return parse_oom_lines("\n".join(lines), "kmsg"), "kmsg"
    except (OSError, ValueError) as e:
        why.append(f"kmsg: {type(e).__name__}")
    try:
        p = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout_s)
        if p.returncode == 0:
            keep = [ln for ln in p.stdout.splitlines()
                    if (m := re.match(r"\[\s*([\d.]+)\]", ln)) and float(m.group(1)) >= after]
            return parse_oom_lines("\n".join(keep), "dmesg"), "dmesg"
        why.append(f"dmesg: {(p.stderr.strip() or f'exit {p.returncode}')[:80]}")
    except (OSError, subprocess.SubprocessError) as e:
        why.append(f"dmesg: {type(e).__name__}")
    return [], "unreadable: " + "; ".join(why)


# -- the sampler -----------------------------------------------------------------------------
def process_tree(pid: int) -> list:
    """``pid`` and all its descendants as psutil processes; [] when it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def rss_of(procs: list) -> tuple[int | None, int, bool]:
    """(summed RSS, processes read, whether one has gone) of psutil processes."""
    import psutil

    total = n = 0
    gone = False
    for q in procs:
        try:
            total += q.memory_info().rss
            n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            gone = True
    return (total if n else None), n, gone


def tree_rss(pid: int) -> tuple[int | None, int]:
    """(RSS of ``pid`` and all its descendants, processes counted); (None, 0) when it is gone."""
    rss, n, _ = rss_of(process_tree(pid))
    return rss, n


class ProbeSampler:
    """Samples the box every ``interval_s`` on a daemon thread while the ``with`` block runs."""

    def __init__(self, pid_provider: Callable[[], int | None] | None, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.time, *,
                 state_provider: Callable[[], Any] | None = None, vram: str | Any = "auto",
                 kernel_log: bool = True, sysfs_root: str | Path = "/sys/class/drm",
                 tree_refresh_s: float = 10.0) -> None:
        self.pid_provider, self.interval_s, self.clock = pid_provider, float(interval_s), clock
        self.tree_refresh_s = tree_refresh_s      # re-walk the process tree this often (costly)
        self._tree: list = []
        self._tree_at = float("-inf")
        self.state_provider, self.kernel_log, self.sysfs_root = state_provider, kernel_log, sysfs_root
        self._vram_arg = vram
        self._samples: list[ProbeSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self.vram_source = "n/a"
        self.started_at = self.stopped_at = None
        self.cpu_s = self.wall_s = 0.0
        self.oom_kills: list[OomKill] = []
        self.kernel_log_source = "not scanned"
        self.container: dict[str, Any] = {}

    def __enter__(self) -> ProbeSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.started_at = self.clock()
        self._thread = threading.Thread(target=self._run, name="probe-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        c0, w0 = time.thread_time(), time.perf_counter()
        reader = detect_vram_reader(self.sysfs_root) if self._vram_arg == "auto" else self._vram_arg
        self.vram_source = getattr(reader, "source", "n/a") if reader else "n/a"
        try:
            while True:
                stopping = self._stop.wait(self.interval_s) if self._samples else False
                self._take(reader)
                self.cpu_s, self.wall_s = time.thread_time() - c0, time.perf_counter() - w0
                if stopping:
                    break
        finally:
            if reader is not None and self._vram_arg == "auto":
                try:
                    reader.close()
                except Exception:  # noqa: BLE001
                    pass

    def _engine_pid(self) -> int | None:
        import psutil

        if self._pid is not None and psutil.pid_exists(self._pid):
            return self._pid
        try:
            self._pid = self.pid_provider() if self.pid_provider else None
        except Exception:  # noqa: BLE001 - a host that cannot say gives "no PID"
            self._pid = None
        return self._pid

    def _take(self, reader: Any) -> None:
        import psutil

        vm, sw = psutil.virtual_memory(), psutil.swap_memory()
        pid = self._engine_pid()
        now = time.monotonic()
        if not pid:
            self._tree = []
        elif not self._tree or self._tree[0].pid != pid or now - self._tree_at >= self.tree_refresh_s:
            self._tree, self._tree_at = process_tree(pid), now
        rss, n, gone = rss_of(self._tree)
        if gone and pid:                          # a process left: walk the tree again now
            self._tree, self._tree_at = process_tree(pid), now
            rss, n, _ = rss_of(self._tree)
        try:
            vram = tuple(reader.read()) if reader is not None else None
        except Exception:  # noqa: BLE001
            vram = None
        s = ProbeSample(self.clock(), int(vm.available), int(sw.used), int(sw.free), rss, n, vram)
        with self._lock:
            self._samples.append(s)

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None or self.stopped_at is not None:
            return
        self._stop.set()
        self._thread.join(timeout)
        self.stopped_at = self.clock()
        if self.state_provider is not None:
            try:
                st = self.state_provider()
                self.container = {"status": st.status, "exit_code": st.exit_code,
                                  "oom_killed": bool(st.oom_killed)}
                if st.oom_killed or st.exit_code == 137:
                    why = "OOMKilled" if st.oom_killed else "exit 137 (SIGKILL: OOM killer or kill -9)"
                    self.oom_kills.append(OomKill(st.pid, "container", None, "container", why))
            except Exception as e:  # noqa: BLE001
                self.container = {"error": f"{type(e).__name__}: {e}"}
        if self.kernel_log and self.started_at is not None:
            kills, self.kernel_log_source = kernel_oom_kills(self.started_at)
            self.oom_kills += kills

    def samples(self) -> list[ProbeSample]:
        with self._lock:
            return list(self._samples)

    @property
    def cpu_fraction(self) -> float | None:
        """The sampler thread's CPU seconds per wall second (1.0 = one core)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else None

    def summary(self) -> dict:
        ss = self.samples()
        rss = [s.engine_rss_bytes for s in ss if s.engine_rss_bytes is not None]
        vram: dict[str, Any] | str = "n/a"
        if any(s.vram for s in ss):
            vram = {}
            for s in ss:
                for g in s.vram or ():
                    v = vram.setdefault(f"gpu{g.index}", {"used_peak_bytes": 0, "total_bytes": g.total_bytes})
                    v["used_peak_bytes"] = max(v["used_peak_bytes"], g.used_bytes)
        frac = self.cpu_fraction
        return {
            "samples": len(ss), "interval_s": self.interval_s,
            "duration_s": (ss[-1].t - ss[0].t) if ss else 0.0,
            "ram_available_min_bytes": min((s.ram_available_bytes for s in ss), default=None),
            "ram_available_first_bytes": ss[0].ram_available_bytes if ss else None,
            "swap_used_max_bytes": max((s.swap_used_bytes for s in ss), default=None),
            "swap_used_first_bytes": ss[0].swap_used_bytes if ss else None,
            "engine_rss_peak_bytes": max(rss) if rss else None,
            "engine_procs_max": max((s.engine_procs for s in ss), default=0),
            "vram_source": self.vram_source, "vram": vram,
            "oom_kills": [asdict(k) for k in self.oom_kills], "container": dict(self.container),
            "kernel_log": self.kernel_log_source,
            "sampler_cpu_s": round(self.cpu_s, 6), "sampler_wall_s": round(self.wall_s, 3),
            "sampler_cpu_percent_of_core": None if frac is None else round(frac * 100, 4)}

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "samples": [s.to_dict() for s in self.samples()]}


def for_container(host: Any, cid: str, interval_s: float = 2.0, **kw: Any) -> ProbeSampler:
    """A sampler for one arm's container: its PID from ``host.state`` (None on a simulated
    host), its OOMKilled / exit 137 state at stop."""
    return ProbeSampler(lambda: host.state(cid).pid, interval_s,
                        state_provider=lambda: host.state(cid), **kw)


class StateProbes:
    """The probe session of a host with no machine under it (simulated, fake): samples nothing of
    the box this process runs on and scans no kernel log; reports the container's state (an OOM
    kill the simulation decided included) on the host's own clock, in ProbeSampler's shape."""

    def __init__(self, host: Any, cid: str, interval_s: float = 2.0, source: str = "simulated") -> None:
        self.host, self.cid, self.interval_s, self.source = host, cid, float(interval_s), source
        self.started_at = self.stopped_at = None
        self.container: dict[str, Any] = {}
        self.oom_kills: list[OomKill] = []

    def __enter__(self) -> StateProbes:
        self.started_at = self.host.now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped_at = self.host.now()
        try:
            st = self.host.state(self.cid)
            self.container = {"status": st.status, "exit_code": st.exit_code, "oom_killed": bool(st.oom_killed)}
            if st.oom_killed or st.exit_code == 137:
                self.oom_kills.append(OomKill(st.pid, "container", None, "container",
                                              "OOMKilled" if st.oom_killed else "exit 137"))
        except Exception as e:  # noqa: BLE001 - a container already gone says nothing
            self.container = {"error": f"{type(e).__name__}: {e}"}

    def to_dict(self) -> dict:
        dur = (self.stopped_at - self.started_at) if self.started_at is not None and self.stopped_at is not None else 0.0
        return {"summary": {
            "samples": 0, "interval_s": self.interval_s, "duration_s": dur,
            "ram_available_min_bytes": None, "ram_available_first_bytes": None, "swap_used_max_bytes": None,
            "swap_used_first_bytes": None, "engine_rss_peak_bytes": None, "engine_procs_max": 0,
            "vram_source": "n/a", "vram": "n/a", "oom_kills": [asdict(k) for k in self.oom_kills],
            "container": dict(self.container), "kernel_log": f"not scanned ({self.source} host)",
            "sampler_cpu_s": 0.0, "sampler_wall_s": 0.0, "sampler_cpu_percent_of_core": None}, "samples": []}


def fingerprint(nvml: Any = None) -> dict:
    """What makes two boxes the same hardware for a shared campaign (tuner/night/shared.py): the
    CPU model and core count, the RAM (GiB, rounded), and each GPU's name and the driver where
    NVML can say ("none" without a reader)."""
    import os

    import psutil

    cpu = "?"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = {"cpu": cpu, "cores": os.cpu_count() or 0, "ram_gib": round(psutil.virtual_memory().total / 2**30),
           "gpus": "none", "driver": "none"}
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        nvml.nvmlInit()
        names = [nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
        out["gpus"] = ", ".join(n.decode() if isinstance(n, bytes) else str(n) for n in names) or "none"
        drv = nvml.nvmlSystemGetDriverVersion()
        out["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
    except Exception:  # noqa: BLE001 - no reader: the GPU part reads "none"
        pass
    return out

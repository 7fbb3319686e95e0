"""The box's conditions during one measured run, and whether another process held the box.

A host's ``conditions(cid)`` (``arms.host.Host``) gives a ``RunConditions`` probe: ``start()``
just before a run's request, ``stop()`` just after its stream ends, returning a dict that the
run keeps (``RunResult.conditions``):

    source          "psutil" (a real box), "simulated", "fake"
    wall_s          the seconds between start and stop
    foreign_cores   CPU time that processes other than the engine's container and the tuner
                    itself used during the run, per wall second (1.0 = one core busy), or None
                    when it could not be read. The real host computes it as the box's busy CPU
                    time delta (psutil.cpu_times: all but idle, iowait and steal) minus the
                    container's cgroup CPU usage delta minus this process's own CPU time delta.
    container_cores the engine container's own CPU time per wall second (real host), and where
    container_cpu   it was read: "cgroup", "process tree" (no own cgroup readable) or "none"
    steal_cores     CPU time a hypervisor gave to other guests, per wall second (recorded, not
                    judged: a VM on a shared host always has some)
    load_avg        [1, 5, 15] minute load average at stop (None: unreadable)
    cpu_freq_mhz    the CPUs' mean current frequency at stop (None: unreadable)
    gpu             [{index, sm_clock_mhz, mem_clock_mhz, throttle: [reasons]}] at stop, where
                    NVML (nvidia-ml-py) reads; absent otherwise
    foreign_gpu     [[pid, name], ...]: processes outside the engine's container that held GPU
                    memory during the run (NVML); absent when NVML cannot tell

A run is **contended** (``contention``) when ``foreign_cores`` reaches the box's *background*
plus ``FOREIGN_CORES_LIMIT``, or a foreign process held the GPU. The background is what other
processes used while the box was at rest before the night's first boot (``Host.rest_load``,
journaled once per night and box, ``tuner.night.opening``): a load that was there all along is
part of the box, the same for the incumbent's boots as for the challenger's, and the blocked
comparisons see it on both sides; a tenant that comes and goes is not. Such a run is marked (``RunResult.contended``, the reason) and the
night's comparisons leave it out like a disturbed run (``tuner.night.compare``), counting it on
its own. Half a core: an idle box reads a few hundredths (kernel threads, the podman service's
log copy); a second process busy on one core reads about 1.0; an engine offloading experts to
the CPU shares its cores with whatever else runs there, so half a core of somebody else already
moves a decode rate. Pure: no psutil, no podman.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

FOREIGN_CORES_LIMIT = 0.5       # cores of somebody else's CPU time during a run: the run is contended
QUIET_WAIT_S = 600.0            # measure.quiet_wait_s's default: after a boot whose runs another process held,
                                # wait at most this long for a quiet box before the next boot


@runtime_checkable
class RunConditions(Protocol):
    def start(self) -> None: ...

    def stop(self) -> dict: ...


def contention(cond: dict | None, limit: float = FOREIGN_CORES_LIMIT, background: float = 0.0) -> str | None:
    """Why a run with these conditions was taken while another process held the box, or None:
    other processes' CPU time reached ``background`` (the box's own load at rest) plus ``limit``.
    Conditions that could not be read (None, no figure) never mark a run."""
    if not isinstance(cond, dict):
        return None
    why = []
    cores = cond.get("foreign_cores")
    bar = limit + max(0.0, background)
    if isinstance(cores, (int, float)) and not isinstance(cores, bool) and cores >= bar:
        why.append(f"foreign CPU load {cores:.2f} cores >= {bar:g}" +
                   (f" (the box's {background:.2f} at rest + {limit:g})" if background > 0 else ""))
    gpu = cond.get("foreign_gpu")
    if isinstance(gpu, list) and gpu:
        names = ", ".join(f"pid {p[0]} ({p[1]})" if isinstance(p, (list, tuple)) and len(p) >= 2 else str(p)
                          for p in gpu[:3])
        why.append(f"another process holds the GPU: {names}")
    return "; ".join(why) or None


def foreign_cores(busy_s: float, container_s: float, own_s: float, wall_s: float) -> float | None:
    """Somebody else's CPU time per wall second: the box's busy CPU seconds minus the engine
    container's and the tuner's own, never below 0 (the counters tick at different
    granularities: a few milliseconds either way); None over no wall time."""
    if wall_s <= 0:
        return None
    return max(0.0, busy_s - container_s - own_s) / wall_s


def rest_load(samples: list[float | None]) -> float | None:
    """The box's background from foreign-load readings taken at rest (no engine running): the
    smallest, so that a burst inside one window (a cron job, the tuner's own start) is not taken
    for the box's steady load; None when none could be read."""
    got = [x for x in samples if isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0]
    return round(min(got), 3) if got else None


class NoConditions:
    """The probe of a host that cannot say (``--url`` mode, a test): every figure unknown."""

    def start(self) -> None:
        pass

    def stop(self) -> dict:
        return {"source": "none", "foreign_cores": None}

"""`tuner run` and `tuner status`: the daemon around CampaignLoop — host choice, deadline,
signals, detaching, sd_notify, the live view, and reading a campaign folder back."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from dataclasses import replace

from arms.errors import ConfigError
from arms import values

log = logging.getLogger("tuner.daemon")


def sd_notify(msg: str) -> bool:
    """sd_notify(3) without libsystemd: READY=1, STATUS=..., WATCHDOG=1."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)          # a full notify queue drops a message; it never stalls the night
            s.connect(addr)
            s.send(msg.encode())
        return True
    except OSError:
        return False


def _detach(ns) -> int:
    from tuner.night.campaign import load_campaign

    from tuner.night.lock import CampaignLock

    camp = _boxed(load_campaign(ns.campaign), ns)
    with CampaignLock(camp.folder):        # refuse here, in the operator's terminal, not in daemon.log
        pass
    camp.folder.mkdir(parents=True, exist_ok=True)
    out = open(camp.folder / "daemon.log", "ab")
    argv = [sys.executable, "-m", "tuner.cli", "run", ns.campaign, "--quiet"]
    for flag in ("force_resume", "simulated"):
        if getattr(ns, flag):
            argv.append("--" + flag.replace("_", "-"))
    if ns.max_arms:
        argv += ["--max-arms", str(ns.max_arms)]
    if getattr(ns, "box", None):
        argv += ["--box", ns.box]
    if getattr(ns, "port", None):
        argv += ["--port", str(ns.port)]
    p = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    print(f"campaign {camp.name} running in the background as pid {p.pid}; log: {camp.folder / 'daemon.log'}; "
          f"`tuner status {ns.campaign}` reads its journal")
    return 0


def _boxed(camp, ns):
    """A shared campaign as this box runs it (``--box``, default: the host name); one box's
    campaign is itself (``--box`` refused: it names nothing)."""
    box = getattr(ns, "box", None)
    if not camp.shared:
        if box:
            raise ConfigError(f"--box {box}: {camp.path} has no storage: (a campaign of one box); add "
                              "storage: postgresql://... to share it between boxes")
        return camp
    import socket

    return camp.for_box(box or socket.gethostname().split(".")[0])


def _join(camp, ns, host):
    """This box's connection to a shared campaign, joined (refused in one line: an unreachable or
    wrong database, another campaign of this name, a live box of this name, other hardware)."""
    from tuner.night.shared import Fleet

    st = camp.storage
    fleet = Fleet(st.url, camp.name, camp.folder.name, grace_s=st.grace_s, heartbeat_s=st.heartbeat_s,
                  wait_s=st.wait_s)
    fleet.connect()
    if ns.simulated:
        fp = {"host": "simulated"}
    else:
        from host.probes import fingerprint

        fp = fingerprint()
    try:
        fleet.join(camp.identity(), fp, force=ns.force_resume, mixed=st.mixed_hardware)
    except BaseException:
        fleet.close()
        raise
    return fleet


def _host_and_shape(camp, simulated: bool):
    from arms.profiles import load_profile

    profile = load_profile(camp.engine, camp.profile_overrides or None)
    if simulated:
        from host.simhost import SimHost

        host = SimHost.for_campaign(camp)
    else:
        from host.podman_host import PodmanHost

        host = PodmanHost(camp.podman)
    info = host.resolve_image(camp.baseline.image)
    return host, profile, info


def run_campaign(ns) -> int:
    """`tuner run`: the campaign folder's one writer, for its whole life (``tuner.night.lock``)."""
    if ns.detach:
        return _detach(ns)
    from tuner.night.campaign import load_campaign
    from tuner.night.lock import CampaignLock

    from arms.secrets import SealFilter

    camp = _boxed(load_campaign(ns.campaign), ns)
    if ns.simulated and camp.sweep_plan is not None:
        raise ConfigError(f"{camp.path}: the concurrency sweep (measure.sweep / objective goodput_at_slo) needs "
                          "wall-clock concurrency: run it on podman, without --simulated")
    seal_logs = SealFilter(camp.sealer())
    for h in logging.getLogger().handlers:           # no secret of the campaign reaches a log line
        h.addFilter(seal_logs)
    with CampaignLock(camp.folder):
        return _run_locked(ns, camp)


def _run_locked(ns, camp) -> int:
    from tuner.night.campaign import check_paths
    from tuner.night.loop import CampaignLoop, deadline_from
    from tuner.night.readback import DAEMON_PID

    host, profile, info = _host_and_shape(camp, ns.simulated)
    baseline = replace(camp.baseline, image=info.ref)
    baseline.validate_image()
    if not ns.simulated:
        check_paths(baseline, camp)          # each missing mount or device at its line of the file
    camp = replace(camp, baseline=baseline)
    if not ns.simulated:
        holders = host.gpu_holders()
        if holders is None:
            log.warning("[gpu] no VRAM reader works here (pip install 'offload-tuner[gpu]' for nvidia-ml-py / "
                        "amdsmi): the 'GPU memory already taken' check is off")
        if holders:
            who = ", ".join(f"{name} (pid {pid}, {used / 2**30:.1f} GiB)" for pid, name, used in holders[:4])
            raise ConfigError(f"the GPU memory is already taken by {who}: stop it (or the production service) "
                              "before the campaign, or use production.guard: stop-and-restore")
    deadline = deadline_from(camp.search.budget, host.now(), host.wall())      # a simulated night: its own clock
    max_arms = ns.max_arms or camp.search.budget.max_arms
    from tuner.morning.liveview import NightView      # header + scrolling log on a tty; sd_notify STATUS/WATCHDOG always

    def on_arm(st, end):
        view.update(st)
        sd_notify("WATCHDOG=1")

    fleet = _join(camp, ns, host) if camp.shared else None
    # a new night's deadline; a resumed night keeps the one it journaled (loop.deadline)
    try:
        loop = CampaignLoop(camp, host, profile, deadline=deadline, max_arms=max_arms,
                            force_resume=ns.force_resume, on_arm=on_arm, simulated=bool(ns.simulated),
                            facts=None if ns.simulated else lambda: _night_facts(camp, profile), fleet=fleet)
    except BaseException:
        if fleet is not None:
            fleet.close()
        raise
    if getattr(ns, "port", None):
        if not 0 < ns.port < 65536:
            raise ConfigError(f"--port {ns.port}: give a TCP port in 1..65535")
        loop.runner.port = ns.port
    view = NightView(camp, deadline=loop.deadline, max_arms=max_arms, clock=host.now, notify=sd_notify,
                     live=not ns.quiet and sys.stderr.isatty(), simulated=bool(ns.simulated))
    (camp.folder / DAEMON_PID).write_text(str(os.getpid()))
    sd_notify("READY=1")
    try:
        with view:
            summary = loop.run()
    finally:
        try:
            (camp.folder / DAEMON_PID).unlink()
        except FileNotFoundError:
            pass
        if fleet is not None:
            fleet.leave()
            fleet.close()
    if summary.no_result is not None:        # the first line says so; a distinct exit code (tuner/cli.py)
        from tuner.night.ending import NO_RESULT_EXIT

        print(summary.no_result.text())
    reason = "stopped early, no result" if summary.no_result is not None else summary.reason
    print(f"campaign {camp.name}: {reason}; {summary.arms} arms; incumbent {summary.incumbent_key} "
          f"(objective {summary.incumbent_objective if summary.incumbent_objective is None else round(summary.incumbent_objective, 2)}); "
          f"{summary.moves} incumbent moves" + (f"\nverdict: {summary.verdict}" if summary.verdict else ""))
    return NO_RESULT_EXIT if summary.no_result is not None else 0


def arms_table(st, last: int | None = None):
    from rich.table import Table

    t = Table(title=f"incumbent {st.incumbent_key}  ·  {len(st.arms)} arms", expand=False)
    for col in ("arm", "kind", "change", "verdict", "objective", "Δ vs incumbent", "boot s"):
        t.add_column(col)
    arms = sorted(st.arms.values(), key=lambda a: a.n)
    for a in arms[-last:] if last else arms:
        e = a.end or {}
        obj = (e.get("score") or {}).get("objective")
        t.add_row(str(a.n), a.kind, values.change_text(a.change), e.get("verdict") or "running",
                  "" if obj is None else f"{obj:.2f}",
                  "" if e.get("delta") is None else f"{e['delta']:+.1%}",
                  "" if not e.get("boot") else f"{e['boot'].get('boot_s', 0):.0f}")
    return t


def _night_facts(camp, profile) -> dict:
    """What this host measures once at the start of a new night, journaled in campaign_start for
    the morning to read (a reader never probes): a llama.cpp night's host memory bandwidth, the
    roofline's denominator, unless the campaign gives it (measure.membw_gbs)."""
    if profile.family != "llamacpp" or camp.membw_gbs:
        return {}
    from host.membw import membw_probe_gbs

    return {"membw": {"gbs": round(membw_probe_gbs(), 3), "source": "host.membw probe at the start of the night"}}

"""The promotion's host on the production box: systemctl, the wall clock, plain HTTP.

``SystemdHost.unreachable()`` says up front whether systemd can be asked at all (no systemctl,
or a machine where systemd is not the init: a container, a CI runner), so `tuner promote`
refuses before it writes anything instead of failing at daemon-reload. ``WriteOnlyHost`` is
`tuner promote --write-only`: the files are written and backed up, the unit is left alone.
"""
from __future__ import annotations

import re
import shutil
import subprocess

from arms.errors import HostError
from arms.host import UNIT_ACTIONS, RealTime


class Systemctl:
    """Unit control through `systemctl` (``--user`` for a rootless setup), and the podman version
    units are written for: the real hosts' mixin."""

    systemctl_user: bool = False

    def podman_version(self) -> str | None:
        """`podman --version` on this machine (PodmanHost asks its API service instead)."""
        try:
            out = subprocess.run(["podman", "--version"], capture_output=True, text=True, timeout=30,
                                 check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", out)
        return m.group(1) if m else None

    def unit(self, name: str, action: str) -> str:
        if action not in UNIT_ACTIONS:
            raise ValueError(f"unknown unit action {action!r}")
        base = ["systemctl"] + (["--user"] if self.systemctl_user else [])
        argv = {"is-active": base + ["is-active", name], "mask-runtime": base + ["mask", "--runtime", name],
                "unmask-runtime": base + ["unmask", "--runtime", name], "daemon-reload": base + ["daemon-reload"]
                }.get(action, base + [action, name])
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HostError(f"`{' '.join(argv)}` failed: {e}") from None
        if action == "is-active":
            return (r.stdout.strip() or "unknown").splitlines()[0]
        if r.returncode != 0:
            raise HostError(f"`{' '.join(argv)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()[:300]}")
        return "ok"


class SystemdHost(RealTime, Systemctl):
    """systemctl (``--user`` for a rootless service), wall clock, plain HTTP."""

    write_only = False

    def __init__(self, user: bool = False):
        self.systemctl_user = user

    def unreachable(self) -> str | None:
        """None when systemctl answers for this scope; otherwise why not, in words."""
        if shutil.which("systemctl") is None:
            return "there is no systemctl on this machine"
        argv = ["systemctl"] + (["--user"] if self.systemctl_user else []) + ["show", "--property=Version"]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"`{' '.join(argv)}` failed: {e}"
        if r.returncode != 0 or "Version=" not in r.stdout:
            why = (r.stderr or r.stdout).strip().splitlines()
            return f"systemd does not answer `{' '.join(argv)}` ({why[0] if why else f'exit {r.returncode}'})"
        return None


class WriteOnlyHost(SystemdHost):
    """Write the unit files only: no daemon-reload, no restart, no health wait."""

    write_only = True

    def unreachable(self) -> str | None:
        return None

    def unit(self, name: str, action: str) -> str:
        return "unknown" if action == "is-active" else "skipped (--write-only)"

"""`tuner promote` and `tuner rollback`: put a campaign's winner into the production service,
and take it back out — every restart of that service is an outage, so each step is checked.

promote:  refuse a simulated night (``--allow-simulated``: promote it anyway, with a warning) ->
          choose the arm (the final incumbent, or ``--arm N``: it must be ``better`` and
          confirmed by a second boot unless ``--force``) -> render the production file in the
          campaign's form (tuner.production.units) -> show the diff, secrets redacted (``--dry-run`` stops
          here) -> back the current file up beside it -> write the new one -> daemon-reload ->
          restart -> wait for health within the arm's measured boot time + margin -> a smoke
          measurement at one depth -> keep it, or roll back when the unit failed, health timed
          out or the smoke decode fell below the arm's noise band (max(3 x MAD, min_effect)).
rollback: restore the backup, daemon-reload, restart (or stop, when the unit was stopped before
          the promotion), wait healthy. ``tuner rollback`` undoes the latest promotion still in
          effect; run again, it undoes the one before.

Every step is journaled (op ``promotion``: started, promoted, rolled-back), so a crash between
writing the file and the verdict still leaves the backup's path in the campaign journal.
Unit control, HTTP and the clock all go through the Host protocol; the files are local.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from arms.argv import REDACTED, is_secret
from arms.errors import ConfigError, HostError
from host.systemd import SystemdHost, WriteOnlyHost

from tuner.night.guard import Production
from tuner.night.lock import CampaignLock
from tuner.night.readback import daemon_pid
from tuner.production.context import (
    Context,
    Smoke,
    Target,
    choose,
    endpoint,
    load_context,
    measured_smoke,
    parse_file,
    render,
    same_shape,
    show_diff,
    smoke_reference,
    target_of,
    wait_healthy,
)

log = logging.getLogger("tuner.promote")

BACKUP_TAG = ".tuner-backup-"
UP = ("active", "activating", "reloading")


__all__ = ["promote", "rollback", "Result", "SystemdHost", "WriteOnlyHost"]


@dataclass
class Result:
    outcome: str                  # dry-run | unchanged | promoted | written | rolled-back | restored
    arm: int | None = None
    target: str = ""
    diff: str = ""
    reason: str = ""
    healthy: bool | None = None


# -- file I/O ----------------------------------------------------------------------------------
def _sha(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()[:16]


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tuner-tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _promotions(ctx: Context) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in ctx.journal.records:
        if r["op"] == "promotion":
            out.setdefault(r["id"], []).append(r)
    return out


def _preflight(ctx: Context, target: Target, force: bool) -> None:
    pid = daemon_pid(ctx.folder)
    if pid is not None:
        raise ConfigError(f"campaign {ctx.name} is still running (daemon pid {pid}); promote after it ends")
    held = [g for g in ctx.state.guard if g.get("unit") == target.unit]
    if held and held[-1].get("action") in ("stopped", "masked", "adopted"):
        raise ConfigError(f"the campaign's guard still holds {target.unit} stopped and masked; let `tuner run` "
                          "end (it restores the unit) before promoting")
    for pid_, recs in _promotions(ctx).items():
        if recs[-1]["action"] == "started" and not force:
            raise ConfigError(f"promotion #{pid_} (arm {recs[0]['arm']}) was interrupted before its verdict; "
                              "`tuner rollback` restores the file it replaced (or pass --force)")


# -- promote -----------------------------------------------------------------------------------
def promote(folder, arm: int | None = None, *, dry_run: bool = False, force: bool = False, host=None,
            margin_s: float | None = None, poll_s: float = 2.0, smoke: Smoke | None = None,
            out: Callable[[str], None] = print, write_only: bool = False, allow_simulated: bool = False) -> Result:
    """Promote (see the module). A dry run only reads; otherwise the campaign folder's writer lock
    (``tuner.night.lock``) is held from the first read to the last journal line, so a `tuner run` of
    the same campaign refuses meanwhile, and a promote refuses while one runs."""
    if dry_run:
        ctx = refuse_simulated(load_context(folder, writer=False), allow_simulated, out)
        return _promote_locked(ctx, arm, True, force, host, margin_s, poll_s, smoke, out, write_only)
    with CampaignLock(Path(folder), command="tuner promote"):
        ctx = refuse_simulated(load_context(folder), allow_simulated, out)
        return _promote_locked(ctx, arm, False, force, host, margin_s, poll_s, smoke, out, write_only)


def refuse_simulated(ctx: Context, allow: bool, out: Callable[[str], None]) -> Context:
    """A night journaled as simulated (``tuner run --simulated``) measured the simulated engine,
    not this machine: refused in one line, unless ``allow`` (then a warning, and it goes on)."""
    if not ctx.simulated:
        return ctx
    what = (f"campaign {ctx.name} was a simulated night (`tuner run --simulated`): its measurements come from "
            "the simulated engine, not from this machine's engine")
    if not allow:
        raise ConfigError(f"{ctx.folder}: {what}; nothing was written. Run the campaign without --simulated, "
                          "or pass --allow-simulated to promote it anyway")
    log.warning("[promote] %s; promoting it anyway (--allow-simulated)", what)
    out(f"warning: {what}; promoting it anyway (--allow-simulated)")
    return ctx


def _promote_locked(ctx, arm, dry_run, force, host, margin_s, poll_s, smoke, out, write_only) -> Result:
    if not dry_run:
        _still_running(ctx)            # before choosing: a night with no winner *yet* is not "no winner"
    choice = choose(ctx.state, arm, force)
    target = target_of(ctx)
    host = host or _host(ctx, target.path, write_only, dry_run)
    existing = _read(target.path)
    new = render(ctx, target, choice, host, existing)
    changes = [c.describe() for c in ctx.baseline.diff(choice.shape)]
    diff = show_diff(existing, new, target.path, f"arm {choice.n}")
    out(f"promote {choice.why}\n  shape {choice.shape.key()} vs the campaign baseline: "
        f"{'; '.join(changes) or 'no change'}\n  target {target.form} {target.path} (unit {target.unit})")
    if not dry_run:
        _preflight(ctx, target, force)
    if existing is not None and same_shape(existing, new):
        out(f"{target.path} already holds this shape: nothing written, {target.unit} not restarted")
        return Result("unchanged", choice.n, str(target.path))
    out(diff or "(no textual difference)")
    if dry_run:
        return Result("dry-run", choice.n, str(target.path), diff)
    return _promote(ctx, host, target, choice, existing, new, changes, diff, margin_s, poll_s,
                    smoke or measured_smoke(host, ctx.plan, ctx.profile), out)


def _host(ctx: Context, path: Path, write_only: bool, dry_run: bool = False):
    """The real host, after checking up front that systemd answers (or --write-only)."""
    user = _user_scope(ctx.production, path)
    if write_only:
        return WriteOnlyHost(user=user)
    host = SystemdHost(user=user)
    why = None if dry_run else host.unreachable()
    if why:
        raise ConfigError(f"cannot reach systemd to restart {ctx.production.unit}: {why}; nothing was written. "
                          "Run it on the machine that serves the model, or pass --write-only to write the unit "
                          "file only (then daemon-reload and restart it yourself)")
    return host


def _still_running(ctx: Context) -> None:
    pid = daemon_pid(ctx.folder)
    if pid is not None:
        raise ConfigError(f"campaign {ctx.name} is still running (daemon pid {pid}, {len(ctx.state.arms)} arms "
                          "so far); promote after it ends — `tuner status` shows where it is")


def _user_scope(prod: Production, path: Path) -> bool:
    if prod.scope:
        return prod.scope == "user"
    home = Path.home()
    return os.geteuid() != 0 and str(path).startswith(str(home))


def _promote(ctx, host, target, choice, existing, new, changes, diff, margin_s, poll_s, smoke, out) -> Result:
    j, unit = ctx.journal, target.unit
    folder = target.path.parent if target.path.parent.exists() else target.path.parent.parent
    if not os.access(folder, os.W_OK) or (existing is not None and not os.access(target.path, os.W_OK)):
        raise ConfigError(f"cannot write {target.path}: run `tuner promote` as the user that owns it "
                          "(root for /etc/...); nothing was changed")
    pid = max(_promotions(ctx), default=0) + 1
    state_before = host.unit(unit, "is-active")
    backup = None
    if existing is not None:
        backup = target.path.with_name(f"{target.path.name}{BACKUP_TAG}{pid:03d}-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copy2(target.path, backup)
    secret = any(is_secret(k) or v == REDACTED for k, v in choice.shape.env)     # sealed by name or by look
    mode = target.path.stat().st_mode & 0o777 if existing is not None else (0o600 if secret else 0o644)
    started = j.append("promotion", id=pid, action="started", arm=choice.n, form=target.form, unit=unit,
                       target=str(target.path), backup=str(backup) if backup else None, existed=existing is not None,
                       state_before=state_before, sha_before=_sha(existing), sha_new=_sha(new), changes=changes,
                       shape=choice.shape.to_dict(), why=choice.why)
    log.info("[promote #%d] arm %d -> %s (backup %s)", pid, choice.n, target.path, backup or "none: new file")
    _write(target.path, new, mode)
    if host.write_only:
        j.append("promotion", id=pid, action="promoted", arm=choice.n, healthy_s=None, smoke=None, write_only=True)
        out(f"wrote {target.path} (promotion #{pid}, arm {choice.n}); --write-only: {unit} was not reloaded or "
            f"restarted — `systemctl{' --user' if host.systemctl_user else ''} daemon-reload && "
            f"systemctl{' --user' if host.systemctl_user else ''} restart {unit}` applies it")
        return Result("written", choice.n, str(target.path), diff)
    boot_s = (choice.end.get("boot") or {}).get("boot_s") or 0.0
    margin = margin_s if margin_s is not None else max(60.0, 0.5 * boot_s)
    url, probe = endpoint(ctx.production, ctx.profile, choice.shape.port)
    reason, healthy_s, smoke_rec = None, None, None
    try:
        host.unit(unit, "daemon-reload")
        host.unit(unit, "restart")
        ok, healthy_s, why = wait_healthy(host, unit, url, probe, boot_s + margin, poll_s)
        if not ok:
            reason = why
    except HostError as e:
        reason = f"unit failed: {e}"
    if reason is None:
        ref = smoke_reference(ctx, choice)
        if ref is None:
            out("no measured decode to compare a smoke run with: smoke check skipped")
        else:
            depth, med, band = ref
            got, detail = smoke(url, depth)
            smoke_rec = {"depth": depth, "decode_tok_s": got, "arm_decode_tok_s": med, "band": band, **detail}
            if got is None:
                reason = f"smoke measurement at depth {depth} failed: {detail.get('reason')}"
            elif got < med - band:
                reason = (f"slow smoke: {got:.2f} tok/s at depth {depth}, below the arm's {med:.2f} "
                          f"- {band:.2f} (noise band)")
            elif got > med + band:
                out(f"smoke decode {got:.2f} tok/s is above the arm's {med:.2f} + {band:.2f}: kept, but check it")
    if reason is None:
        j.append("promotion", id=pid, action="promoted", arm=choice.n, healthy_s=round(healthy_s or 0, 3),
                 smoke=smoke_rec)
        out(f"promoted arm {choice.n} to {unit}: healthy in {healthy_s:.1f} s"
            + (f", smoke {smoke_rec['decode_tok_s']:.2f} tok/s at depth {smoke_rec['depth']}" if smoke_rec else ""))
        return Result("promoted", choice.n, str(target.path), diff, healthy=True)
    out(f"promotion of arm {choice.n} failed: {reason}; rolling back")
    res = _restore(ctx, host, started, reason, poll_s, smoke_rec)
    return Result("rolled-back", choice.n, str(target.path), diff, reason, res["healthy"])


# -- rollback ----------------------------------------------------------------------------------
def _restore(ctx: Context, host, started: dict, reason: str, poll_s: float, smoke_rec: dict | None = None) -> dict:
    unit, target = started["unit"], Path(started["target"])
    previous = None
    if started["existed"]:
        previous = Path(started["backup"]).read_text()
        _write(target, previous, Path(started["backup"]).stat().st_mode & 0o777)
    else:
        target.unlink(missing_ok=True)
    healthy, seconds, why = False, 0.0, ""
    if host.write_only:
        healthy, why = True, ("restored the file it replaced" if started["existed"] else
                              f"removed the file it wrote (there was no {target.name} before)") + \
            f"; --write-only: {unit} was not reloaded or restarted"
        return ctx.journal.append("promotion", id=started["id"], action="rolled-back", arm=started["arm"],
                                  reason=reason, healthy=healthy, healthy_s=0.0, detail=why, smoke=smoke_rec)
    try:
        host.unit(unit, "daemon-reload")
        if started["state_before"] in UP and previous is not None:
            host.unit(unit, "restart")
            url, probe = endpoint(ctx.production, ctx.profile, _port_of(ctx, started["form"], previous))
            healthy, seconds, why = wait_healthy(host, unit, url, probe, ctx.production.restore_timeout_s, poll_s)
        elif previous is None:
            host.unit(unit, "stop")
            healthy, why = True, (f"removed the new {target.name}: there was no such file before the promotion, "
                                  f"so nothing was restored; {unit} stopped")
        else:
            host.unit(unit, "stop")
            healthy, why = True, f"left stopped, as it was ({started['state_before']}) before the promotion"
    except HostError as e:
        why = str(e)
    rec = ctx.journal.append("promotion", id=started["id"], action="rolled-back", arm=started["arm"], reason=reason,
                             healthy=healthy, healthy_s=round(seconds, 3), detail=why, smoke=smoke_rec)
    if healthy:
        log.info("[rollback #%d] %s: %s", started["id"], target, why)
    elif previous is None:
        log.error("[rollback #%d] removed the new %s (there was none before); %s: %s", started["id"], target,
                  unit, why)
    else:
        log.error("[rollback #%d] %s restored but %s is NOT healthy: %s — check `journalctl -u %s`",
                  started["id"], target, unit, why, unit)
    return rec


def _port_of(ctx: Context, form: str, text: str) -> int:
    if form != "env-file":
        with contextlib.suppress(ConfigError, ValueError):
            return parse_file(form, text, ctx.profile.family).shape.port
    return ctx.baseline.port


def rollback(folder, *, force: bool = False, host=None, poll_s: float = 2.0,
             out: Callable[[str], None] = print, write_only: bool = False) -> Result:
    """Undo the latest promotion still in effect: restore its backup, reload, restart, wait
    (under the campaign folder's writer lock, as ``promote``)."""
    with CampaignLock(Path(folder), command="tuner rollback"):
        return _rollback(load_context(folder), force, host, poll_s, out, write_only)


def _rollback(ctx, force, host, poll_s, out, write_only) -> Result:
    live = [recs for recs in _promotions(ctx).values() if recs[-1]["action"] in ("started", "promoted")]
    if not live:
        raise ConfigError(f"nothing to roll back: no promotion of campaign {ctx.name} is in effect")
    started = live[-1][0]
    target = Path(started["target"])
    host = host or _host(ctx, target, write_only or bool(live[-1][-1].get("write_only")))
    current = _read(target)
    if _sha(current) != started["sha_new"] and not force:
        raise ConfigError(f"{target} changed since promotion #{started['id']} wrote it (someone edited it); "
                          "--force restores the backup over it anyway")
    if started["existed"] and not Path(started["backup"]).exists():
        raise ConfigError(f"the backup {started['backup']} of promotion #{started['id']} is gone; restore by hand")
    previous = Path(started["backup"]).read_text() if started["existed"] else None
    diff = show_diff(current, previous or "", target, f"before promotion #{started['id']}")
    out(f"rollback of promotion #{started['id']} (arm {started['arm']}): {target}\n{diff}")
    _preflight(ctx, target_of(ctx), force=True)
    rec = _restore(ctx, host, started, "on demand (tuner rollback)", poll_s)
    if host.write_only:
        out(f"rolled back promotion #{started['id']}: {rec['detail']}")
    else:
        out(f"{started['unit']} {'healthy' if rec['healthy'] else 'NOT healthy'}: {rec['detail']}")
    return Result("restored", started["arm"], str(target), diff, rec["detail"], rec["healthy"])

"""What can be known about a night before any boot, from the campaign file and this host alone.

``tuner check`` and ``tuner run`` refuse, each with ``FILE:LINE: KEY: ...`` at the key's own line:

- an objective that reads a depth the night does not measure (``decode@4064`` with depths
  ``[166, 1087]``: every arm would be "objective n/a"); depths or sweep levels given twice;
- ``levers: {}`` (a night with nothing to try), a lever on what the tuner owns (the port, the
  address it reaches the engine at, the model), a one-value lever equal to the baseline and two
  values that run one engine (``lever_problem``, after the profile's spellings are applied);
- an image digest that is not ``@sha256:`` and 64 hex digits; env names that are no names
  (``A=B``, ``MY VAR``, ``""``); a mount that is not ``SOURCE:TARGET[:ro]``; a container option
  the tuner does not pass on; a baseline flag the engine profile does not list;
- a journal folder no file can be written to (``folder_problem``): under /proc
  or /sys, under a regular file, on a read-only file system, not writable by this user, a name
  too long or holding a NUL byte.

Mount sources, devices, a compile cache this user can write and a model file that must exist on
the box are ``host_path_errors``: checked by ``tuner check`` and before a night's first boot
(``campaign.check_paths``), not when ``tuner status`` or ``report`` reads a folder back.
"""
from __future__ import annotations

import difflib
import os
import re
import stat
from pathlib import Path
from typing import Any

from arms.errors import ConfigError

# flags the tuner sets itself on every arm: a lever or a baseline arg on them breaks the arm
OWNED_LEVERS = {
    "port": "the tuner gives every arm its port (baseline.port) and measures it there",
    "host": "the tuner reaches the engine on this host's address; a lever on it makes arms unreachable",
    "uds": "the tuner reaches the engine over TCP; a unix socket makes every arm unreachable",
    "model": "the model is baseline.model, the one thing every arm shares",
    "m": "the model is baseline.model, the one thing every arm shares",
}
OWNED_ARGS = {"port": "set baseline.port instead", "model": "set baseline.model instead",
              "m": "set baseline.model instead"}
# what arms/lifecycle.py passes on to podman from baseline.options
KNOWN_OPTIONS = ("group_add", "ipc", "network", "shm_size", "ulimits")
PSEUDO_FS = ("/proc", "/sys", "/dev")
REAL_UNDER_DEV = ("/dev/shm",)               # a tmpfs: files can live there
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
NAME_MAX = 255


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why no file can be written in ``folder`` (which may not exist yet), or None."""
    text = os.fspath(folder)
    if "\0" in text:
        return "holds a NUL byte"
    long = [p for p in Path(text).parts if len(os.fsencode(p)) > NAME_MAX]
    if long:
        return f"has a name of {len(os.fsencode(long[0]))} bytes; a file name holds at most {NAME_MAX}"
    probe = Path(text)
    while True:
        try:
            st = os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            if probe == probe.parent:
                return "has no existing folder above it"
            probe = probe.parent
        except PermissionError:
            return f"{probe} cannot be looked into by this user"
        except OSError as e:
            return f"{probe}: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode):
        return (f"{probe} is a file, not a folder" if str(probe) == text.rstrip("/")
                else f"lies under {probe}, which is a file, not a folder")
    real = os.path.realpath(probe)
    if any(real == d or real.startswith(d + "/") for d in PSEUDO_FS) \
            and not any(real == d or real.startswith(d + "/") for d in REAL_UNDER_DEV):
        return f"{real} cannot hold files (a kernel file system)"
    try:
        if os.statvfs(probe).f_flag & os.ST_RDONLY:
            return f"{probe} is on a read-only file system"
    except OSError:
        pass
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user ({_user()})"
    return None


def file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be written as a file (created or replaced), or None."""
    text = os.fspath(path)
    if "\0" in text:
        return "holds a NUL byte"
    p = Path(text)
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        return folder_problem(p.parent)
    except OSError as e:
        return f"{p}: {e.strerror or e}"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder; give a file name"
    why = folder_problem(p.parent)
    if why is None and not os.access(p, os.W_OK):
        return f"{p} is not writable by this user ({_user()})"
    return why


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def resolve(base: Path, p: str) -> Path:
    q = Path(os.path.expanduser(p))
    return q if q.is_absolute() else base / q


# -- the static checks, on the raw mapping; ``rep`` is schema.Report ---------------------------
def check(raw: dict, rep, profile_flags: frozenset) -> None:
    _objective_depths(raw, rep)
    _distinct(raw, rep)
    _levers(raw, rep)
    base = raw.get("baseline")
    if isinstance(base, dict):
        _image(base, rep)
        _env(base, rep)
        _args(raw, base, rep, profile_flags)
        _mounts(base, rep)
        _options(base, rep)
    _journal(raw, rep)


def _depths(raw: dict) -> list | None:
    m = raw.get("measure")
    depths = (m or {}).get("depths", [166, 1087, 4064]) if isinstance(m, dict) or m is None else None
    return depths if isinstance(depths, list) else None


def _objective_depths(raw: dict, rep) -> None:
    obj, depths = raw.get("objective"), _depths(raw)
    if not (isinstance(obj, str) and obj.startswith("decode@")) or depths is None:
        return
    try:
        depth = int(obj.split("@", 1)[1])
    except ValueError:
        return                               # Objective.parse says so
    if depth not in depths:
        shown = ", ".join(str(d) for d in depths)
        rep.error(("objective",), f"decode@{depth} reads depth {depth}, which the night does not measure "
                  f"(measure.depths: [{shown}]), so every arm would be 'objective n/a'; add {depth} to "
                  f"measure.depths or choose " + ", ".join(f"decode@{d}" for d in depths[:4]) + " or decode_geomean")


def _distinct(raw: dict, rep) -> None:
    m = raw.get("measure") if isinstance(raw.get("measure"), dict) else {}
    sweep = m.get("sweep") if isinstance(m.get("sweep"), dict) else {}
    for loc, items in ((("measure", "depths"), m.get("depths")), (("measure", "sweep", "levels"), sweep.get("levels"))):
        if not isinstance(items, list):
            continue
        seen: dict = {}
        for i, v in enumerate(items):
            if isinstance(v, int) and not isinstance(v, bool) and v in seen:
                rep.error((*loc, i), f"{v} is given twice (item {seen[v] + 1} and {i + 1}); each is measured "
                          "once per arm, so keep one")
            seen.setdefault(v, i)


def _levers(raw: dict, rep) -> None:
    from arms.shape import lever_name

    if "levers" in raw and raw["levers"] == {}:
        rep.error(("levers",), "no levers: a night with nothing to try; give at least one, "
                  "e.g. levers: {max-num-seqs: [4, 8]}")
    levers = raw.get("levers")
    if not isinstance(levers, dict):
        return
    for name in levers:
        try:
            flag = lever_name(name)
        except ConfigError:
            continue                          # Lever.from_spec says so
        if flag in OWNED_LEVERS:
            rep.error(("levers", name), f"the tuner owns '{flag}': {OWNED_LEVERS[flag]}; remove this lever")


def _image(base: dict, rep) -> None:
    image = base.get("image")
    if not isinstance(image, str) or not image:
        return
    if any(c.isspace() for c in image):
        rep.error(("baseline", "image"), f"{image!r} holds a space; an image reference is NAME[:TAG][@sha256:DIGEST]")
    elif "@" in image:
        digest = image.split("@", 1)[1]
        if not _DIGEST.match(digest):
            hexpart = digest.split(":", 1)[-1]
            rep.error(("baseline", "image"), f"digest {digest!r} is not sha256: and 64 hex digits (got "
                      f"{len(hexpart)} characters); copy it from `podman image inspect`, or give the tag "
                      "and let `tuner check` pin it")


def _env(base: dict, rep) -> None:
    env = base.get("env")
    if not isinstance(env, dict):
        return
    for name in env:
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            fix = name.split("=", 1) if isinstance(name, str) and "=" in name else None
            rep.error(("baseline", "env", str(name)), f"{str(name)!r} is not an env var name (letters, digits "
                      "and _, not starting with a digit)"
                      + (f"; write {fix[0]}: {fix[1]!r}" if fix and fix[0] else ""))


def _args(raw: dict, base: dict, rep, profile_flags: frozenset) -> None:
    from arms.shape import lever_name

    args = base.get("args")
    if not isinstance(args, dict):
        return
    for name in args:
        try:
            flag = lever_name(name)
        except ConfigError as e:
            rep.error(("baseline", "args", str(name)), str(e))
            continue
        if flag.startswith("env."):
            rep.error(("baseline", "args", str(name)), "an env var goes in baseline.env, not args")
        elif flag in OWNED_ARGS:
            rep.error(("baseline", "args", str(name)), f"the tuner passes --{flag} itself; {OWNED_ARGS[flag]}")
        elif profile_flags and raw.get("engine_newer") is not True and flag not in profile_flags \
                and not (flag.startswith("no-") and flag[3:] in profile_flags):
            near = difflib.get_close_matches(flag, sorted(profile_flags), n=1, cutoff=0.6)
            rep.error(("baseline", "args", str(name)), f"'{flag}' is not a flag of engine profile "
                      f"'{raw.get('engine', 'vllm-expert-offload')}', so every arm would fail bad-argument"
                      + (f"; did you mean '{near[0]}'?" if near else "")
                      + " (a newer engine build: set engine_newer: true)")


def _mounts(base: dict, rep) -> None:
    from arms.shape import COMPILE_CACHE_TARGET, Mount

    targets: dict[str, int] = {}
    for i, m in enumerate(base.get("mounts") or [] if isinstance(base.get("mounts"), list) else []):
        try:
            mount = Mount.parse(m)
        except ConfigError as e:
            rep.error(("baseline", "mounts", i), str(e))
            continue
        if mount.target in targets:
            rep.error(("baseline", "mounts", i), f"target {mount.target} is mounted twice (also item "
                      f"{targets[mount.target] + 1}); mount each target once")
        targets.setdefault(mount.target, i)
    cc = base.get("compile_cache")
    if not cc:
        return
    try:
        mount = Mount.parse(cc, default_target=COMPILE_CACHE_TARGET)
    except ConfigError as e:
        rep.error(("baseline", "compile_cache"), str(e))
        return
    if mount.target in targets:             # whether it can be written is host_path_errors' (not a reader's)
        rep.error(("baseline", "compile_cache"), f"target {mount.target} is also a mount (item "
                  f"{targets[mount.target] + 1}); mount each target once")


def _options(base: dict, rep) -> None:
    opts = base.get("options")
    if not isinstance(opts, dict):
        return
    for name in opts:
        norm = str(name).strip().lstrip("-").replace("-", "_")
        if norm not in KNOWN_OPTIONS:
            near = difflib.get_close_matches(norm, KNOWN_OPTIONS, n=1, cutoff=0.6)
            rep.error(("baseline", "options", str(name)), "not a container option the tuner passes on"
                      + (f"; did you mean '{near[0]}'?" if near else "") + f" (known: {', '.join(KNOWN_OPTIONS)})")


def _journal(raw: dict, rep) -> None:
    j = raw.get("journal", "journal")
    if not isinstance(j, str):
        return
    why = folder_problem(resolve(rep.path.parent, j))
    if why:
        rep.error(("journal",), f"{j!r}: {why}; give a folder this user can write, e.g. journal: ./journal")


# -- after the profile's spellings: one lever against the baseline ---------------------------
def lever_problem(baseline, lever, style: str) -> str | None:
    """Why a lever cannot be a night's lever: two of its values run one engine, or its only value
    is the baseline's (nothing to try); None when it is fine."""
    from arms.argv import render_argv
    from arms import values

    def engine(shape) -> tuple:
        return tuple(render_argv(shape, style)), shape.env

    try:
        base = engine(baseline)
        runs = [(v, engine(baseline.with_change(lever.name, v))) for v in lever.values]
    except ConfigError:
        return None
    seen: dict[tuple, Any] = {}
    for v, run in runs:
        if run in seen:
            return (f"values {values.text(seen[run])} and {values.text(v)} run the engine the same way "
                    f"({' '.join(run[0][1:]) or 'no flags'}): one engine twice; keep one")
        seen[run] = v
    if all(run == base for _, run in runs):
        return (f"its only value {values.text(lever.values[0])} is the baseline's, so the night has nothing "
                "to try on it; add another value or remove the lever")
    return None


def host_path_errors(path: Path, raw: dict, shape, family: str, lines) -> list[str]:
    """Mount sources, devices, (llama.cpp) the model file that must exist on this host and (vLLM) a
    mounted model folder that must hold config.json, each as ``FILE:LINE: KEY: ...`` at the item
    that names it."""
    from arms.shape import COMPILE_CACHE_TARGET, Mount
    from tuner.night.campaign_file import key_text

    base = raw.get("baseline") if isinstance(raw.get("baseline"), dict) else {}
    where: dict[str, tuple] = {}
    for i, m in enumerate(base.get("mounts") or []):
        try:
            where[Mount.parse(m).target] = ("baseline", "mounts", i)
        except ConfigError:
            pass
    if base.get("compile_cache"):
        where[COMPILE_CACHE_TARGET] = ("baseline", "compile_cache")
    devices = base.get("devices") or []
    devices = [devices] if isinstance(devices, str) else list(devices)
    out: list[tuple[int, str]] = []

    def err(loc: tuple, why: str) -> None:
        line, _ = lines.line(loc)
        out.append((line, f"{path}:{line}: {key_text(loc)}: {why}"))

    for m in shape.mounts:
        loc = where.get(m.target, ("baseline", "mounts"))
        if m.target == COMPILE_CACHE_TARGET and not m.read_only:
            why = folder_problem(m.source)
            if why:
                err(loc, f"{m.source!r} {why}; the compile cache is a folder the tuner creates and every arm "
                         "writes: give one this user can write")
        elif not os.path.exists(m.source):
            if m.source == shape.model and m.target == shape.model:
                continue                     # the model's own mount: said below, at baseline.model
            err(loc, f"mount source {m.source} (-> {m.target}) does not exist on this host; create it or "
                     "fix the path (relative paths are relative to the campaign file)")
    for d in shape.devices:
        if d.startswith("/") and not os.path.exists(d):
            i = devices.index(d) if d in devices else None
            err(("baseline", "devices") if i is None or isinstance(base.get("devices"), str)
                else ("baseline", "devices", i),
                f"device {d} does not exist on this host (CDI names like nvidia.com/gpu=all are passed as-is)")
    model = shape.model
    if family == "llamacpp" and model.startswith("/") and not os.path.exists(model) and \
            _mount_for(model, shape.mounts) is None:
        err(("baseline", "model"), f"model {model} does not exist on this host and no mount provides it; "
                                   "give the GGUF's host path (it is mounted read-only at the same path)")
    if family == "vllm" and model.startswith("/"):
        m = _mount_for(model, shape.mounts)
        host = m.source.rstrip("/") + model[len(m.target.rstrip("/")):] if m is not None and m.kind == "bind" else None
        if host is not None and os.path.isdir(host) and not any(
                os.path.exists(os.path.join(host, f)) for f in ("config.json", "params.json")):   # params: Mistral format
            err(("baseline", "model"), f"model {model} is a folder without config.json ({host} on this host): "
                                       "not a Hugging Face model folder (nor a Mistral one: params.json); give the folder "
                                       "that holds config.json, "
                                       "the tokenizer and the weights")
    return [text for _, text in sorted(out, key=lambda e: e[0])]


def _mount_for(path: str, mounts):
    """The mount that provides container ``path`` (the deepest whose target holds it), or None."""
    for m in sorted(mounts, key=lambda m: -len(m.target)):
        t = m.target.rstrip("/")
        if path == t or path.startswith(t + "/"):
            return m
    return None

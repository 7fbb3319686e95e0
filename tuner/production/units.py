"""A Shape as a production service file, and back. Pure: text in, text out.

Three forms (the campaign's ``production.promote_as``):

``quadlet``   a Quadlet ``NAME.container`` (podman >= 4.4): ``Image=`` by digest, ``Exec=`` the
              engine args, one ``Environment=`` per var, ``Volume=`` per mount, ``AddDevice=``
              per device (never the ``-`` prefix, which would make a CDI name "skip if the
              path is absent"), ``Network=host`` (else ``Network=`` + ``PublishPort=``),
              ``PodmanArgs=--ipc=...`` (Quadlet has no IPC key; PodmanArgs needs 4.6),
              ``Ulimit=``/``ShmSize=`` from 4.7 (one ``Ulimit=`` line until 5.0, otherwise
              ``PodmanArgs=--ulimit``), ``TimeoutStartSec=`` and ``Label=tuner.promoted=``.
``unit``      a plain ``NAME.service`` that runs ``podman run --rm --name NAME IMAGE@DIGEST
              args`` (podman 4.3 has no Quadlet): ``ExecStartPre`` removes a stale container,
              ``ExecStop`` stops it, ``Type=notify`` with ``--sdnotify=conmon``. Secret env
              values go to ``Environment=`` lines of the unit and reach the container as
              ``--env NAME``, so they never appear on a command line.
``env-file``  the variables an existing serve script reads, one per mapped lever
              (``production.mapping``: lever -> VAR); rules in ``tuner.production.envfile``.

Secrets stay in the files (they are the production files) but ``redact_text`` is what any
log, diff or journal sees.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from arms.argv import REDACTED, is_secret, render_argv
from arms.argv import parse_argv as parse_engine_argv
from arms.errors import ConfigError
from arms.secrets import seal
from arms.shape import Mount, Shape, format_value

from tuner.production.envfile import HEADER, check_mapping, parse_env_file, redact_text, render_env_file
from tuner.production.unitsyntax import (
    join_words,
    parse_ini,
    quote_word,
    split_words,
)

__all__ = ["PROMOTE_FORMS", "ParsedUnit", "check_mapping", "engine_argv", "journal_key", "kept_sections",
           "parse_env_file", "parse_quadlet", "parse_service", "redact_text", "render_env_file",
           "render_quadlet", "render_service", "timeout_start_s", "version_tuple"]

PROMOTE_FORMS = ("quadlet", "unit", "env-file")
QUADLET_KEYS = {"ContainerName", "Image", "Exec", "Environment", "Volume", "AddDevice", "Network",
                "PublishPort", "PodmanArgs", "Ulimit", "ShmSize", "Label"}
KNOWN_OPTIONS = ("network", "ipc", "ulimits", "shm_size", "group_add")
DEFAULT_UNIT_SECTION = (("After", "network-online.target"), ("Wants", "network-online.target"))
DEFAULT_INSTALL = (("WantedBy", "multi-user.target"),)


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""))
    return tuple(int(x or 0) for x in m.groups()) if m else None


def timeout_start_s(boot_s: float | None, margin_s: float = 120.0, default: float = 900.0) -> int:
    """``TimeoutStartSec``: twice the boot the arm measured plus a margin (image pull, a cold
    compile cache); systemd's 90 s default would kill a 420 s boot."""
    if not boot_s or boot_s <= 0:
        return int(default)
    return max(90, math.ceil(boot_s * 2 + margin_s))


def engine_argv(shape: Shape, style: str) -> list[str]:
    """What runs after the image's entrypoint: the shape's args plus ``--port`` (as the
    campaign booted it, see arms.lifecycle.container_spec)."""
    argv = render_argv(shape, style=style)
    if "--port" not in argv:
        argv += ["--port", str(shape.port)]
    return argv


def _ulimit_text(name: str, value) -> str:
    v = -1 if value in (-1, "-1", "unlimited") else int(value)
    return f"{name}={v}:{v}"


def _parse_ulimit(text: str) -> tuple[str, int]:
    name, _, rng = text.partition("=")
    soft, _, hard = rng.partition(":")
    if not name or not soft or (hard and hard != soft):
        raise ConfigError(f"ulimit {text!r}: the tuner writes NAME=V:V with equal soft and hard limits")
    return name, int(soft)


def _check_options(shape: Shape) -> dict:
    opts = dict(shape.options)
    unknown = [k for k in opts if k not in KNOWN_OPTIONS]
    if unknown:
        raise ConfigError(f"container option {unknown[0]!r} has no place in a production unit "
                          f"(the tuner writes {', '.join(KNOWN_OPTIONS)})")
    return opts


def _section(name: str, pairs) -> list[str]:
    return [f"[{name}]"] + [f"{k}={v}" for k, v in pairs] + [""]


def _continued(key: str, groups: list[list[str]]) -> list[tuple[str, str]]:
    """A long command as one key whose value goes on over lines (one flag per line)."""
    return [(key, " \\\n    ".join(join_words(g) for g in groups if g))]


def _flag_groups(argv: list[str]) -> list[list[str]]:
    """Words grouped as a flag and its value (a negative number is a value, not a flag)."""
    groups: list[list[str]] = []
    for w in argv:
        if groups and not (w.startswith("-") and len(w) > 1 and not re.match(r"-[0-9.]", w)):
            groups[-1].append(w)
        else:
            groups.append([w])
    return groups


def _volume(m: Mount) -> str:
    spec = m.spec()
    if re.search(r"[\s\"'\\]", spec):
        raise ConfigError(f"mount {spec!r}: a path with spaces, quotes or backslashes cannot be "
                          "written to a unit; use a path without them")
    return spec.replace("%", "%%")


def journal_key(shape: Shape) -> str:
    """The shape's key as the journal knows it (secret env values redacted there)."""
    return replace(shape, env=tuple((k, REDACTED if is_secret(k) else seal(v)) for k, v in shape.env)).key()


def _env_assignment(name: str, value: str) -> str:
    return quote_word(f"{name}={value}", dollars=False)


@dataclass(frozen=True)
class ParsedUnit:
    shape: Shape
    container_name: str | None
    timeout_start_s: int | None


def _head(label: str, description: str, kept: dict | None) -> tuple:
    unit = list(kept.get("Unit", ())) if kept and kept.get("Unit") else list(DEFAULT_UNIT_SECTION)
    unit = [("Description", description)] + [(k, v) for k, v in unit if k != "Description"]
    install = list(kept.get("Install", ())) if kept and kept.get("Install") else list(DEFAULT_INSTALL)
    top = [f"{HEADER}: {label}.",
           "# The file it replaced is kept beside it; `tuner rollback CAMPAIGN_DIR` puts it back.", ""]
    return top, unit, install


# -- Quadlet ----------------------------------------------------------------------------------
def render_quadlet(shape: Shape, *, style: str, container_name: str, podman_version: str,
                   timeout_s: int, label: str, description: str = "",
                   kept: dict | None = None) -> str:
    """A Quadlet ``.container`` for ``shape``. ``kept``: [Unit]/[Install] pairs of the file it
    replaces, carried over (an operator's After=, WantedBy= stay)."""
    ver = version_tuple(podman_version)
    if ver is None:
        raise ConfigError(f"podman version {podman_version!r} is not a version; set production.podman_version")
    if ver < (4, 4):
        raise ConfigError(f"podman {podman_version} has no Quadlet (it arrived in 4.4): set "
                          "production.promote_as: unit for a plain systemd unit running `podman run`")
    opts = _check_options(shape)
    pairs: list[tuple[str, str]] = [("ContainerName", container_name), ("Image", shape.image)]
    pairs += _continued("Exec", _flag_groups(engine_argv(shape, style)))
    pairs += [("Environment", _env_assignment(k, v)) for k, v in shape.env]
    pairs += [("Volume", _volume(m)) for m in shape.mounts]
    pairs += [("AddDevice", d.replace("%", "%%")) for d in shape.devices]
    network = str(opts.get("network", "host"))
    pairs.append(("Network", network))
    if network != "host":
        pairs.append(("PublishPort", f"{shape.port}:{shape.port}"))
    podman_args: list[str] = []
    if opts.get("ipc"):
        podman_args.append(f"--ipc={opts['ipc']}")
    ulimits = [_ulimit_text(str(n), v) for n, v in dict(opts.get("ulimits") or {}).items()]
    if ulimits and (ver >= (5, 0) or (ver >= (4, 7) and len(ulimits) == 1)):
        pairs += [("Ulimit", u) for u in ulimits]
    else:
        podman_args += [f"--ulimit={u}" for u in ulimits]
    if opts.get("shm_size") is not None:
        if ver >= (4, 7):
            pairs.append(("ShmSize", format_value(opts["shm_size"])))
        else:
            podman_args.append(f"--shm-size={format_value(opts['shm_size'])}")
    podman_args += [f"--group-add={g}" for g in opts.get("group_add") or ()]
    if podman_args and ver < (4, 6):
        raise ConfigError(f"podman {podman_version} has no PodmanArgs= (4.6+), needed for "
                          f"{' '.join(podman_args)}: set production.promote_as: unit")
    pairs += [("PodmanArgs", quote_word(a)) for a in podman_args]
    pairs += [("Label", f"tuner.promoted={label}"), ("Label", f"tuner.shape={journal_key(shape)}")]
    top, unit, install = _head(label, description or f"offload-tuner shape {journal_key(shape)} ({label})", kept)
    service = [("TimeoutStartSec", str(int(timeout_s))), ("Restart", "on-failure")]
    lines = top + _section("Unit", unit) + _section("Container", pairs) + _section("Service", service) \
        + _section("Install", install)
    return "\n".join(lines).rstrip("\n") + "\n"


def _sections(text: str) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for section, key, value in parse_ini(text):
        out.setdefault(section, []).append((key, value))
    return out


def kept_sections(text: str | None) -> dict | None:
    """The [Unit] and [Install] pairs of an existing file (None when there is none)."""
    if not text:
        return None
    try:
        s = _sections(text)
    except ConfigError:
        return None
    return {"Unit": s.get("Unit", []), "Install": s.get("Install", [])}


def _timeout(pairs: list[tuple[str, str]]) -> int | None:
    for k, v in pairs:
        if k == "TimeoutStartSec" and re.fullmatch(r"\d+", v):
            return int(v)
    return None


def _build(image: str, argv: list[str], style: str, env: dict, mounts: list, devices: list,
           options: dict, port_hint: int | None) -> Shape:
    model, args, port = parse_engine_argv(argv, style)
    port = port or port_hint or 8000
    return Shape(image=image, model=model, args=tuple(args), env=tuple(env.items()),
                 mounts=tuple(mounts), devices=tuple(devices), port=port,
                 options=tuple((k, v) for k, v in options.items()))


def _mount(spec: str) -> Mount:
    m = Mount.parse(spec)
    return m if m.source.startswith("/") else Mount(m.source, m.target, m.read_only, "volume")


def _podman_option(opts: dict, word: str) -> None:
    name, eq, value = word.partition("=")
    if not eq:
        raise ConfigError(f"PodmanArgs {word!r}: the tuner writes --option=value")
    if name == "--ipc":
        opts["ipc"] = value
    elif name == "--ulimit":
        n, v = _parse_ulimit(value)
        opts.setdefault("ulimits", {})[n] = v
    elif name == "--shm-size":
        opts["shm_size"] = int(value) if value.isdigit() else value
    elif name == "--group-add":
        opts.setdefault("group_add", []).append(value)
    else:
        raise ConfigError(f"PodmanArgs {word!r} is not one the tuner reads back")


def parse_quadlet(text: str, style: str = "vllm") -> ParsedUnit:
    """A ``.container`` file -> its Shape (``render_quadlet``'s inverse; labels are not shape)."""
    s = _sections(text)
    c = s.get("Container")
    if not c:
        raise ConfigError("no [Container] section: not a Quadlet .container file")
    unknown = sorted({k for k, _ in c} - QUADLET_KEYS)
    if unknown:
        raise ConfigError(f"[Container] key {unknown[0]}= is not one the tuner reads back "
                          f"({', '.join(sorted(QUADLET_KEYS))})")
    vals: dict[str, list[str]] = {}
    for k, v in c:
        vals.setdefault(k, []).append(v)
    if len(vals.get("Image", [])) != 1:
        raise ConfigError("a .container file needs exactly one Image=")
    argv = [w for v in vals.get("Exec", []) for w in split_words(v)]
    env = {}
    for v in vals.get("Environment", []):
        for w in split_words(v, dollars=False):
            name, eq, value = w.partition("=")
            if not eq:
                raise ConfigError(f"Environment={v!r}: each word is NAME=value")
            env[name] = value
    mounts = [_mount(v.replace("%%", "%")) for v in vals.get("Volume", [])]
    devices = [d.replace("%%", "%") for d in vals.get("AddDevice", [])]
    if any(d.startswith("-") for d in devices):
        raise ConfigError("AddDevice=-... skips a device whose path is absent; the tuner writes none")
    opts: dict = {}
    network = (vals.get("Network") or ["host"])[-1]
    if network != "host":
        opts["network"] = network
    port_hint = None
    for p in vals.get("PublishPort", []):
        port_hint = int(p.rsplit(":", 1)[-1].split("/")[0])
    for v in vals.get("Ulimit", []):
        n, lim = _parse_ulimit(v)
        opts.setdefault("ulimits", {})[n] = lim
    if vals.get("ShmSize"):
        raw = vals["ShmSize"][-1]
        opts["shm_size"] = int(raw) if raw.isdigit() else raw
    for v in vals.get("PodmanArgs", []):
        for w in split_words(v):
            _podman_option(opts, w)
    shape = _build(vals["Image"][0], argv, style, env, mounts, devices, opts, port_hint)
    name = (vals.get("ContainerName") or [None])[-1]
    return ParsedUnit(shape, name, _timeout(s.get("Service", [])))


# -- plain systemd unit running `podman run` -------------------------------------------------------
def render_service(shape: Shape, *, style: str, container_name: str, timeout_s: int, label: str,
                   description: str = "", podman: str = "/usr/bin/podman", kept: dict | None = None) -> str:
    opts = _check_options(shape)
    secrets = [(k, v) for k, v in shape.env if is_secret(k)]
    run = [podman, "run", "--rm", "--sdnotify=conmon", "--cgroups=no-conmon", "-d",
           "--name", container_name, "--label", f"tuner.promoted={label}",
           "--label", f"tuner.shape={journal_key(shape)}"]
    network = str(opts.get("network", "host"))
    run += ["--network", network] + (["--publish", f"{shape.port}:{shape.port}"] if network != "host" else [])
    if opts.get("ipc"):
        run += ["--ipc", str(opts["ipc"])]
    for k, v in shape.env:
        run += ["--env", k if is_secret(k) else f"{k}={v}"]
    for m in shape.mounts:
        run += ["--volume", m.spec()]
    for d in shape.devices:
        run += ["--device", d]
    for n, v in dict(opts.get("ulimits") or {}).items():
        run += ["--ulimit", _ulimit_text(str(n), v)]
    if opts.get("shm_size") is not None:
        run += ["--shm-size", format_value(opts["shm_size"])]
    for g in opts.get("group_add") or ():
        run += ["--group-add", str(g)]
    run.append(shape.image)
    for m in shape.mounts:
        _volume(m)
    groups = [run[:6]] + _flag_groups(run[6:-1]) + [[shape.image]] + _flag_groups(engine_argv(shape, style))
    service = [("Type", "notify"), ("NotifyAccess", "all"), ("Environment", "PODMAN_SYSTEMD_UNIT=%n")]
    service += [("Environment", _env_assignment(k, v)) for k, v in secrets]
    service += [("TimeoutStartSec", str(int(timeout_s))), ("TimeoutStopSec", "70"), ("Restart", "on-failure"),
                ("ExecStartPre", "-" + join_words([podman, "rm", "-f", "--ignore", container_name]))]
    service += _continued("ExecStart", groups)
    service += [("ExecStop", join_words([podman, "stop", "--ignore", "-t", "30", container_name])),
                ("ExecStopPost", "-" + join_words([podman, "rm", "-f", "--ignore", container_name]))]
    top, unit, install = _head(label, description or f"offload-tuner shape {journal_key(shape)} ({label})", kept)
    lines = top + _section("Unit", unit) + _section("Service", service) + _section("Install", install)
    return "\n".join(lines).rstrip("\n") + "\n"


_RUN_VALUED = {"--name", "--label", "--network", "--ipc", "--env", "-e", "--volume", "-v", "--device",
               "--ulimit", "--shm-size", "--group-add", "--publish", "-p", "--cidfile", "--cgroups",
               "--sdnotify", "--pull", "--log-driver", "--stop-timeout"}
_RUN_FLAGS = {"--rm", "-d", "--detach", "--replace", "--init"}


def parse_service(text: str, style: str = "vllm") -> ParsedUnit:
    """A unit written by ``render_service`` -> its Shape."""
    s = _sections(text)
    svc = s.get("Service") or []
    starts = [v for k, v in svc if k == "ExecStart"]
    if len(starts) != 1:
        raise ConfigError("the unit needs exactly one ExecStart= (podman run ...)")
    words = split_words(starts[0])
    if len(words) < 3 or not words[0].endswith("podman") or words[1] != "run":
        raise ConfigError(f"ExecStart= runs {' '.join(words[:2])!r}, not `podman run`")
    unit_env = {}
    for k, v in svc:
        if k == "Environment":
            for w in split_words(v, dollars=False):
                name, _, value = w.partition("=")
                unit_env[name] = value
    env, mounts, devices, opts, name, port_hint = {}, [], [], {}, None, None
    i = 2
    while i < len(words) and words[i].startswith("-"):
        opt, eq, value = words[i].partition("=")
        if opt in _RUN_FLAGS:
            i += 1
            continue
        if opt not in _RUN_VALUED:
            raise ConfigError(f"podman run option {opt} is not one the tuner reads back")
        if not eq:
            value, i = words[i + 1], i + 2
        else:
            i += 1
        if opt == "--name":
            name = value
        elif opt in ("--env", "-e"):
            k, has, v = value.partition("=")
            env[k] = v if has else unit_env.get(k, "")
        elif opt in ("--volume", "-v"):
            mounts.append(_mount(value))
        elif opt == "--device":
            devices.append(value)
        elif opt == "--network" and value != "host":
            opts["network"] = value
        elif opt in ("--publish", "-p"):
            port_hint = int(value.rsplit(":", 1)[-1].split("/")[0])
        elif opt in ("--ipc", "--ulimit", "--shm-size", "--group-add"):
            _podman_option(opts, f"{opt}={value}")
    if i >= len(words):
        raise ConfigError("ExecStart= names no image after the podman run options")
    shape = _build(words[i], words[i + 1:], style, env, mounts, devices, opts, port_hint)
    return ParsedUnit(shape, name, _timeout(svc))

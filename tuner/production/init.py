"""`tuner init --from-container NAME`: a campaign whose baseline is a running container's shape.

podman inspect (through podman-py) gives the pieces; ``shape_from_inspect`` turns them into a
Shape (pure), ``render_campaign`` writes the commented campaign YAML (pure), and
``init_from_container`` does the I/O. What is read, and what is left out:

  image    the RepoDigests entry of the container's repository (else ImageName when it is a
           digest, else repo@Digest): a campaign boots by digest;
  args     the container's Cmd — the arguments after the image's entrypoint — parsed back into
           model, flags and ``--port`` (a container that overrides the entrypoint is refused:
           a shape runs its args after the image's own entrypoint);
  env      the container's env minus what the image's Config.Env sets to the same value and
           minus what podman adds itself (``container``, ``HOSTNAME``, ``TERM=xterm``, its
           default ``PATH``, ``HOME=/root``);
  mounts   bind mounts and named volumes (``/root/.cache`` becomes ``compile_cache``);
  devices  CreateCommand's ``--device`` words when podman kept them (CDI names survive), else
           HostConfig.Devices, with nodes under ``/dev/dri/`` folded back to the whole
           ``/dev/dri`` (seed 002: single renderD nodes enumerate but refuse contexts);
  network  ``host`` is the default; another mode becomes ``options.network``;
  ipc      HostConfig.IpcMode ``host``, or — podman 4.3 reports ``shareable`` for a host IPC
           namespace — the container's /proc/PID/ns/ipc equal to our own;
  ulimits  all but nofile/nproc, which podman sets from containers.conf on every container: those
           two when CreateCommand names them or, for a container created through the API (no
           CreateCommand), when they differ from what the same service gives a container that
           asks for none (``Host.default_ulimits``: a throwaway container, created, read, removed);
  shm      its size when not podman's 64 MB, in the largest unit that states it exactly (``1g``).
"""
from __future__ import annotations

import logging
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from arms.argv import parse_argv as parse_engine_argv
from arms.errors import ConfigError
from arms.lifecycle import ulimits_of
from arms.measure import MeasurePlan
from arms.shape import COMPILE_CACHE_TARGET, Mount, Shape
from tuner.night.schema import Noise

log = logging.getLogger("tuner.init")
_PLAN, _NOISE = MeasurePlan(), Noise()     # the written campaign states the defaults it runs with

PODMAN_ENV = {"container": None, "HOSTNAME": None, "TERM": "xterm", "HOME": "/root",
              "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
DEFAULT_SHM = 65536000
_OFFLOAD_HINTS = ("expert-prefetch", "expert-precise-memory", "cpu-offload-gb")
_VLLM_HINTS = ("tensor-parallel-size", "gpu-memory-utilization", "max-model-len", "max-num-seqs",
               "enable-prefix-caching", "kv-cache-dtype", "max-num-batched-tokens")

LEVERS = {
    "vllm-expert-offload": """\
  expert-prefetch: [absent, 1, 2]              # seed 002: prefetch OFF was the night's +40-51 %
  speculative-config:
    - absent
    - {method: mtp, num_speculative_tokens: 3}
    - {method: mtp, num_speculative_tokens: 6}
  env.R4D_LRU_GATHER_CHUNKS: [8, 16, 32, 64]   # gather geometry: 32x64 won +18.7 % in the redo
  env.R4D_LRU_GATHER_LANES: [16, 32, 64, 128]
  env.R4D_LRU_UVA_TOKENS: [2048, 8192]         # 2048 was poison (-39 %)
  max-num-batched-tokens: [512, 1024, 4096, 8192]
  kv-cache-dtype: {values: [auto, fp8], numerics: changing}   # changes numerics: text is checked
  expert-precise-memory: [absent, true]        # the arena lever that leaves the window alone
""",
    "vllm": """\
  max-num-batched-tokens: [1024, 2048, 4096, 8192]
  max-num-seqs: [4, 8, 16, 32]
  gpu-memory-utilization: [0.90, 0.92, 0.95]
  enable-prefix-caching: [true, false]
  kv-cache-dtype: {values: [auto, fp8], numerics: changing}
""",
    "llamacpp": """\
  n-cpu-moe: [absent, 8, 16, 24, 32]          # -ncmoe: the first N layers' experts stay in host RAM
  override-tensor: [absent, exps=CPU]         # -ot: every expert tensor to host RAM (what --cpu-moe does)
  n-gpu-layers: [99, auto]                    # -ngl
  threads: [4, 8, 16]                         # -t: decode threads (experts in RAM decode on the CPU)
  threads-batch: [8, 16]                      # -tb: prompt threads
  batch-size: [512, 1024, 2048]               # -b
  ubatch-size: [256, 512, 1024]               # -ub
  flash-attn: [true, false]                   # -fa on / -fa off
  cache-type-k: {values: [f16, q8_0], numerics: changing}   # -ctk: changes numerics, text is checked
  cache-type-v: {values: [f16, q8_0], numerics: changing}   # -ctv (quantized V needs -fa on)
  load-mode: [mmap, mlock, none]              # -lm (2025 builds: --no-mmap / --mlock)
""",
}
LEVERS["simengine"] = LEVERS["vllm-expert-offload"]


@dataclass
class Inspected:
    shape: Shape
    profile: str
    why: str
    notes: list[str] = field(default_factory=list)


def _image_ref(attrs: dict, image: dict) -> str:
    name = attrs.get("ImageName") or ""
    repo = name.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    digests = image.get("RepoDigests") or []
    for rd in digests:
        if rd.split("@", 1)[0] == repo:
            return rd
    if "@sha256:" in name:
        return name
    if digests:
        return digests[0]
    if repo and image.get("Digest"):
        return f"{repo}@{image['Digest']}"
    raise ConfigError(f"image {name or attrs.get('Image')} has no digest; push or re-tag it so podman records one")


def _words(value) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def _created_with(attrs: dict, option: str) -> list[str] | None:
    """The values of ``--option`` in the CLI command that created the container, if podman kept it."""
    cmd = (attrs.get("Config") or {}).get("CreateCommand") or []
    if not cmd:
        return None
    out = []
    for i, w in enumerate(cmd):
        if w == option and i + 1 < len(cmd):
            out.append(cmd[i + 1])
        elif w.startswith(option + "="):
            out.append(w.split("=", 1)[1])
    return out


def guess_profile(image: str, entrypoint: list[str], argv: list[str], env: dict) -> tuple[str, str]:
    text = " ".join([image] + entrypoint).lower()
    flags = {a.lstrip("-").split("=")[0] for a in argv if a.startswith("-")}
    if "simengine" in text:
        return "simengine", "the image runs the simulated engine (simengine)"
    if "llama" in text and ("server" in text or "cpp" in text):
        return "llamacpp", "the image runs llama.cpp's server"
    if flags & set(_OFFLOAD_HINTS) or any(k.startswith("R4D_") for k in env):
        return "vllm-expert-offload", "expert-offload flags or R4D_* env: the expert-offload vLLM fork"
    if "vllm" in text or flags & set(_VLLM_HINTS):
        return "vllm", "vLLM image or vLLM flags"
    return "vllm", "could not tell the engine; vLLM assumed — set engine: by hand"


def size_text(n: int) -> str | int:
    """Bytes in the largest of podman's units (g, m, k) that states them exactly: 1073741824 -> 1g;
    a size no unit states exactly stays a number of bytes."""
    for unit, size in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return n


def shape_from_inspect(attrs: dict, image: dict, *, ipc_host: bool = False,
                       default_ulimits: dict[str, int] | None = None) -> Inspected:
    """A container's inspect data (and its image's) -> Inspected. Pure. ``default_ulimits``: the
    soft nofile/nproc the podman service gives a container that asks for none (None: unknown)."""
    cfg, hc = attrs.get("Config") or {}, attrs.get("HostConfig") or {}
    notes: list[str] = []
    img_cfg = image.get("Config") or {}
    entry, img_entry = _words(cfg.get("Entrypoint")), _words(img_cfg.get("Entrypoint"))
    if entry and entry != img_entry:
        raise ConfigError(f"container {attrs.get('Name')} overrides the image's entrypoint ({' '.join(entry)} vs "
                          f"{' '.join(img_entry) or 'none'}): a shape runs its args after the image's own entrypoint")
    ref = _image_ref(attrs, image)
    argv = _words(cfg.get("Cmd"))
    image_env = {e.split("=", 1)[0]: e.split("=", 1)[1] for e in img_cfg.get("Env") or [] if "=" in e}
    env = {}
    for e in cfg.get("Env") or []:
        k, _, v = e.partition("=")
        if image_env.get(k) == v or (k in PODMAN_ENV and PODMAN_ENV[k] in (None, v)):
            continue
        env[k] = v
    profile, why = guess_profile(ref, entry, argv, env)
    model, args, port = parse_engine_argv(argv, "llamacpp" if profile == "llamacpp" else "vllm")
    if profile == "llamacpp":
        from arms.spellings import flag_table

        table = flag_table("llamacpp")
        for k in env:
            lever = table.env_lever(k)
            if lever:
                notes.append(f"env {k} sets the flag {lever}; a lever {lever} overrides it on the command "
                             "line (llama-server warns and takes the flag)")
    bindings = hc.get("PortBindings") or {}
    if port is None:
        port = int(next(iter(bindings)).split("/")[0]) if bindings else 8000
        notes.append(f"no --port in the args: port {port} assumed; the tuner passes --port {port} when it boots")
    mounts = []
    for m in attrs.get("Mounts") or []:
        if m.get("Type") == "bind":
            mounts.append(Mount(m["Source"], m["Destination"], not m.get("RW", True)))
        elif m.get("Type") == "volume" and m.get("Name"):
            mounts.append(Mount(m["Name"], m["Destination"], not m.get("RW", True), "volume"))
    devices = _created_with(attrs, "--device")
    if devices is None:
        devices = [d["PathOnHost"] for d in hc.get("Devices") or [] if d.get("PathOnHost")]
        if any(d.startswith("/dev/dri/") for d in devices):
            devices = sorted({"/dev/dri" if d.startswith("/dev/dri/") else d for d in devices})
            notes.append("devices under /dev/dri/ folded back to the whole /dev/dri")
    options: dict = {}
    mode = hc.get("NetworkMode") or "host"
    if mode != "host":
        options["network"] = mode
    if hc.get("IpcMode") == "host" or ipc_host:
        options["ipc"] = "host"
    created = _created_with(attrs, "--ulimit")
    asked = {u.split("=", 1)[0] for u in created or []}
    ulimits = {}
    for name, value in ulimits_of(hc.get("Ulimits")).items():
        if name in ("nofile", "nproc") and name not in asked:
            if created is not None or default_ulimits is None or default_ulimits.get(name) == value:
                continue             # podman's own default (or nothing says it was asked for)
        ulimits[name] = value
    if ulimits:
        options["ulimits"] = ulimits
    if hc.get("ShmSize") and int(hc["ShmSize"]) != DEFAULT_SHM and options.get("ipc") != "host":
        options["shm_size"] = size_text(int(hc["ShmSize"]))
    if hc.get("GroupAdd"):
        options["group_add"] = list(hc["GroupAdd"])
    shape = Shape(image=ref, model=model, args=tuple(args), env=tuple(env.items()), mounts=tuple(mounts),
                  devices=tuple(devices), port=port, options=tuple(options.items()))
    return Inspected(shape, profile, why, notes)


def _y(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True).strip()
    return text[:-4].strip() if text.endswith("\n...") else text


def render_campaign(ins: Inspected, *, name: str, container: str) -> str:
    """The campaign YAML, commented. Pure."""
    s = ins.shape
    campaign = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:64] or "campaign"
    lines = [f"# Campaign written by `tuner init --from-container {container}`: the baseline is that",
             "# container's shape as podman inspect reports it (image by digest, args, env, mounts,",
             "# devices, port, options). Check it, prune the levers, then `tuner check` this file.",
             *[f"# note: {n}" for n in ins.notes],
             f"name: {campaign}",
             f"engine: {ins.profile}                   # guessed: {ins.why}",
             "# podman: unix:///run/podman/podman.sock   # default: $CONTAINER_HOST",
             "baseline:",
             f"  image: {_y(s.image)}",
             f"  model: {_y(s.model)}"]
    if s.args:
        lines += ["  args:"] + [f"    {n}: {_y(_plain(v))}" for n, v in s.args]
    if s.env:
        lines += ["  env:"] + [f"    {k}: {_y(v)}" for k, v in s.env]
    cache = [m for m in s.mounts if m.target == COMPILE_CACHE_TARGET and not m.read_only and m.kind == "bind"]
    other = [m for m in s.mounts if m not in cache]
    if other:
        lines += ["  mounts:"] + [f"    - {_y(m.to_dict())}" for m in other]
    if cache:
        lines.append(f"  compile_cache: {_y(cache[0].source)}   # mounted at /root/.cache")
    if s.devices:
        lines.append(f"  devices: {_y(list(s.devices))}")
    lines.append(f"  port: {s.port}")
    if s.options:
        lines.append(f"  options: {_y({k: _plain(v) for k, v in s.options})}")
    lines += ["", f"# Suggested levers for the {ins.profile} profile: each arm changes exactly one of them.",
              "levers:", LEVERS.get(ins.profile, LEVERS["vllm"]).rstrip("\n"), "",
              f"measure: {{depths: {list(_PLAN.depths)}, runs: {_PLAN.runs}, warm_tokens: {_PLAN.warm_tokens}, "
              f"max_tokens: {_PLAN.max_tokens}}}",
              "objective: decode_geomean",
              f"noise: {{recheck_every: {_NOISE.recheck_every}, min_effect: {_NOISE.min_effect:g}}}",
              "budget: {until: \"07:00\", max_arms: 60}",
              "boot: {timeout_s: 1200, hang_s: 600}",
              "# production:                          # the service this container is; `tuner promote` writes it",
              f"#   unit: {campaign}.service",
              "#   guard: refuse-if-active",
              "#   promote_as: quadlet                 # or unit (podman 4.3) or env-file (+ env_file, mapping)",
              ""]
    return "\n".join(lines)


def _plain(v):
    from arms.shape import thaw

    return thaw(v)


def _ipc_is_host(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return os.readlink(f"/proc/{pid}/ns/ipc") == os.readlink("/proc/self/ns/ipc")
    except OSError:
        return False


def init_from_container(name: str, output: str | None = None, *, podman: str | None = None,
                        force: bool = False, host=None) -> Path:
    from host.podman_host import PodmanHost

    host = host or PodmanHost(podman)
    attrs = host.inspect_container(name)           # the Host seam: plain inspect data, no podman-py objects
    if attrs is None:
        raise ConfigError(f"no container named {name!r} (`podman ps -a` lists them)")
    state = attrs.get("State") or {}
    if str(state.get("Status", "")).lower() != "running":
        raise ConfigError(f"container {name} is {state.get('Status', 'not running')}: start it; init reads a "
                          "running container")
    image = host.inspect_image(attrs["Image"])
    defaults = None
    if _created_with(attrs, "--ulimit") is None and hasattr(host, "default_ulimits"):
        try:                                  # created through the API: measure podman's defaults
            defaults = host.default_ulimits(attrs["Image"]) or None      # none read: not known
        except Exception as e:                # noqa: BLE001 - a probe; without it nofile/nproc are left to podman
            log.warning("[init] podman's default ulimits could not be read (%s): nofile/nproc are left out", e)
    ins = shape_from_inspect(attrs, image, ipc_host=_ipc_is_host(state.get("Pid")), default_ulimits=defaults)
    path = Path(output or f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.yaml")
    if path.exists() and not force:
        raise ConfigError(f"{path} exists; pass --force to overwrite it, or -o another file")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)     # it holds the container's secrets
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(render_campaign(ins, name=name.lstrip("/"), container=name))
    return path

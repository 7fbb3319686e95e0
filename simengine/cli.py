"""``python -m simengine serve MODEL [flags]``: boot like the expert-offload fork, then serve.

The boot prints vLLM-format lines (see LOG_FORMAT.md) with the planner's numbers, sleeps the
landscape's boot costs (times ``time_scale``), honours a compile cache under
``$VLLM_CACHE_ROOT`` (default ``/root/.cache/vllm``), fails the way the seed's shapes failed,
and then serves the HTTP API from a ``Behaviour``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from .landscape import ABSENT, ENV_HOOKS, LandscapeError, load_landscape

VERSION = "0.29.0.dev0+sim"


class Log:
    """vLLM 0.33 line format: (Process pid=N) LEVEL MM-DD HH:MM:SS [file:line] message."""

    def __init__(self, out=None, now: Callable[[], datetime] = datetime.now):
        self.out = out or sys.stdout
        self.now = now

    def __call__(self, msg: str, proc: str = "EngineCore_DP0", level: str = "INFO", where: str = "core.py:93"):
        pid = 1 if proc == "APIServer" else 7
        ts = self.now().strftime("%m-%d %H:%M:%S")
        self.out.write(f"({proc} pid={pid}) {level} {ts} [{where}] {msg}\n")
        self.out.flush()

    def raw(self, line: str) -> None:
        self.out.write(line.rstrip("\n") + "\n")
        self.out.flush()

    def api(self, msg: str, where: str = "api_server.py:1351"):
        self(msg, proc="APIServer", where=where)


def _json_arg(s: str):
    return json.loads(s)


def build_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="vllm")
    sub = top.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", usage="vllm serve [model_tag] [options]")
    p.add_argument("model_tag")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--gpu-memory-utilization", "--device-memory-utilization", type=float, default=0.92)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument("--kv-cache-dtype", choices=["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"], default="auto")
    p.add_argument("--speculative-config", "-sc", type=_json_arg, default=None)
    p.add_argument("--expert-prefetch", type=int, default=None)
    p.add_argument("--expert-precise-memory", action="store_true", default=False)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enforce-eager", action="store_true", default=False)
    p.add_argument("--profiler-config", type=_json_arg, default=None)
    p.add_argument("--trust-remote-code", action="store_true", default=False)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-token", default=None)      # accepted and unused, as vLLM does without a download
    p.add_argument("--landscape", default=None, help="landscape file (or SIMENGINE_LANDSCAPE)")
    return top


def known_flags(parser: argparse.ArgumentParser | None = None) -> set[str]:
    parser = parser or build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001 - argparse has no public walk
    names = set()
    for act in serve._actions:  # noqa: SLF001
        for opt in act.option_strings:
            if opt.startswith("--"):
                names.add(opt[2:])
    return names


def shape_values(ns: argparse.Namespace, parser: argparse.ArgumentParser, env: dict) -> dict:
    """Lever name -> value for every flag (None when not given) and env hook."""
    serve = parser._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    vals: dict = {}
    for act in serve._actions:  # noqa: SLF001
        if not act.option_strings or act.dest in ("help",):
            continue
        name = act.option_strings[0].lstrip("-")
        v = getattr(ns, act.dest)
        vals[name] = None if v is False else v
    sc = ns.speculative_config
    if isinstance(sc, dict):
        for k, v in sc.items():
            vals[f"speculative-config.{k}"] = v
    for name in ENV_HOOKS:
        vals[f"env.{name}"] = env.get(name)
    return vals


def non_default_args(ns: argparse.Namespace, parser: argparse.ArgumentParser, ignored: set[str]) -> dict:
    serve = parser._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    out = {"model_tag": ns.model_tag}
    for act in serve._actions:  # noqa: SLF001
        if not act.option_strings or act.dest in ("help", "landscape"):
            continue
        if act.option_strings[0].lstrip("-") in ignored:
            continue
        v = getattr(ns, act.dest)
        if v != act.default:
            out[act.dest] = v
    return out


class PrepareError(Exception):
    """Bad landscape or SIMENGINE_* value: ``str()`` is the engine's one stderr line (exit 2)."""


def _env_float(env: dict, name: str, default: float) -> float:
    v = env.get(name)
    if v in (None, ""):
        return default
    try:
        return float(v)
    except ValueError:
        raise PrepareError(f"simengine: error: {name}={v!r} is not a number") from None


@dataclass
class Prepared:
    """Everything a boot needs, from argv and env."""

    land: object                  # Landscape
    ns: argparse.Namespace
    values: dict                  # lever name -> value as the engine parsed it
    nda: dict                     # the non-default args line
    time_scale: float
    noise_sigma: float
    fault: str | None


def prepare(argv: list[str] | None, env: dict, *, path_map: Callable[[str], str] | None = None,
            default_landscape: str | None = None, load: Callable = load_landscape) -> Prepared:
    """Parse argv (argparse errors: usage + "vllm: error: ..." on stderr and SystemExit(2)) and
    env, and load the landscape (PrepareError). ``path_map`` turns the engine's landscape path
    into one to read; ``default_landscape`` replaces the built-in one when none is named;
    ``load`` is ``load_landscape`` or a cache of it (it must return a fresh copy)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    path = ns.landscape or env.get("SIMENGINE_LANDSCAPE")
    path = (path_map(path) if path_map else path) if path else default_landscape
    try:
        land = load(path, known_flags(parser))
    except LandscapeError as e:
        raise PrepareError(f"simengine: error: {e}") from None
    ts = _env_float(env, "SIMENGINE_TIME_SCALE", float(land.get("time_scale", 1.0)))
    land.data["decode_scale"] = _env_float(env, "SIMENGINE_DECODE_SCALE", float(land.get("decode_scale", 1.0)))
    noise = _env_float(env, "SIMENGINE_NOISE", float(land.get("noise_sigma", 0.0)))
    fault = env.get("SIMENGINE_FAULT") or None
    from .engine import FAULTS

    if fault is not None and fault not in FAULTS:
        raise PrepareError(f"simengine: error: SIMENGINE_FAULT={fault!r} is not one of {', '.join(sorted(FAULTS))}")
    values = shape_values(ns, parser, env)
    ignored = {str(f) for f in land.get("ignored_flags", [])}
    for f in ignored:                      # the engine accepts these flags and silently drops them
        values[f] = None
    nda = non_default_args(ns, parser, ignored)
    return Prepared(land, ns, values, nda, ts, noise, fault)


def main(argv: list[str] | None = None, env: dict | None = None) -> int:
    env = dict(os.environ if env is None else env)
    try:
        p = prepare(argv, env)
    except PrepareError as e:
        print(e, file=sys.stderr)
        return 2
    from .boot import Boot

    code = Boot(p.land, p.ns, p.values, p.nda, env=env, time_scale=p.time_scale, noise_sigma=p.noise_sigma,
                log=Log()).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)      # like a dying engine core: no interpreter teardown under serving threads


__all__ = ["main", "prepare", "Prepared", "PrepareError", "build_parser", "known_flags", "ABSENT"]

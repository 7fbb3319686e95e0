"""The expert-cache telemetry window of an arm (seed 002: the measurement that found the win).

When a campaign enables telemetry, the arm's shape gets ``R4D_LRU_TELEMETRY=1`` and a profiler
config with ``torch_profiler_with_stack=false`` (``apply_telemetry``; ``check_telemetry`` turns
a profile without telemetry into a one-line ConfigError at check time). Inside ``boot_arm``,
``telemetry_window`` then:

1. builds the fixed prompt (``arms.prompts``) and POSTs ``/start_profile``;
2. drives ``requests`` streamed completions at one depth (``arms.measure`` helpers);
3. POSTs ``/stop_profile`` with a deadline: with stack tracing on it has hung >10 min on ROCm,
   so a stop that has not answered by ``stop_timeout_s`` ends the window as ``stop-timeout``
   (the call is abandoned on a daemon thread; the arm's teardown removes the container);
4. copies ``expert_cache_rank<N>.json`` out (``host.copy_out``, or from a bind-mounted profiler
   folder), deletes trace files beyond ``max_trace_bytes`` (never the telemetry json), and
   parses them (``arms.expert_cache``).

Copying: with ``ranks`` known and ``max_trace_bytes == 0`` only the telemetry files are copied,
one by one, so a huge trace never travels; otherwise the whole profiler folder is copied
(``PodmanHost.copy_out`` holds the archive in memory: keep traces small or bind-mount the
folder and pass ``host_profiler_dir``).
"""
from __future__ import annotations

import shutil
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import httpx

from .errors import ConfigError, HostError
from .expert_cache import (COUNTERS, Counts, LayerStats, RankStats, TelemetryReport,  # noqa: F401
                           load_report, parse_rank, report_from_texts, slab_bytes_from_plan,
                           telemetry_files)
from .host import Host
from .measure import RunResult, classify, discover_model, spec_acceptance, stream_completion
from .prompts import DEFAULT_CACHE, EngineAPI, PromptCache, Tokenizer, api_from_profile
from .shape import ABSENT, Shape, thaw

__all__ = ["TELEMETRY_ENV", "DEFAULT_PROFILER_DIR", "PROFILER_CONFIG", "TelemetryResult",
           "telemetry_window", "telemetry_shape_changes", "apply_telemetry", "check_telemetry",
           "expected_ranks", "profiler_config", "bounded_post", "cap_traces",
           # the parse, from arms.expert_cache
           "COUNTERS", "Counts", "LayerStats", "RankStats", "TelemetryReport", "load_report",
           "parse_rank", "report_from_texts", "slab_bytes_from_plan", "telemetry_files"]

TELEMETRY_ENV = "R4D_LRU_TELEMETRY"
DEFAULT_PROFILER_DIR = "/profiles"
PROFILER_CONFIG = "profiler-config"
START_PATH, STOP_PATH = "/start_profile", "/stop_profile"
_WHY_NO_STACK = ("with stack tracing a 6.5-min window's trace grew ~40 GB and OOM-killed the "
                 "engine, and /stop_profile hung >10 min on ROCm")


# -- the shape -------------------------------------------------------------------------------
def profiler_config(profiler_dir: str = DEFAULT_PROFILER_DIR) -> dict[str, Any]:
    return {"profiler": "torch", "torch_profiler_dir": profiler_dir,
            "torch_profiler_with_stack": False}


def _on(v: Any) -> bool:
    return v is True or str(v).strip().lower() in ("1", "true", "yes", "on")


def check_telemetry(profile: Any, enabled: bool, shape: Shape | None = None, *,
                    where: str = "measure.telemetry") -> None:
    """ConfigError (one line) when telemetry is enabled for a profile that has none, or for a
    shape that asks for stack tracing. Call it at check time, before any arm boots."""
    if not enabled:
        return
    if not getattr(profile, "telemetry", False):
        raise ConfigError(
            f"{where}: telemetry is enabled but engine profile {getattr(profile, 'name', profile)!r} "
            f"has no expert-cache telemetry (its 'telemetry' is false); turn {where} off or use "
            f"an expert-offload profile such as vllm-expert-offload")
    if shape is None:
        return
    pc = shape.value_of(PROFILER_CONFIG)
    dotted = shape.value_of(PROFILER_CONFIG + ".torch_profiler_with_stack")
    env = shape.value_of("env.VLLM_TORCH_PROFILER_WITH_STACK")
    if (isinstance(pc, Mapping) and _on(pc.get("torch_profiler_with_stack", False))) \
            or (dotted is not ABSENT and _on(dotted)) or (env is not ABSENT and _on(env)):
        raise ConfigError(f"{where}: the shape sets torch_profiler_with_stack true; telemetry "
                          f"needs it false ({_WHY_NO_STACK})")


def telemetry_shape_changes(profile: Any, *, profiler_dir: str = DEFAULT_PROFILER_DIR,
                            style: str = "config") -> tuple[dict[str, str], dict[str, Any]]:
    """(env, args) an arm adds when telemetry is on. ``style`` "config" is ``--profiler-config``
    (vLLM >= 0.33 and the seed's fork); "env" is the older VLLM_TORCH_PROFILER_DIR form."""
    check_telemetry(profile, True)
    if style == "env":
        return ({TELEMETRY_ENV: "1", "VLLM_TORCH_PROFILER_DIR": profiler_dir,
                 "VLLM_TORCH_PROFILER_WITH_STACK": "0"}, {})
    if style != "config":
        raise ConfigError(f"telemetry profiler style {style!r} is unknown; use config or env")
    return {TELEMETRY_ENV: "1"}, {PROFILER_CONFIG: profiler_config(profiler_dir)}


def apply_telemetry(shape: Shape, profile: Any, *, profiler_dir: str = DEFAULT_PROFILER_DIR,
                    style: str = "config") -> Shape:
    """``shape`` with the telemetry env and profiler config (merged into an existing one)."""
    check_telemetry(profile, True, shape)
    env, args = telemetry_shape_changes(profile, profiler_dir=profiler_dir, style=style)
    for k, v in env.items():
        shape = shape.with_change("env." + k, v)
    for k, v in args.items():
        old = shape.value_of(k)
        shape = shape.with_change(k, {**thaw(old), **v} if isinstance(old, Mapping) else v)
    return shape


def expected_ranks(shape: Shape) -> int:
    """How many expert_cache_rank<N>.json files an arm writes: its tensor-parallel size."""
    for name in ("tensor-parallel-size", "tp"):
        v = shape.value_of(name)
        if v is not ABSENT:
            return max(1, int(v))
    return 1


# -- the window ------------------------------------------------------------------------------
@dataclass
class TelemetryResult:
    status: str                  # ok | partial | stop-timeout | stop-failed | start-failed | no-telemetry
    reason: str | None
    depth: int
    runs: list[RunResult] = field(default_factory=list)
    acceptance: float | None = None
    mean_acceptance_length: float | None = None
    stop_s: float | None = None             # how long /stop_profile took (or was waited for)
    window_s: float | None = None           # start_profile to the end of the stop
    files: list[str] = field(default_factory=list)
    traces_removed: list[tuple[str, int]] = field(default_factory=list)
    trace_bytes_kept: int = 0
    report: TelemetryReport | None = None

    @property
    def decode_tok_s(self) -> float | None:
        ok = [r.decode_tok_s for r in self.runs if r.valid and r.decode_tok_s]
        return statistics.median(ok) if ok else None

    def findings(self) -> list[str]:
        head = [] if self.status == "ok" else [f"telemetry window {self.status}: {self.reason}"]
        return head + (self.report.findings() if self.report else [])

    def to_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason, "depth": self.depth,
                "requests": len(self.runs), "valid_runs": sum(r.valid for r in self.runs),
                "decode_tok_s": self.decode_tok_s, "acceptance": self.acceptance,
                "mean_acceptance_length": self.mean_acceptance_length,
                "stop_s": self.stop_s, "window_s": self.window_s, "files": list(self.files),
                "traces_removed": [list(t) for t in self.traces_removed],
                "trace_bytes_kept": self.trace_bytes_kept, "findings": self.findings(),
                "runs": [{k: v for k, v in asdict(r).items() if k != "text"} for r in self.runs],
                "report": self.report.to_dict() if self.report else None}


def _text(http: httpx.Client, url: str | None, timeout: float) -> str | None:
    if not url:
        return None
    try:
        r = http.get(url, timeout=timeout)
        return r.text if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def bounded_post(http: httpx.Client, url: str, timeout_s: float, *, clock: Callable[[], float],
                 sleep: Callable[[float], Any] | None = None) -> tuple[int | None, str | None, float]:
    """POST with a deadline: (status or None, error or None, seconds waited). The client's own
    timeouts bound it (a hung /stop_profile sends nothing, so the read timeout fires), on the
    host's clock: real time on podman, virtual time on the simulated host."""
    t0 = clock()
    try:
        status = http.post(url, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))).status_code
        return status, None, clock() - t0
    except httpx.TimeoutException:
        return None, "timeout", clock() - t0
    except httpx.HTTPError as e:
        return None, f"{type(e).__name__}: {e}", clock() - t0


def cap_traces(folders: list[Path], max_bytes: int) -> tuple[int, list[tuple[str, int]]]:
    """Delete trace files (anything but expert_cache_rank<N>.json) beyond ``max_bytes`` in
    total, smallest kept first. Returns (bytes kept, [(path, bytes) removed])."""
    keep = {p.resolve() for f in folders for p in telemetry_files(f)}
    traces = sorted(((p.stat().st_size, str(p)) for f in folders if Path(f).is_dir()
                     for p in Path(f).rglob("*") if p.is_file() and p.resolve() not in keep))
    kept, removed = 0, []
    for size, path in traces:
        if kept + size <= max_bytes:
            kept += size
            continue
        try:
            Path(path).unlink()
            removed.append((path, size))
        except OSError:
            kept += size
    return kept, removed


def _collect(host: Host, cid: str, profiler_dir: str, dest: Path, ranks: int | None,
             host_dir: Path | None, want_traces: bool) -> list[str]:
    """Bring the telemetry (and traces when wanted) into ``dest``; returns problems."""
    if host_dir is not None:
        for p in telemetry_files(host_dir):
            shutil.copy2(p, dest / p.name)
        return []
    try:
        if ranks and not want_traces:
            for r in range(ranks):
                try:
                    host.copy_out(cid, f"{profiler_dir.rstrip('/')}/expert_cache_rank{r}.json", dest)
                except HostError as e:
                    if "is gone" in str(e):
                        raise
            return []
        host.copy_out(cid, profiler_dir, dest)
    except HostError as e:
        return [f"copy out of {profiler_dir}: {e}"]
    return []


def telemetry_window(host: Host, cid: str, base_url: str, http: httpx.Client,
                     api: EngineAPI | None, profile: Any, *, depth: int = 166, requests: int = 3,
                     max_tokens: int = 128, stop_timeout_s: float = 120.0, dest_dir: Path,
                     max_trace_bytes: int = 0, clock: Callable[[], float] | None = None,
                     sleep: Callable[[float], Any] | None = None,
                     profiler_dir: str = DEFAULT_PROFILER_DIR, ranks: int | None = None,
                     slab_bytes: int | None = None, host_profiler_dir: Path | None = None,
                     prompts: PromptCache | None = None, idle_timeout_s: float = 60.0,
                     run_timeout_s: float = 300.0) -> TelemetryResult:
    """One profiler window on a serving engine (see the module docstring). Never raises for
    what the engine does; ConfigError only for a profile without telemetry."""
    check_telemetry(profile, True)
    clock, sleep = clock or host.now, sleep or host.sleep
    api = api or api_from_profile(profile)
    base, dest = base_url.rstrip("/"), Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    res = TelemetryResult("ok", None, depth)
    model, _ = discover_model(http, base, api, idle_timeout_s)
    prompt = (prompts or DEFAULT_CACHE).get(Tokenizer(http, base, api, model), depth)
    metrics = base + api.metrics_path if api.metrics_path else None
    before = _text(http, metrics, idle_timeout_s)
    t0 = clock()
    try:
        r = http.post(base + START_PATH, timeout=30.0)
        bad = None if r.status_code == 200 else f"{START_PATH} answered {r.status_code}" + (
            ": the profiler routes are not mounted (the engine needs --profiler-config with a "
            "profiler)" if r.status_code == 404 else "")
    except httpx.HTTPError as e:
        bad = f"{START_PATH} failed: {type(e).__name__}: {e}"
    if bad:
        res.status, res.reason = "start-failed", bad
        return res
    for _ in range(requests):
        body = {"prompt": prompt.payload, "max_tokens": max_tokens, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}}
        if model:
            body["model"] = model
        s = stream_completion(http, base + api.completions_path, body, clock=clock,
                              idle_timeout_s=idle_timeout_s, run_timeout_s=run_timeout_s)
        res.runs.append(classify(s, max_tokens, ignores_eos=api.ignores_eos, depth=depth))
    status, err, res.stop_s = bounded_post(http, base + STOP_PATH, stop_timeout_s, clock=clock, sleep=sleep)
    res.window_s = clock() - t0
    if err == "timeout":
        res.status, res.reason = "stop-timeout", (
            f"{STOP_PATH} did not answer within {stop_timeout_s:g} s (abandoned; the arm's "
            f"teardown removes the engine)")
    elif err or status != 200:
        res.status, res.reason = "stop-failed", f"{STOP_PATH}: {err or f'HTTP {status}'}"
    else:
        res.acceptance, res.mean_acceptance_length = spec_acceptance(
            before, _text(http, metrics, idle_timeout_s), api)
    problems = _collect(host, cid, profiler_dir, dest, ranks,
                        Path(host_profiler_dir) if host_profiler_dir else None, max_trace_bytes > 0)
    folders = [dest] + ([Path(host_profiler_dir)] if host_profiler_dir else [])
    res.trace_bytes_kept, res.traces_removed = cap_traces(folders, max_trace_bytes)
    res.files = [str(p) for p in telemetry_files(dest)]
    if res.files or res.status == "ok":
        res.report = load_report(dest, ranks=ranks, slab_bytes=slab_bytes)
        res.report.problems[:0] = problems
    if res.status != "ok":
        return res
    if not res.report or not res.report.ranks:
        res.status = "no-telemetry"
        res.reason = "; ".join(problems) or (
            f"no expert_cache_rank<N>.json in {profiler_dir} after the stop (is "
            f"{TELEMETRY_ENV}=1 set and the profiler dir right?)")
    elif res.report.problems:
        res.status, res.reason = "partial", "; ".join(res.report.problems)
    return res

"""Concurrency sweep and goodput at an SLO (the discipline of seeds 000 and 001).

For each concurrency level, that many workers (threads sharing one httpx client) send
streamed completions back to back for ``duration_s``: the same prompt of ``prompt_tokens``
(``arms.prompts``), a fixed ``output_tokens`` with ``ignore_eos``. No request starts after the
level's duration, none lasts past ``request_timeout_s`` (+ the idle timeout), and a level
never sends more than ``max_requests_per_level``.

Per level: TTFT p95, TPOT p95 (TPOT = (end - TTFT) / (tokens - 1)), req/s and output tok/s
over the level's span (first start to last end), the share of requests meeting the SLO (their
own TTFT and TPOT within it; failures never meet it) and goodput (req/s meeting it). A level
meets the SLO when both p95s are within it and at most 5 % of its requests failed. The knee is
the lowest level whose req/s is within ``knee_tolerance`` of the best; ``goodput_at_slo`` is
the best goodput among levels meeting the SLO (0.0 when none does).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass

import httpx

from .errors import ConfigError
from .measure import Clock, discover_model, stream_completion
from .prompts import DEFAULT_CACHE, EngineAPI, PromptCache, Tokenizer

MAX_ERROR_SHARE = 0.05


@dataclass(frozen=True)
class SweepPlan:
    levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    duration_s: float = 20.0
    output_tokens: int = 200
    slo_ttft_s: float = 1.0
    slo_tpot_s: float = 0.050
    prompt_tokens: int = 166
    request_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0
    max_requests_per_level: int = 5000
    knee_tolerance: float = 0.05

    def __post_init__(self) -> None:
        if not self.levels or any(type(c) is not int or c < 1 for c in self.levels):
            raise ConfigError(f"levels must be positive integers, got {self.levels!r}")
        if self.output_tokens < 2 or self.prompt_tokens < 1:
            raise ConfigError("output_tokens must be >= 2 and prompt_tokens >= 1")
        if min(self.duration_s, self.slo_ttft_s, self.slo_tpot_s, self.request_timeout_s,
               self.idle_timeout_s) <= 0 or self.max_requests_per_level < 1:
            raise ConfigError("durations, SLOs, timeouts and the request cap must be positive")


@dataclass(frozen=True)
class Sample:
    """One request of a level; times in seconds from the level start."""

    start_s: float
    end_s: float
    ttft_s: float | None
    tpot_s: float | None
    output_tokens: int
    ok: bool
    reason: str | None = None


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    span_s: float
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    req_s: float
    output_tok_s: float
    slo_pct: float
    goodput_req_s: float
    meets_slo: bool
    first_error: str | None = None


@dataclass(frozen=True)
class SweepResult:
    levels: list[LevelResult]
    knee: int | None
    goodput_at_slo: float
    goodput_level: int | None
    plan: SweepPlan
    wall_s: float | None = None

    def to_dict(self) -> dict:
        return {"levels": [asdict(x) for x in self.levels], "knee": self.knee,
                "goodput_at_slo": self.goodput_at_slo, "goodput_level": self.goodput_level,
                "slo": {"ttft_p95_s": self.plan.slo_ttft_s, "tpot_p95_s": self.plan.slo_tpot_s},
                "output_tokens": self.plan.output_tokens, "duration_s": self.plan.duration_s,
                "wall_s": self.wall_s}


def percentile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated ``q``-th percentile (0..100); None for no values."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize_level(concurrency: int, samples: list[Sample], plan: SweepPlan) -> LevelResult:
    ok = [x for x in samples if x.ok]
    errors = len(samples) - len(ok)
    span = max((x.end_s for x in samples), default=0.0) - min((x.start_s for x in samples),
                                                             default=0.0)
    ttft = percentile([x.ttft_s for x in ok if x.ttft_s is not None], 95)
    tpot = percentile([x.tpot_s for x in ok if x.tpot_s is not None], 95)
    good = [x for x in ok if x.ttft_s is not None and x.ttft_s <= plan.slo_ttft_s
            and x.tpot_s is not None and x.tpot_s <= plan.slo_tpot_s]
    per_s = 1.0 / span if span > 0 else 0.0
    meets = (ttft is not None and tpot is not None and ttft <= plan.slo_ttft_s
             and tpot <= plan.slo_tpot_s and errors <= MAX_ERROR_SHARE * len(samples))
    return LevelResult(concurrency, len(samples), errors, span, ttft, tpot, len(ok) * per_s,
                       sum(x.output_tokens for x in ok) * per_s,
                       100.0 * len(good) / len(samples) if samples else 0.0,
                       len(good) * per_s, meets,
                       next((x.reason for x in samples if not x.ok), None))


def find_knee(levels: list[LevelResult], tolerance: float = 0.05) -> int | None:
    """Lowest concurrency whose req/s is within ``tolerance`` of the best level's."""
    served = [x for x in levels if x.req_s > 0]
    if not served:
        return None
    best = max(x.req_s for x in served)
    return min(x.concurrency for x in served if x.req_s >= (1 - tolerance) * best)


def _sample(s, t0: float, t_req: float, t_end: float) -> Sample:
    comp = (s.usage or {}).get("completion_tokens")
    reason = s.error or (None if isinstance(comp, int) else "no usage in the stream")
    if reason is None and (s.ttft_s is None or s.wall_s is None or comp < 1):
        reason = "no token streamed"
    if reason:
        return Sample(t_req - t0, t_end - t0, s.ttft_s, None, 0, False, reason)
    tpot = (s.wall_s - s.ttft_s) / (comp - 1) if comp > 1 else None
    return Sample(t_req - t0, t_end - t0, s.ttft_s, tpot, comp, True)


def run_level(client: httpx.Client, url: str, body: dict, concurrency: int, plan: SweepPlan,
              clock: Clock = time.monotonic) -> list[Sample]:
    """``concurrency`` workers sending ``body`` back to back for the plan's duration."""
    lock = threading.Lock()
    samples: list[Sample] = []
    sent = [0]
    t0 = clock()
    stop_at = t0 + plan.duration_s

    def worker() -> None:
        while True:
            with lock:
                if clock() >= stop_at or sent[0] >= plan.max_requests_per_level:
                    return
                sent[0] += 1
            t_req = clock()
            s = stream_completion(client, url, body, idle_timeout_s=plan.idle_timeout_s,
                                  run_timeout_s=plan.request_timeout_s, clock=clock)
            x = _sample(s, t0, t_req, clock())
            with lock:
                samples.append(x)

    threads = [threading.Thread(target=worker, name=f"sweep-c{concurrency}-{i}", daemon=True)
               for i in range(concurrency)]
    for t in threads:
        t.start()
    limit = plan.duration_s + plan.request_timeout_s + plan.idle_timeout_s + 5.0
    for t in threads:
        t.join(max(0.0, t0 + limit - clock()))
    with lock:
        return list(samples)


def run_sweep(base_url: str, api: EngineAPI, plan: SweepPlan, *, http: httpx.Client | None = None,
              clock: Clock = time.monotonic, prompts: PromptCache | None = None) -> SweepResult:
    """Sweep the engine at ``base_url`` (already serving) through ``plan.levels``."""
    t_start, base = clock(), base_url.rstrip("/")
    top = max(plan.levels)
    client = http or httpx.Client(
        timeout=httpx.Timeout(plan.idle_timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=top + 4, max_keepalive_connections=top + 4))
    try:
        model, _ = discover_model(client, base, api, plan.idle_timeout_s)
        prompt = (prompts or DEFAULT_CACHE).get(Tokenizer(client, base, api, model),
                                                plan.prompt_tokens)
        body = {"prompt": prompt.payload, "max_tokens": plan.output_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        if model:
            body["model"] = model
        levels = [summarize_level(c, run_level(client, base + api.completions_path, body, c,
                                               plan, clock), plan)
                  for c in plan.levels]
    finally:
        if http is None:
            client.close()
    meeting = [x for x in levels if x.meets_slo]
    best = max(meeting, key=lambda x: x.goodput_req_s, default=None)
    return SweepResult(levels, find_knee(levels, plan.knee_tolerance),
                       best.goodput_req_s if best else 0.0, best.concurrency if best else None,
                       plan, clock() - t_start)


def format_sweep(r: SweepResult) -> str:
    """P0-style table: one line per level, then the knee and goodput at the SLO."""
    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)
    lines = [f"{'conc':>5}  {'TTFT p95 s':>10}  {'TPOT p95 s':>10}  {'req/s':>8}  "
             f"{'out tok/s':>9}  {'SLO met':>7}  {'goodput':>8}  errors"]
    for x in r.levels:
        lines.append(f"{x.concurrency:>5}  {f(x.ttft_p95_s, '.3f'):>10}  "
                     f"{f(x.tpot_p95_s, '.4f'):>10}  {x.req_s:>8.3f}  {x.output_tok_s:>9.1f}  "
                     f"{x.slo_pct:>6.0f}%  {x.goodput_req_s:>8.3f}  {x.errors}"
                     + (f" ({x.first_error})" if x.first_error else ""))
    p = r.plan
    at = f" @ concurrency {r.goodput_level}" if r.goodput_level else " (no level meets the SLO)"
    lines.append(f"knee {r.knee if r.knee is not None else '-'} | goodput_at_slo "
                 f"{r.goodput_at_slo:.3f} req/s{at} | SLO TTFT p95 <= {p.slo_ttft_s:g} s, "
                 f"TPOT p95 <= {p.slo_tpot_s:g} s, {p.output_tokens} output tokens")
    return "\n".join(lines)

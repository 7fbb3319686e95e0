"""The engine's own figures for each measured run, paired by /metrics scrapes around it.

vLLM reports no per-request timings in its responses (llama.cpp does: ``timings``), only
Prometheus counters and histograms on ``/metrics``. Runs are measured one request at a time, so a
scrape just before a run and one just after it differ by exactly that request: its prompt and
generation tokens, its TTFT, prefill and decode times as the engine's scheduler saw them, and the
prompt tokens it served from its prefix cache. ``ScrapePairing`` does the scraping through the
measurement's own per-run hook (``measure_engine(conditions=...)``: ``start()`` before a run,
``stop()`` after it, the result kept on the run as ``RunResult.conditions``).

What each side times, for the decode rate:
  * the client: ``usage.completion_tokens / (wall - ttft)``, N tokens over first text chunk ->
    end of stream (``arms.measure.classify``);
  * vLLM v1: ``request_decode_time_seconds`` runs from the first token to the last one
    (``RequestStateStats.first_token_ts`` -> ``last_token_ts``), N - 1 decode steps.
So the client reads ``N / (N - 1)`` high by construction (+0.39 % at N = 256, +1.6 % at N = 64)
and low by whatever the stream's tail adds (the last chunk's and the usage chunk's way out).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields

import httpx

from arms.measure import counters, moved

# vLLM v1's names (0.10 -> 0.32): counters and the _sum/_count of histograms
VLLM_NAMES = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "requests": "vllm:e2e_request_latency_seconds_count",
    "e2e_s": "vllm:e2e_request_latency_seconds_sum",
    "ttft_s": "vllm:time_to_first_token_seconds_sum",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "decode_s": "vllm:request_decode_time_seconds_sum",
    "inter_token_s": "vllm:inter_token_latency_seconds_sum",
    "inter_tokens": "vllm:inter_token_latency_seconds_count",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}


@dataclass(frozen=True)
class EngineRun:
    """One request as the engine counted and timed it (the deltas of two scrapes)."""
    requests: float
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    inter_token_s: float | None = None
    inter_tokens: float | None = None
    prefix_cache_hits: float | None = None
    e2e_s: float | None = None
    prefill_s: float | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """The engine's own decode rate: N - 1 decode steps over first -> last token."""
        n = self.generation_tokens
        if n is None or n < 2 or not self.decode_s or self.decode_s <= 0:
            return None
        return (n - 1) / self.decode_s

    @property
    def itl_tok_s(self) -> float | None:
        """The same from the inter-token latency histogram: its count over its sum."""
        if not self.inter_tokens or not self.inter_token_s:
            return None
        return self.inter_tokens / self.inter_token_s


def delta(before: dict[str, float], after: dict[str, float], names: dict[str, str] = VLLM_NAMES) -> dict:
    """What moved between two scrapes, by our key; a name absent from either (or that went back:
    the engine restarted) is None."""
    return {key: moved(before, after, name) for key, name in names.items()}


def engine_run(d: dict) -> EngineRun | None:
    """The ``EngineRun`` of one run's paired deltas (``ScrapePairing.stop``'s dict), or None when
    the scrapes did not pair with exactly one request (another client used the engine)."""
    if not isinstance(d, dict) or d.get("requests") != 1:
        return None
    return EngineRun(**{f.name: d.get(f.name) for f in fields(EngineRun)})     # its fields: VLLM_NAMES' keys


class ScrapePairing:
    """A ``RunConditions`` for ``measure_engine`` that scrapes ``/metrics`` before and after each
    run; ``stop()`` returns the deltas (a dict of ``VLLM_NAMES``' keys), which the run keeps as its
    ``conditions`` (it carries no ``foreign_cores``, so it never marks a run contended)."""

    def __init__(self, base_url: str, names: dict[str, str] = VLLM_NAMES, timeout_s: float = 10.0,
                 settle_s: float = 2.0):
        self.url = base_url.rstrip("/") + "/metrics"
        self.names = names
        self.timeout_s, self.settle_s = timeout_s, settle_s
        self._before: dict[str, float] = {}

    def _scrape(self) -> dict[str, float]:
        """The named counters now; {} when /metrics does not answer (the run then pairs with nothing:
        ``engine_run`` gives None, and the measurement itself goes on)."""
        try:
            r = httpx.get(self.url, timeout=self.timeout_s)
            r.raise_for_status()
        except httpx.HTTPError:
            return {}
        return counters(r.text, list(self.names.values()))

    def start(self) -> None:
        self._before = self._scrape()

    def stop(self) -> dict:
        """The deltas since ``start``. vLLM records a request's histograms after it has handed the
        last chunk on, so a scrape right after the stream closed can miss it: scrape again (up
        to ``settle_s``) until the request counter moved."""
        deadline = time.monotonic() + self.settle_s
        while True:
            d = delta(self._before, self._scrape(), self.names)
            if d.get("requests") != 0 or time.monotonic() >= deadline:
                return d
            time.sleep(0.05)

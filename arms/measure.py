"""Measure an arm: single-stream decode at exact prompt depths, from the engine's usage counters.

decode tok/s = ``usage.completion_tokens / (wall - ttft)`` of a streamed completion
(``stream_options.include_usage``). Counting SSE chunks is wrong under speculative decoding,
where one chunk carries every token a step accepted, so chunks are only kept as evidence.
Per depth: one 64-token warm pass first (once, at the first depth), then ``runs`` runs at
temperature 0; the median and MAD (median absolute deviation, unscaled) of the valid runs.
Every request defeats the engine's prompt cache by the profile's method (``cache_defeat``:
``cache_prompt: false``, a unique ``cache_salt``, or a per-run prompt of the same depth, see
arms.prompts.CACHE_DEFEATS), so TTFT and prefill tok/s are the engine's real ones; where
/metrics counts prefix-cache hits (vLLM), hits during the measured runs mean the defeat failed:
the depths' TTFT and prefill medians are left out (None) and the table says why.

A run is invalid, with its reason, on: a non-200, malformed SSE, an error object in the
stream, no usage, a stall (no byte for ``idle_timeout_s``) or a run past ``run_timeout_s``
(so one run never takes longer than the sum of the two), a prompt that was not the depth
asked, or fewer tokens than asked on an engine that ignores EOS. More than
``max_invalid_per_depth`` invalid runs at a depth make the arm ``invalid`` (never a zero).
Spec-decode acceptance comes from /metrics counter deltas across the measured runs only;
absent counters give None ("n/a").

With a ``conditions`` probe (``Host.conditions``) every run records the box during it (load,
foreign CPU load, CPU frequency, GPU clocks) and a run taken while another process held the box
is marked ``contended`` (``arms.conditions``): still valid, its figures kept, but the night's
comparisons leave it out. Without one (``--url`` mode, tests) runs carry neither field.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from . import httpio
from .conditions import RunConditions, contention
from .errors import ConfigError, MeasurementError
from .prompts import (DEFAULT_CACHE, LLAMACPP_API, VLLM_API, EngineAPI, PromptCache,
                      Tokenizer, api_from_profile)
from .sse import CompletionStream, SSEParser

log = logging.getLogger("arms.measure")

__all__ = ["MeasurePlan", "RunResult", "DepthResult", "Measurement", "EngineAPI", "VLLM_API",
           "LLAMACPP_API", "api_from_profile", "measure_engine", "format_table",
           "stream_completion", "classify", "counters", "spec_acceptance", "discover_model"]

Clock = Callable[[], float]


@dataclass(frozen=True)
class MeasurePlan:
    depths: tuple[int, ...] = (166, 1087, 4064)
    runs: int = 3
    warm_tokens: int = 64
    max_tokens: int = 256
    temperature: float = 0.0
    run_timeout_s: float = 300.0       # one run, start to end of stream
    idle_timeout_s: float = 60.0       # no byte for this long = a stall
    max_invalid_per_depth: int = 1     # more than this at any depth: the arm is invalid
    max_model_len: int | None = None   # None: ask the engine (/v1/models)
    background_cores: float = 0.0      # other processes' CPU load on the box at rest (arms.conditions)

    def __post_init__(self) -> None:
        if not self.depths or any(type(d) is not int or d < 1 for d in self.depths):
            raise ConfigError(f"depths must be positive integers, got {self.depths!r}")
        for name in ("runs", "max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        if self.warm_tokens < 0 or self.max_invalid_per_depth < 0:
            raise ConfigError("warm_tokens and max_invalid_per_depth must be >= 0")
        if self.run_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ConfigError("run_timeout_s and idle_timeout_s must be positive")


@dataclass(frozen=True)
class RunResult:
    decode_tok_s: float | None
    ttft_s: float | None
    completion_tokens: int | None
    prompt_tokens: int | None
    finish_reason: str | None
    valid: bool
    reason: str | None
    wall_s: float | None
    text: str = ""
    prefill_tok_s: float | None = None
    chunks: int = 0                    # SSE chunks with text (evidence only)
    engine_decode_tok_s: float | None = None   # llama.cpp timings.predicted_per_second
    engine_prefill_tok_s: float | None = None  # llama.cpp timings.prompt_per_second
    prompt_tag: str = ""               # "": the depth's fixed prompt; else its per-run variant
    # llama.cpp's own counts and times (timings.prompt_n/_ms, predicted_n/_ms): the server's
    # prompt_ms spans slot start to the first token's sampling, so ttft_s * 1e3 >= it always
    # (the client's TTFT adds the request's way in and the first chunk's way out)
    engine_prompt_n: int | None = None
    engine_prompt_ms: float | None = None
    engine_predicted_n: int | None = None
    engine_predicted_ms: float | None = None
    conditions: dict | None = None     # the box during the run (arms.conditions), None: not probed
    contended: str | None = None       # why another process held the box during the run, None: it did not


@dataclass(frozen=True)
class DepthResult:
    depth: int
    runs: list[RunResult] = field(default_factory=list)
    median_decode_tok_s: float | None = None
    mad_decode_tok_s: float | None = None
    median_ttft_s: float | None = None
    median_prefill_tok_s: float | None = None
    skipped_reason: str | None = None

    @property
    def invalid_runs(self) -> int:
        return sum(not r.valid for r in self.runs)

    @classmethod
    def of(cls, depth: int, runs: list[RunResult]) -> DepthResult:
        ok = [r for r in runs if r.valid and r.decode_tok_s is not None]
        dec = [r.decode_tok_s for r in ok]
        med = statistics.median(dec) if dec else None
        return cls(depth, list(runs), med,
                   statistics.median(abs(x - med) for x in dec) if dec else None,
                   _median([r.ttft_s for r in ok]), _median([r.prefill_tok_s for r in ok]))


@dataclass(frozen=True)
class Measurement:
    depths: dict[int, DepthResult]
    acceptance: float | None
    outcome: str                       # "measured" | "invalid"
    reason: str | None = None
    mean_acceptance_length: float | None = None
    warm: RunResult | None = None
    wall_s: float | None = None        # the measurement's own wall time
    max_tokens: int = 256
    ignores_eos: bool = False
    profile: str = ""
    model: str | None = None
    cache_hit_tokens: float | None = None   # prompt tokens the engine's prefix cache served (/metrics)

    def to_dict(self, include_text: bool = False) -> dict[str, Any]:
        def run(r: RunResult) -> dict[str, Any]:
            d = asdict(r)
            if not include_text:
                d.pop("text")
            for k in ("conditions", "contended"):      # absent when not probed: the old records' shape
                if d[k] is None:
                    d.pop(k)
            return d
        return {
            "outcome": self.outcome, "reason": self.reason, "profile": self.profile,
            "model": self.model, "max_tokens": self.max_tokens, "ignores_eos": self.ignores_eos,
            "acceptance": self.acceptance, "mean_acceptance_length": self.mean_acceptance_length,
            "wall_s": self.wall_s, "warm": run(self.warm) if self.warm else None,
            "cache_hit_tokens": self.cache_hit_tokens,
            "depths": {str(d): {"median_decode_tok_s": r.median_decode_tok_s,
                                "mad_decode_tok_s": r.mad_decode_tok_s,
                                "median_ttft_s": r.median_ttft_s,
                                "median_prefill_tok_s": r.median_prefill_tok_s,
                                "skipped_reason": r.skipped_reason,
                                "runs": [run(x) for x in r.runs]}
                       for d, r in self.depths.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        depths = {int(k): DepthResult(int(k), [RunResult(**{"text": "", **r}) for r in v["runs"]],
                                      v["median_decode_tok_s"], v["mad_decode_tok_s"],
                                      v["median_ttft_s"], v.get("median_prefill_tok_s"),
                                      v.get("skipped_reason"))
                  for k, v in d["depths"].items()}
        warm = RunResult(**{"text": "", **d["warm"]}) if d.get("warm") else None
        return cls(depths, d["acceptance"], d["outcome"], d.get("reason"),
                   d.get("mean_acceptance_length"), warm, d.get("wall_s"),
                   d.get("max_tokens", 256), d.get("ignores_eos", False), d.get("profile", ""),
                   d.get("model"), d.get("cache_hit_tokens"))


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


# -- one streamed completion ------------------------------------------------------------------
def stream_completion(client: httpx.Client, url: str, body: dict, *, idle_timeout_s: float,
                      run_timeout_s: float,
                      clock: Clock = time.monotonic) -> CompletionStream:
    """POST a streaming completion and read it to the end, the first problem, or a timeout."""
    s, t0 = CompletionStream(), clock()
    timeout = httpx.Timeout(idle_timeout_s, connect=min(idle_timeout_s, 30.0), pool=run_timeout_s)
    try:
        with httpio.open_response(client, "POST", url, json=body, timeout=timeout) as r:
            s.status = r.status_code
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {_error_message(r.read())}"
                return s
            parser = SSEParser()
            for chunk in r.iter_bytes():
                t = clock() - t0
                for ev in parser.feed(chunk):
                    s.error = s.add(ev, t)
                    if s.error:
                        return s
                if parser.problems:
                    s.error = f"malformed SSE: {parser.problems[0]}"
                    return s
                if t > run_timeout_s:
                    s.error = f"run timeout: still streaming after {run_timeout_s:g} s"
                    return s
            t = clock() - t0
            for ev in parser.close():
                s.error = s.error or s.add(ev, t)
            if parser.problems and not s.error:
                s.error = f"malformed SSE: {parser.problems[0]}"
            s.wall_s = s.wall_s if s.done else t
    except httpx.ReadTimeout:
        s.error = f"stall: no data for {idle_timeout_s:g} s after {clock() - t0:.1f} s"
    except httpx.TimeoutException as e:
        s.error = f"timeout ({type(e).__name__}) after {clock() - t0:.1f} s"
    except httpx.HTTPError as e:
        s.error = f"{type(e).__name__}: {e}"
    return s


def _clip(s: str, n: int = 160) -> str:
    return s if len(s) <= n else s[:n] + "..."


def _error_message(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message", err) if isinstance(err, dict) else err
        return str(msg)[:200]
    except ValueError:
        return text[:200] or "(empty body)"


def _count(x: Any) -> int | None:
    """An integer token count; None for anything else (a bool, a float, a string)."""
    return x if type(x) is int else None


def _number(x: Any) -> float | None:
    """A JSON number as a float; None for anything else (a bool, a string, null)."""
    return float(x) if type(x) in (int, float) else None


def sanity(s: CompletionStream, asked: int) -> str | None:
    """Why the engine's own figures for one stream cannot be trusted, or None."""
    u = s.usage if isinstance(s.usage, dict) else {}
    comp = u.get("completion_tokens")
    if type(comp) is not int:
        return f"usage.completion_tokens is not an integer: {_clip(repr(comp), 60)}"
    if comp <= 0:
        return f"usage.completion_tokens is {comp} though text was streamed"
    if comp > asked:
        return f"usage.completion_tokens {comp} exceeds the max_tokens {asked} asked for"
    if comp < s.chunks:
        return f"usage.completion_tokens {comp} is fewer than the {s.chunks} text chunks received"
    prompt = u.get("prompt_tokens")
    if prompt is not None and (type(prompt) is not int or prompt < 0):
        return f"usage.prompt_tokens is not a token count: {_clip(repr(prompt), 60)}"
    if s.ttft_s is not None and s.ttft_s < 0 or s.wall_s is not None and s.ttft_s is not None \
            and s.wall_s <= s.ttft_s:
        return f"no decode interval: the stream ended {s.wall_s} s after the request, first token at {s.ttft_s} s"
    return None


def classify(s: CompletionStream, asked: int, *, ignores_eos: bool,
             depth: int | None = None, prompt_tag: str = "") -> RunResult:
    """One stream as a RunResult: the decode figure, and whether (or why not) it is valid.
    Figures that fail ``sanity`` are kept as evidence only: the run is invalid."""
    u = s.usage if isinstance(s.usage, dict) else {}
    comp, prompt = _count(u.get("completion_tokens")), _count(u.get("prompt_tokens"))
    timed = s.ttft_s is not None and s.wall_s is not None and s.wall_s > s.ttft_s >= 0
    decode = comp / (s.wall_s - s.ttft_s) if timed and comp is not None and comp > 1 else None
    prefill = prompt / s.ttft_s if prompt is not None and s.ttft_s and s.ttft_s > 0 else None
    timings = s.timings if isinstance(s.timings, dict) else {}
    engine, engine_prefill = timings.get("predicted_per_second"), timings.get("prompt_per_second")
    if s.error:
        reason = s.error
    elif s.usage is None:
        reason = "no usage in the stream (stream_options.include_usage not honoured)"
    elif not isinstance(s.usage, dict) or "completion_tokens" not in u:
        reason = f"usage without completion_tokens: {_clip(repr(s.usage))}"
    elif s.ttft_s is None:
        reason = "no token streamed"
    elif (bad := sanity(s, asked)) is not None:
        reason = bad
    elif decode is None:
        reason = f"too few tokens to time decode ({comp})"
    elif ignores_eos and comp < asked:
        reason = (f"early stop: {comp} of {asked} tokens (finish_reason {s.finish_reason}) "
                  f"on an engine that ignores EOS")
    elif depth is not None and prompt is not None and prompt != depth:
        reason = (f"prompt was {prompt} tokens by the completion's usage.prompt_tokens, not the "
                  f"depth {depth} the tokenize endpoint counted: the two endpoints disagree")
    else:
        reason = None
    return RunResult(decode, s.ttft_s, comp, prompt, s.finish_reason, reason is None,
                     reason, s.wall_s, s.text, prefill, s.chunks,
                     float(engine) if type(engine) in (int, float) else None,
                     float(engine_prefill) if type(engine_prefill) in (int, float) else None,
                     prompt_tag, _count(timings.get("prompt_n")), _number(timings.get("prompt_ms")),
                     _count(timings.get("predicted_n")), _number(timings.get("predicted_ms")))


# -- /metrics ---------------------------------------------------------------------------------
def counters(text: str | None, names: list[str]) -> dict[str, float]:
    """Each named counter summed over its label sets; a name absent from ``text`` is absent."""
    if not text:
        return {}
    want = {n: {n, n + "_total"} if not n.endswith("_total") else {n} for n in names}
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                for name, spellings in want.items():
                    if smp.name in spellings:
                        out[name] = out.get(name, 0.0) + smp.value
    except (ValueError, TypeError):
        return {}
    return out


def moved(before: dict[str, float], after: dict[str, float], name: str | None) -> float | None:
    """How far counter ``name`` moved between two ``counters`` readings; None when either lacks it
    or it went back (the engine restarted)."""
    if not name or name not in before or name not in after or after[name] < before[name]:
        return None
    return after[name] - before[name]


def spec_acceptance(before: str | None, after: str | None,
                    api: EngineAPI) -> tuple[float | None, float | None]:
    """(acceptance = accepted/draft tokens, mean acceptance length = 1 + accepted/drafts) from
    two /metrics scrapes; None for each when the counters are absent, reset or did not move."""
    names = [n for n in (api.spec_accepted_metric, api.spec_draft_tokens_metric,
                         api.spec_drafts_metric) if n]
    b, a = counters(before, names), counters(after, names)
    acc, drafted, drafts = (moved(b, a, api.spec_accepted_metric), moved(b, a, api.spec_draft_tokens_metric),
                            moved(b, a, api.spec_drafts_metric))
    rate = acc / drafted if acc is not None and drafted else None
    length = 1 + acc / drafts if acc is not None and drafts else None
    return rate, length


def _cache_hits(before: str | None, after: str | None, api: EngineAPI) -> float | None:
    """Prompt tokens the engine served from its prefix cache between two scrapes; None: unknown."""
    name = api.prefix_hits_metric
    if not name:
        return None
    return moved(counters(before, [name]), counters(after, [name]), name)


def cache_note(hits: float, method: str) -> str:
    return (f"{hits:,.0f} prompt tokens came from the engine's prefix cache during the measured "
            f"runs: TTFT and prefill are not the engine's real ones and are left out (readiness."
            f"cache_defeat {method!r} did not defeat the cache; 'prefix' works on any engine)")


def _get_text(client: httpx.Client, url: str, timeout: float) -> str | None:
    try:
        r = httpio.get(client, url, timeout=timeout)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def discover_model(client: httpx.Client, base: str, api: EngineAPI,
              timeout: float) -> tuple[str | None, int | None]:
    """(served model id, max model length) from the models route, when it answers."""
    if not api.models_path:
        return None, None
    try:
        r = httpio.get(client, base + api.models_path, timeout=timeout)
        m = r.json()["data"][0] if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None, None
    if not isinstance(m, dict):
        return None, None
    length = m.get("max_model_len") or (m.get("meta") or {}).get("n_ctx")
    return m.get("id"), length if isinstance(length, int) and length > 0 else None


# -- the measurement --------------------------------------------------------------------------
def measure_engine(base_url: str, plan: MeasurePlan, api: EngineAPI, *,
                   http: httpx.Client | None = None, clock: Clock = time.monotonic,
                   prompts: PromptCache | None = None,
                   conditions: RunConditions | None = None) -> Measurement:
    """Measure the engine at ``base_url`` (already serving) under ``plan``. ``conditions``
    (``Host.conditions``): started before and stopped after every run; each run keeps what it
    read and is marked ``contended`` when another process held the box (``arms.conditions``)."""
    t_start, base = clock(), base_url.rstrip("/")
    client = http or httpio.fresh_client(plan.idle_timeout_s, connect=10.0)
    try:
        model, max_len = discover_model(client, base, api, plan.idle_timeout_s)
        max_len = plan.max_model_len or max_len
        done: dict[int, DepthResult] = {}
        todo = []
        for d in plan.depths:
            if max_len is not None and d + plan.max_tokens > max_len:
                done[d] = DepthResult(d, skipped_reason=(
                    f"depth {d} + max_tokens {plan.max_tokens} exceeds max_model_len {max_len}"))
            else:
                todo.append(d)
        meta = dict(max_tokens=plan.max_tokens, ignores_eos=api.ignores_eos, profile=api.name,
                    model=model)
        if not todo:
            return Measurement({d: done[d] for d in plan.depths}, None, "invalid",
                               "no depth fits max_model_len", wall_s=clock() - t_start, **meta)
        unique = api.cache_defeat == "prefix"
        tags = [f"{d}-{k}" for d in todo for k in range(plan.runs)] + ["warm"] if unique else []
        try:
            tok = Tokenizer(client, base, api, model)
            cache = prompts or DEFAULT_CACHE
            built = {} if unique else {d: cache.get(tok, d) for d in todo}
            variants = {t: cache.get(tok, todo[0] if t == "warm" else int(t.split("-")[0]),
                                     head=f"Log {t}.\n\n") for t in tags}
        except MeasurementError as e:      # the engine's answers cannot give a prompt: invalid
            return Measurement({d: done.get(d) or DepthResult(d, skipped_reason=f"not measured: {e}")
                                for d in plan.depths}, None, "invalid", str(e),
                               wall_s=clock() - t_start, **meta)

        salt = f"offload-tuner-{uuid.uuid4().hex}"
        sent = 0

        def run(depth: int, n: int, tag: str = "") -> RunResult:
            nonlocal sent
            sent += 1
            prompt = variants[tag] if unique else built[depth]
            body: dict[str, Any] = {"prompt": prompt.payload, "max_tokens": n,
                                    "temperature": plan.temperature, "stream": True,
                                    "stream_options": {"include_usage": True}}
            if model:
                body["model"] = model
            if api.cache_defeat == "cache_prompt":   # prefill and TTFT are the engine's real ones
                body["cache_prompt"] = False
            elif api.cache_defeat == "salt":
                body["cache_salt"] = f"{salt}-{sent}"
            if conditions is not None:
                conditions.start()
            s = stream_completion(client, base + api.completions_path, body, clock=clock,
                                  idle_timeout_s=plan.idle_timeout_s,
                                  run_timeout_s=plan.run_timeout_s)
            r = classify(s, n, ignores_eos=api.ignores_eos, depth=depth,
                         prompt_tag=tag if unique else "")
            if conditions is None:
                return r
            cond = conditions.stop()
            why = contention(cond, background=plan.background_cores)
            if why:
                log.info("[measure depth %d] run contended: %s", depth, why)
            return dataclasses.replace(r, conditions=cond, contended=why)

        warm = run(todo[0], plan.warm_tokens, "warm") if plan.warm_tokens else None
        metrics_url = base + api.metrics_path if api.metrics_path else None
        before = _get_text(client, metrics_url, plan.idle_timeout_s) if metrics_url else None
        why_invalid = None
        for d in todo:
            if why_invalid:
                done[d] = DepthResult(d, skipped_reason=f"not measured: {why_invalid}")
                continue
            runs: list[RunResult] = []
            log.info("[measure depth %d] %d runs of %d tokens", d, plan.runs, plan.max_tokens)
            while len(runs) < plan.runs:
                runs.append(run(d, plan.max_tokens, f"{d}-{len(runs)}"))
                bad = sum(not r.valid for r in runs)
                if bad > plan.max_invalid_per_depth:
                    why_invalid = (f"{bad} of {len(runs)} runs invalid at depth {d} (limit "
                                   f"{plan.max_invalid_per_depth}): {runs[-1].reason}")
                    break
            done[d] = DepthResult.of(d, runs)
            if not why_invalid and done[d].median_decode_tok_s is None:
                why_invalid = (f"no valid run at depth {d} ({len(runs)} run(s)): "
                               f"{next((r.reason for r in runs if r.reason), 'no decode figure')}")
        after = _get_text(client, metrics_url, plan.idle_timeout_s) if metrics_url else None
        rate, length = spec_acceptance(before, after, api)
        hits = _cache_hits(before, after, api)
        if hits:                           # the defeat failed: TTFT and prefill are not the engine's
            log.warning("[measure] %s", cache_note(hits, api.cache_defeat))
            done = {d: dataclasses.replace(r, median_ttft_s=None, median_prefill_tok_s=None)
                    for d, r in done.items()}
        return Measurement({d: done[d] for d in plan.depths}, rate,
                           "invalid" if why_invalid else "measured", why_invalid, length, warm,
                           clock() - t_start, **meta, cache_hit_tokens=hits)
    finally:
        if http is None:
            client.close()


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(m: Measurement) -> str:
    """Seed-style: depth x median decode tok/s, MAD, TTFT, valid runs; acceptance below."""
    lines = [f"{'depth':>7}  {'decode tok/s':>12}  {'MAD':>7}  {'TTFT s':>7}  "
             f"{'prefill tok/s':>13}  valid"]
    for d, r in m.depths.items():
        if r.skipped_reason:
            lines.append(f"{d:>7}  skipped: {r.skipped_reason}")
            continue
        f = _fmt
        lines.append(f"{d:>7}  {f(r.median_decode_tok_s, '.2f'):>12}  "
                     f"{f(r.mad_decode_tok_s, '.2f'):>7}  {f(r.median_ttft_s, '.3f'):>7}  "
                     f"{f(r.median_prefill_tok_s, '.1f'):>13}  "
                     f"{len(r.runs) - r.invalid_runs}/{len(r.runs)}")
        lines += [f"{'':>9}run {i + 1}: invalid: {x.reason}" for i, x in enumerate(r.runs)
                  if not x.valid]
    acc = "n/a" if m.acceptance is None else f"{m.acceptance:.1%}"
    if m.mean_acceptance_length is not None:
        acc += f" (mean acceptance length {m.mean_acceptance_length:.2f})"
    if m.cache_hit_tokens:
        lines.append(cache_note(m.cache_hit_tokens, "of the profile"))
    tail = f"acceptance {acc} | outcome {m.outcome}"
    if m.reason:
        tail += f": {m.reason}"
    if m.wall_s is not None:
        tail += f" | {m.wall_s:.1f} s"
    return "\n".join(lines + [tail])

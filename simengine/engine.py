"""Request handling of the simulated engine without sockets: one ``EngineCore`` per Behaviour.

``route(core, method, path, raw_body)`` answers one request as a ``Response``: a status, a
content type and either a whole body or ``chunks``, a generator of chunk payloads (one SSE
event each) for a streamed body. Time passes only through the core's ``clock`` and ``sleep``:
the HTTP server (``server.py``) gives it real ones, the simulated host (``host/simhost.py``) a
virtual clock, so the same code decides what a request returns and when each byte is due.

Timing: TTFT = queueing + base_ttft_s + prompt_tokens / prefill_tok_s, then decode goes in
steps of ``1 + accepted drafts`` tokens (one SSE chunk per step), each lasting
``tokens / rate`` (see ``textgen`` for the rate and the step plan). A streamed body waits
before yielding each chunk, so whoever iterates it experiences the engine's timing.
Stdlib only.
"""
from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from . import prefixcache, realbox, textgen
from . import tokenizer as tok
from .behaviour import Behaviour
from .wire import (
    PERMS,
    VLLM_VERSION,
    BadRequest,
    Response,
    error_response,
    json_response,
    log_line,
    metrics_text,
    parse_completion,
    sse,
    telemetry_report,
)

FAULTS = ("stall", "no-usage", "garbage", "http500")
STALL_S = 3600.0            # how long a "stall" request keeps its connection open and silent
STALL_AFTER_TOKENS = 8      # tokens streamed before the stall
_ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
ROUTES = {
    "/health": ("GET", "health"), "/v1/models": ("GET", "models"),
    "/version": ("GET", "version"), "/metrics": ("GET", "metrics"),
    "/tokenize": ("POST", "tokenize"), "/detokenize": ("POST", "detokenize"),
    "/v1/completions": ("POST", "completions"),
    "/start_profile": ("POST", "start_profile"), "/stop_profile": ("POST", "stop_profile"),
}


def check_behaviour(b: Behaviour) -> None:
    """ValueError for a Behaviour no engine can serve from."""
    if b.fault is not None and b.fault not in FAULTS:
        raise ValueError(f"unknown fault {b.fault!r}; expected one of {FAULTS}")
    if not b.decode_tok_s or min(b.decode_tok_s.values()) <= 0:
        raise ValueError("decode_tok_s needs at least one positive rate")
    if b.max_num_seqs < 1 or b.prefill_tok_s <= 0:
        raise ValueError("max_num_seqs must be >= 1 and prefill_tok_s > 0")


def route(core: EngineCore | None, method: str, path: str, raw: bytes) -> Response:
    """One request to an engine that serves from ``core`` (None: loading or failed: 503)."""
    path = path.split("?", 1)[0]
    if path not in ROUTES:
        return json_response(404, {"detail": "Not Found"})
    want, name = ROUTES[path]
    if method != want:
        return json_response(405, {"detail": "Method Not Allowed"})
    if core is None:
        if path == "/health":
            return Response(503)
        return error_response(503, "The engine is not ready (loading or failed).",
                              "ServiceUnavailableError")
    return core.handle(name, method, raw)


@dataclass
class _Completion:
    rid: str
    created: int
    ids: list[int]
    tokens: list[int]
    steps: list[tuple[int, int]]
    rate: float
    stream: bool
    include_usage: bool
    finish: str
    halt: int | None
    max_tokens: int
    head: dict = field(default_factory=dict)
    cached: int = 0                   # prompt tokens served by the prefix cache


class EngineCore:
    """Mutable serving state for one Behaviour: counters, admission, the profiler window.

    ``log`` receives whole vLLM-format lines; ``closing`` is the server's shutdown event (None
    in virtual time: requests never wait for admission and a stall is a plain ``sleep``);
    ``path_map`` turns an engine path into the path to write (a simulated container's files);
    ``stamp`` gives the log lines' timestamp (default: the local wall clock)."""

    def __init__(self, b: Behaviour, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep,
                 log: Callable[[str], object] = print, closing: threading.Event | None = None,
                 path_map: Callable[[str], str] | None = None,
                 stamp: Callable[[], str] | None = None, epoch: float | None = None):
        check_behaviour(b)
        self.b, self.clock, self.sleep, self.log = b, clock, sleep, log
        self.epoch = clock() if epoch is None else epoch      # where the landscape's drift starts
        self.closing, self.stamp = closing, stamp
        self.path_map = path_map or (lambda p: p)
        self.admit = threading.Semaphore(b.max_num_seqs)
        self.lock = threading.Lock()
        self.running = self.waiting = self.requests = 0
        self.prompt_tokens = self.generation_tokens = 0
        self.drafts = self.draft_tokens = self.accepted = 0
        self.accepted_per_pos = [0] * max(0, b.spec_k)
        self.success = {"stop": 0, "length": 0, "abort": 0}
        self.profiling = False
        self.profile_steps = 0
        self.prefix_cache = prefixcache.PrefixCache(b.prefix_caching)

    def say(self, process: str, level: str, where: str, msg: str) -> None:
        self.log(log_line(process, level, where, msg, self.stamp() if self.stamp else None))

    def handle(self, name: str, method: str, raw: bytes) -> Response:
        try:
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object")
            if body.get("model") not in (None, self.b.model) and method == "POST":
                return json_response(404, {"error": {
                    "message": f"The model `{body['model']}` does not exist.",
                    "type": "NotFoundError", "param": "model", "code": 404}})
            return getattr(self, "_" + name)(body)
        except (BadRequest, ValueError) as e:   # json.JSONDecodeError is a ValueError
            return error_response(400, str(e), "BadRequestError")

    # -- simple routes -------------------------------------------------------------------
    def _health(self, body: dict) -> Response:
        return Response(200)

    def _version(self, body: dict) -> Response:
        return json_response(200, {"version": VLLM_VERSION})

    def _models(self, body: dict) -> Response:
        b, now = self.b, int(time.time())
        perm = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": now, **PERMS, "organization": "*", "group": None}
        return json_response(200, {"object": "list", "data": [{
            "id": b.model, "object": "model", "created": now, "owned_by": "vllm",
            "root": b.model, "parent": None, "max_model_len": b.max_model_len,
            "permission": [perm]}]})

    def _tokenize(self, body: dict) -> Response:
        prompt = body.get("prompt")    # add_special_tokens: accepted; no BOS in this vocab
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string (chat 'messages' are not supported)")
        ids = tok.tokenize(prompt)
        strs = [tok.token_str(t) for t in ids] if body.get("return_token_strs") else None
        return json_response(200, {"count": len(ids), "max_model_len": self.b.max_model_len,
                                   "tokens": ids, "token_strs": strs})

    def _detokenize(self, body: dict) -> Response:
        ids = body.get("tokens")
        if not isinstance(ids, list):
            raise BadRequest("'tokens' must be a list of token ids")
        return json_response(200, {"prompt": tok.detokenize(ids)})

    def _metrics(self, body: dict) -> Response:
        text = metrics_text(self) + self.prefix_cache.metrics_text(self.b.model)
        return Response(200, "text/plain; version=0.0.4; charset=utf-8", text.encode())

    def _start_profile(self, body: dict) -> Response:
        with self.lock:
            self.profiling, self.profile_steps = True, 0
        self.say("APIServer", "INFO", "api_router.py:46", "Starting profiler...")
        return Response(200)

    def _stop_profile(self, body: dict) -> Response:
        b = self.b
        with self.lock:
            steps, self.profiling = self.profile_steps, False
        self.say("APIServer", "INFO", "api_router.py:58", "Stopping profiler...")
        if b.stop_profile_hang_s > 0:
            self.sleep(b.stop_profile_hang_s)
        if b.telemetry and b.profiler_dir:
            os.makedirs(self.path_map(b.profiler_dir), exist_ok=True)
            for rank in range(b.tp):
                rep = telemetry_report(b, rank, steps)
                path = os.path.join(b.profiler_dir, f"expert_cache_rank{rank}.json")
                real = self.path_map(path)
                with open(real + ".tmp", "w", encoding="utf-8") as f:
                    json.dump(rep, f, indent=1)
                os.replace(real + ".tmp", real)
                t = rep["totals"]
                hit = t["hits"] / t["routed"] if t["routed"] else 0.0
                self.say("EngineCore_DP0" if b.tp == 1 else f"Worker_TP{rank}", "INFO",
                         "expert_lru.py:612",
                         f"expert cache telemetry rank {rank}: hit rate {hit:.4f} "
                         f"({t['hits']:,}/{t['routed']:,}) host installs {t['installs']:,} "
                         f"read-through {t['read_through']:,} prefetched {t['prefetched']:,} "
                         f"served by prefetch (migrations) {t['served_by_prefetch']:,} "
                         f"steps {steps} -> {path}")
        self.say("APIServer", "INFO", "api_router.py:61", "Profiler stopped.")
        return Response(200)

    # -- completions ---------------------------------------------------------------------
    def _completions(self, body: dict) -> Response:
        b = self.b
        if b.fault == "http500":
            self.say("APIServer", "ERROR", "async_llm.py:480",
                     f"AsyncLLM output_handler failed. {_ENGINE_DEAD}")
            return error_response(500, _ENGINE_DEAD, "InternalServerError")
        ids, max_tokens, temperature = parse_completion(body, b.max_model_len)
        with self.lock:
            self.requests += 1
            n_request = self.requests
            rng = random.Random(f"simengine:{b.noise_seed}:{self.requests}")
        n, finish, halt = max_tokens, "length", textgen.corrupt_halt_at(ids, b)
        if halt is not None and halt < n:
            n, finish = halt, "stop"
        elif halt is None and not (b.ignore_eos or body.get("ignore_eos")):
            eos = textgen.natural_length(ids, b)
            n, finish = (eos, "stop") if eos < n else (n, finish)
        tokens = textgen.generate_tokens(ids, n, b, temperature)
        rate = textgen.decode_rate_at(b.decode_tok_s, len(ids))
        rate *= math.exp(rng.gauss(0.0, b.noise_sigma))
        if b.drift_per_h:
            rate *= math.exp(b.drift_per_h * (self.clock() - self.epoch) / 3600.0)
        if b.drift_steps:
            rate *= realbox.step_factor(b.drift_steps, self.clock() - self.epoch)
        if b.tenants:
            rate *= realbox.tenant_factor(b.tenants, self.clock() - self.epoch)
        rate *= b.boot_factor * realbox.warmup_factor(b.warmup_requests, b.warmup_factor, n_request)
        acceptance = b.acceptance
        if b.corrupt is not None:
            rate, acceptance = rate * b.corrupt.tok_s_factor, b.corrupt.acceptance
        k = max(0, b.spec_k)
        steps = textgen.plan_steps(n, k, textgen.position_acceptance(acceptance, k), rng)
        c = _Completion(f"cmpl-{uuid.uuid4().hex}", int(time.time()), ids, tokens, steps, rate,
                        bool(body.get("stream", False)),
                        bool((body.get("stream_options") or {}).get("include_usage", False)),
                        finish, halt, max_tokens)
        c.cached = self.prefix_cache.admit(ids, body)
        c.head = {"id": c.rid, "object": "text_completion", "created": c.created, "model": b.model}
        if c.stream:
            resp = Response(200, "text/event-stream; charset=utf-8")
            resp.chunks = self._serve(resp, c)
            return resp
        resp = Response(200, "application/json")
        for _ in self._serve(resp, c):     # yields nothing when not streaming: runs to the end
            pass
        return resp

    def _admit(self) -> tuple[bool, bool]:
        """(admitted, holds a slot); not admitted only when the server shuts down."""
        if self.closing is None:       # virtual time: nothing else runs meanwhile, never wait
            return True, self.admit.acquire(blocking=False)
        while not self.admit.acquire(timeout=0.1):
            if self.closing.is_set():
                return False, False
        return True, True

    def _serve(self, resp: Response, c: _Completion) -> Iterator[bytes]:
        """Queue, decode, account; the SSE events when streaming, else ``resp.body``."""
        b = self.b
        with self.lock:
            self.waiting += 1
        admitted = holds = False
        try:
            admitted, holds = self._admit()
        finally:
            with self.lock:
                self.waiting -= 1
                self.running += admitted
        if not admitted:
            resp.truncated = True
            return
        try:
            text = yield from self._decode(c)
        except GeneratorExit:          # the client went away mid-stream
            with self.lock:
                self.success["abort"] += 1
            self.say("APIServer", "INFO", "logger.py:77", f"Aborted request {c.rid}.")
            raise
        finally:
            with self.lock:
                self.running -= 1
            if holds:
                self.admit.release()
        if text is None:   # stalled until shutdown
            resp.truncated = True
            return
        n = len(c.tokens)
        if c.halt is not None and c.finish == "stop":
            self.say("EngineCore_DP0", "WARNING", "repetition.py:88",
                     f"repetition detected in request {c.rid}: n-gram loop in the recent output, "
                     f"halting at {n} tokens (max_tokens={c.max_tokens})")
        with self.lock:
            self.success[c.finish] += 1
        self.say("APIServer", "INFO", "logger.py:72", f"Finished request {c.rid}: prompt_tokens="
                 f"{len(c.ids)}, completion_tokens={n}, finish_reason={c.finish}")
        usage = {"prompt_tokens": len(c.ids), "total_tokens": len(c.ids) + n, "completion_tokens": n}
        if not c.stream:
            out = {**c.head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                          "finish_reason": c.finish, "stop_reason": None,
                                          "prompt_logprobs": None}]}
            if b.fault != "no-usage":
                out["usage"] = usage
            resp.body = json.dumps(out, separators=(",", ":")).encode()
            return
        if c.include_usage and b.fault != "no-usage":
            yield sse({**c.head, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    def _decode(self, c: _Completion) -> Iterator[bytes]:
        """Prefill, then the decode steps on the core's clock; returns the text (None: stalled).

        Steps coalesce into one chunk until it holds ``stream_interval`` tokens (vLLM's
        --stream-interval); the first token and the last step always end a chunk, so TTFT and
        the end of the stream fall where they would with one chunk per step."""
        b, k, n = self.b, max(0, self.b.spec_k), len(c.tokens)
        deadline = self.clock() + b.base_ttft_s + (len(c.ids) - c.cached) / b.prefill_tok_s
        with self.lock:
            self.prompt_tokens += len(c.ids)
        every = 1 if b.fault == "garbage" else max(1, b.stream_interval)
        last = len(c.steps) - 1
        # n tokens take n / rate after the first one arrives: spread 1/rate over the steps
        scale = n / (n - 1) if n > 1 else 1.0
        pos, sent, parts = 0, 0, []
        for i, (take, acc) in enumerate(c.steps):
            if i:
                with self.lock:
                    batch = self.running
                deadline += take / (c.rate * b.batch_efficiency ** max(0, batch - 1)) * scale
            pos += take
            with self.lock:
                self.generation_tokens += take
                if i and k:
                    self.drafts, self.draft_tokens = self.drafts + 1, self.draft_tokens + k
                    self.accepted += acc
                    for j in range(acc):
                        self.accepted_per_pos[j] += 1
                if i and self.profiling:
                    self.profile_steps += 1
            stall = b.fault == "stall" and pos >= min(STALL_AFTER_TOKENS, n)
            if i and i < last and pos - sent < every and not stall:
                continue
            wait = deadline - self.clock()
            if wait > 0:
                self.sleep(wait)
            piece = tok.detokenize(c.tokens[sent:pos])
            sent = pos
            parts.append(piece)
            if c.stream and b.fault == "garbage" and i % 3 == 1:
                yield b'data: {"id":"' + c.rid.encode() + b'","object":"text_compl\n\n'
            elif c.stream:
                yield sse({**c.head, "choices": [{
                    "index": 0, "text": piece, "logprobs": None,
                    "finish_reason": c.finish if pos >= n else None, "stop_reason": None}]})
            if stall:
                self.say("EngineCore_DP0", "WARNING", "shm_broadcast.py:466",
                         "No available shared memory broadcast block found in 60 seconds.")
                if self.closing is not None:
                    self.closing.wait(STALL_S)
                else:
                    self.sleep(STALL_S)
                return None
        return "".join(parts)

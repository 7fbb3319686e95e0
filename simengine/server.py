"""HTTP side of the simulated engine: serves vLLM-shaped routes from one ``Behaviour``.

``start_server`` binds and serves from a background thread at once; every route answers 503
until ``ServerHandle.set_ready(behaviour)``. Timing is real time (``clock``/``sleep`` are
injectable): TTFT = queueing + base_ttft_s + prompt_tokens / prefill_tok_s, then decode goes
in steps of ``1 + accepted drafts`` tokens (one SSE chunk per step), each lasting
``tokens / rate`` (see ``textgen`` for the rate and the step plan). Stdlib only.
"""
from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import textgen
from . import tokenizer as tok
from .behaviour import Behaviour

VLLM_VERSION = "0.29.0.dev0+sim"
FAULTS = ("stall", "no-usage", "garbage", "http500")
STALL_S = 3600.0            # how long a "stall" request keeps its connection open and silent
STALL_AFTER_TOKENS = 8      # tokens streamed before the stall
COUNTERS = ("routed", "hits", "installs", "read_through", "prefetched", "served_by_prefetch")
_PERMS = {"allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
          "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
          "is_blocking": False}
_ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def _pid(process: str) -> int:
    """The boot log's pids (``simengine.cli.Log``): APIServer 1, EngineCore 7, workers 8+rank."""
    if process.startswith("Worker_TP"):
        return 8 + int(process[9:])
    return 1 if process == "APIServer" else 7


def log_line(process: str, level: str, where: str, msg: str) -> str:
    """One vLLM 0.33 line: ``(APIServer pid=1) INFO MM-DD HH:MM:SS [file.py:N] msg``."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"({process} pid={_pid(process)}) {level} {stamp} [{where}] {msg}"


def telemetry_report(b: Behaviour, rank: int, steps: int) -> dict:
    """The fork's ``expert_cache_rank<N>.json``: per-layer counter = per-step rate x steps."""
    layers = []
    for i, kind in enumerate(["resident"] * b.resident_layers + ["swap"] * b.swap_layers):
        rates = b.expert_counters.get(kind, {})
        layers.append({"layer": i, "kind": kind,
                       **{c: round(rates.get(c, 0.0) * steps) for c in COUNTERS}})
    totals = {c: sum(layer[c] for layer in layers) for c in COUNTERS}
    return {"rank": rank, "steps": steps, "slab_bytes": b.slab_bytes, "layers": layers,
            "totals": totals}


class _BadRequest(Exception):
    pass


class _Engine:
    """Mutable serving state for one Behaviour: counters, admission, the profiler window."""

    def __init__(self, b: Behaviour):
        self.b = b
        self.admit = threading.Semaphore(b.max_num_seqs)
        self.lock = threading.Lock()
        self.running = self.waiting = self.requests = 0
        self.prompt_tokens = self.generation_tokens = 0
        self.drafts = self.draft_tokens = self.accepted = 0
        self.accepted_per_pos = [0] * max(0, b.spec_k)
        self.success = {"stop": 0, "length": 0, "abort": 0}
        self.profiling = False
        self.profile_steps = 0


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False      # a stalled handler must not block server_close
    sim: ServerHandle


class ServerHandle:
    """A running simulated server. Every route answers 503 until ``set_ready``."""

    def __init__(self, httpd: _HTTPServer, log: Callable[[str], object],
                 clock: Callable[[], float], sleep: Callable[[float], object], access_log: bool):
        self._httpd, self._log, self._log_lock = httpd, log, threading.Lock()
        self.clock, self.sleep, self.access_log = clock, sleep, access_log
        self.closing = threading.Event()
        self.engine: _Engine | None = None
        self.failed = False
        httpd.sim = self
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="simengine-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def behaviour(self) -> Behaviour | None:
        return self.engine.b if self.engine else None

    def log(self, line: str) -> None:
        with self._log_lock:
            self._log(line)

    def say(self, process: str, level: str, where: str, msg: str) -> None:
        self.log(log_line(process, level, where, msg))

    def set_ready(self, behaviour: Behaviour) -> None:
        """Serve from ``behaviour`` (fresh counters); /health turns 200."""
        if behaviour.fault is not None and behaviour.fault not in FAULTS:
            raise ValueError(f"unknown fault {behaviour.fault!r}; expected one of {FAULTS}")
        if not behaviour.decode_tok_s or min(behaviour.decode_tok_s.values()) <= 0:
            raise ValueError("decode_tok_s needs at least one positive rate")
        if behaviour.max_num_seqs < 1 or behaviour.prefill_tok_s <= 0:
            raise ValueError("max_num_seqs must be >= 1 and prefill_tok_s > 0")
        self.failed = False
        self.engine = _Engine(behaviour)

    def set_failed(self) -> None:
        """The engine died: /health (and everything else) answers 503 from now on."""
        self.failed, self.engine = True, None

    def shutdown(self) -> None:
        """Stop serving, release stalled requests, close the socket."""
        self.closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def start_server(host: str, port: int, log: Callable[[str], object] = print, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep,
                 access_log: bool = True) -> ServerHandle:
    """Bind ``host:port`` (0 picks a free port) and serve in a background thread at once.
    ``log`` receives whole vLLM-format lines; ``access_log`` adds uvicorn access lines."""
    return ServerHandle(_HTTPServer((host, port), _Handler), log, clock, sleep, access_log)


_ROUTES = {
    "/health": ("GET", "health"), "/v1/models": ("GET", "models"),
    "/version": ("GET", "version"), "/metrics": ("GET", "metrics"),
    "/tokenize": ("POST", "tokenize"), "/detokenize": ("POST", "detokenize"),
    "/v1/completions": ("POST", "completions"),
    "/start_profile": ("POST", "start_profile"), "/stop_profile": ("POST", "stop_profile"),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version, sys_version = "uvicorn", ""
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: object) -> None:  # access lines: see _start
        pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    # -- plumbing ------------------------------------------------------------------------
    def _start(self, status: int, ctype: str | None, length: int | None) -> None:
        """Status line and headers; ``length`` None means a chunked body follows."""
        self.send_response(status)
        if ctype:
            self.send_header("content-type", ctype)
        if length is None:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", str(length))
        self.end_headers()
        if self.server.sim.access_log:
            host, port = self.client_address[:2]
            phrase = self.responses.get(status, ("",))[0]
            self.server.sim.log(f'(APIServer pid=1) INFO:     {host}:{port} - '
                                f'"{self.command} {self.path} HTTP/1.1" {status} {phrase}')

    def _json(self, status: int, obj: object) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        self._start(status, "application/json", len(data))
        self.wfile.write(data)

    def _error(self, status: int, message: str, typ: str) -> None:
        self._json(status, {"error": {"message": message, "type": typ, "param": None,
                                      "code": status}})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))

    def _sse(self, obj: object) -> None:
        self._chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if path not in _ROUTES:
            return self._json(404, {"detail": "Not Found"})
        want, name = _ROUTES[path]
        if method != want:
            return self._json(405, {"detail": "Method Not Allowed"})
        engine = self.server.sim.engine
        if engine is None:
            if path == "/health":
                return self._start(503, None, 0)
            return self._error(503, "The engine is not ready (loading or failed).",
                               "ServiceUnavailableError")
        try:
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise _BadRequest("request body must be a JSON object")
            if body.get("model") not in (None, engine.b.model) and method == "POST":
                return self._json(404, {"error": {
                    "message": f"The model `{body['model']}` does not exist.",
                    "type": "NotFoundError", "param": "model", "code": 404}})
            getattr(self, "_" + name)(engine, body)
        except (_BadRequest, ValueError) as e:   # json.JSONDecodeError is a ValueError
            self._error(400, str(e), "BadRequestError")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- simple routes -------------------------------------------------------------------
    def _health(self, engine: _Engine, body: dict) -> None:
        self._start(200, None, 0)

    def _version(self, engine: _Engine, body: dict) -> None:
        self._json(200, {"version": VLLM_VERSION})

    def _models(self, engine: _Engine, body: dict) -> None:
        b, now = engine.b, int(time.time())
        perm = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": now, **_PERMS, "organization": "*", "group": None}
        self._json(200, {"object": "list", "data": [{
            "id": b.model, "object": "model", "created": now, "owned_by": "vllm",
            "root": b.model, "parent": None, "max_model_len": b.max_model_len,
            "permission": [perm]}]})

    def _tokenize(self, engine: _Engine, body: dict) -> None:
        prompt = body.get("prompt")    # add_special_tokens: accepted; no BOS in this vocab
        if not isinstance(prompt, str):
            raise _BadRequest("'prompt' must be a string (chat 'messages' are not supported)")
        ids = tok.tokenize(prompt)
        strs = [tok.token_str(t) for t in ids] if body.get("return_token_strs") else None
        self._json(200, {"count": len(ids), "max_model_len": engine.b.max_model_len,
                         "tokens": ids, "token_strs": strs})

    def _detokenize(self, engine: _Engine, body: dict) -> None:
        ids = body.get("tokens")
        if not isinstance(ids, list):
            raise _BadRequest("'tokens' must be a list of token ids")
        self._json(200, {"prompt": tok.detokenize(ids)})

    def _metrics(self, engine: _Engine, body: dict) -> None:
        data = _metrics_text(engine).encode()
        self._start(200, "text/plain; version=0.0.4; charset=utf-8", len(data))
        self.wfile.write(data)

    def _start_profile(self, engine: _Engine, body: dict) -> None:
        with engine.lock:
            engine.profiling, engine.profile_steps = True, 0
        self.server.sim.say("APIServer", "INFO", "api_router.py:46", "Starting profiler...")
        self._start(200, None, 0)

    def _stop_profile(self, engine: _Engine, body: dict) -> None:
        sim, b = self.server.sim, engine.b
        with engine.lock:
            steps, engine.profiling = engine.profile_steps, False
        sim.say("APIServer", "INFO", "api_router.py:58", "Stopping profiler...")
        if b.stop_profile_hang_s > 0:
            sim.sleep(b.stop_profile_hang_s)
        if b.telemetry and b.profiler_dir:
            os.makedirs(b.profiler_dir, exist_ok=True)
            for rank in range(b.tp):
                rep = telemetry_report(b, rank, steps)
                path = os.path.join(b.profiler_dir, f"expert_cache_rank{rank}.json")
                with open(path + ".tmp", "w", encoding="utf-8") as f:
                    json.dump(rep, f, indent=1)
                os.replace(path + ".tmp", path)
                t = rep["totals"]
                hit = t["hits"] / t["routed"] if t["routed"] else 0.0
                sim.say("EngineCore_DP0" if b.tp == 1 else f"Worker_TP{rank}", "INFO",
                        "expert_lru.py:612",
                        f"expert cache telemetry rank {rank}: hit rate {hit:.4f} "
                        f"({t['hits']:,}/{t['routed']:,}) host installs {t['installs']:,} "
                        f"read-through {t['read_through']:,} prefetched {t['prefetched']:,} "
                        f"served by prefetch (migrations) {t['served_by_prefetch']:,} "
                        f"steps {steps} -> {path}")
        sim.say("APIServer", "INFO", "api_router.py:61", "Profiler stopped.")
        self._start(200, None, 0)

    # -- completions ---------------------------------------------------------------------
    def _completions(self, engine: _Engine, body: dict) -> None:
        sim, b = self.server.sim, engine.b
        if b.fault == "http500":
            sim.say("APIServer", "ERROR", "async_llm.py:480",
                    f"AsyncLLM output_handler failed. {_ENGINE_DEAD}")
            return self._error(500, _ENGINE_DEAD, "InternalServerError")
        ids, max_tokens, temperature = _parse_completion(body, b.max_model_len)
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        with engine.lock:
            engine.requests += 1
            rng = random.Random(f"simengine:{b.seed}:{engine.requests}")
        n, finish, halt = max_tokens, "length", textgen.corrupt_halt_at(ids, b)
        if halt is not None and halt < n:
            n, finish = halt, "stop"
        elif halt is None and not (b.ignore_eos or body.get("ignore_eos")):
            eos = textgen.natural_length(ids, b)
            n, finish = (eos, "stop") if eos < n else (n, finish)
        tokens = textgen.generate_tokens(ids, n, b, temperature)
        rate = textgen.decode_rate_at(b.decode_tok_s, len(ids))
        rate *= math.exp(rng.gauss(0.0, b.noise_sigma))
        acceptance = b.acceptance
        if b.corrupt is not None:
            rate, acceptance = rate * b.corrupt.tok_s_factor, b.corrupt.acceptance
        k = max(0, b.spec_k)
        steps = textgen.plan_steps(n, k, textgen.position_acceptance(acceptance, k), rng)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if stream:
            self._start(200, "text/event-stream; charset=utf-8", None)
        with engine.lock:
            engine.waiting += 1
        admitted = False
        try:
            while not (admitted := engine.admit.acquire(timeout=0.1)):
                if sim.closing.is_set():
                    self.close_connection = True
                    return
        finally:
            with engine.lock:
                engine.waiting -= 1
                engine.running += admitted
        try:
            text = self._decode(engine, rid, created, ids, tokens, steps, rate, stream, finish)
        except (BrokenPipeError, ConnectionResetError):
            with engine.lock:
                engine.success["abort"] += 1
            sim.say("APIServer", "INFO", "logger.py:77", f"Aborted request {rid}.")
            self.close_connection = True
            return
        finally:
            with engine.lock:
                engine.running -= 1
            engine.admit.release()
        if text is None:   # stalled until shutdown
            self.close_connection = True
            return
        if halt is not None and finish == "stop":
            sim.say("EngineCore_DP0", "WARNING", "repetition.py:88",
                    f"repetition detected in request {rid}: n-gram loop in the recent output, "
                    f"halting at {n} tokens (max_tokens={max_tokens})")
        with engine.lock:
            engine.success[finish] += 1
        sim.say("APIServer", "INFO", "logger.py:72", f"Finished request {rid}: prompt_tokens="
                f"{len(ids)}, completion_tokens={n}, finish_reason={finish}")
        usage = {"prompt_tokens": len(ids), "total_tokens": len(ids) + n, "completion_tokens": n}
        head = {"id": rid, "object": "text_completion", "created": created, "model": b.model}
        if not stream:
            out = {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                        "finish_reason": finish, "stop_reason": None,
                                        "prompt_logprobs": None}]}
            if b.fault != "no-usage":
                out["usage"] = usage
            return self._json(200, out)
        if include_usage and b.fault != "no-usage":
            self._sse({**head, "choices": [], "usage": usage})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _decode(self, engine: _Engine, rid: str, created: int, ids: list[int],
                tokens: list[int], steps: list[tuple[int, int]], rate: float, stream: bool,
                finish: str) -> str | None:
        """Prefill, then the decode steps in real time. Returns the text (None: stalled)."""
        sim, b, k, n = self.server.sim, engine.b, max(0, engine.b.spec_k), len(tokens)
        deadline = sim.clock() + b.base_ttft_s + len(ids) / b.prefill_tok_s
        with engine.lock:
            engine.prompt_tokens += len(ids)
        # n tokens take n / rate after the first one arrives: spread 1/rate over the steps
        scale = n / (n - 1) if n > 1 else 1.0
        pos, parts = 0, []
        for i, (take, acc) in enumerate(steps):
            if i:
                with engine.lock:
                    batch = engine.running
                deadline += take / (rate * b.batch_efficiency ** max(0, batch - 1)) * scale
            wait = deadline - sim.clock()
            if wait > 0:
                sim.sleep(wait)
            piece = tok.detokenize(tokens[pos:pos + take])
            pos += take
            parts.append(piece)
            with engine.lock:
                engine.generation_tokens += take
                if i and k:
                    engine.drafts, engine.draft_tokens = engine.drafts + 1, engine.draft_tokens + k
                    engine.accepted += acc
                    for j in range(acc):
                        engine.accepted_per_pos[j] += 1
                if i and engine.profiling:
                    engine.profile_steps += 1
            if stream and b.fault == "garbage" and i % 3 == 1:
                self._chunk(b'data: {"id":"' + rid.encode() + b'","object":"text_compl\n\n')
            elif stream:
                self._sse({"id": rid, "object": "text_completion", "created": created,
                           "model": b.model, "choices": [{
                               "index": 0, "text": piece, "logprobs": None,
                               "finish_reason": finish if pos >= n else None,
                               "stop_reason": None}]})
            if b.fault == "stall" and pos >= min(STALL_AFTER_TOKENS, n):
                sim.say("EngineCore_DP0", "WARNING", "shm_broadcast.py:466",
                        "No available shared memory broadcast block found in 60 seconds.")
                sim.closing.wait(STALL_S)
                return None
        return "".join(parts)


def _parse_completion(body: dict, max_model_len: int) -> tuple[list[int], int, float]:
    """(prompt ids, max_tokens, temperature), or _BadRequest with vLLM's wording."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tok.tokenize(prompt)
    elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
        tok.check_ids(prompt)
        ids = list(prompt)
    else:
        raise _BadRequest("'prompt' must be a string or a list of token ids (one prompt)")
    if not ids:
        raise _BadRequest("The decoder prompt cannot be empty")
    n, limit = len(ids), max_model_len
    if n >= limit:
        raise _BadRequest(f"This model's maximum context length is {limit} tokens. However, "
                          f"your request has {n} input tokens. Please reduce the length of "
                          "the input messages.")
    max_tokens = body.get("max_tokens", 16)
    max_tokens = limit - n if max_tokens is None else max_tokens
    if type(max_tokens) is not int or max_tokens < 1:
        raise _BadRequest(f"max_tokens must be at least 1, got {max_tokens!r}.")
    if n + max_tokens > limit:
        raise _BadRequest(f"This model's maximum context length is {limit} tokens. However, "
                          f"you requested {n + max_tokens} tokens ({n} in the messages, "
                          f"{max_tokens} in the completion). Please reduce the length of the "
                          "messages or completion.")
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    if type(temperature) not in (int, float) or temperature < 0:
        raise _BadRequest(f"temperature must be non-negative, got {temperature!r}.")
    return ids, max_tokens, float(temperature)


_METRICS = (  # name, type, help, _Engine attribute
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
     "running"),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
     "waiting"),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
     "prompt_tokens"),
    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
     "generation_tokens"),
    ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
     "success"),
    ("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", "drafts"),
    ("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
     "draft_tokens"),
    ("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
     "accepted"),
    ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
     "Accepted tokens per draft position.", "accepted_per_pos"),
)


def _metrics_text(engine: _Engine) -> str:
    """Prometheus text exposition (0.0.4) with vLLM's names; spec decode only when spec_k > 0."""
    model = engine.b.model.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    out: list[str] = []
    with engine.lock:
        for name, typ, doc, attr in _METRICS:
            if "spec_decode" in name and engine.b.spec_k <= 0:
                continue
            value = getattr(engine, attr)
            if attr == "success":
                samples = [(f',finished_reason="{r}"', v) for r, v in value.items()]
            elif attr == "accepted_per_pos":
                samples = [(f',position="{j}"', v) for j, v in enumerate(value)]
            else:
                samples = [("", value)]
            out += [f"# HELP {name} {doc}", f"# TYPE {name} {typ}"]
            out += [f'{name}{{model_name="{model}",engine="0"{extra}}} {float(v)!r}'
                    for extra, v in samples]
    return "\n".join(out) + "\n"

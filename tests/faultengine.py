"""A fault-injecting engine for tests: a stdlib HTTP/1.1 server with the llama.cpp-style
completion surface (/health, /v1/models, /tokenize, /v1/completions streamed or not, /metrics)
that misbehaves in exactly one named way.

Its tokenizer is the truth the completion's ``usage.prompt_tokens`` reports: one token per
word or punctuation mark. Tokens stream at ``tok_s``; the final chunk carries ``usage`` and
llama.cpp-style ``timings``, then ``data: [DONE]``. Every wait is on ``stopping``, so a hang
ends when the server stops and nothing outlives a test.

Faults (``FaultEngine(fault=...)``):

=====================  ==================================================================
hang-first             headers sent, then silence (no token ever)
hang-mid               three tokens, then silence
keepalive-forever      SSE comments (``: keep-alive``) every 50 ms, no token, never ending
garbage                ``data: {not json`` instead of a chunk
no-usage               tokens and ``[DONE]``, no usage chunk
tokens=0|-5|str|1e6    usage.completion_tokens reported as 0, -5, "16" (a string), 1000000
tokenize-double        /tokenize reports twice the true count
tokenize-shrink        /tokenize reports fewer tokens the longer the text
tokenize-constant      /tokenize reports 7 tokens whatever the text
http500                every route answers HTTP 500 with an error body
reset-mid              three tokens, then a TCP reset
drop-reused            a request on a reused (keep-alive) connection is dropped unanswered
drop-first             the first completion request is dropped unanswered (then all is well)
partial-then-close     a completion gets half a status line, then the connection closes
=====================  ==================================================================
"""
from __future__ import annotations

import json
import re
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("none", "hang-first", "hang-mid", "keepalive-forever", "garbage", "no-usage", "tokens=0",
          "tokens=-5", "tokens=str", "tokens=1e6", "tokenize-double", "tokenize-shrink",
          "tokenize-constant", "http500", "reset-mid", "drop-reused", "drop-first", "partial-then-close")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_USAGE = {"tokens=0": 0, "tokens=-5": -5, "tokens=1e6": 1_000_000}


def true_count(text: str) -> int:
    return len(_TOKEN.findall(text))


class FaultEngine:
    """``with FaultEngine("hang-mid") as eng: measure_engine(eng.url, ...)``."""

    def __init__(self, fault: str = "none", *, tok_s: float = 400.0, model: str = "fault/m",
                 n_ctx: int = 4096):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        self.fault, self.tok_s, self.model, self.n_ctx = fault, tok_s, model, n_ctx
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.connections = 0                    # TCP connections accepted
        self.requests: list[tuple[int, str, str]] = []    # (connection number, method, path)
        self.bodies: list[dict] = []            # completion request bodies, in order
        self.dropped = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def wait(self, seconds: float) -> bool:
        """Sleep unless the server is stopping; True when it is."""
        return self.stopping.wait(seconds)


def _handler(eng: FaultEngine):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:      # quiet
            pass

        def setup(self) -> None:
            super().setup()
            with eng.lock:
                eng.connections += 1
                self.conn_no, self.served = eng.connections, 0

        # -- plumbing ----------------------------------------------------------------------
        def _body(self) -> dict:
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                obj = json.loads(raw or b"{}")
            except ValueError:
                return {}
            return obj if isinstance(obj, dict) else {}

        def _json(self, status: int, obj) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _drop(self) -> None:
            """Close without a byte of response (a server dropping an idle keep-alive)."""
            eng.dropped += 1
            self.close_connection = True

        def _reset(self) -> None:
            """Close with a TCP reset (SO_LINGER 0), not the orderly FIN of a finished reply."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        def finish(self) -> None:
            try:
                super().finish()
            except OSError:                     # the socket was reset on purpose
                pass

        def _route(self, method: str) -> None:
            self.served += 1
            path = self.path.split("?")[0]
            with eng.lock:
                eng.requests.append((self.conn_no, method, path))
            body = self._body() if method == "POST" else {}
            f = eng.fault
            if f == "drop-reused" and self.served > 1:
                return self._drop()
            if f == "http500":
                return self._json(500, {"error": {"code": 500, "message": "engine fell over",
                                                  "type": "server_error"}})
            if path == "/health":
                return self._json(200, {"status": "ok"})
            if path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{"id": eng.model, "meta": {"n_ctx": eng.n_ctx}}]})
            if path == "/metrics":
                data = b"# TYPE fault_requests_total counter\nfault_requests_total 1\n"
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                return self.wfile.write(data)
            if path == "/tokenize" and method == "POST":
                n = true_count(str(body.get("content", body.get("prompt", ""))))
                n = {"tokenize-double": 2 * n, "tokenize-shrink": max(1, 5000 - n),
                     "tokenize-constant": 7}.get(f, n)
                return self._json(200, {"tokens": list(range(n))})
            if path == "/v1/completions" and method == "POST":
                with eng.lock:
                    eng.bodies.append(body)
                    first = len(eng.bodies) == 1
                if f == "drop-first" and first:
                    return self._drop()
                if f == "partial-then-close":
                    self.wfile.write(b"HTTP/1.1 20")
                    self.wfile.flush()
                    self.close_connection = True
                    return None
                return self._complete(body)
            return self._json(404, {"error": {"code": 404, "message": f"File Not Found: {path}"}})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        # -- completions -------------------------------------------------------------------
        def _complete(self, body: dict) -> None:
            prompt = body.get("prompt", "")
            n_prompt = true_count(prompt) if isinstance(prompt, str) else len(prompt)
            n = max(1, int(body.get("max_tokens") or 16))
            if not body.get("stream"):
                return self._json(200, {"choices": [{"text": " tok" * min(n, 4), "index": 0,
                                                     "finish_reason": "length"}],
                                        "usage": {"completion_tokens": n, "prompt_tokens": n_prompt}})
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            f = eng.fault
            try:
                self._stream(f, n, n_prompt)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _event(self, obj) -> None:
            self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

        def _stream(self, f: str, n: int, n_prompt: int) -> None:
            if f == "hang-first":
                eng.wait(3600)
                return self._reset()
            if f == "keepalive-forever":
                while not eng.wait(0.05):
                    self._chunk(b": keep-alive\n\n")
                return self._reset()
            if f == "garbage":
                self._chunk(b"data: {not json\n\n")
                return self._end()
            dt = 1.0 / eng.tok_s
            for i in range(n):
                if f in ("hang-mid", "reset-mid") and i == 3:
                    if f == "hang-mid":
                        eng.wait(3600)
                    return self._reset()
                if eng.wait(dt):
                    return self._reset()
                self._event({"choices": [{"text": f" t{i}", "index": 0, "finish_reason": None}]})
            final: dict = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}
            if f != "no-usage":
                comp = "16" if f == "tokens=str" else _USAGE.get(f, n)
                final["usage"] = {"completion_tokens": comp, "prompt_tokens": n_prompt,
                                  "total_tokens": n_prompt + n}
                final["timings"] = {"predicted_n": n, "predicted_per_second": eng.tok_s}
            self._event(final)
            self._chunk(b"data: [DONE]\n\n")
            self._end()

        def _end(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler

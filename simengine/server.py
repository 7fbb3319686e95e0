"""HTTP side of the simulated engine: serves vLLM-shaped routes from one ``Behaviour``.

``start_server`` binds and serves from a background thread at once; every route answers 503
until ``ServerHandle.set_ready(behaviour)``. What each request returns, and when each streamed
chunk is due, is decided by the socket-free ``engine.EngineCore`` (see ``engine.py`` for the
timing model); this module only moves bytes. Timing is real time here (``clock``/``sleep``
are injectable). Stdlib only.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .behaviour import Behaviour
from .engine import FAULTS, STALL_AFTER_TOKENS, STALL_S, EngineCore, route  # noqa: F401
from .wire import COUNTERS, VLLM_VERSION, Response, log_line, telemetry_report  # noqa: F401


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
        self.engine: EngineCore | None = None
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
        engine = EngineCore(behaviour, clock=self.clock, sleep=self.sleep, log=self.log,
                            closing=self.closing)
        self.failed = False
        self.engine = engine

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


def access_line(host: str, port: int, method: str, path: str, status: int) -> str:
    """uvicorn's access line, as the engine's log carries it."""
    from http import HTTPStatus

    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f'(APIServer pid=1) INFO:     {host}:{port} - "{method} {path} HTTP/1.1" {status} {phrase}'


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
            self.server.sim.log(access_line(host, port, self.command, self.path, status))

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))

    def _route(self, method: str) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            self._send(route(self.server.sim.engine, method, self.path, raw))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send(self, resp: Response) -> None:
        if resp.chunks is None and resp.truncated:      # stalled until shutdown: no answer
            self.close_connection = True
            return
        self._start(resp.status, resp.ctype, None if resp.chunks is not None else len(resp.body))
        if resp.chunks is None:
            if resp.body:
                self.wfile.write(resp.body)
            return
        try:
            for data in resp.chunks:
                self._chunk(data)
        except (BrokenPipeError, ConnectionResetError):
            resp.chunks.close()                          # the engine counts an abort
            self.close_connection = True
            return
        if resp.truncated:
            self.close_connection = True
            return
        self._chunk(b"")

"""SimHost's HTTP: an ``httpx.MockTransport`` handler that answers from a simulated
container's ``EngineCore`` (``simengine.engine.route``) in virtual time.

The URL's host names the container (``SimHost.base_url``: ``http://sim-<id>:<port>``); a wrong
port, a container still starting its API server or a dead one is "connection refused". A
streamed body pulls one chunk at a time from the engine, whose wait before each chunk advances
the virtual clock; a wait longer than the client's read timeout becomes ``httpx.ReadTimeout``
after exactly that much virtual time, as a real client would see it.
"""
from __future__ import annotations

from typing import Any, Protocol

import httpx

from simengine.engine import EngineCore, route
from simengine.wire import Response

_INCOMPLETE = "peer closed connection without sending complete message body (incomplete chunked read)"


class ServingHost(Protocol):
    """What the handler needs of the simulated host (``host.simhost.SimHost`` is the one): which
    container a URL names, whether it runs, the engine it serves, the virtual read clock, and its
    access log. ``ctr`` is the host's container record (``cid``, ``port``, ``core``)."""

    def container_at(self, url_host: str, default: str) -> Any: ...
    def state(self, cid: str) -> Any: ...
    def serving(self, cid: str) -> EngineCore | None: ...
    def begin_read(self, read_timeout: float | None) -> None: ...
    def access(self, ctr: Any, method: str, path: str, status: int) -> None: ...


class ReadTimedOut(Exception):
    """The engine stayed silent past the client's read timeout (virtual time has moved on)."""


def _read_timeout(request: httpx.Request) -> float | None:
    return (request.extensions.get("timeout") or {}).get("read")


class EngineHandler:
    """``handler(request) -> httpx.Response`` for one client (``default_cid``: loopback URLs)."""

    def __init__(self, host: ServingHost, default_cid: str):
        self.host, self.default_cid = host, default_cid

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = self.host
        ctr = host.container_at(request.url.host, self.default_cid)
        port = request.url.port or 80
        if ctr is None or not host.state(ctr.cid).running or port != ctr.port:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        host.begin_read(_read_timeout(request))
        path = request.url.raw_path.decode()
        try:
            resp = route(host.serving(ctr.cid), request.method, path, request.content)
        except ReadTimedOut:
            raise httpx.ReadTimeout("timed out", request=request) from None
        if resp.chunks is None and resp.truncated:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        host.access(ctr, request.method, path, resp.status)
        headers = {"content-type": resp.ctype} if resp.ctype else {}
        if resp.chunks is None:
            return httpx.Response(resp.status, headers=headers, content=resp.body)
        return httpx.Response(resp.status, headers=headers, stream=_Stream(host, ctr, resp, request))


class SimClient(httpx.Client):
    """An ``httpx.Client`` whose ``send`` hands the request straight to the engine's handler:
    no auth, redirect or cookie machinery (the engine uses none), and so a fraction of the cost
    per request in a night of tens of thousands of simulated requests. Requests are built by
    httpx as usual (URL, headers, JSON body, the timeout the handler reads)."""

    def __init__(self, handler: EngineHandler, timeout: httpx.Timeout):
        super().__init__(transport=httpx.MockTransport(handler), timeout=timeout, trust_env=False)
        self._handler = handler

    def send(self, request: httpx.Request, *, stream: bool = False, **_) -> httpx.Response:
        response = self._handler(request)
        response.request = request
        if not stream:
            try:
                response.read()
            finally:
                response.close()
        return response


class _Stream(httpx.SyncByteStream):
    """A streamed body: each chunk is pulled from the engine when the client reads it."""

    def __init__(self, host: ServingHost, ctr: Any, resp: Response, request: httpx.Request):
        self.host, self.ctr, self.resp, self.request = host, ctr, resp, request
        self.core = ctr.core

    def __iter__(self):
        host, chunks = self.host, self.resp.chunks
        while True:
            if host.serving(self.ctr.cid) is not self.core:      # killed or removed mid-stream
                chunks.close()
                raise httpx.RemoteProtocolError(_INCOMPLETE, request=self.request)
            host.begin_read(_read_timeout(self.request))
            try:
                data = next(chunks)
            except StopIteration:
                break
            except ReadTimedOut:
                raise httpx.ReadTimeout("timed out", request=self.request) from None
            yield data
        if self.resp.truncated:
            raise httpx.RemoteProtocolError(_INCOMPLETE, request=self.request)

    def close(self) -> None:
        self.resp.chunks.close()

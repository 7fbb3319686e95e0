"""HTTP that survives real servers: one fresh connection per request, one safe retry.

Real engines (llama.cpp's cpp-httplib, uvicorn) close idle keep-alive connections on their own
schedule; a client that reuses such a pooled connection gets ``RemoteProtocolError: Server
disconnected without sending a response`` and, without care, loses the run. So every request
an arm makes goes out with ``Connection: close`` (the server closes after answering; nothing is
pooled), and a request that still dies before the server sent a single byte is sent once more.
A request whose response had begun (status line, headers or body bytes) is never retried: its
bytes are evidence of what the engine did.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import httpx

log = logging.getLogger("tuner.arms.http")

FRESH = {"Connection": "close"}
_NOTHING_SENT = "without sending a response"     # httpcore's words for a closed idle connection


def closed_before_response(e: BaseException) -> bool:
    """The server closed the connection before sending any byte of a response."""
    return isinstance(e, httpx.RemoteProtocolError) and _NOTHING_SENT in str(e)


def fresh_client(timeout: float = 30.0, connect: float | None = None) -> httpx.Client:
    """An httpx client that keeps no idle connection (each request opens its own)."""
    return httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0) if connect is None else connect),
                        limits=httpx.Limits(max_keepalive_connections=0))


@contextlib.contextmanager
def open_response(client: httpx.Client, method: str, url: str, **kw) -> Iterator[httpx.Response]:
    """Send one request on a fresh connection; yields the response with its headers read and
    its body unread (stream it or ``.read()`` it). Retried once, and only when the server
    closed the connection before answering anything."""
    headers = {**dict(kw.pop("headers", None) or {}), **FRESH}
    for attempt in (1, 2):
        req = client.build_request(method, url, headers=headers, **kw)
        try:
            r = client.send(req, stream=True)
        except httpx.RemoteProtocolError as e:
            if attempt == 2 or not closed_before_response(e):
                raise
            log.info("%s %s: server closed the connection before answering; sending once more", method, url)
            continue
        break
    try:
        yield r
    finally:
        r.close()


def request(client: httpx.Client, method: str, url: str, **kw) -> httpx.Response:
    """``open_response`` with the body read: a plain request on a fresh connection."""
    with open_response(client, method, url, **kw) as r:
        r.read()
    return r


def get(client: httpx.Client, url: str, **kw) -> httpx.Response:
    return request(client, "GET", url, **kw)


def post(client: httpx.Client, url: str, **kw) -> httpx.Response:
    return request(client, "POST", url, **kw)

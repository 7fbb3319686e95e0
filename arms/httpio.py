"""HTTP that survives real servers: one fresh connection per request, and no retry.

Real engines (llama.cpp's cpp-httplib, uvicorn) close idle keep-alive connections on their own
schedule; a client that reuses such a pooled connection gets ``RemoteProtocolError: Server
disconnected without sending a response`` and, without care, loses the run (4 of 10 runs
against a real llama-server). So every request an arm makes goes out with ``Connection:
close`` on a connection of its own (the server closes it after answering; nothing is pooled),
and the race cannot happen. Nothing is retried: httpcore reports a server that sent half a
status line and closed with the same words as one that sent nothing, so a retry could repeat
a request the engine had begun to answer; a fresh connection the server closes unanswered is
the engine's fault, and the run is invalid with that reason.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx

FRESH = {"Connection": "close"}


def fresh_client(timeout: float = 30.0, connect: float | None = None) -> httpx.Client:
    """An httpx client that keeps no idle connection (each request opens its own)."""
    return httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0) if connect is None else connect),
                        limits=httpx.Limits(max_keepalive_connections=0))


@contextlib.contextmanager
def open_response(client: httpx.Client, method: str, url: str, **kw) -> Iterator[httpx.Response]:
    """Send one request on a fresh connection; yields the response with its headers read and
    its body unread (stream it or ``.read()`` it)."""
    headers = {**dict(kw.pop("headers", None) or {}), **FRESH}
    r = client.send(client.build_request(method, url, headers=headers, **kw), stream=True)
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

"""Readiness: the health endpoint answers AND a tiny real completion returns text.

A 200 from /health alone is not readiness (seed 004: servers answer health while unable to
serve), and an answer is the booted engine's only while its container runs, its log shows
no failure to bind the port, and, where the engine has a models route, it serves the model
booted (``port-in-use`` otherwise: with host networking, whoever held the port would answer
for it). The wait ends early when the container dies (its exit code is the evidence), when the
boot log stops growing for ``hang_s`` (a hang), or at ``timeout_s`` (a boot timeout). Clock and
sleep are parameters so tests control time.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable

import httpx

from . import httpio
from .host import ContainerState, Host, LogFollower

LOG_TAIL = 1 << 20        # how much of the boot log (head + tail) each readiness poll reads


# the engine could not bind its port (uvicorn, cpp-httplib, Go/Rust servers, raw errno text)
BIND_FAILURE = re.compile(r"[Aa]ddress already in use|EADDRINUSE|couldn't bind HTTP server socket|"
                          r"failed to bind|[Cc]ould not bind|error while attempting to bind")


def bind_failure(log_text: str) -> str | None:
    """The first log line saying the server could not bind its port, or None."""
    m = BIND_FAILURE.search(log_text)
    if m is None:
        return None
    start = log_text.rfind("\n", 0, m.start()) + 1
    end = log_text.find("\n", m.end())
    return log_text[start:end if end >= 0 else len(log_text)].strip()[:300]


class BindWatch:
    """Reads only what a growing boot log added since the last look (at most ``LOG_TAIL``
    bytes of it, with a little overlap) for a bind failure: each poll costs its new lines."""

    def __init__(self, logs: LogFollower):
        self.path, self.pos, self.carry, self.found = logs.path, 0, b"", None

    def check(self) -> str | None:
        if self.found:
            return self.found
        try:
            size = self.path.stat().st_size
            if size < self.pos:                        # truncated: start over
                self.pos, self.carry = 0, b""
            if size == self.pos:
                return None
            with self.path.open("rb") as f:
                f.seek(max(self.pos, size - LOG_TAIL))
                data = f.read(size - f.tell())
        except OSError:
            return None
        self.pos = size
        self.found = bind_failure((self.carry + data).decode("utf-8", "replace"))
        self.carry = data[-256:]
        return self.found


@dataclass(frozen=True)
class ReadyResult:
    outcome: str                  # "ready" | "exited" | "port-in-use" | "boot-timeout" | "hang"
    seconds: float                # from start of the wait to the outcome
    state: ContainerState | None = None
    detail: str = ""

    @property
    def ready(self) -> bool:
        return self.outcome == "ready"


@dataclass(frozen=True)
class ReadinessProbe:
    health_path: str = "/health"
    completion_path: str = "/v1/completions"
    prompt: str = "Hello"
    max_tokens: int = 4
    text_key: str = "text"        # choices[0][text_key] must be non-empty
    models_path: str | None = "/v1/models"
    expect_models: tuple[str, ...] = ()   # names the booted engine serves under (empty: not checked)


class WrongEngine(Exception):
    """The server answering serves another model than the one booted (the message says which)."""


def served_names(body: object) -> list[str]:
    """Every name a models-route answer gives its models: vLLM ``id`` / ``root``, llama-server
    ``id`` / ``aliases`` (and its Ollama-style ``models[].model``)."""
    out: list[str] = []
    if not isinstance(body, dict):
        return out
    for key, fields in (("data", ("id", "root")), ("models", ("model", "name"))):
        entries = body.get(key)
        for m in entries if isinstance(entries, list) else ():
            if not isinstance(m, dict):
                continue
            vals = [m.get(f) for f in fields] + list(m.get("aliases") or [])
            out += [v for v in vals if isinstance(v, str) and v]
    return out


def _same_model(a: str, b: str) -> bool:
    """One name for the same model: equal, or the same last path component (a path seen
    through another mount, an HF id beside its local directory)."""
    a, b = a.strip().rstrip("/"), b.strip().rstrip("/")
    return a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1] != ""


def wrong_model(client: httpx.Client, base_url: str, probe: ReadinessProbe) -> str | None:
    """Why the server that answers is not the engine booted (it serves another model), or None
    when it is, or when the engine does not say (no models route, an answer without names)."""
    if not probe.expect_models or not probe.models_path:
        return None
    try:
        r = httpio.get(client, base_url + probe.models_path)
        names = served_names(r.json()) if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return None
    if not names or any(_same_model(n, e) for n in names for e in probe.expect_models):
        return None
    return (f"the server answering on {base_url} serves model {names[0]!r} "
            f"({probe.models_path}), not {probe.expect_models[0]!r} of the engine booted: "
            f"another engine holds the port; stop it or give the campaign another baseline.port")


def probe_once(client: httpx.Client, base_url: str, probe: ReadinessProbe, model: str | None) -> tuple[bool, str]:
    """One readiness check; (ready, what was seen). Raises WrongEngine when the server that
    answers serves another model (it is never sent a completion)."""
    try:
        r = httpio.get(client, base_url + probe.health_path)
    except httpx.HTTPError as e:
        return False, f"health: {type(e).__name__}"
    if r.status_code != 200:
        return False, f"health: HTTP {r.status_code}{_snippet(r)}"
    wrong = wrong_model(client, base_url, probe)
    if wrong:                     # not ours: never send it a completion
        raise WrongEngine(wrong)
    body = {"prompt": probe.prompt, "max_tokens": probe.max_tokens, "temperature": 0}
    if model:
        body["model"] = model
    try:
        c = httpio.post(client, base_url + probe.completion_path, json=body)
    except httpx.HTTPError as e:
        return False, f"completion: {type(e).__name__}"
    if c.status_code != 200:
        return False, f"completion: HTTP {c.status_code}{_snippet(c)}"
    try:
        text = c.json()["choices"][0].get(probe.text_key) or ""
    except (ValueError, KeyError, IndexError, TypeError):
        return False, "completion: malformed body"
    return (bool(text), "completion: text" if text else "completion: empty text")


def _snippet(r: httpx.Response) -> str:
    """The start of an error body on one line, for the reason a boot never became ready."""
    text = " ".join(r.text.split())[:120]
    return f" {text!r}" if text else ""


def wait_ready(host: Host, cid: str, base_url: str, logs: LogFollower, *,
               probe: ReadinessProbe = ReadinessProbe(), model: str | None = None,
               timeout_s: float = 1200.0, hang_s: float = 600.0, poll_s: float = 1.0,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
               http: httpx.Client | None = None, poll_max_s: float = 3.0) -> ReadyResult:
    """Polls from ``poll_s`` apart, backing off (x1.5) to at most ``poll_max_s`` or 4 x poll_s:
    a boot of minutes costs ~100 probes, not one a second, and is still seen within seconds."""
    t0 = clock()
    delay, cap = poll_s, max(poll_s, min(poll_max_s, 4 * poll_s))
    last_size, last_growth = -1, t0
    seen = ""
    watch = BindWatch(logs)
    client = http or httpio.fresh_client(10.0, connect=2.0)
    try:
        while True:
            now = clock()
            st = host.state(cid)
            if st.exited:
                return ReadyResult("exited", now - t0, st, f"container exited with code {st.exit_code}")
            bind = watch.check()
            if bind:
                return ReadyResult("port-in-use", now - t0, st, bind)
            try:
                ok, seen = probe_once(client, base_url, probe, model)
            except WrongEngine as e:
                return ReadyResult("port-in-use", clock() - t0, host.state(cid), str(e))
            if ok:                    # the answer counts only if our container still runs and bound
                st = host.state(cid)
                if st.exited:
                    return ReadyResult("exited", clock() - t0, st,
                                       f"container exited with code {st.exit_code} (something else answered)")
                bind = watch.check()
                if bind:
                    return ReadyResult("port-in-use", clock() - t0, st, bind)
                return ReadyResult("ready", clock() - t0, st, seen)
            size = logs.path.stat().st_size if logs.path.exists() else 0
            if size != last_size:
                last_size, last_growth = size, now
            if now - t0 >= timeout_s:
                return ReadyResult("boot-timeout", now - t0, st, f"not ready after {timeout_s:.0f} s ({seen})")
            if now - last_growth >= hang_s:
                return ReadyResult("hang", now - t0, st,
                                   f"boot log silent for {now - last_growth:.0f} s and not ready ({seen})")
            sleep(delay)
            delay = min(cap, delay * 1.5)
    finally:
        if http is None:
            client.close()

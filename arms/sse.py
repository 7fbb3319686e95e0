"""Incremental Server-Sent Events parser: bytes in, events out. Pure; no I/O, no clock.

``SSEParser.feed(chunk)`` takes whatever the network delivered (a chunk may end anywhere,
inside a line, inside a UTF-8 sequence, or between the CR and LF of a CRLF) and returns the
events completed by it. Lines end in LF, CRLF or CR; ``:`` lines are comments; an event is
dispatched at a blank line (WHATWG rules: ``data`` lines of one event join with ``\\n``, one
space after the colon is dropped, unknown fields are ignored). ``close()`` flushes at EOF.

What a stream must not contain is recorded in ``problems`` rather than raised, so the
caller decides (a measurement marks its run invalid): undecodable UTF-8, unknown field
names, an over-long line, an event cut off by EOF. ``decode_json(event)`` turns a ``data``
payload into an object or a one-line reason why it is malformed.

``CompletionStream`` folds the events of an OpenAI-style ``/v1/completions`` stream (vLLM:
token chunks, then a ``"choices":[]`` chunk with ``usage``; llama.cpp: the last chunk keeps its
choices and carries ``usage`` and ``timings``) into one record, given each event's arrival
time. The caller does the I/O and supplies the times.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_FIELDS = ("data", "event", "id", "retry")
MAX_LINE_BYTES = 8 << 20


@dataclass(frozen=True)
class Event:
    data: str
    event: str = "message"
    id: str | None = None

    @property
    def done(self) -> bool:
        """The OpenAI-style end-of-stream sentinel ``data: [DONE]``."""
        return self.data.strip() == "[DONE]"


class SSEParser:
    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES):
        self._buf = bytearray()
        self._skip_lf = False          # the previous chunk ended in CR: a leading LF is its pair
        self._first = True             # a UTF-8 BOM may open the stream
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._max = max_line_bytes
        self.problems: list[str] = []
        self.lines = 0

    def feed(self, chunk: bytes) -> list[Event]:
        out: list[Event] = []
        if not chunk:
            return out
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        self._buf += chunk
        start = 0
        buf = self._buf
        n = len(buf)
        while start < n:
            cr, lf = buf.find(b"\r", start), buf.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 or 0 <= lf < cr else cr
            line = bytes(buf[start:end])
            if buf[end:end + 1] == b"\r":
                if end + 1 < n:
                    start = end + 2 if buf[end + 1:end + 2] == b"\n" else end + 1
                else:                  # CR at the very end: its LF may be in the next chunk
                    start, self._skip_lf = end + 1, True
            else:
                start = end + 1
            ev = self._line(line)
            if ev is not None:
                out.append(ev)
        del buf[:start]
        if len(buf) > self._max:
            self.problems.append(f"line longer than {self._max} bytes without a line end")
            buf.clear()
        return out

    def close(self) -> list[Event]:
        """End of stream: a partial line is processed; an event without its blank line is a
        problem (it is still returned, so the caller can see what arrived)."""
        out: list[Event] = []
        if self._buf:
            line, self._buf = bytes(self._buf), bytearray()
            ev = self._line(line)
            if ev is not None:
                out.append(ev)
        if self._data:
            self.problems.append("stream ended inside an event (no blank line after it)")
            out.append(self._dispatch())
        return out

    # -- one line --------------------------------------------------------------------------
    def _line(self, raw: bytes) -> Event | None:
        self.lines += 1
        if self._first:
            self._first = False
            if raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
        if not raw:
            return self._dispatch() if self._data else self._reset()
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.problems.append(f"line {self.lines}: invalid UTF-8 ({e.reason})")
            line = raw.decode("utf-8", "replace")
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name not in _FIELDS:
            self.problems.append(f"line {self.lines}: not an SSE field: {_clip(line)!r}")
        return None

    def _dispatch(self) -> Event:
        ev = Event("\n".join(self._data), self._event or "message", self._id)
        self._reset()
        return ev

    def _reset(self) -> None:
        self._data, self._event = [], ""
        return None


def decode_json(event: Event) -> tuple[Any, str | None]:
    """(object, None) for a JSON ``data`` payload, or (None, reason) when it is malformed."""
    try:
        return json.loads(event.data), None
    except json.JSONDecodeError as e:
        return None, f"malformed SSE data ({e.msg} at column {e.pos + 1}): {_clip(event.data)!r}"


def parse_all(raw: bytes) -> tuple[list[Event], list[str]]:
    """A whole stream at once: (events, problems)."""
    p = SSEParser()
    events = p.feed(raw) + p.close()
    return events, p.problems


def _clip(s: str, n: int = 80) -> str:
    return s if len(s) <= n else s[:n] + "..."


@dataclass
class CompletionStream:
    """What one streamed completion said; times in seconds from the request start."""

    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None          # first event with text (or a finish reason)
    wall_s: float | None = None          # ``[DONE]``, else the end of the stream
    text: str = ""
    usage: dict | None = None
    finish_reason: str | None = None
    chunks: int = 0                      # events carrying text
    timings: dict | None = None          # llama.cpp's own timings
    done: bool = False

    def add(self, event: Event, t: float) -> str | None:
        """Fold one event that arrived at ``t``; a reason when it is unusable."""
        if event.done:
            self.done, self.wall_s = True, t
            return None
        obj, bad = decode_json(event)
        if bad:
            return bad
        if not isinstance(obj, dict):
            return f"malformed SSE data: a JSON {type(obj).__name__}, not an object"
        if obj.get("error"):
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            return f"engine error in stream: {msg}"
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                return f"malformed SSE data: a choice that is not an object: {_clip(event.data)!r}"
            text, fin = choice.get("text") or "", choice.get("finish_reason")
            if text:
                self.chunks += 1
                self.text += text
            if self.ttft_s is None and (text or fin):
                self.ttft_s = t
            if fin:
                self.finish_reason = fin
        if obj.get("usage"):
            self.usage = obj["usage"]
        if obj.get("timings"):
            self.timings = obj["timings"]
        return None

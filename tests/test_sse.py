"""arms.sse: the incremental SSE parser, fed whole, split everywhere, and fed garbage."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from arms.sse import CompletionStream, Event, SSEParser, decode_json, parse_all

# A vLLM-shaped /v1/completions stream (engine-interface B): token chunks, then the usage
# chunk with "choices":[], then [DONE].
VLLM_STREAM = (
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" The",'
    b'"finish_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" keeper",'
    b'"finish_reason":"length"}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","choices":[],"usage":{"prompt_tokens":5,'
    b'"total_tokens":7,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n")

# llama.cpp (engine-interface D): the last chunk keeps choices and carries usage + timings.
LLAMACPP_STREAM = (
    b'data: {"choices":[{"text":" h\xc3\xa9","index":0,"finish_reason":null}],'
    b'"object":"text_completion"}\r\n\r\n'
    b'data: {"choices":[{"text":"","index":0,"finish_reason":"length"}],"usage":'
    b'{"completion_tokens":2,"prompt_tokens":3,"total_tokens":5},"timings":'
    b'{"predicted_n":2,"predicted_per_second":51.5}}\r\n\r\n'
    b"data: [DONE]\r\n\r\n")


@dataclass
class Case:
    name: str
    raw: bytes
    data: list[str]
    problems: int = 0


CASES = [
    Case("lf", b"data: a\n\ndata: b\n\n", ["a", "b"]),
    Case("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", ["a", "b"]),
    Case("cr", b"data: a\r\rdata: b\r\r", ["a", "b"]),
    Case("comments", b": keep-alive\n\n:ping\ndata: a\n\n", ["a"]),
    Case("multi-line data", b"data: a\ndata: b\n\n", ["a\nb"]),
    Case("no space after colon", b"data:a\n\n", ["a"]),
    Case("only one space dropped", b"data:  a\n\n", [" a"]),
    Case("empty data line", b"data\n\n", [""]),
    Case("blank lines alone dispatch nothing", b"\n\n\r\n", []),
    Case("event and id fields", b"event: x\nid: 7\ndata: a\n\n", ["a"]),
    Case("retry is a known field", b"retry: 100\ndata: a\n\n", ["a"]),
    Case("bom", b"\xef\xbb\xbfdata: a\n\n", ["a"]),
    Case("unknown field", b"dtaa: a\ndata: b\n\n", ["b"], 1),
    Case("bad utf-8", b"data: \xff\xfe\n\n", ["\ufffd\ufffd"], 1),
    Case("eof inside event", b"data: a\n\ndata: b", ["a", "b"], 1),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_whole_stream(case: Case):
    events, problems = parse_all(case.raw)
    assert [e.data for e in events] == case.data
    assert len(problems) == case.problems, problems


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_byte_at_a_time_equals_whole(case: Case):
    p = SSEParser()
    events: list[Event] = []
    for i in range(len(case.raw)):
        events += p.feed(case.raw[i:i + 1])
    events += p.close()
    assert [e.data for e in events] == case.data
    assert len(p.problems) == case.problems


@pytest.mark.parametrize("raw", [VLLM_STREAM, LLAMACPP_STREAM], ids=["vllm", "llamacpp"])
def test_every_split_point(raw: bytes):
    whole, _ = parse_all(raw)
    for cut in range(1, len(raw)):
        p = SSEParser()
        got = p.feed(raw[:cut]) + p.feed(raw[cut:]) + p.close()
        assert got == whole, cut
        assert p.problems == []


def test_crlf_split_between_cr_and_lf_is_one_line_end():
    p = SSEParser()
    got = p.feed(b"data: a\r") + p.feed(b"\ndata: b\r") + p.feed(b"\n\r") + p.feed(b"\n")
    assert [e.data for e in got] == ["a\nb"]


def test_event_fields_and_done():
    events, _ = parse_all(b"event: update\nid: 42\ndata: [DONE]\n\n")
    assert events == [Event("[DONE]", "update", "42")]
    assert events[0].done


def test_vllm_stream_decodes():
    events, problems = parse_all(VLLM_STREAM)
    assert problems == [] and events[-1].done
    objs = [decode_json(e)[0] for e in events[:-1]]
    assert [o["choices"][0]["text"] for o in objs[:2]] == [" The", " keeper"]
    assert objs[2]["choices"] == [] and objs[2]["usage"]["completion_tokens"] == 2


def test_llamacpp_stream_decodes_utf8_and_final_chunk():
    events, problems = parse_all(LLAMACPP_STREAM)
    assert problems == []
    first, last = decode_json(events[0])[0], decode_json(events[1])[0]
    assert first["choices"][0]["text"] == " hé"
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["timings"]["predicted_per_second"] == 51.5


def test_utf8_split_inside_a_character():
    raw = 'data: "é€"\n\n'.encode()
    for cut in range(1, len(raw)):
        p = SSEParser()
        got = p.feed(raw[:cut]) + p.feed(raw[cut:])
        assert decode_json(got[0]) == ("é€", None)
        assert p.problems == []


def test_malformed_json_is_reported_not_raised():
    # the simulated engine's "garbage" fault writes a JSON object cut short
    events, problems = parse_all(b'data: {"id":"cmpl-1","object":"text_compl\n\n')
    assert problems == []
    obj, reason = decode_json(events[0])
    assert obj is None and reason.startswith("malformed SSE data")
    assert "text_compl" in reason


def test_overlong_line_is_a_problem_and_memory_is_bounded():
    p = SSEParser(max_line_bytes=64)
    assert p.feed(b"data: " + b"x" * 100) == []
    assert p.problems and "longer than 64" in p.problems[0]


def fold(raw: bytes) -> CompletionStream:
    c = CompletionStream()
    events, _ = parse_all(raw)
    for t, ev in enumerate(events, 1):
        assert c.add(ev, float(t)) is None
    return c


def test_completion_stream_vllm_shape():
    c = fold(VLLM_STREAM)
    assert (c.text, c.chunks, c.finish_reason, c.ttft_s, c.wall_s) == (" The keeper", 2, "length",
                                                                        1.0, 4.0)
    assert c.usage["completion_tokens"] == 2 and c.done and c.timings is None


def test_completion_stream_llamacpp_shape():
    c = fold(LLAMACPP_STREAM)
    assert (c.text, c.chunks, c.finish_reason) == (" hé", 1, "length")
    assert c.usage["completion_tokens"] == 2 and c.timings["predicted_per_second"] == 51.5


@pytest.mark.parametrize("data,why", [
    ('{"choices":[{"text":"a"', "malformed SSE data"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"choices":["a"]}', "a choice that is not an object"),
    ('{"error":{"message":"boom"}}', "engine error in stream: boom"),
])
def test_completion_stream_rejects(data, why):
    assert why in CompletionStream().add(Event(data), 0.0)

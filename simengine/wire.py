"""vLLM's wire formats, as the simulated engine speaks them: responses, request validation
with vLLM's wording, the Prometheus metrics text, log lines and the fork's telemetry json.
Pure functions and data; ``engine.EngineCore`` decides what to answer. Stdlib only.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from . import tokenizer as tok
from .behaviour import Behaviour

VLLM_VERSION = "0.29.0.dev0+sim"
COUNTERS = ("routed", "hits", "installs", "read_through", "prefetched", "served_by_prefetch")
PERMS = {"allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
         "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
         "is_blocking": False}


def _pid(process: str) -> int:
    """The boot log's pids (``simengine.cli.Log``): APIServer 1, EngineCore 7, workers 8+rank."""
    if process.startswith("Worker_TP"):
        return 8 + int(process[9:])
    return 1 if process == "APIServer" else 7


def log_line(process: str, level: str, where: str, msg: str, stamp: str | None = None) -> str:
    """One vLLM 0.33 line: ``(APIServer pid=1) INFO MM-DD HH:MM:SS [file.py:N] msg``."""
    stamp = stamp or time.strftime("%m-%d %H:%M:%S")
    return f"({process} pid={_pid(process)}) {level} {stamp} [{where}] {msg}"


def telemetry_report(b: Behaviour, rank: int, steps: int) -> dict:
    """The fork's ``expert_cache_rank<N>.json``: per-layer counter = per-step rate x steps.

    Rounded cumulatively over the layers of a kind, so a kind's total is the rounded exact
    product (rounding each layer alone biases ratios such as prefetch precision by up to
    half a count per layer, enough to move 36.4 % to 36.5 %)."""
    layers, seen = [], {}
    for i, kind in enumerate(["resident"] * b.resident_layers + ["swap"] * b.swap_layers):
        rates = b.expert_counters.get(kind, {})
        k = seen[kind] = seen.get(kind, 0) + 1
        layers.append({"layer": i, "kind": kind,
                       **{c: round(rates.get(c, 0.0) * steps * k)
                          - round(rates.get(c, 0.0) * steps * (k - 1)) for c in COUNTERS}})
    totals = {c: sum(layer[c] for layer in layers) for c in COUNTERS}
    return {"rank": rank, "steps": steps, "slab_bytes": b.slab_bytes, "layers": layers,
            "totals": totals}


class BadRequest(Exception):
    pass


@dataclass
class Response:
    """One answer. ``chunks`` (a generator, started by the first ``next``) is a chunked body;
    ``truncated`` is set when the engine dropped the connection without finishing (a stall
    released by shutdown): the server closes it, no terminating chunk (no response at all
    when nothing was streamed)."""

    status: int
    ctype: str | None = None
    body: bytes = b""
    chunks: Iterator[bytes] | None = None
    truncated: bool = False


def json_response(status: int, obj: object) -> Response:
    return Response(status, "application/json", json.dumps(obj, separators=(",", ":")).encode())


def error_response(status: int, message: str, typ: str) -> Response:
    return json_response(status, {"error": {"message": message, "type": typ, "param": None,
                                            "code": status}})


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def parse_completion(body: dict, max_model_len: int) -> tuple[list[int], int, float]:
    """(prompt ids, max_tokens, temperature), or BadRequest with vLLM's wording."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tok.tokenize(prompt)
    elif isinstance(prompt, list) and set(map(type, prompt)) <= {int}:
        tok.check_ids(prompt)
        ids = list(prompt)
    else:
        raise BadRequest("'prompt' must be a string or a list of token ids (one prompt)")
    if not ids:
        raise BadRequest("The decoder prompt cannot be empty")
    n, limit = len(ids), max_model_len
    if n >= limit:
        raise BadRequest(f"This model's maximum context length is {limit} tokens. However, "
                         f"your request has {n} input tokens. Please reduce the length of "
                         "the input messages.")
    max_tokens = body.get("max_tokens", 16)
    max_tokens = limit - n if max_tokens is None else max_tokens
    if type(max_tokens) is not int or max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens!r}.")
    if n + max_tokens > limit:
        raise BadRequest(f"This model's maximum context length is {limit} tokens. However, "
                         f"you requested {n + max_tokens} tokens ({n} in the messages, "
                         f"{max_tokens} in the completion). Please reduce the length of the "
                         "messages or completion.")
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    if type(temperature) not in (int, float) or temperature < 0:
        raise BadRequest(f"temperature must be non-negative, got {temperature!r}.")
    return ids, max_tokens, float(temperature)


_METRICS = (  # name, type, help, EngineCore attribute
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


def metrics_text(core) -> str:
    """Prometheus text exposition (0.0.4) with vLLM's names from an ``EngineCore``'s counters;
    spec decode only when spec_k > 0."""
    model = core.b.model.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    out: list[str] = []
    with core.lock:
        for name, typ, doc, attr in _METRICS:
            if "spec_decode" in name and core.b.spec_k <= 0:
                continue
            value = getattr(core, attr)
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

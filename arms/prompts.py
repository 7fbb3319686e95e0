"""Exact-depth prompts: N tokens by the serving engine's own tokenizer, the same for every arm.

The text comes from a fixed corpus shipped here (original sentences, arranged in numbered
parts by a fixed permutation, so it never depends on a file, the locale or ``hash()``).
``build_prompt`` asks the server's tokenize endpoint (``EngineAPI``) how many tokens a prefix
of that text is, and returns:

* when the engine accepts token-id prompts: the first N ids of a long enough prefix;
* otherwise: a text prefix cut at word boundaries (binary search), then completed with
  characters of the next word or short fillers until the endpoint counts exactly N.

``PromptCache`` keeps one prompt per (profile, served model, depth, head), so every arm of a
campaign measures the identical prompts (see CACHE_DEFEATS for the per-run heads). A missing
tokenize endpoint is a MeasurementError naming the profile key to set.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import httpx

from . import httpio
from .errors import MeasurementError

# How each measured run defeats the engine's prompt cache, so that its TTFT and prefill are the
# engine's real ones (profile key readiness.cache_defeat; default by family):
#   cache_prompt  llama.cpp: "cache_prompt": false in the body; the prompt is the same for every run
#   salt          vLLM >= 0.9: a unique "cache_salt" per request; the prompt is the same for every run
#   prefix        any engine: each run gets its own prompt, the same depth with a different first line
#                 ("Log <depth>-<run>."), the same for every arm, so arms compare run by run
#   none          nothing (an engine without a prompt cache)
CACHE_DEFEATS = ("cache_prompt", "salt", "prefix", "none")
_FAMILY_DEFEAT = {"llamacpp": "cache_prompt", "vllm": "salt"}

TOKENIZE_KEYS = ("readiness.tokenize_path", "readiness.tokenize_request_key",
                 "readiness.tokenize_response_key")


@dataclass(frozen=True)
class EngineAPI:
    """The HTTP surface a measurement uses (derived from an engine profile)."""

    name: str                                   # profile name, quoted in error messages
    tokenize_path: str | None = "/tokenize"
    tokenize_request_key: str = "prompt"        # vLLM "prompt"; llama.cpp "content"
    tokenize_response_key: str = "tokens"
    tokenize_extra: tuple[tuple[str, Any], ...] = ()   # extra body keys, as (key, value) pairs
    completions_path: str = "/v1/completions"
    models_path: str | None = "/v1/models"
    metrics_path: str | None = "/metrics"
    accepts_token_ids: bool = True              # completions take a list of ids as the prompt
    ignores_eos: bool = False                   # the engine always produces max_tokens
    cache_defeat: str = "none"                  # how a measured run misses the prompt cache (CACHE_DEFEATS)
    prefix_hits_metric: str | None = None       # /metrics counter of prompt tokens served from a cache
    spec_drafts_metric: str | None = None
    spec_draft_tokens_metric: str | None = None
    spec_accepted_metric: str | None = None


VLLM_API = EngineAPI(
    name="vllm", tokenize_extra=(("add_special_tokens", True),), cache_defeat="salt",
    prefix_hits_metric="vllm:prefix_cache_hits_total",
    spec_drafts_metric="vllm:spec_decode_num_drafts_total",
    spec_draft_tokens_metric="vllm:spec_decode_num_draft_tokens_total",
    spec_accepted_metric="vllm:spec_decode_num_accepted_tokens_total")

LLAMACPP_API = EngineAPI(
    name="llamacpp", tokenize_request_key="content",
    tokenize_extra=(("add_special", True), ("with_pieces", False)),
    accepts_token_ids=False, cache_defeat="cache_prompt",
    spec_drafts_metric="llamacpp:spec_decode_num_drafts_total",
    spec_draft_tokens_metric="llamacpp:spec_decode_num_draft_tokens_total",
    spec_accepted_metric="llamacpp:spec_decode_num_accepted_tokens_total")


def api_from_profile(profile: Any, *, accepts_token_ids: bool | None = None) -> EngineAPI:
    """An EngineAPI from an engine profile (anything with the EngineProfile attributes)."""
    spec = dict(getattr(profile, "spec_decode_metrics", {}) or {})
    family = getattr(profile, "family", "")
    return EngineAPI(
        name=profile.name, tokenize_path=profile.tokenize_path,
        tokenize_request_key=profile.tokenize_request_key,
        tokenize_response_key=profile.tokenize_response_key,
        tokenize_extra=tuple(dict(profile.tokenize_extra or {}).items()),
        completions_path=getattr(profile, "completion_path", "/v1/completions"),
        accepts_token_ids=family == "vllm" if accepts_token_ids is None else accepts_token_ids,
        ignores_eos=bool(profile.ignores_eos),
        cache_defeat=getattr(profile, "cache_defeat", None) or _FAMILY_DEFEAT.get(family, "prefix"),
        prefix_hits_metric="vllm:prefix_cache_hits_total" if family == "vllm" else None,
        spec_drafts_metric=spec.get("drafts"), spec_draft_tokens_metric=spec.get("draft_tokens"),
        spec_accepted_metric=spec.get("accepted_tokens"))


@dataclass(frozen=True)
class Prompt:
    depth: int
    text: str | None                 # the text sent (None when token ids are sent)
    token_ids: tuple[int, ...] | None

    @property
    def payload(self) -> str | list[int]:
        """The value of the completion request's ``prompt`` field."""
        return list(self.token_ids) if self.token_ids is not None else self.text or ""


# -- the corpus -------------------------------------------------------------------------------
_SENTENCES = tuple(s.strip() + "." for s in """
The keeper of the harbour light wrote down the weather every morning before the boats went out
A narrow path climbed from the quay to the tower between walls of grey stone and yellow moss
Each spring the gulls returned to the ledges under the lamp room and argued through the night
The lens was cleaned with soft cloth and a little spirit so that no streak could dim the beam
Fishermen trusted the light more than their charts because the charts were older than the town
When fog rolled in from the west the horn sounded twice a minute until the air cleared again
Supplies arrived by cart on the first day of each month and were counted against the ledger
The ledger recorded oil, wicks, bread, salt fish, candles, rope and the price paid for each
In winter the wind found every gap in the windows and the keeper stuffed them with old sails
A small garden behind the cottage grew beans, onions and a few stubborn rows of potatoes
Children from the village came on Sundays to climb the stairs and count the steps aloud
There were one hundred and twelve steps, though the children rarely agreed on the number
Ships passing at night signalled with their lamps and the keeper answered with a flag at dawn
The clockwork that turned the lens had to be wound by hand every four hours without fail
A brass plate by the door gave the height of the tower and the year the first stone was laid
Storms sometimes threw spray over the gallery rail and left salt crusted on the glass
After a storm the keeper walked the shore to look for wreckage, lost nets or stranded seals
The nearest doctor lived three miles inland and came by pony when the road was not flooded
Letters were few, but each one was read twice and then kept in a tin box under the bed
A barometer hung in the kitchen and its needle was tapped each hour to see which way it moved
Old maps in the cupboard showed sandbanks that had shifted since they were drawn
The inspector visited once a year, ran a finger along the shelves and asked to see the log
Every entry in the log was signed, even the ones that said only calm sea and clear sky
On quiet evenings the keeper mended clothes by lamplight and listened to the tide on the rocks
The tide tables were pinned above the stove and crossed out one day at a time
Sometimes a lost traveller knocked at the door and was given soup and a blanket by the fire
The lamp itself burned with a steady yellow flame that could be seen for many miles at sea
Rust was the constant enemy, and the railings were scraped and painted every summer
A pair of ravens nested in the cliff and stole anything shiny that was left outside
The keeper kept a list of every ship name seen through the telescope over thirty years
Rain ran down the tower in sheets and gurgled through the drains into the rock pools below
The village church rang its bell at noon, and on a still day the sound carried to the point
Candles were saved for emergencies because the oil was measured and had to last the month
In the longest nights the keeper slept in short turns and woke by habit before the lamp dimmed
A wooden chest held spare glass, tools, a lantern, flags and a book of signal codes
The pilots who guided ships into the harbour stopped for tea and news on their way home
The lens had been made far away by craftsmen who ground each prism by hand
A crack in one prism once forced the keeper to shade that side with a sheet of tin
Salt air made bread go stale quickly, so baking was done twice a week in the iron oven
On clear nights the stars were so bright that the lamp seemed small beside them
The path to the tower was lined with white stones so it could be followed in the dark
Visitors often asked whether the work was lonely, and the keeper usually said it was not
Seals hauled out on the flat rocks at low tide and watched the tower with mild interest
A record of every storm was kept, with the wind direction, the hour and any damage done
Later the light was fitted with an electric lamp and the clockwork was left to gather dust
Even then the keeper climbed the stairs each evening, out of habit, to watch the beam turn
""".strip().splitlines())


def corpus_text(min_words: int) -> str:
    """At least ``min_words`` words of the fixed corpus (numbered parts, fixed order)."""
    parts: list[str] = []
    words, part, x = 0, 1, 0x1B873593
    while words < min_words:
        order = list(range(len(_SENTENCES)))
        for i in range(len(order) - 1, 0, -1):       # Fisher-Yates with a fixed 32-bit LCG
            x = (1664525 * x + 1013904223) & 0xFFFFFFFF
            j = x % (i + 1)
            order[i], order[j] = order[j], order[i]
        body = " ".join(_SENTENCES[i] for i in order)
        parts.append(f"Part {part}. {body}")
        words += len(body.split()) + 2
        part += 1
    return "\n\n".join(parts)


def _corpus_pieces(min_words: int) -> list[str]:
    """Words with the whitespace before them: a prefix of k pieces is a prefix of the text."""
    out: list[str] = []
    text = corpus_text(min_words)
    i, n = 0, len(text)
    while i < n:
        j = i
        while j < n and text[j].isspace():
            j += 1
        while j < n and not text[j].isspace():
            j += 1
        out.append(text[i:j])
        i = j
    return out


MAX_GROW = 6       # a prompt builder doubles its text at most this often: 64x an honest count


def _body(r: httpx.Response) -> str:
    """An error response's body on one line, clipped."""
    text = " ".join(r.text.split())
    return repr(text[:200]) if text else "(empty body)"


_FILLERS = (".", ",", " a", " the", " and", " of", "\n", " to", " in", "-", " it", " is")


# -- the tokenizer endpoint -------------------------------------------------------------------
class Tokenizer:
    """Counts tokens through the engine's own tokenize endpoint."""

    def __init__(self, client: httpx.Client, base_url: str, api: EngineAPI, model: str | None):
        if not api.tokenize_path:
            raise MeasurementError(
                f"profile {api.name!r} has no tokenize endpoint, so exact-depth prompts cannot "
                f"be built; set readiness.tokenize_path in the engine profile")
        self.client, self.api, self.model = client, api, model
        self.url = base_url.rstrip("/") + api.tokenize_path
        self.calls = 0

    def ids(self, text: str) -> list[int]:
        api = self.api
        body: dict[str, Any] = {api.tokenize_request_key: text, **dict(api.tokenize_extra)}
        if self.model and api.tokenize_request_key == "prompt":
            body["model"] = self.model
        self.calls += 1
        try:
            r = httpio.post(self.client, self.url, json=body)
        except httpx.HTTPError as e:
            raise MeasurementError(f"tokenize endpoint {self.url} failed ({type(e).__name__}: "
                                   f"{e}); check the engine and readiness.tokenize_path of "
                                   f"profile {api.name!r}") from e
        if r.status_code in (404, 405, 501):
            raise MeasurementError(
                f"tokenize endpoint {self.url} answered {r.status_code}: the engine has no such "
                f"route; set readiness.tokenize_path (and tokenize_request_key / "
                f"tokenize_response_key) in engine profile {api.name!r}")
        if r.status_code in (400, 422):
            raise MeasurementError(f"tokenize endpoint {self.url} answered HTTP {r.status_code}: "
                                   f"{_body(r)}; check readiness.tokenize_request_key "
                                   f"({api.tokenize_request_key!r}) of profile {api.name!r}")
        if r.status_code != 200:
            raise MeasurementError(f"tokenize endpoint {self.url} answered HTTP {r.status_code}: {_body(r)}")
        try:
            tokens = r.json()[api.tokenize_response_key]
            return [t["id"] if isinstance(t, dict) else int(t) for t in tokens]
        except (ValueError, KeyError, TypeError, OverflowError) as e:
            raise MeasurementError(
                f"tokenize endpoint {self.url} answered without a token list under "
                f"{api.tokenize_response_key!r}; set readiness.tokenize_response_key in profile "
                f"{api.name!r} (got {r.text[:120]!r})") from e

    def count(self, text: str) -> int:
        return len(self.ids(text))


def build_prompt(tok: Tokenizer, depth: int, max_calls: int = 80, head: str = "") -> Prompt:
    """A prompt of exactly ``depth`` tokens by ``tok``'s count (see the module docstring);
    ``head`` starts the text (a first line that makes the prompt unique)."""
    if depth < 1:
        raise MeasurementError(f"prompt depth must be at least 1, got {depth}")

    def _pieces(n: int) -> list[str]:
        out = _corpus_pieces(n)
        return [head + out[0], *out[1:]] if head else out
    pieces = _pieces(depth + 16)
    hi = min(len(pieces), depth + 8)
    before: tuple[int, int] | None = None             # (words, count) of the previous try
    for grow in range(MAX_GROW + 1):                 # grow until the prefix reaches depth
        ids = tok.ids("".join(pieces[:hi]))
        if len(ids) >= depth:
            break
        if before is not None and len(ids) <= before[1]:
            raise MeasurementError(
                f"tokenize endpoint {tok.url} lied: it counted {before[1]} tokens for {before[0]} "
                f"words and {len(ids)} for {hi} words (a longer text must count more)")
        if grow == MAX_GROW:
            raise MeasurementError(
                f"tokenize endpoint {tok.url} lied: it counted only {len(ids)} tokens for {hi} words "
                f"({sum(map(len, pieces[:hi]))} characters), short of the depth {depth} after "
                f"{MAX_GROW} doublings")
        before = (hi, len(ids))
        hi *= 2
        if hi > len(pieces):
            pieces = _pieces(hi + 16)
    if tok.api.accepts_token_ids:
        return Prompt(depth, None, tuple(ids[:depth]))
    if len(ids) == depth:
        return Prompt(depth, "".join(pieces[:hi]), None)
    lo, c_lo, c_hi = 0, 0, len(ids)                  # count(lo) < depth < count(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        text = "".join(pieces[:mid])
        c = tok.count(text)
        if c == depth:
            return Prompt(depth, text, None)
        if not c_lo <= c <= c_hi:
            raise MeasurementError(
                f"tokenize endpoint {tok.url} lied: it counted {c} tokens for {mid} words, but "
                f"{c_lo} for {lo} words and {c_hi} for {hi} (a longer text must count more)")
        lo, hi, c_lo, c_hi = (mid, hi, c, c_hi) if c < depth else (lo, mid, c_lo, c)
    base, nxt = "".join(pieces[:lo]), pieces[lo]
    tails = [nxt[:j] for j in range(1, len(nxt))] + list(_FILLERS)
    tails += [a + b for a in _FILLERS[:4] for b in _FILLERS[:6]]
    for tail in tails:
        if tok.calls >= max_calls:
            break
        text = base + tail
        if tok.count(text) == depth:
            return Prompt(depth, text, None)
    raise MeasurementError(
        f"could not build a prompt of exactly {depth} tokens: tokenize endpoint {tok.url} of "
        f"profile {tok.api.name!r} never counted {depth} ({tok.calls} calls); if the engine "
        f"accepts token-id prompts, measure with accepts_token_ids")


class PromptCache:
    """One prompt per (profile, served model, depth): every arm measures the same prompt."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompts: dict[tuple[str, str | None, int, bool, str], Prompt] = {}

    def get(self, tok: Tokenizer, depth: int, head: str = "") -> Prompt:
        key = (tok.api.name, tok.model, depth, tok.api.accepts_token_ids, head)
        with self._lock:
            hit = self._prompts.get(key)
        if hit is not None:
            return hit
        prompt = build_prompt(tok, depth, head=head)
        with self._lock:
            return self._prompts.setdefault(key, prompt)

    def clear(self) -> None:
        with self._lock:
            self._prompts.clear()


DEFAULT_CACHE = PromptCache()

"""Text the simulated engine generates. Stdlib only.

At temperature 0 the token stream is a pure function of (prompt token ids, ``behaviour.seed``,
``behaviour.text_variant``): each position draws from SHA-256 of a stream key and the
position, and a small sentence grammar turns draws into vocabulary tokens. A non-reference
variant draws from the reference key for its first ``diverge_after`` positions (so it shares
them exactly) and from its own key after that; its first own token is forced to differ from
the reference token at that position. Temperature > 0 draws the key from ``os.urandom``.

A corrupt behaviour emits a few normal tokens and then a short n-gram loop; the server halts
it at ``corrupt_halt_at``. Generated text never contains byte tokens, and it re-tokenizes to
the same ids (words always carry their leading space unless a line starts with them).

The step schedule lives here too: ``decode_rate_at`` (the rate at a prompt depth) and
``plan_steps`` (tokens per decode step under speculative decoding).
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
import struct

from . import tokenizer as tok
from .behaviour import Behaviour

_TWO64 = float(1 << 64)
_END_PUNCT = (".", ".", ".", ".", ".", ".", "?", "!")


def _key(prompt_ids: list[int], seed: int, variant: str) -> bytes:
    h = hashlib.sha256(f"simengine|{seed}|{variant}|".encode())
    h.update(_joined(tuple(prompt_ids)))
    return h.digest()


@functools.lru_cache(maxsize=8)
def _joined(prompt_ids: tuple[int, ...]) -> bytes:
    """The prompt's ids as the key hashes them (one request asks for several keys of one prompt)."""
    return ",".join(map(str, prompt_ids)).encode()


_QUAD = struct.Struct("<4Q")


def _draws(key: bytes, index: int, salt: int = 0) -> tuple[float, float, float, float]:
    a, b, c, d = _QUAD.unpack(hashlib.sha256(key + _IDX.pack(index, salt)).digest())
    return a / _TWO64, b / _TWO64, c / _TWO64, d / _TWO64


_IDX = struct.Struct("<QI")


def _word(u: float, v: float, space: bool, capital: bool) -> int:
    if u < 0.45:
        index = int(v * tok.NUM_COMMON_WORDS)
    else:
        index = tok.NUM_COMMON_WORDS + int(v * (len(tok.WORDS) - tok.NUM_COMMON_WORDS))
    return tok.word_id(index, space=space, capital=capital)


# Grammar state: (words placed in the sentence, sentence length, just ended a sentence,
# at the start of a line, last token was a comma). Length 0 means "start a sentence"; the
# first word of a completion carries a leading space, as it follows the prompt.
_START = (0, 0, False, False, False)


def _next(state: tuple, d: tuple[float, float, float, float]) -> tuple[int, tuple]:
    pos, length, ended, line_start, comma = state
    if ended:
        if d[0] < 0.18:
            return tok.punct_id("\n\n"), (0, 0, False, True, False)
        pos, length = 0, 0
    if length == 0:
        length = 4 + int(d[1] * 12)
        return _word(d[2], d[3], not line_start, True), (1, length, False, False, False)
    if pos >= length:
        return tok.punct_id(_END_PUNCT[int(d[1] * len(_END_PUNCT))]), (0, 0, True, False, False)
    if pos > 1 and not comma and d[0] < 0.08:
        return tok.punct_id(","), (pos, length, False, False, True)
    return _word(d[2], d[3], True, False), (pos + 1, length, False, False, False)


def _stream(ref_key: bytes, own_key: bytes, diverge_after: int, n: int) -> list[int]:
    return list(_stream_of(ref_key, own_key, diverge_after, n))


@functools.lru_cache(maxsize=256)
def _stream_of(ref_key: bytes, own_key: bytes, diverge_after: int, n: int) -> tuple[int, ...]:
    """The token stream (a pure function of its keys: the same prompt on every boot of a
    night asks for it again, so recent streams are kept)."""
    out: list[int] = []
    state = _START
    for i in range(n):
        if own_key == ref_key or i < diverge_after:
            t, state_next = _next(state, _draws(ref_key, i))
        else:
            t, state_next = _next(state, _draws(own_key, i))
            if i == diverge_after:
                ref_t, _ = _next(state, _draws(ref_key, i))
                salt = 1
                while t == ref_t and salt < 64:
                    t, state_next = _next(state, _draws(own_key, i, salt))
                    salt += 1
        out.append(t)
        state = state_next
    return tuple(out)


def _loop(key: bytes, n: int) -> list[int]:
    """A few normal tokens, then one short n-gram repeated: degenerate numerics."""
    d = _draws(key, 0, 0xC0)
    prefix = _stream(key, key, 0, 3 + int(d[0] * 8))
    gram_len = 2 + int(d[1] * 4)
    gram = [_word(*_draws(key, j + 1, 0xC0)[:2], True, False) for j in range(gram_len)]
    out = prefix[:n]
    while len(out) < n:
        out += gram[: n - len(out)]
    return out


def generate_tokens(prompt_ids: list[int], n: int, behaviour: Behaviour,
                    temperature: float = 0.0) -> list[int]:
    """The first ``n`` generated token ids for this prompt under ``behaviour``."""
    if n <= 0:
        return []
    if temperature > 0:
        ref_key = own_key = hashlib.sha256(os.urandom(32)).digest()
    else:
        ref_key = _key(prompt_ids, behaviour.seed, "")
        own_key = _key(prompt_ids, behaviour.seed, behaviour.text_variant)
    if behaviour.corrupt is not None:
        return _loop(own_key, n)
    return _stream(ref_key, own_key, max(0, behaviour.diverge_after), n)


def _unit(prompt_ids: list[int], behaviour: Behaviour, what: str) -> float:
    return _draws(_key(prompt_ids, behaviour.seed, what), 0)[0]


def corrupt_halt_at(prompt_ids: list[int], behaviour: Behaviour) -> int | None:
    """Completion-token count at which the repetition guard halts this prompt (seeded by the
    prompt and ``behaviour.seed``), or None when the behaviour is not corrupt."""
    rule = behaviour.corrupt
    if rule is None:
        return None
    lo, hi = sorted((rule.halt_min, rule.halt_max))
    return lo + int(_unit(prompt_ids, behaviour, "\x00halt") * (hi - lo + 1))


def natural_length(prompt_ids: list[int], behaviour: Behaviour) -> int:
    """Where the model would emit EOS if EOS were honoured (32..511 tokens, seeded)."""
    return 32 + int(_unit(prompt_ids, behaviour, "\x00eos") * 480)


# -- the step schedule: how fast, and how many tokens per step -----------------------------
def decode_rate_at(table: dict[int, float], depth: int) -> float:
    """Linear in depth between the table's keys, flat outside them."""
    keys = sorted(table)
    if depth <= keys[0]:
        return float(table[keys[0]])
    for lo, hi in zip(keys, keys[1:]):
        if depth <= hi:
            return table[lo] + (depth - lo) / (hi - lo) * (table[hi] - table[lo])
    return float(table[keys[-1]])


def position_acceptance(acceptance: float, k: int) -> float:
    """Per-position probability ``p`` for a drafter that accepts a prefix of its ``k`` drafts
    (stopping at the first rejection) so that the expected accepted fraction of all drafted
    tokens, (p + p^2 + ... + p^k) / k, the acceptance rate vLLM reports, is ``acceptance``."""
    a = min(max(acceptance, 0.0), 1.0)
    if k <= 1 or a in (0.0, 1.0):
        return a
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) / k < a:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def plan_steps(n: int, k: int, p: float, rng: random.Random) -> list[tuple[int, int]]:
    """(tokens emitted, drafts accepted) per step; step 0 is the prefill's single token."""
    steps = [(1, 0)] if n > 0 else []
    left = n - 1
    while left > 0:
        acc = 0
        while acc < k and rng.random() < p:
            acc += 1
        steps.append((min(1 + acc, left), acc))
        left -= steps[-1][0]
    return steps

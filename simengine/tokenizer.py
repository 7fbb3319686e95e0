"""Deterministic, reversible tokenizer for the simulated engine. Stdlib only.

Vocabulary (ids are fixed by construction, identical in every process and Python version):

* ``0..255``: one token per byte, the fallback for anything the word vocabulary lacks;
* ``256..``: punctuation and newlines (``PUNCT``);
* then words: a fixed list of common English words followed by pseudo-words built from
  syllables by a fixed linear congruential generator. Every word appears four times, as
  ``w``, ``" w"``, ``W`` and ``" W"`` (capitalised), in that order.

``tokenize`` splits text into maximal pieces (an optional space plus ``[A-Za-z][a-z]*``, a
newline pair, a newline, or any other single character) and maps each piece to one vocabulary
id when it has one, otherwise to its UTF-8 bytes (``surrogatepass``, so every ``str`` works).
Hence ``detokenize(tokenize(s)) == s`` for any string, and text made of vocabulary words
separated by spaces or punctuation re-tokenizes to the same ids.
"""
from __future__ import annotations

import re

NUM_BYTES = 256
PUNCT: tuple[str, ...] = ("\n\n", "\n", ".", ",", "!", "?", ";", ":", "'", '"', "-", "(", ")")

COMMON_WORDS: tuple[str, ...] = tuple("""
the of and to in is that it for as with on was by at from this be are or an not which but
have has had were been their they there its one all would will can more other than into some
these when what about only over also new time such may then each where most after first two
any those both between under while before many because well much still through same should
even could must every since three here long part high small large number point during
without system model layer expert cache memory token value state order field group step
""".split())

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "ch", "sh", "th", "br", "st", "tr", "pl", "gr", "kr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "nd", "st")
NUM_PSEUDO_WORDS = 2000


def _pseudo_words(count: int) -> list[str]:
    """``count`` distinct syllable words from a fixed 32-bit LCG (no ``hash()``, no ``random``)."""
    taken = set(COMMON_WORDS)
    out: list[str] = []
    x = 0x2545F491
    while len(out) < count:
        x = (1103515245 * x + 12345) & 0xFFFFFFFF
        n_syll = 1 + (x >> 8) % 3
        word = ""
        y = x
        for _ in range(n_syll):
            y = (1664525 * y + 1013904223) & 0xFFFFFFFF
            word += _ONSETS[(y >> 4) % len(_ONSETS)] + _VOWELS[(y >> 12) % len(_VOWELS)]
            if (y >> 20) % 3 == 0:
                word += _CODAS[(y >> 24) % len(_CODAS)]
        if 2 <= len(word) <= 12 and word not in taken:
            taken.add(word)
            out.append(word)
    return out


WORDS: tuple[str, ...] = COMMON_WORDS + tuple(_pseudo_words(NUM_PSEUDO_WORDS))
NUM_COMMON_WORDS = len(COMMON_WORDS)

_PIECES: list[bytes] = [bytes([b]) for b in range(NUM_BYTES)]
_PIECES += [p.encode("ascii") for p in PUNCT]
PUNCT_BASE = NUM_BYTES
WORD_BASE = PUNCT_BASE + len(PUNCT)
for _w in WORDS:
    _cap = _w[0].upper() + _w[1:]
    _PIECES += [_w.encode(), b" " + _w.encode(), _cap.encode(), b" " + _cap.encode()]
del _w, _cap

vocab_size: int = len(_PIECES)
_LOOKUP: dict[str, int] = {p.decode("ascii"): i for i, p in enumerate(_PIECES) if i >= NUM_BYTES}
_SPLIT = re.compile(r"\n\n|\n| ?[A-Za-z][a-z]*|[^\n]", re.S)


def punct_id(p: str) -> int:
    return PUNCT_BASE + PUNCT.index(p)


def word_id(index: int, space: bool = True, capital: bool = False) -> int:
    """Id of ``WORDS[index]`` with or without a leading space, lower case or capitalised."""
    return WORD_BASE + 4 * index + (2 if capital else 0) + (1 if space else 0)


def _bytes_of(piece: str) -> list[int]:
    return list(piece.encode("utf-8", "surrogatepass"))


def tokenize(text: str) -> list[int]:
    ids: list[int] = []
    for m in _SPLIT.finditer(text):
        piece = m.group()
        tid = _LOOKUP.get(piece)
        if tid is not None:
            ids.append(tid)
        elif piece[0] == " " and len(piece) > 1 and piece[1:] in _LOOKUP:
            ids += (32, _LOOKUP[piece[1:]])
        else:
            ids += _bytes_of(piece)
    return ids


def check_ids(ids: list[int]) -> None:
    """Raise ValueError unless every id is an int in ``range(vocab_size)``."""
    if not ids or set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < vocab_size:
        return                     # the common case, at C speed (bools are not of type int)
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise ValueError(f"token id {t!r} is out of vocabulary (vocab_size {vocab_size})")


def detokenize(ids: list[int]) -> str:
    check_ids(ids)
    raw = b"".join(_PIECES[t] for t in ids)
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace")


def token_str(tid: int) -> str:
    """Display form of one token (``<0x0A>`` for byte tokens), as in ``return_token_strs``."""
    check_ids([tid])
    if tid < NUM_BYTES:
        return f"<0x{tid:02X}>"
    return _PIECES[tid].decode("ascii")

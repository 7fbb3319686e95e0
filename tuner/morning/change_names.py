"""Names for lever values that tell them apart: `tuner status`'s narrow table and the report's
plot legends, where a value's full text does not fit.

``ValueNames`` names a value by what distinguishes it from the other values its lever took
that night. A JSON object shows only the keys in which it differs from its siblings (for each
sibling object, at least one key where the two differ; fewest keys, in the value's own key
order), with ``…`` for the keys left out: next to ``{"method":"mtp","num_speculative_tokens":3}``
and ``{"method":"ngram","num_speculative_tokens":4}``, ``{"method":"mtp","num_speculative_tokens":6}``
is ``{… num_speculative_tokens: 6}``. Any other value keeps its text.

``fit`` cuts texts to a width, and where two different texts would be cut to the same text it
keeps the part where they differ instead (a head, ``…``, and a window from a separator before
the first differing character): ``speculat…tokens: 6}`` and ``speculat…tokens: 3}``, never two
``speculative-config → {"me…``.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Iterable, Sequence

from arms.values import text

SEPARATORS = set(" _-.,:;={}[]()\"'/|→")
MIN_LEVER = 6                # a lever cut to make room for its value keeps at least this much


def _key(v: Any) -> str:
    return text(v)


def _distinguishing_keys(v: Mapping, siblings: list[Mapping]) -> list[str]:
    """The fewest keys of ``v`` (greedy) such that every sibling differs from ``v`` in one of them."""
    need = []
    for s in siblings:
        d = {k for k in set(v) | set(s) if k not in v or k not in s or _key(v[k]) != _key(s[k])}
        if d:
            need.append(d)
    chosen: list[str] = []
    while need:
        counts: dict[str, int] = defaultdict(int)
        for d in need:
            for k in d:
                counts[k] += 1
        order = list(v) + sorted(k for k in counts if k not in v)
        best = max((k for k in order if k in counts), key=lambda k: counts[k])
        chosen.append(best)
        need = [d for d in need if best not in d]
    return [k for k in v if k in chosen]


def _short_mapping(v: Mapping, keys: list[str]) -> str:
    inner = ", ".join(f"{k}: {text(v[k])}" for k in keys)
    return f"{{… {inner}}}" if len(keys) < len(v) else text(v)


class ValueNames:
    """Per lever, the values it took (``pairs``: (lever, value) as decoded by arms.values)."""

    def __init__(self, pairs: Iterable[tuple[str, Any]]):
        self._maps: dict[str, dict[str, Mapping]] = defaultdict(dict)
        self._names: dict[tuple[str, str], str] = {}
        for lever, v in pairs:
            if isinstance(v, Mapping):
                self._maps[lever][_key(v)] = v

    def value(self, lever: str, v: Any) -> str:
        if not isinstance(v, Mapping):
            return text(v)
        k = (lever, _key(v))
        if k not in self._names:
            siblings = [s for key, s in self._maps.get(lever, {}).items() if key != k[1]]
            keys = _distinguishing_keys(v, siblings) if siblings else list(v)
            self._names[k] = _short_mapping(v, keys) if keys else text(v)
        return self._names[k]

    def change(self, lever: str, v: Any, arrow: str = "→") -> str:
        return f"{lever} {arrow} {self.value(lever, v)}"


def _cut(t: str, width: int) -> str:
    return t if len(t) <= width else t[: max(width - 1, 0)] + "…"


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _window(t: str, p: int, width: int, head: int) -> str:
    """``t`` in ``width`` characters, keeping its character ``p`` (where it differs from another):
    ``head`` characters, ``…``, and a window that starts just after a separator (the earliest
    from which the rest fits, else the last one before ``p``)."""
    budget = width - head - 1
    if budget < 2 or p < head:
        return _cut(t, width)
    p = min(p, len(t) - 1)
    bounds = [s for s in range(max(head, p - budget + 1), p + 1) if t[s - 1] in SEPARATORS]
    fits = [s for s in bounds if len(t) - s <= budget]
    start = fits[0] if fits else (bounds[-1] if bounds else max(head, p - budget // 3))
    seg = t[start:].lstrip("… ")
    if len(seg) > budget:
        seg = seg[: budget - 1] + "…"
    return t[:head] + "…" + seg


def _fit_one(t: str, width: int, others: Iterable[str], head: int) -> str:
    if len(t) <= width:
        return t
    c = _cut(t, width)
    clash = [o for o in others if o != t and _cut(o, width) == c]
    return _window(t, max(_common(t, o) for o in clash), width, head) if clash else c


def fit(texts: Sequence[str], width: int, arrow: str = " → ") -> list[str]:
    """Each of ``texts`` in at most ``width`` characters. A change (``lever → value``) gives up
    its lever's letters first (down to ``MIN_LEVER``); two different texts whose plain cuts
    would be equal keep the part in which they differ."""
    split = [t.split(arrow, 1) if arrow in t else None for t in texts]
    out = []
    for t, sp in zip(texts, split):
        if len(t) > width and sp:
            lever, value = sp
            lw = min(len(lever), max(MIN_LEVER, width - len(arrow) - len(value)))
            vw = width - len(arrow) - lw
            if vw >= 4:
                siblings = [x[1] for x in split if x and x[0] == lever]
                out.append(_cut(lever, lw) + arrow + _fit_one(value, vw, siblings, head=0))
                continue
        out.append(_fit_one(t, width, texts, head=max(4, width // 3)))
    return out


__all__ = ["ValueNames", "fit"]

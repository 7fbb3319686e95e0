"""The simulated engine's prefix cache, modelled on vLLM's automatic prefix caching.

The prompt is cut into blocks of ``BLOCK`` tokens; a full block is cached under a hash of its
tokens, of every token before it and of the request's ``cache_salt`` (vLLM puts the salt in
the first block's hash, so a salted request shares nothing with another salt or none). A
request's cached tokens are its leading full blocks already in the cache, never the whole
prompt (vLLM recomputes the last token to produce the first output), and prefill then costs
only the rest. Blocks are kept least recently used first out, ``capacity`` blocks at most.
With caching off every request prefills its whole prompt. Stdlib only.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from .wire import BadRequest

BLOCK = 16
CAPACITY = 1 << 16      # blocks


def salt_of(body: dict) -> str | None:
    """The request's ``cache_salt``; BadRequest (vLLM's wording) for an empty or non-string one."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
    return salt


class PrefixCache:
    def __init__(self, enabled: bool, capacity: int = CAPACITY):
        self.enabled, self.capacity = enabled, capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        self.queries = self.hits = 0      # in tokens, like vllm:prefix_cache_{queries,hits}_total

    def admit(self, ids: list[int], body: dict) -> int:
        """Tokens of ``ids`` served from the cache; the prompt's full blocks are cached after."""
        salt = salt_of(body)
        if not self.enabled:
            return 0
        h = hashlib.blake2b(("salt:" + (salt or "")).encode(), digest_size=16).digest()
        keys = []
        for i in range(len(ids) // BLOCK):
            blk = ",".join(map(str, ids[i * BLOCK:(i + 1) * BLOCK])).encode()
            h = hashlib.blake2b(h + blk, digest_size=16).digest()
            keys.append(h)
        limit = (len(ids) - 1) // BLOCK       # the last prompt token is always computed
        with self._lock:
            hit = 0
            while hit < min(len(keys), limit) and keys[hit] in self._blocks:
                hit += 1
            for k in keys:
                self._blocks[k] = None
                self._blocks.move_to_end(k)
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
            self.queries += len(ids)
            self.hits += hit * BLOCK
        return hit * BLOCK

    def metrics_text(self, model: str) -> str:
        """vLLM's prefix-cache counters (tokens), in Prometheus text exposition."""
        model = model.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        with self._lock:
            values = (("queries", self.queries), ("hits", self.hits))
        out = []
        for what, v in values:
            name = f"vllm:prefix_cache_{what}_total"
            out += [f"# HELP {name} Prefix cache {what}, in terms of number of tokens.",
                    f"# TYPE {name} counter", f'{name}{{model_name="{model}",engine="0"}} {float(v)!r}']
        return "\n".join(out) + "\n"

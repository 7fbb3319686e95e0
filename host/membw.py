"""Host memory bandwidth and a GGUF model's bytes per token: the two inputs of the llama.cpp
roofline (arms.headroom.Roofline).

``membw_probe_gbs`` reads a buffer several times the size of the last-level cache with one
numpy reduction per thread (numpy releases the GIL), best of ``repeats``, and returns GB/s read.
It is a lower bound of what llama.cpp's hand-written kernels stream, and on a shared machine a
noisy one; the report says where the figure came from.
"""
from __future__ import annotations

import threading
import time

import numpy as np


def membw_probe_gbs(mib: int = 256, threads: int | None = None, repeats: int = 5) -> float:
    import os

    threads = threads or os.cpu_count() or 1
    per = max(1, mib * 2**20 // 8 // threads)
    bufs = [np.ones(per, dtype=np.float64) for _ in range(threads)]
    best = 0.0
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        def read(buf):
            barrier.wait()
            buf.sum()

        ts = [threading.Thread(target=read, args=(b,)) for b in bufs]
        for t in ts:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        best = max(best, threads * per * 8 / dt / 1e9)
    return best


def gguf_tensors(path) -> tuple[list[tuple[str, int, int]], int, int]:
    """([(tensor name, bytes, rows)], n_expert, n_expert_used) of a GGUF file."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = None
    fields = {}
    for name, f in r.fields.items():
        if f.types and len(f.data) == 1:
            try:
                fields[name] = f.parts[f.data[0]].tolist()
            except (IndexError, AttributeError):
                continue
        if name == "general.architecture":
            arch = bytes(f.parts[f.data[0]]).decode()
    n_expert = int((fields.get(f"{arch}.expert_count") or [0])[0])
    n_used = int((fields.get(f"{arch}.expert_used_count") or [0])[0])
    tensors = [(t.name, int(t.n_bytes), int(t.shape[-1]) if len(t.shape) > 1 else 1) for t in r.tensors]
    return tensors, n_expert, n_used

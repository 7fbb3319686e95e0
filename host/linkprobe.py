"""The optional PCIe link probe an operator runs (seed 002's "pcie-link-probe" / HIP probe).

``link_probe_gbs()`` times pinned host->device copies of one expert slab (2.344 MiB by
default), one synchronous copy after another so that the per-transfer cost counts as it does
in the engine's gather, through the CUDA driver API or the HIP runtime by ctypes (no torch).
It returns GB/s (1e9 B/s), or None when neither runtime nor a device is available. Run it when
no engine holds the GPU; ``arms.headroom`` takes the number (or one the campaign states).
Seed 002 measured 22.74 GB/s at slab size on Gen5 x8 (28.7 at 1 GiB).
"""
from __future__ import annotations

import ctypes
import time
from typing import Callable

SLAB_BYTES = 2_457_862                     # seed 002's expert slab, 2.344 MiB


def _timed(copy: Callable[[], None], sync: Callable[[], None], size: int, iters: int) -> float:
    for _ in range(5):
        copy()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        copy()
    sync()
    return size * iters / (time.perf_counter() - t0) / 1e9


def _cuda(size: int, iters: int, device: int) -> float:
    lib = ctypes.CDLL("libcuda.so.1")

    def ok(rc: int, what: str) -> None:
        if rc:
            raise OSError(f"{what}: CUresult {rc}")
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    ok(lib.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    ok(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    host, dptr = ctypes.c_void_p(), ctypes.c_uint64()
    try:
        ok(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        ok(lib.cuMemAllocHost_v2(ctypes.byref(host), ctypes.c_size_t(size)), "cuMemAllocHost")
        ok(lib.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(size)), "cuMemAlloc")
        return _timed(lambda: ok(lib.cuMemcpyHtoD_v2(dptr.value, host, size), "cuMemcpyHtoD"),
                      lambda: ok(lib.cuCtxSynchronize(), "cuCtxSynchronize"), size, iters)
    finally:
        if dptr.value:
            lib.cuMemFree_v2(dptr)
        if host.value:
            lib.cuMemFreeHost(host)
        lib.cuDevicePrimaryCtxRelease(dev)


def _hip(size: int, iters: int, device: int) -> float:
    lib = ctypes.CDLL("libamdhip64.so")

    def ok(rc: int, what: str) -> None:
        if rc:
            raise OSError(f"{what}: hipError {rc}")
    lib.hipMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ok(lib.hipSetDevice(device), "hipSetDevice")
    host, dptr = ctypes.c_void_p(), ctypes.c_void_p()
    try:
        ok(lib.hipHostMalloc(ctypes.byref(host), ctypes.c_size_t(size), 0), "hipHostMalloc")
        ok(lib.hipMalloc(ctypes.byref(dptr), ctypes.c_size_t(size)), "hipMalloc")
        return _timed(lambda: ok(lib.hipMemcpy(dptr, host, size, 1), "hipMemcpy"),
                      lambda: ok(lib.hipDeviceSynchronize(), "hipDeviceSynchronize"), size, iters)
    finally:
        if dptr.value:
            lib.hipFree(dptr)
        if host.value:
            lib.hipHostFree(host)


def link_probe_gbs(size_bytes: int = SLAB_BYTES, iters: int = 200, device: int = 0) -> float | None:
    """Pinned host->device GB/s (1e9 B/s) at ``size_bytes`` per transfer, synchronous copies
    one after another (the per-transfer cost counts, as in the engine's gather); None when no
    CUDA driver or HIP runtime is available or the probe fails."""
    for probe in (_cuda, _hip):
        try:
            return probe(int(size_bytes), int(iters), int(device))
        except Exception:  # noqa: BLE001 - no runtime, no device, or a failed call: try the next
            continue
    return None

"""A trainer's process heap kept from growing past what it uses (glibc; issue 40).

glibc's malloc raises its mmap threshold to the size of every large block freed (up to
32 MiB), so after the first few steps a step's large temporaries (PyTorch's activations and
gradients of the batch, a few MiB each, made by several threads) come from the per-thread
heaps instead of fresh mappings, and the heaps keep what they freed: measured 2026-12-02 on
6.3M x 128 rows, a 640 MiB row cache, 8,192 Zipf ids a step: 100 MiB of anonymous memory
more than NumPy and the cache hold after 400 steps, 150 MiB after 1,000, still growing (what
killed a 1 GiB memory cgroup's run).  A fixed threshold (``mallopt``, which also stops the
adjustment) makes every block past it a mapping of its own, returned to the system when
freed: the same 400 steps grew 21 MiB (the batch's buffers).  Other C libraries: nothing done.

A fixed threshold above a step's temporaries (32 MiB: reused from the heaps, 820 page faults
a step instead of 5,300 on 2M x 128 in a 600 MiB cgroup, the backward 2.4x faster) brought
the growth back at 6.3M x 128 in the 1 GiB cgroup (anonymous memory past 1 GiB within 150
timed steps, OOM-killed; 2026-12-03), so the threshold stays below them; a checkpoint first
hands freed heap memory back (:func:`trim_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

__all__ = ["bound_heap", "trim_heap", "MMAP_THRESHOLD"]

#: blocks from this size up are mappings of their own (glibc's initial threshold: 128 KiB)
MMAP_THRESHOLD = 256 << 10
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_done: bool | None = None
_lock = threading.Lock()
_trim = None


def bound_heap() -> bool:
    """Fix glibc's mmap threshold (and trim threshold) at :data:`MMAP_THRESHOLD`, once per
    process; returns whether it took (False on other C libraries)."""
    global _done
    with _lock:
        if _done is None:
            _done = False
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                fn = getattr(libc, "mallopt", None)
                if fn is not None and getattr(libc, "gnu_get_libc_version", None):
                    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                    _done = bool(fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                        fn(_M_TRIM_THRESHOLD, MMAP_THRESHOLD))
            except OSError:
                _done = False
        return _done


def trim_heap() -> bool:
    """Hand the heaps' free memory back to the system (glibc ``malloc_trim``; a checkpoint,
    before it takes memory of its own); returns whether it ran."""
    global _trim
    if not bound_heap():
        return False
    with _lock:
        if _trim is None:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _trim = libc.malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
    _trim(0)
    return True

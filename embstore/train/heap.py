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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

__all__ = ["bound_heap", "MMAP_THRESHOLD"]

#: blocks from this size up are mappings of their own (glibc's initial threshold: 128 KiB)
MMAP_THRESHOLD = 256 << 10
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_done: bool | None = None
_lock = threading.Lock()


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

"""Reading only what a batch needs when the page cache does not hold it (Linux).

A page fault on a file mapping reads ahead around the fault (``read_ahead_kb``, 8 MiB on the
machine we measured), and faults are taken one at a time, so a cold random gather through
a memory map reads far more than it uses and waits for each read in turn.  The shard
mappings are therefore advised ``MADV_RANDOM`` (a fault reads its own page only), and a
batch that is not resident first asks the kernel for all of its pages at once
(``MADV_WILLNEED`` on every page run it needs: asynchronous reads, all in flight together),
then gathers as usual: the faults find the pages read or being read.

Measured on a 2 GiB file with its pages evicted, 16,384 random 4 KiB pages
(``benchmarks``, 2026-11-30; disk: virtio, 8 MiB read-ahead):

| how | ms | MiB read |
|---|---|---|
| plain mmap gather (read-ahead on) | 2,400 | 2,047 |
| ``MADV_RANDOM``, one gather (serial faults) | 810-1,030 | 63 |
| ``MADV_RANDOM``, gather split over 16 / 32 / 64 threads | 260 / 260 / 840 | 63 |
| thread pool of ``os.preadv`` (8 / 16 / 32 / 64 threads) | 430 / 590 / 520 / 580 | 67-75 |
| ``posix_fadvise(WILLNEED)`` per page, then one gather | 190-215 | 63 |
| ``process_madvise(WILLNEED)``, 1,024 pages a call, then one gather | 189 | 63 |

The device does about 87,000 random 4 KiB reads a second when it has enough of them in
flight; asking for every page in one go reaches that, with one thread and no pool, where
threads stall on the GIL and on each other.  ``process_madvise`` takes 1,024 ranges per
system call (no Python call per page); without it (kernels before 5.10, seccomp) the
fallback is one ``madvise`` per page run.  Issuing the advice costs about 0.7 us per page
that is already resident, too much for warm batches (a warm gather of 16,384 rows is
~1.3 ms), so a batch first checks a few of its pages with ``mincore`` (one per 512 rows, at
most ``SAMPLES``: a call costs 4-7 us on this VM) and only a batch found cold is prefetched;
chunks read for the first time (their crc32c is checked, a loop per chunk anyway) are
always asked for.

The advice is given by the thread that reads the batch, before it reads: it returns once
the last read is queued (the device holds a few hundred in flight), and the checksums and
the gather then find their pages arrived or arriving.  Given from a second thread while the
checks faulted pages in, the same batch was slower and far less steady (2 GiB table, 16,384
ids, pages evicted, load 4.5: median 509 ms, 417-1,582 ms; in the reading thread 316 ms,
298-337 ms).  Where a cold batch's time goes (same table, load 5-6): CPU 110-180 ms of
580-690 ms wall (tensorstore: 800 ms of CPU in its threads, 1.2-1.5 s wall), the rest
waiting for ~20,000 page reads; a ``preadv`` thread pool (8-64 threads, 4 KiB a read) took
0.9-1.1 s for 16,384 pages where one ``process_madvise`` took 0.29 s.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..codecs import pool

__all__ = ["available", "advise_random", "advise_sequential", "is_cold", "willneed",
           "willneed_and", "pageout", "PAGE", "SAMPLES"]

PAGE = mmap.PAGESIZE
#: pages per advice at most (4 MiB): the kernel caps one WILLNEED at its read-ahead window
#: (``read_ahead_kb``, 8 MiB on the machine measured) and leaves the rest of a longer run
#: unread
RUN_PAGES = (4 << 20) // PAGE
#: pages checked with ``mincore`` to decide whether a batch is resident
SAMPLES = 16
#: fewer first-touch chunks than this are not prefetched (their faults read one page each)
MIN_PAGES = 8
_MADV_RANDOM, _MADV_SEQUENTIAL, _MADV_WILLNEED, _MADV_PAGEOUT = 1, 2, 3, 21
_IOV_MAX = 1024
#: ranges asked for at a time by :func:`willneed_and` while the ones before are used
ASK_SLICE = 1024
_NR_PROCESS_MADVISE = {"x86_64": 440, "aarch64": 440, "arm64": 440}


class _Sys:
    def __init__(self):
        lib = ctypes.CDLL(None, use_errno=True)
        self.madvise = lib.madvise
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.madvise.restype = ctypes.c_int
        self.mincore = lib.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.mincore.restype = ctypes.c_int
        self.syscall = lib.syscall
        self.syscall.restype = ctypes.c_long
        self.nr = _NR_PROCESS_MADVISE.get(platform.machine())
        self.batched = self.nr is not None and hasattr(os, "pidfd_open")
        self.pidfd = (-1, -1)  # (pid, fd): a forked child opens its own
        self.lock = threading.Lock()

    def own_pidfd(self) -> int:
        pid = os.getpid()
        if self.pidfd[0] != pid:
            with self.lock:
                if self.pidfd[0] != pid:
                    self.pidfd = (pid, os.pidfd_open(pid))  # the parent's fd stays the parent's
        return self.pidfd[1]


_sys: _Sys | None | bool = None


def _get() -> _Sys | None:
    global _sys
    if _sys is None:
        ok = sys.platform == "linux" and ctypes.sizeof(ctypes.c_void_p) == 8
        try:
            _sys = _Sys() if ok else False
        except (OSError, AttributeError):
            _sys = False
    return _sys if isinstance(_sys, _Sys) else None


def available() -> bool:
    return _get() is not None


def advise_random(addr: int, length: int) -> None:
    """``MADV_RANDOM`` on a mapping: its faults read their own page, no read-ahead."""
    s = _get()
    if s is not None and length > 0:
        s.madvise(addr - addr % PAGE, length + addr % PAGE, _MADV_RANDOM)


def advise_sequential(addr: int, length: int) -> None:
    """``MADV_SEQUENTIAL`` on a mapping about to be read whole (aggressive read-ahead)."""
    s = _get()
    if s is not None and length > 0:
        s.madvise(addr - addr % PAGE, length + addr % PAGE, _MADV_SEQUENTIAL)


def is_cold(addrs: np.ndarray, k: int = SAMPLES) -> bool:
    """Whether any of (at most ``k``, evenly spread) ``addrs`` is not in memory."""
    s = _get()
    if s is None or addrs.size == 0 or k < 1:
        return False
    n = addrs.size
    pick = addrs if n <= k else addrs[(np.arange(k) * (n - 1)) // max(1, k - 1)]
    vec = np.zeros(pick.size, dtype=np.uint8)
    base = vec.ctypes.data
    for i, a in enumerate((pick - pick % PAGE).tolist()):  # a loop over the samples only
        if s.mincore(a, 1, base + i) != 0:
            return False  # not a mapping we can ask about: leave it to the faults
    return not bool(np.all(vec & 1))


def willneed(starts: np.ndarray, stops: np.ndarray) -> int:
    """Start reading the pages of the mapped byte ranges ``[starts, stops)`` (addresses),
    merged into runs of pages, all at once and without waiting.  Returns the number of
    advices (runs, long ones cut in pieces)."""
    s = _get()
    if s is None or starts.size == 0:
        return 0
    first = starts // PAGE
    last = (stops - 1) // PAGE
    order = np.argsort(first, kind="stable")
    first, last = first[order], np.maximum.accumulate(last[order])
    new = np.ones(first.size, dtype=bool)
    new[1:] = first[1:] > last[:-1] + 1
    heads = np.flatnonzero(new)
    tails = np.r_[heads[1:], first.size] - 1
    # a run longer than the device's read-ahead window is cut in pieces of RUN_PAGES: the
    # kernel reads at most that window per advice and leaves the rest to page faults, one
    # 4 KiB page at a time under MADV_RANDOM (a first scan of a cold 1 GB table: 15 s)
    begin, size = first[heads], last[tails] - first[heads] + 1
    pieces = -(-size // RUN_PAGES)
    total = int(pieces.sum())
    at = np.repeat(begin, pieces) + RUN_PAGES * (
        np.arange(total) - np.repeat(np.cumsum(pieces) - pieces, pieces))
    iov = np.empty((total, 2), dtype=np.uint64)
    iov[:, 0] = at * PAGE
    iov[:, 1] = (np.minimum(at + RUN_PAGES, np.repeat(begin + size, pieces)) - at) * PAGE
    if s.batched:
        try:
            fd = s.own_pidfd()
            p = iov.ctypes.data
            for a in range(0, total, _IOV_MAX):
                k = min(_IOV_MAX, total - a)
                if s.syscall(s.nr, fd, ctypes.c_void_p(p + 16 * a), ctypes.c_size_t(k),
                             _MADV_WILLNEED, 0) < 0:
                    raise OSError(ctypes.get_errno(), "process_madvise")
            return total
        except OSError:
            s.batched = False  # not allowed or not supported here: one madvise per run
    for a, n in iov.tolist():
        s.madvise(a, n, _MADV_WILLNEED)
    return total


def pageout(starts: np.ndarray, stops: np.ndarray) -> int:
    """Reclaim the pages of the mapped byte ranges ``[starts, stops)`` (addresses) now
    (``MADV_PAGEOUT``, Linux 5.4+): clean file pages no other process maps leave the page
    cache.  A reader under a memory limit (a training row cache in a memory cgroup, whose
    misses it has just copied out) keeps the page cache from filling the limit, where
    every further read and allocation would wait for reclaim.  ``process_madvise``, 1,024
    pages a call; where that is missing or refused, nothing is done (the kernel reclaims
    them when it must).  Returns the pages advised."""
    s = _get()
    if s is None or not s.batched or starts.size == 0:
        return 0
    at = np.unique(np.concatenate([starts // PAGE, (stops - 1) // PAGE]))
    iov = np.empty((at.size, 2), dtype=np.uint64)
    iov[:, 0] = at * PAGE
    iov[:, 1] = PAGE
    try:
        fd = s.own_pidfd()
    except OSError:
        return 0
    p = iov.ctypes.data
    for a in range(0, at.size, _IOV_MAX):  # a loop per 1,024 pages
        k = min(_IOV_MAX, at.size - a)
        if s.syscall(s.nr, fd, ctypes.c_void_p(p + 16 * a), ctypes.c_size_t(k),
                     _MADV_PAGEOUT, 0) < 0:
            return a  # (not supported here, or a range not mapped: the rest left alone)
    return int(at.size)


def willneed_and(starts: np.ndarray, size: int, use: Callable[[int, int], Any]) -> None:
    """Ask for the ranges ``[starts, starts + size)`` (sorted addresses) and call
    ``use(a, b)`` on ``starts[a:b]``, slice after slice, overlapped: a pool thread asks for
    them :data:`ASK_SLICE` at a time (the call returns only when the device has taken the
    slice's reads: a 2 GiB table's 16,384 cold pages, 150 of 200 ms) while this thread uses
    each slice once it is asked for (its faults then wait for reads in flight, never start
    their own).  Slices of 1,024 / 2,048 / 4,096 pages: 178 / 185 / 190 ms a batch there,
    all asked for before any use 200 ms.  Few ranges, or a call from the pool itself: ask,
    then use, in this thread."""
    n = starts.size
    if n < 2 * ASK_SLICE or threading.current_thread().name.startswith("embstore-codec"):
        willneed(starts, starts + size)
        use(0, n)
        return
    cuts = [*range(0, n, ASK_SLICE), n]
    asked = [threading.Event() for _ in cuts[1:]]

    def ask() -> None:
        for j, ev in enumerate(asked):  # a loop per slice (a few)
            try:
                willneed(starts[cuts[j]:cuts[j + 1]], starts[cuts[j]:cuts[j + 1]] + size)
            finally:
                ev.set()
    fut = pool().submit(ask)
    try:
        for j, ev in enumerate(asked):
            ev.wait()
            use(cuts[j], cuts[j + 1])
    finally:
        fut.result()

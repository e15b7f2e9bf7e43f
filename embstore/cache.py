"""The LRU row cache of on-disk tables, and its statistics.

:class:`RowCache` keeps up to ``capacity_bytes // entry_bytes`` rows in a preallocated slot
matrix.  ``entry_bytes`` is a row's bytes plus 32 bytes of bookkeeping per slot (slot id,
last-use stamp, and the sorted id/slot arrays), so everything the cache holds stays within
its budget.  A batch costs a handful of NumPy operations over its ids: ``np.searchsorted``
into the sorted cached ids, one gather of the hits, one fetch of all the batch's distinct
misses through the read path, and eviction of the least recently used slots by
``np.argpartition`` of their stamps.

Counting (``cache_info``): every requested id counts once (duplicates in a batch included):
a *hit* if its row was cached when the batch started, a *miss* otherwise.  ``evictions``
counts rows dropped to make room (not rows dropped because they were written).  ``warm``
and ``cache_clear`` do not count hits or misses; ``cache_clear`` resets all counters.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["CacheInfo", "RowCache", "parse_bytes"]

ENTRY_OVERHEAD = 32  # bytes of bookkeeping per slot

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1000**4, "tib": 1024**4}


class CacheInfo(NamedTuple):
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0


def parse_bytes(value) -> int:
    """``256``, ``"256MiB"``, ``"1GB"``, ``"1.5 GiB"`` -> bytes (1 KB = 1000 B, 1 KiB = 1024 B)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"a byte size must be an int or a string like '256MiB', got {value!r}")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"cannot read {value!r} as a byte size (examples: 0, 1048576, "
                             "'256MiB', '1GB')")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise ValueError(f"a byte size must be an int or a string like '256MiB', got {value!r}")
    if n < 0:
        raise ValueError(f"a byte size must be >= 0, got {value!r}")
    return n


class RowCache:
    """A thread-safe LRU cache of table rows with a byte budget it never exceeds."""

    def __init__(self, capacity_bytes: int, dim: int, dtype):
        self.capacity_bytes = int(capacity_bytes)
        self.dtype = np.dtype(dtype)
        self.dim = int(dim)
        self.entry_bytes = self.dim * self.dtype.itemsize + ENTRY_OVERHEAD
        self.slots = self.capacity_bytes // self.entry_bytes
        self._lock = threading.Lock()
        self._rows = np.empty((self.slots, self.dim), dtype=self.dtype)  # pages come on use
        self._reset()

    def _reset(self) -> None:
        self._slot_id = np.full(self.slots, -1, dtype=np.int64)
        self._stamp = np.full(self.slots, -1, dtype=np.int64)  # -1: empty, evicted first
        self._ids = np.empty(0, dtype=np.int64)  # cached ids, sorted
        self._where = np.empty(0, dtype=np.int64)  # slot of each sorted id
        self._clock = 0
        self._gen = 0
        self.hits = self.misses = self.evictions = 0

    # -- lookups ----------------------------------------------------------------------
    def _find(self, ids: np.ndarray):
        """(positions in the sorted ids, hit mask) for ``ids``; call under the lock."""
        n = self._ids.size
        if n == 0:
            return None, np.zeros(ids.shape, dtype=bool)
        pos = np.searchsorted(self._ids, ids)
        np.minimum(pos, n - 1, out=pos)
        return pos, self._ids[pos] == ids

    def gather(self, ids: np.ndarray, out: np.ndarray,
               fetch: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """Fill ``out`` with rows ``ids`` (validated 1-D int64); ``fetch(ids, out)`` reads misses."""
        n = ids.size
        if n == 0:
            return
        with self._lock:
            self._clock += 1
            tick, gen = self._clock, self._gen
            pos, hit = self._find(ids)
            nh = int(np.count_nonzero(hit))
            self.hits += nh
            self.misses += n - nh
            if nh == n:
                slots = self._where[pos]
                np.take(self._rows, slots, axis=0, out=out, mode="clip")
                self._stamp[slots] = tick
                return
            if nh:
                slots = self._where[pos[hit]]
                out[hit] = self._rows[slots]
                self._stamp[slots] = tick
        miss_at = np.flatnonzero(~hit)
        uniq, inv = np.unique(ids[miss_at], return_inverse=True)
        rows = np.empty((uniq.size, self.dim), dtype=self.dtype)
        fetch(uniq, rows)  # one call into the read path, outside the lock
        out[miss_at] = rows[inv]
        with self._lock:
            if gen == self._gen:  # no write happened meanwhile: the rows are current
                self._insert(uniq, rows, tick)

    def _insert(self, ids: np.ndarray, rows: np.ndarray, tick: int) -> None:
        """Cache sorted distinct ``ids``; call under the lock."""
        if self.slots == 0 or ids.size == 0:
            return
        pos, present = self._find(ids)
        if present.any():  # another thread cached some meanwhile
            ids, rows = ids[~present], rows[~present]
        k = min(ids.size, self.slots)
        if k < ids.size:
            ids, rows = ids[:k], rows[:k]
        if k == 0:
            return
        victims = (np.argpartition(self._stamp, k - 1)[:k] if k < self.slots
                   else np.arange(self.slots))
        old = self._slot_id[victims]
        gone = old[old >= 0]
        if gone.size:
            self.evictions += int(gone.size)
            self._remove(gone)
        self._slot_id[victims] = ids
        self._stamp[victims] = tick
        self._rows[victims] = rows
        at = np.searchsorted(self._ids, ids)
        self._ids = np.insert(self._ids, at, ids)
        self._where = np.insert(self._where, at, victims)

    def _remove(self, ids: np.ndarray) -> None:
        """Drop cached ``ids`` (all present) from the sorted arrays; call under the lock."""
        keep = np.ones(self._ids.size, dtype=bool)
        keep[np.searchsorted(self._ids, ids)] = False
        self._ids = self._ids[keep]
        self._where = self._where[keep]

    # -- maintenance ----------------------------------------------------------------------
    def warm(self, ids: np.ndarray, fetch: Callable[[np.ndarray, np.ndarray], None],
             *, block: int = 65536) -> int:
        """Load rows ``ids`` (validated, 1-D; most important first) without counting hits.

        At most ``slots`` distinct ids are loaded, the first ones given.  Returns how many.
        """
        _, first = np.unique(ids, return_index=True)
        order = ids[np.sort(first)][: self.slots]
        for s in range(0, order.size, block):
            part = np.sort(order[s: s + block])
            rows = np.empty((part.size, self.dim), dtype=self.dtype)
            with self._lock:
                gen = self._gen
            fetch(part, rows)
            with self._lock:
                self._clock += 1
                if gen == self._gen:
                    self._insert(part, rows, self._clock)
        return int(order.size)

    def invalidate(self, ids: np.ndarray) -> None:
        """Forget rows ``ids`` (just written) so they are read again from the store."""
        with self._lock:
            self._gen += 1
            pos, hit = self._find(np.unique(ids))
            if pos is None or not hit.any():
                return
            slots = self._where[pos[hit]]
            self._remove(self._slot_id[slots])
            self._slot_id[slots] = -1
            self._stamp[slots] = -1

    def clear(self, *, keep_stats: bool = False) -> None:
        """Drop every row and (unless ``keep_stats``) reset the statistics."""
        with self._lock:
            gen, stats = self._gen, (self.hits, self.misses, self.evictions)
            self._reset()
            self._gen = gen + 1
            if keep_stats:
                self.hits, self.misses, self.evictions = stats

    def info(self) -> CacheInfo:
        with self._lock:
            n = int(self._ids.size)
            return CacheInfo(self.hits, self.misses, self.evictions, n, n * self.entry_bytes,
                             self.capacity_bytes)

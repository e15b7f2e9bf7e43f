"""The write-back row cache of a trained table (issue 40; docs/training.md).

A :class:`WriteBackCache` holds up to ``capacity`` rows of a table (float32 master
values) with their optimizer state (``state_cols`` float32 per row, 0 for SGD), bounded
in bytes.  Every structure is a NumPy array and every operation is vectorised over a
batch's unique ids (no Python loop per id):

- ``slot_of`` (one int32/int64 per table row, -1: not cached) and ``id_of`` (per slot)
  map ids to slots; ``last_used`` (the step a slot was last resolved) orders eviction;
  ``dirty`` marks slots updated since they were last written to the table.
- :meth:`resolve` gives the slots of unique ids, reading the missing rows once from the
  table (or from rows a prefetch read, when no write happened since) into free slots;
  when none are free it evicts the least recently used eighth of the cache (at most
  WRITE_BACK_ROWS; never a row of the batch being resolved) and hands the dirty ones
  among them to ``write_back`` (one commit of many rows).
- :meth:`flush` writes every dirty row back (the rows stay cached, clean): in one
  ``flush_back`` that asks for them a block at a time (an on-disk table: one commit of
  rows and one of state), else in write-backs of WRITE_BACK_ROWS rows: the memory a
  flush takes is bounded.

A row is never served older than its newest update: a cached row is the newest value
(updates go to the cache only), and a row leaves the cache only after it was written.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import InvalidOptionError
from ..store.rows.source import PagedSource
from ..store.table import ZarrTable
from ..store.versions.delta import OverlaySource
from ..table import Table

__all__ = ["WriteBackCache", "WriteBack", "FlushBack", "Staged", "StagedFor",
           "CacheTooSmallError", "release_pages"]

#: ``write_back(ids, rows, state)``: persist rows (sorted unique ids) and their state
WriteBack = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
#: ``flush_back(ids, rows_at, state_at)``: persist rows (sorted unique ids) given a block at
#: a time (``rows_at(pos)``, ``state_at(pos)``: those of ``ids[pos]``), one commit each
FlushBack = Callable[[np.ndarray, Callable[[np.ndarray], np.ndarray],
                      Callable[[np.ndarray], np.ndarray]], None]
#: rows read ahead: ``(sorted unique ids, rows, state)``
Staged = tuple[np.ndarray, np.ndarray, np.ndarray]
#: ``staged_for(missing ids)``: rows read ahead for some of them (checked first), or None
StagedFor = Callable[[np.ndarray], "Staged | None"]


#: rows evicted (and written back) at most at once, and per write-back of a flush: what a
#: write-back copies and commits stays this size, whatever the cache's
WRITE_BACK_ROWS = 1 << 15


def release_pages(table: Table, ids: np.ndarray) -> int:
    """After rows ``ids`` were read from ``table`` into the row cache: if the read went to
    the disk (the page cache does not hold the table), let the page cache drop their pages
    now rather than when a memory limit forces reclaim (a trained table larger than
    memory: reclaim under a memory cgroup's limit stalled every read and allocation of a
    step).  Rows the page cache holds are left there.  Returns the pages released."""
    if not isinstance(table, ZarrTable):
        return 0
    src = table.row_source  # (the chunks, under the deltas' overlay)
    if not isinstance(src, (OverlaySource, PagedSource)) or not src.reads_cold():
        return 0
    return int(src.release(ids))


class CacheTooSmallError(InvalidOptionError):
    """A batch has more distinct rows than the training row cache holds."""


class WriteBackCache:
    """Rows of ``table`` (and of ``state``, a table of ``state_cols`` columns or None)
    cached for training, within ``capacity_bytes``; see the module doc."""

    def __init__(self, table: Table, state: Table | None, capacity_bytes: int,
                 write_back: WriteBack, *, evict_fraction: float = 0.125,
                 flush_back: FlushBack | None = None):
        self.table, self.state_table, self._write_back = table, state, write_back
        self._flush_back = flush_back
        v, d = table.vocab_size, table.dim
        self.state_cols = 0 if state is None else state.dim
        self.row_bytes = 4 * (d + self.state_cols) + 8 + 8 + 1  # rows, state, id, tick, dirty
        cap = int(min(max(1, v), max(1, capacity_bytes // self.row_bytes)))
        self.capacity = cap
        self.rows = np.zeros((cap, d), np.float32)
        self.state = np.zeros((cap, self.state_cols), np.float32)
        self.slot_of = np.full(v, -1, np.int32 if cap < 2**31 else np.int64)
        self.id_of = np.full(cap, -1, np.int64)
        self.last_used = np.zeros(cap, np.int64)
        self.dirty = np.zeros(cap, bool)
        self._free = np.arange(cap - 1, -1, -1, dtype=np.int64)  # a stack: [0, n_free)
        self._n_free = cap
        self._evict_n = max(1, min(int(cap * evict_fraction), WRITE_BACK_ROWS))
        self.clock = 0
        self.flushes = 0  # bumped by every write to the table (prefetches check it)
        self.stats = {"hits": 0, "misses": 0, "evictions": 0, "written": 0}
        self._miss_rows = np.empty((0, d), np.float32)
        self._miss_state = np.empty((0, self.state_cols), np.float32)
        #: called before anything is written to the tables (a prefetch in flight ends)
        self.before_write: Callable[[], None] | None = None

    @property
    def nbytes(self) -> int:
        return self.capacity * self.row_bytes

    def __len__(self) -> int:
        return self.capacity - self._n_free

    def resolve(self, uniq: np.ndarray, staged_for: StagedFor | None = None) -> np.ndarray:
        """The slots (int64) of the sorted unique ids ``uniq``, loading the missing ones."""
        self.clock += 1
        slots = self.slot_of[uniq].astype(np.int64)
        miss = slots < 0
        n_miss = int(np.count_nonzero(miss))
        self.stats["hits"] += uniq.size - n_miss
        if n_miss:
            self.stats["misses"] += n_miss
            if uniq.size > self.capacity:
                raise CacheTooSmallError(
                    f"a batch of {uniq.size} distinct rows does not fit the training row "
                    f"cache of {self.capacity} rows ({self.nbytes} bytes): give a larger "
                    "row_cache_bytes")
            self.last_used[slots[~miss]] = self.clock  # the batch's rows stay
            ids = uniq[miss]
            staged = None if staged_for is None else staged_for(ids)  # (before evicting)
            new = self._take(n_miss)
            self._load(ids, new, staged)
            slots[miss] = new
        self.last_used[slots] = self.clock
        return slots

    def _take(self, k: int) -> np.ndarray:
        if self._n_free < k:
            self._evict(max(k - self._n_free, self._evict_n))
        self._n_free -= k
        return self._free[self._n_free: self._n_free + k].copy()

    def _evict(self, n: int) -> None:
        """Free the ``n`` least recently used slots (not those of the current step),
        writing the dirty ones back first."""
        key = np.where(self.id_of < 0, np.iinfo(np.int64).max, self.last_used)
        n = min(n, int(np.count_nonzero(key < self.clock)))
        victims = np.argpartition(key, n - 1)[:n] if n < key.size else np.arange(key.size)
        victims = victims[key[victims] < self.clock]
        self._write(victims[self.dirty[victims]])
        self.slot_of[self.id_of[victims]] = -1
        self.id_of[victims] = -1
        self._free[self._n_free: self._n_free + victims.size] = victims
        self._n_free += victims.size
        self.stats["evictions"] += int(victims.size)

    def _load(self, ids: np.ndarray, slots: np.ndarray, staged: Staged | None) -> None:
        """Rows (and state) of ``ids`` (sorted) into ``slots``: from ``staged`` where it
        has them, else read from the tables."""
        todo = np.ones(ids.size, bool)
        if staged is not None and staged[0].size:
            sid, srows, sstate = staged
            pos = np.minimum(np.searchsorted(sid, ids), sid.size - 1)
            have = sid[pos] == ids
            if have.any():  # (through the reused buffers: no allocation of the rows)
                at = pos[have]
                rows, state = self._miss_buffers(at.size)
                self.rows[slots[have]] = np.take(srows, at, axis=0, out=rows, mode="clip")
                if self.state_cols:
                    self.state[slots[have]] = np.take(sstate, at, axis=0, out=state,
                                                      mode="clip")
                todo = ~have
        if todo.any():
            rest, rs = ids[todo], slots[todo]
            rows, state = self._miss_buffers(rest.size)
            self.rows[rs] = self.table.lookup(rest, out=rows)
            release_pages(self.table, rest)
            if self.state_table is not None:
                self.state[rs] = self.state_table.lookup(rest, out=state)
        self.slot_of[ids] = slots
        self.id_of[slots] = ids
        self.dirty[slots] = False

    def _miss_buffers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Buffers the missing rows (and state) of a batch are read into: grown to the most
        a batch missed, then reused (no allocation of the rows a step)."""
        if self._miss_rows.shape[0] < n:
            self._miss_rows = np.empty((n, self.rows.shape[1]), np.float32)
            self._miss_state = np.empty((n, self.state_cols), np.float32)
        return self._miss_rows[:n], self._miss_state[:n]

    def _write(self, slots: np.ndarray) -> None:
        if not slots.size:
            return
        ids = self.id_of[slots]
        order = np.argsort(ids, kind="stable")
        slots, ids = slots[order], ids[order]
        if self.before_write is not None:
            self.before_write()
        self.flushes += 1
        self._write_back(ids, self.rows[slots], self.state[slots])
        self.dirty[slots] = False
        self.stats["written"] += int(slots.size)

    def flush(self) -> int:
        """Write every dirty row back: one ``flush_back`` (which asks for the rows a block
        at a time), or a ``write_back`` per WRITE_BACK_ROWS of them; returns how many.
        Besides the blocks, it holds 12 bytes a dirty row (their ids, sorted in place, and
        slots)."""
        if self._flush_back is None:
            slots = np.flatnonzero(self.dirty)
            for a in range(0, slots.size, WRITE_BACK_ROWS):  # a loop per write-back
                self._write(slots[a: a + WRITE_BACK_ROWS])
            return int(slots.size)
        ids = self.id_of[self.dirty]
        if not ids.size:
            return 0
        ids.sort()
        at = self.slot_of[ids]
        if self.before_write is not None:
            self.before_write()
        self.flushes += 1
        self._flush_back(ids, lambda pos: self.rows[at[pos]],
                         lambda pos: self.state[at[pos]])
        self.dirty[at] = False
        self.stats["written"] += int(ids.size)
        return int(ids.size)

    def peek(self, ids: np.ndarray, *, state: bool = False) -> np.ndarray:
        """The newest rows (or state) of ``ids`` (1-D), leaving the cache as it is: read
        from the table, the cached ones from the cache (an evaluation's lookups)."""
        src, cached = (self.state_table, self.state) if state else (self.table, self.rows)
        if src is None:
            return np.zeros((ids.size, 0), np.float32)
        slots = self.slot_of[ids]
        hit = slots >= 0
        out = src.lookup(ids) if not hit.all() else np.empty((ids.size, cached.shape[1]),
                                                              np.float32)
        out[hit] = cached[slots[hit]]
        return out

    def missing(self, uniq: np.ndarray) -> np.ndarray:
        """Those of ``uniq`` not cached now (what a prefetch reads)."""
        return uniq[self.slot_of[uniq] < 0]

    def drop(self) -> None:
        """Forget every cached row (dirty ones are lost: flush first)."""
        used = self.id_of >= 0
        self.slot_of[self.id_of[used]] = -1
        self.id_of[:] = -1
        self.dirty[:] = False
        self._free[:] = np.arange(self.capacity - 1, -1, -1)
        self._n_free = self.capacity

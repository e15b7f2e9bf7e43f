"""Reading the next batch's rows ahead (``module.prefetch(ids)``; issue 40).

:class:`Prefetcher` finds, in the calling thread, which of the next batch's unique ids
the row cache lacks, and reads their rows (and state) from the table in one background
thread into a persistent staging buffer.  The next forward that misses any of them waits
for the read and takes them from there instead of reading the table.

Never a row older than its newest update: rows that are cached are not read (the cache
holds their newest value); a row the read got can only have changed since by a
write-back (a row leaves the cache only written), and every write-back first waits for
the read in flight and then bumps the cache's ``flushes`` counter, which invalidates
what was staged before it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .cache import Staged, WriteBackCache, release_pages

__all__ = ["Prefetcher"]


class Prefetcher:
    def __init__(self, cache: WriteBackCache):
        self.cache = cache
        self._pool: ThreadPoolExecutor | None = None
        self._job: Future | None = None
        self._ids = np.empty(0, np.int64)  # what the job in flight (or staged) holds
        self._epoch = -1
        self._staged: Staged | None = None
        self._rows = np.empty((0, cache.rows.shape[1]), np.float32)
        self._state = np.empty((0, cache.state_cols), np.float32)

    def start(self, ids: np.ndarray) -> int:
        """Read the rows of ``ids`` (validated int64) the cache lacks; returns how many."""
        self.wait()
        self._staged = None
        miss = self.cache.missing(np.unique(ids.reshape(-1)))
        self._ids = miss
        if not miss.size:
            return 0
        if self._rows.shape[0] < miss.size:  # grows to the largest batch, then stays
            self._rows = np.empty((miss.size, self._rows.shape[1]), np.float32)
            self._state = np.empty((miss.size, self.cache.state_cols), np.float32)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="embstore-prefetch")
        self._epoch = self.cache.flushes
        self._job = self._pool.submit(self._read, miss)
        return int(miss.size)

    def _read(self, ids: np.ndarray) -> Staged:
        rows = self.cache.table.lookup(ids, out=self._rows[: ids.size])
        release_pages(self.cache.table, ids)
        state = self._state[: ids.size]
        if self.cache.state_table is not None:
            self.cache.state_table.lookup(ids, out=state)
        return ids, rows, state

    def wait(self) -> None:
        """Finish the read in flight (before anything writes the table)."""
        job, self._job = self._job, None
        if job is not None:
            self._staged = job.result()

    def staged_for(self, miss: np.ndarray) -> Staged | None:
        """Rows read ahead for any of the missing ids ``miss`` (sorted), still valid; waits
        for a read in flight only if it holds at least half of them (else it is another
        batch's, and this forward reads its rows itself meanwhile)."""
        if not self._ids.size or not miss.size:
            return None
        pos = np.minimum(np.searchsorted(self._ids, miss), self._ids.size - 1)
        held = self._ids[pos] == miss
        if not held.any():
            return None
        if self._job is not None and not self._job.done() and held.mean() < 0.5:
            return None  # another batch's read (prefetched before this forward): not waited for
        self.wait()
        if self._epoch != self.cache.flushes:  # a write-back since the read: not served
            self._staged, self._ids = None, np.empty(0, np.int64)
        return self._staged

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

"""The id -> slot hash index of :class:`~embstore.cache.rows.RowCache`: open addressing with
linear probing over two int64 arrays (``_hk`` the id held by each cell, -1 empty, -2 deleted;
``_hv`` its slot), every operation vectorised over a batch of ids (one NumPy round per
probing step); and the doorkeeper of admission, one byte per cell.  A mixin: the cache owns
the arrays, ``bits``, ``_entries``, ``_used``, ``_slot_id`` and ``_seen``; call everything
under the cache's lock."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SlotIndex", "EMPTY", "TOMB", "MULT"]

MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing of ids
EMPTY, TOMB = -1, -2


class SlotIndex:
    """Hash index methods shared by the row cache (see the module docstring)."""

    bits: int
    _hk: Any
    _hv: Any
    _slot_id: Any
    _entries: int
    _used: int
    _seen: Any
    _seen_count: int
    slots: int

    def _home(self, ids: np.ndarray) -> np.ndarray:
        return ((ids.astype(np.uint64) * MULT) >> np.uint64(64 - self.bits)).astype(np.int64)

    def _probe(self, ids: np.ndarray) -> np.ndarray:
        """Hash cell of each id, -1 where absent."""
        res = np.full(ids.shape, -1, dtype=np.int64)
        if not self._entries:
            return res
        mask = (1 << self.bits) - 1
        pos = self._home(ids)
        act = np.arange(ids.size)
        q = ids
        while act.size:
            k = self._hk[pos]
            found = k == q
            res[act[found]] = pos[found]
            go = ~found & (k != EMPTY)
            act, q, pos = act[go], q[go], (pos[go] + 1) & mask
        return res

    def _hinsert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add distinct absent ``ids`` -> ``slots``."""
        if self._used + ids.size > (7 << self.bits) // 10:  # too many deleted cells: rebuild
            live = np.flatnonzero(self._slot_id >= 0)
            live = live[~np.isin(live, slots)]
            self._hk.fill(EMPTY)
            self._used = 0
            ids, slots = np.concatenate([self._slot_id[live], ids]), np.concatenate([live, slots])
        if not self._used:
            ids, slots = self._hbulk(ids, slots)
        self._hprobe_insert(ids, slots)

    def _hbulk(self, ids: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Place distinct ``ids`` into the empty index at once, as linear probing would in
        the order of their home cells: sorted by home ``h``, an id lands on
        ``max(h, previous + 1)`` (a running maximum); returns those that ran past the last
        cell (for the probing insert, which wraps around)."""
        home = self._home(ids)
        order = np.argsort(home, kind="stable")
        home = home[order]
        step = np.arange(home.size)
        at = np.maximum.accumulate(home - step) + step
        fits = at < (1 << self.bits)
        put = order[fits]
        self._hk[at[fits]] = ids[put]
        self._hv[at[fits]] = slots[put]
        self._used += int(put.size)
        over = order[~fits]
        return ids[over], slots[over]

    def _hprobe_insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add distinct absent ``ids`` -> ``slots`` by probing, one NumPy round a step."""
        mask = (1 << self.bits) - 1
        pos = self._home(ids)
        while ids.size:
            k = self._hk[pos]
            free = np.flatnonzero(k < 0)
            if free.size:
                _, first = np.unique(pos[free], return_index=True)
                win = free[first]
                self._used += int(np.count_nonzero(k[win] == EMPTY))
                self._hk[pos[win]] = ids[win]
                self._hv[pos[win]] = slots[win]
                rest = np.ones(ids.size, dtype=bool)
                rest[win] = False
                ids, slots, pos = ids[rest], slots[rest], pos[rest]
            pos = (pos + 1) & mask

    def _seen_before(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id missed before: TinyLFU's doorkeeper, one byte per hash cell.

        Marks the ids as seen.  The window is reset after about ``slots`` first misses.
        Call under the lock, the arrays allocated.
        """
        cell = ((ids.astype(np.uint64) * MULT) >> np.uint64(63 - self.bits)).astype(np.intp)
        seen = self._seen[cell].astype(bool)
        self._seen[cell] = 1
        self._seen_count += int(ids.size - np.count_nonzero(seen))
        if self._seen_count > self.slots:
            self._seen.fill(0)
            self._seen_count = 0
        return seen

"""The LRU row cache of on-disk tables, and its statistics.

:class:`RowCache` keeps rows in a slot matrix.  Its bookkeeping (per slot: the cached id
and a last-use stamp; an open-addressing hash table id -> slot of at least twice as many
cells) goes with it.  The number of slots is chosen so that rows plus bookkeeping fit in
``capacity_bytes`` (the cache never holds more than its budget), and never exceeds the
table's row count: a small table gets a small cache whatever the budget.  Nothing is
allocated when a table opens; the slot matrix and the bookkeeping start small on first use
and grow fourfold as rows come in.  It holds the rows of one source (:meth:`RowCache.bind`: a
table's current version).  A batch costs a handful of NumPy operations over its ids: a vectorised hash probe (one
round per step of linear probing), one gather of the hits, one fetch of all the batch's
misses through the read path, and eviction of the least recently used slots by
``np.argpartition`` of their stamps (slots never used are filled first, with no scan).

Admission: a batch caches every row that was missed before (within a window of about
``slots`` first misses: TinyLFU's "doorkeeper") plus up to ``ADMIT_ALL_BELOW`` of its
first-time misses, taken evenly (all of them while there are never-used slots for them and
the batch was read from disk).  A small batch is thus cached whole, as by a plain LRU,
while a large cold batch (a scan, uniformly random ids) copies little into the cache and
so costs about what the read path costs; rows that recur (the head of a Zipf
distribution) enter on their second use at the latest.  A batch that mostly misses on a
store whose reads cost what a hit costs (``cheap_reads``, resident) is read whole from it
and admits only rows missed before: a row read once is no cheaper from the cache.

``warm(ids)`` loads the given rows (hottest first) and holds them: traffic, cached LRU in
the other slots, never evicts them; with as many ids as slots the cache is a fixed cache
of the hottest rows (an LRU under Zipf traffic reads 1.26-1.33x its rows).

Counting (``cache_info``): every requested id counts once (duplicates in a batch included):
a *hit* if its row was cached when the batch started, a *miss* otherwise.  ``evictions``
counts rows dropped to make room (not rows written).  ``bytes`` is ``entries * row_bytes``
(rows plus bookkeeping stay <= capacity).  ``warm`` and ``cache_clear`` count no hits or
misses; ``cache_clear`` resets all counters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..fs.forksafe import renew_after_fork
from ..ids import parse_bytes
from .hotfile import rank_ids
from .slots import EMPTY as _EMPTY, TOMB as _TOMB, SlotIndex

__all__ = ["CacheInfo", "RowCache", "parse_bytes"]

ADMIT_ALL_BELOW = 2048  # first-time misses a batch caches at most (``RowCache._admit``)
_FIRST_SLOTS, _GROWTH = 4096, 4  # slots allocated on first use; grown fourfold as they fill


class CacheInfo(NamedTuple):
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0


def _bits_for(slots: int) -> int:
    return max(3, int(2 * max(1, slots) - 1).bit_length())


class RowCache(SlotIndex):
    """A thread-safe LRU cache of table rows with a byte budget it never exceeds."""

    # bookkeeping arrays, allocated on first use (None until then; see _grow)
    _slot_id: Any
    _stamp: Any
    _hk: Any
    _hv: Any
    _seen: Any
    _rows: Any
    _pin: Any  # per slot: held by warm() (never evicted by traffic)
    _filled: int
    _used: int

    def __init__(self, capacity_bytes: int, dim: int, dtype, rows: int | None = None):
        self.capacity_bytes = int(capacity_bytes)
        self.dtype = np.dtype(dtype)
        self.dim = int(dim)
        self.row_bytes = self.dim * self.dtype.itemsize
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        #: reads are about as cheap as cache hits (uncompressed, memory-mapped): a batch that
        #: mostly misses is then read whole from the store instead of merged from both
        self.cheap_reads = False
        #: ``() -> bool``: whether the store's last reads were not resident (then they are
        #: not cheap whatever ``cheap_reads`` says, and hits are never read again)
        self.reads_cold: Callable[[], bool] | None = None
        self._slot_id = None
        self._cap = 0  # slots allocated so far (rows and bookkeeping), <= slots
        self._owner: Any = None  # the source whose rows are held (bind; clear keeps it)
        self.resize_for(rows)
        self._reset()

    def resize_for(self, rows: int | None) -> None:
        """Size the cache for a table of ``rows`` rows (None: as the budget allows).

        Only the limit changes: arrays grow on use.  A table that grows (``append``) calls
        this again; the cache never shrinks below the slots it already uses.
        """
        slots = self.capacity_bytes // (self.row_bytes + 48)
        if rows is not None:
            slots = min(slots, max(int(rows), 0))
        while slots and self._footprint(slots) > self.capacity_bytes:
            slots -= max(1, slots // 64)
        self.slots = max(slots, self._cap)
        self.bits = _bits_for(self._cap)

    def _footprint(self, slots: int) -> int:
        """Bytes held with ``slots`` slots: rows, slot ids, stamps, pins, hash keys and
        values, and the one-byte-per-cell doorkeeper."""
        h = 1 << _bits_for(slots)
        return slots * (self.row_bytes + 17) + 16 * h + 2 * h

    def _reset(self) -> None:
        # the arrays are allocated on first use, so an open table costs nothing; once
        # allocated they are refilled in place (no new pages to fault in)
        if self._slot_id is not None:
            if self._filled:
                self._slot_id[: self._filled] = -1
                self._stamp[: self._filled] = -1
                self._pin[: self._filled] = False
            if self._used:
                self._hk.fill(_EMPTY)
            if getattr(self, "_seen_count", 0):
                self._seen.fill(0)
        else:
            self._slot_id = self._stamp = self._hk = self._hv = self._seen = None
            self._rows = self._pin = None
            self._cap = 0
        self._used = 0  # hash cells not empty (live + deleted)
        self._entries = 0
        self.pinned = 0  # slots held by warm()
        self._filled = 0  # slots ever used (they fill in order, then LRU eviction)
        self._seen_count = 0
        self._clock = 0
        self._gen = 0
        self.hits = self.misses = self.evictions = 0

    def _drop(self, keep_stats: bool) -> None:
        """Every row dropped (the lock held, or no other thread), the generation raised (a
        gather begun before caches nothing); the bound source stays."""
        gen, stats = self._gen, (self.hits, self.misses, self.evictions)
        self._reset()
        self._gen = gen + 1
        if keep_stats:
            self.hits, self.misses, self.evictions = stats

    def _after_fork(self) -> None:
        """In a forked child: another thread of the parent may have been mid-update, so
        drop every row (the statistics stay)."""
        self._slot_id = None
        self._drop(keep_stats=True)

    def _allocate(self) -> None:
        if self._slot_id is None:
            self._grow(min(self.slots, _FIRST_SLOTS))

    def _grow(self, cap: int) -> None:
        """Make room for ``cap`` slots: copy the filled slots, rebuild the hash index."""
        old = self._cap if self._slot_id is not None else 0
        slot_id = np.full(cap, -1, dtype=np.int64)
        stamp = np.full(cap, -1, dtype=np.int64)  # -1: empty, evicted first
        rows = np.empty((cap, self.dim), dtype=self.dtype)
        pin = np.zeros(cap, dtype=bool)
        if old:
            f = self._filled
            slot_id[:f], stamp[:f], rows[:f] = self._slot_id[:f], self._stamp[:f], self._rows[:f]
            pin[:f] = self._pin[:f]
        self._slot_id, self._stamp, self._rows, self._cap = slot_id, stamp, rows, cap
        self._pin = pin
        self.bits = _bits_for(cap)
        self._hk = np.full(1 << self.bits, _EMPTY, dtype=np.int64)  # id; -1 empty, -2 deleted
        self._hv = np.zeros(1 << self.bits, dtype=np.int64)  # slot of that id
        self._seen = np.zeros(2 << self.bits, dtype=np.uint8)  # doorkeeper (see _admit)
        self._seen_count = 0
        self._used = 0
        live = np.flatnonzero(slot_id >= 0)
        if live.size:
            self._hinsert(slot_id[live], live)

    # -- lookups ----------------------------------------------------------------------
    def gather(self, ids: np.ndarray, out: np.ndarray | None,
               fetch: Callable[[np.ndarray, np.ndarray], None],
               take: Callable[[np.ndarray], np.ndarray] | None = None,
               owner: Any = None) -> np.ndarray:
        """Rows ``ids`` (validated 1-D int64) into ``out`` (returned), reading misses with
        ``fetch(ids, out)`` in one call.  With ``out=None`` a new array is returned; when
        nothing hits, it is ``take(ids)`` itself (no extra copy), if ``take`` is given.
        ``owner``: the source ``fetch`` reads; the cache holds the rows of the source it is
        bound to (:meth:`bind`) only: a lookup through another (a version a refresh
        replaced) reads every row from it and caches none, so it never mixes two."""
        n = ids.size
        if out is None and (take is None or n == 0):
            out = np.empty((n, self.dim), dtype=self.dtype)
        if n == 0:
            assert out is not None
            return out
        with self._lock:
            self._clock += 1
            tick, gen = self._clock, self._gen
            if owner is not None and owner is not self._owner:  # (bound to a newer one)
                gen, cell = -1, np.full(n, -1, dtype=np.int64)  # read all, cache none
            else:
                cell = self._probe(ids)
            hit = cell >= 0
            nh = int(np.count_nonzero(hit))
            self.hits += nh
            self.misses += n - nh
            if (nh and take is not None and out is None and self.cheap_reads and 2 * nh < n
                    and not (self.reads_cold is not None and self.reads_cold())):
                self._stamp[self._hv[cell[hit]]] = tick  # the hits stay recent
                miss_ids = ids[~hit]
                nh = -1  # read everything below
            elif nh:
                if out is None:
                    out = np.empty((n, self.dim), dtype=self.dtype)
                # one gather over all positions (misses overwritten below): faster than a mask
                slots = self._hv[cell]
                np.take(self._rows, slots, axis=0, out=out, mode="clip")
                if nh < n:
                    miss_at = np.flatnonzero(~hit)
                    slots = slots[hit]
                self._stamp[slots] = tick
                if nh == n:
                    return out
        # one call into the read path for all misses, outside the lock; afterwards every
        # row is in ``out`` and ``miss_pos`` says where the missed ones are
        if nh < 0:
            assert take is not None
            out = take(ids)
            miss_pos = np.flatnonzero(~hit)
        elif nh:
            miss_ids = ids[miss_at]
            rows = np.empty((miss_ids.size, self.dim), dtype=self.dtype)
            fetch(miss_ids, rows)
            assert out is not None
            out[miss_at] = rows
            miss_pos = miss_at
        else:
            miss_ids = ids
            if out is None:
                assert take is not None
                out = take(ids)
            else:
                fetch(ids, out)
            miss_pos = None
        with self._lock:
            if gen != self._gen:  # a write happened meanwhile: the rows may be stale
                return out
            admit = self._admit(miss_ids, first_time=nh >= 0)
            if admit.size:
                uniq, first = np.unique(miss_ids[admit], return_index=True)
                src = admit[first] if miss_pos is None else miss_pos[admit[first]]
                self._insert(uniq, out, tick, at=src)
        return out

    def _admit(self, ids: np.ndarray, *, first_time: bool = True) -> np.ndarray:
        """Positions of the missed ``ids`` to cache (``first_time=False``: only those missed
        before); call under the lock.

        Every row missed before (within the doorkeeper's window, see ``_seen_before``), plus
        up to ``ADMIT_ALL_BELOW`` first-time misses, taken evenly from the batch; all of
        them while the cache has never-used slots for them and the batch was read from disk
        (``reads_cold``): copying a row costs nothing beside its page read, evicts nothing,
        and each first-time Zipf tail row cached is a page not read when it recurs.  A small
        batch is thus cached whole, as by a plain LRU; a large cold batch (a scan, uniformly
        random traffic) copies little into the cache and evicts little, while rows that
        recur (the head of a Zipf distribution) get in on their second use at the latest.
        """
        self._allocate()
        seen = self._seen_before(ids)
        if not first_time:
            return np.flatnonzero(seen)
        first = np.flatnonzero(~seen)
        if (first.size > ADMIT_ALL_BELOW and self._filled + ids.size <= self.slots
                and self.reads_cold is not None and self.reads_cold()):
            return np.arange(ids.size)  # read from disk, and room for all: nothing evicted
        if first.size > ADMIT_ALL_BELOW:
            seen[first[:: -(-first.size // ADMIT_ALL_BELOW)]] = True
            return np.flatnonzero(seen)
        return np.arange(ids.size)

    def _insert(self, ids: np.ndarray, rows: np.ndarray, tick: int, *, pin: bool = False,
                at: np.ndarray | None = None) -> None:
        """Cache distinct ``ids`` with rows ``rows[at]`` (copied once, into their slots);
        ``pin``: held until the next ``warm``.  Call under the lock.

        Victims are the least recently used unpinned slots: with every slot pinned, traffic
        caches nothing (and evicts nothing)."""
        if self.slots == 0 or ids.size == 0:
            return
        self._allocate()
        at = np.arange(ids.size) if at is None else at
        cell = self._probe(ids)
        present = cell >= 0
        if present.any():  # cached already (by another thread, or before a warm)
            if pin:
                self._pin_slots(self._hv[cell[present]], tick)
            ids, at = ids[~present], at[~present]
        k = min(ids.size, self.slots)
        if k == 0:
            return
        if self._filled + k > self._cap and self._cap < self.slots:
            self._grow(min(self.slots, max(_GROWTH * self._cap, self._filled + k)))
        start = self._filled
        fresh = min(k, self.slots - start)  # never-used slots first: no eviction scan
        k = fresh + min(k - fresh, start - self.pinned)  # (pinned slots are not victims)
        ids, at = ids[:k], at[:k]
        victims = np.arange(start, start + fresh)
        self._filled += fresh
        if fresh < k:
            need = k - fresh
            stamp = self._stamp[:start]  # (the slots just taken are past ``start``)
            if self.pinned:
                stamp = np.where(self._pin[:start], np.iinfo(np.int64).max, stamp)
            lru = np.argpartition(stamp, need - 1)[:need]
            victims = np.concatenate([victims, lru])
            old = self._slot_id[lru]
            gone = old >= 0
            if gone.any():
                self.evictions += int(np.count_nonzero(gone))
                self._hk[self._probe(old[gone])] = _TOMB
                self._entries -= int(np.count_nonzero(gone))
        self._slot_id[victims] = ids
        self._stamp[victims] = tick
        np.take(rows, at[:fresh], axis=0, out=self._rows[start: start + fresh], mode="clip")
        if fresh < k:
            self._rows[victims[fresh:]] = rows[at[fresh:]]
        self._hinsert(ids, victims)
        self._entries += k
        if pin:
            self._pin_slots(victims, tick)

    def _pin_slots(self, slots: np.ndarray, tick: int) -> None:
        self.pinned += int(slots.size - np.count_nonzero(self._pin[slots]))
        self._pin[slots] = True
        self._stamp[slots] = tick

    # -- maintenance ----------------------------------------------------------------------
    def warm(self, ids: np.ndarray, fetch: Callable[[np.ndarray, np.ndarray], None],
             *, block: int = 65536, owner: Any = None) -> int:
        """Load rows ``ids`` (validated, 1-D) and hold them: traffic never evicts them (it
        has the other slots, LRU), only the next ``warm`` (which releases the rows held
        before), a write to them, or ``clear``.  Hits are not counted.

        Rows are ranked by how often they occur in ``ids``, ties by first occurrence (a
        hottest-first list of distinct ids, or a sample of traffic); the ``slots`` first are
        loaded (rows cached already are kept, not read again); with as many ids as slots
        the cache is a fixed cache of those rows.
        Returns how many rows are held.
        """
        order = rank_ids(ids)[: self.slots]
        with self._lock:
            if self._pin is not None:
                self._pin[: self._filled] = False  # the rows held before go back to LRU
            self.pinned = 0
            self._clock += 1
            cell = self._probe(order)
            have = cell >= 0
            if have.any():
                self._pin_slots(self._hv[cell[have]], self._clock)
            order = np.sort(order[~have])  # (all are held: read them in one sweep)
        for s in range(0, order.size, block):
            part = order[s: s + block]
            rows = np.empty((part.size, self.dim), dtype=self.dtype)
            with self._lock:
                gen = self._gen
            fetch(part, rows)
            with self._lock:
                self._clock += 1
                if gen == self._gen and (owner is None or owner is self._owner):
                    self._insert(part, rows, self._clock, pin=True)
        return self.pinned

    def invalidate(self, ids: np.ndarray) -> None:
        """Forget rows ``ids`` (just written) so they are read again from the store."""
        with self._lock:
            self._gen += 1
            cell = self._probe(np.unique(ids))
            cell = cell[cell >= 0]
            if not cell.size:
                return
            slots = self._hv[cell]
            self._hk[cell] = _TOMB
            self.pinned -= int(np.count_nonzero(self._pin[slots]))
            self._pin[slots] = False
            self._slot_id[slots] = -1
            self._stamp[slots] = -1
            self._entries -= int(cell.size)

    def bind(self, owner: Any) -> None:
        """Hold the rows of source ``owner`` from now on (a new one: the rows held dropped,
        the statistics kept); lookups through another bypass the cache (:meth:`gather`)."""
        with self._lock:
            if owner is not self._owner:
                self._drop(keep_stats=True)
                self._owner = owner

    def clear(self, *, keep_stats: bool = False) -> None:
        """Drop every row and (unless ``keep_stats``) reset the statistics."""
        with self._lock:
            self._drop(keep_stats)

    def info(self) -> CacheInfo:
        with self._lock:
            n = self._entries
            return CacheInfo(self.hits, self.misses, self.evictions, n, n * self.row_bytes,
                             self.capacity_bytes)

"""Rows written since the last compaction: delta files and the overlay that reads them
(docs/FORMAT.md §6c).

A ``write`` on a format-2 table does not rewrite the chunks its rows lie in: each row array
it changes (``vectors``, and ``row_scale`` / ``norms`` where the table has them) gets one
delta file (:mod:`.framed`: the sorted unique ids and their rows as stored).

:class:`OverlaySource` reads a row array with its version's deltas on top: the deltas'
ids are merged once at open (newest wins) into one sorted array, and a gather finds its
ids in it with one ``np.searchsorted`` and copies those rows over the gathered ones.
Compaction (:func:`embstore.store.versions.compact`) folds them into the chunks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError
from ..base import RowsAt, RowSource, Transaction
from ..shard import prefetch
from .framed import (MAGIC, check_delta, read_delta, read_framed, sorted_union,
                        write_delta, write_framed)
from .snapshot import DELTAS

#: a unit (chunk, shard) is folded when its pending rows take 1/DENSE of its bytes in deltas
DENSE = 8
#: pending rows merged (and folded into the layout or a delta file) at a time: what a fold
#: holds of them, whatever their number or the layout's unit (issue 40)
FOLD_BLOCK_BYTES = 4 << 20

__all__ = ["write_delta", "read_delta", "check_delta", "OverlaySource", "Overlays", "MAGIC",
           "write_framed", "read_framed", "sorted_union", "DENSE", "FOLD_BLOCK_BYTES"]



class OverlaySource(RowSource):
    """The row array ``inner`` with the rows of its version's deltas on top; a ``write``
    stages a new delta instead of rewriting chunks."""

    def __init__(self, inner: RowSource, name: str,
                 parts: list[tuple[np.ndarray, np.ndarray]], cols: int, dtype):
        self.inner, self.name = inner, name
        self._cols, self._dtype = cols, np.dtype(dtype)
        # the delta files' values stay where they are (memory maps); one sorted array of
        # the pending ids and, with more than one file, where each one's newest row is:
        # (file << 40) | position in it
        self._parts = [p[1].reshape(p[0].size, cols) for p in parts]
        self._ptr: np.ndarray | None = None
        if len(parts) == 1:
            self.ids = parts[0][0]
        elif parts:  # (16 bytes a pending row kept; the file's ids are mapped views)
            self.ids = sorted_union(*[p[0] for p in parts])
            self._ptr = np.empty(self.ids.size, np.int64)
            for k, p in enumerate(parts):  # a loop per file, oldest first: newest wins
                self._ptr[np.searchsorted(self.ids, p[0])] = (
                    (np.int64(k) << np.int64(40)) + np.arange(p[0].size))
        else:
            self.ids = np.empty(0, np.int64)
        self.cheap_reads = inner.cheap_reads
        #: how a write of this commit treats the pending rows (set by the table for one
        #: commit): None, a delta file of its own; ``"delta"``/``"chunks"``/``"dense"``:
        #: see write_blocks (``"dense"``: at most ``keep_rows`` rows left pending)
        self.combine: str | None = None
        self.keep_rows = 0
        self._combined: Transaction | None = None  # the commit a write folded into
        ids = self.ids
        if ids.size and ids[-1] >= inner.shape[0]:
            raise CorruptStoreError(f"deltas of {name}: row {int(ids[-1])} past the "
                                    f"{inner.shape[0]} rows of the version")
        # a bit per row of the version: whether a delta holds it (a batch's ids are tested
        # with one gather; only the hits are searched for)
        self._bits = np.zeros((inner.shape[0] + 8) // 8, dtype=np.uint8)
        if ids.size:
            byte = ids >> 3
            starts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
            self._bits[byte[starts]] = np.add.reduceat(
                (1 << (ids & 7)).astype(np.uint8), starts)  # distinct bits: the sum is the or

    shape = property(lambda self: self.inner.shape)
    dtype = property(lambda self: self.inner.dtype)
    layout = property(lambda self: self.inner.layout)
    storage_dtype = property(lambda self: self.inner.storage_dtype)

    def reads_cold(self) -> bool:
        return self.inner.reads_cold()

    @property
    def values(self) -> np.ndarray:
        """The pending rows (of :attr:`ids`), in memory (compactions and merges)."""
        return self._rows(np.arange(self.ids.size))

    @property
    def nbytes(self) -> int:
        return int(self.ids.size) * (8 + self._cols * self._dtype.itemsize)

    def _rows(self, pos: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows at positions ``pos`` of :attr:`ids`, gathered from the delta files (into
        ``out`` if given)."""
        if out is None:
            out = np.empty((pos.size, self._cols), self._dtype)
        if self._ptr is None:
            if self._parts:
                np.take(self._parts[0], pos, axis=0, out=out)
            return out
        ptr = self._ptr[pos]
        part, at = ptr >> np.int64(40), ptr & np.int64((1 << 40) - 1)
        for k in np.unique(part).tolist():  # a loop per delta file (at most 32)
            m = part == k
            out[m] = self._parts[k][at[m]]
        return out

    def _addresses(self, pos: np.ndarray) -> np.ndarray:
        """Where the rows at positions ``pos`` of :attr:`ids` lie in memory (the delta
        files' maps)."""
        rb = self._cols * self._dtype.itemsize
        if self._ptr is None:
            return self._parts[0].ctypes.data + pos * rb
        ptr = self._ptr[pos]
        bases = np.array([p.ctypes.data for p in self._parts], np.int64)  # (per file)
        return bases[ptr >> np.int64(40)] + (ptr & np.int64((1 << 40) - 1)) * rb

    def _ask(self, pos: np.ndarray) -> None:
        """Many delta rows to copy whose pages are not in memory (a trainer's misses,
        written back earlier): their pages asked for all at once (``MADV_WILLNEED``), as
        the chunks' are, rather than faulted in one at a time."""
        if pos.size < 64 or not self._parts:
            return
        at = self._addresses(pos)
        if prefetch.is_cold(at):
            prefetch.willneed(at, at + self._cols * self._dtype.itemsize)

    def release(self, ids: np.ndarray) -> int:
        """Let the page cache drop the pages of rows ``ids`` (just read: a trainer's row
        cache holds them now), the delta files' and the chunks' (``release`` of the
        inner source); returns the pages advised."""
        d, n = self.ids, 0
        if d.size and ids.size and self._parts:
            hit = (self._bits[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1 == 1
            if hit.any():
                at = self._addresses(np.searchsorted(d, ids[hit]))
                n += prefetch.pageout(at, at + self._cols * self._dtype.itemsize)
                ids = ids[~hit]
        release = getattr(self.inner, "release", None)
        return n + (int(release(ids)) if release is not None and ids.size else 0)

    def _over(self, ids: np.ndarray, out: np.ndarray) -> None:
        d = self.ids
        if not d.size or not ids.size:
            return
        hit = np.flatnonzero((self._bits[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1)
        if hit.size:
            pos = np.searchsorted(d, ids[hit])
            self._ask(pos)
            out[hit] = self._rows(pos).reshape(-1, out.shape[1])

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        self.inner.gather(ids, out)
        self._over(ids, out)

    def take(self, ids: np.ndarray) -> np.ndarray:
        out = self.inner.take(ids)
        if self.ids.size:
            if not out.flags.writeable:
                out = out.copy()
            self._over(ids, out)
        return out

    def read(self, start: int, stop: int) -> np.ndarray:
        out = self.inner.read(start, stop)
        lo, hi = np.searchsorted(self.ids, [start, stop])
        if hi > lo:
            if not out.flags.writeable:
                out = out.copy()
            out[self.ids[lo:hi] - start] = self._rows(np.arange(lo, hi)).reshape(
                -1, out.shape[1])
        return out

    def write(self, ids: np.ndarray, values: np.ndarray, txn: Transaction) -> None:
        values = values.reshape(ids.size, self._cols)
        if self.combine is None:
            write_delta(txn.delta(self.name), self.name, ids, values)
            return
        self.write_blocks(ids, values.__getitem__, txn)

    def write_blocks(self, ids: np.ndarray, rows_at: RowsAt, txn: Transaction,
                     block_rows: int = 0) -> None:
        """A write's rows (stored values, ``rows_at(pos)`` those of ``ids[pos]``, asked for
        FOLD_BLOCK_BYTES at a time): a new delta file, or, when the table's commit folds
        the pending rows in (``combine``: ``"delta"``, ``"chunks"`` or ``"dense"``), the
        pending rows and these merged (newest wins) into one delta file, into the chunks,
        or the dense units into the chunks and the rest into one delta file."""
        if self.combine is None:
            step = self._step()
            blocks = (rows_at(np.arange(a, min(a + step, ids.size)))
                      for a in range(0, ids.size, step))
            write_delta(txn.delta(self.name), self.name, ids, None, blocks=blocks,
                        cols=self._cols, dtype=self._dtype)
            return
        self._combined = txn
        if self.combine == "dense":
            self.fold_dense(txn, self.keep_rows, ids, rows_at)
        else:
            self._put(self.combine, ids, rows_at, txn)

    def _step(self) -> int:
        """Rows merged at a time: FOLD_BLOCK_BYTES of them (as if 64 bytes at least: the
        ids and positions of a block of narrow rows, 8 bytes each, stay small too)."""
        return max(1, FOLD_BLOCK_BYTES // max(64, self._cols * self._dtype.itemsize))

    def _put(self, how: str, new_ids: np.ndarray, new_at: RowsAt | None, txn: Transaction,
             only: np.ndarray | None = None) -> None:
        """The pending rows and the new ones (``new_ids``, ``new_at(pos)`` the values of
        ``new_ids[pos]``; newest wins) as one delta file, or into the chunks
        (``inner.write_blocks``), FOLD_BLOCK_BYTES of rows merged at a time: never all of
        them, nor a chunk of them, in memory at once (but for layouts that rewrite a whole
        unit from one array: sharded ones); ``only``: those of them alone."""
        ids = only if only is not None else sorted_union(self.ids, new_ids)
        step = self._step()

        def merged(pos: np.ndarray) -> np.ndarray:
            return self._merged(ids[pos], new_ids, new_at)
        if how == "delta":
            blocks = (merged(np.arange(a, min(a + step, ids.size)))
                      for a in range(0, ids.size, step))
            write_delta(txn.delta(self.name), self.name, ids, None, blocks=blocks,
                        cols=self._cols, dtype=self._dtype)
            return
        self.inner.write_blocks(ids, merged, txn, step)

    def fold_units(self, keep_rows: int, ids: np.ndarray) -> np.ndarray:
        """Which of the rows ``ids`` (sorted: pending, and a commit's new ones) a dense fold
        writes into the layout (a mask over ``ids``): whole units (chunks or shards) in
        order of their rows, most first: every unit whose rows take at least 1/DENSE of its
        bytes in a delta (rewriting it costs less than keeping them), then more until at
        most ``keep_rows`` rows are left pending.  Rows scattered thinly over many units
        stay in one delta file."""
        lay = self.inner.layout
        unit = int(lay.get("shard_rows") or lay.get("chunk_rows") or 0)
        if not unit or not ids.size:
            return np.ones(ids.size, bool)
        n_units = int(ids[-1]) // unit + 1  # (rows per unit by bisection: no id-sized temp)
        at = np.searchsorted(ids, np.arange(n_units + 1, dtype=np.int64) * unit)
        counts = np.diff(at)
        units = np.flatnonzero(counts)
        c = counts[units]
        order = np.argsort(-c, kind="stable")
        row_bytes = 8 + self._cols * self._dtype.itemsize  # (a row in a delta: id + values)
        dense = int((c[order] * row_bytes * DENSE >= unit * self._cols * self._dtype.itemsize)
                    .sum())
        left = ids.size - np.cumsum(c[order])  # rows pending after folding the first j + 1
        enough = int(np.searchsorted(-left, -keep_rows)) + 1 if ids.size > keep_rows else 0
        chosen = np.zeros(n_units, np.int8)
        chosen[units[order[: max(dense, enough)]]] = 1
        return np.repeat(chosen, counts).view(bool)

    def fold_dense(self, txn: Transaction, keep_rows: int, new_ids: np.ndarray | None = None,
                   new_at: RowsAt | None = None) -> int:
        """The pending rows (and a write's new ones) of a commit that drops the version's
        deltas: those of the units :meth:`fold_units` picks written into the layout, the
        others as one delta file of the commit.  Returns the rows written into the
        layout."""
        new_ids = np.empty(0, np.int64) if new_ids is None else new_ids
        ids = sorted_union(self.ids, new_ids)
        if not ids.size:
            return 0
        into = self.fold_units(keep_rows, ids)
        n_into = int(np.count_nonzero(into))
        for how, sel in (("chunks", into), ("delta", ~into)):  # (two: layout, then delta)
            if sel.any():
                self._put(how, new_ids, new_at, txn, only=ids if sel.all() else ids[sel])
        return n_into

    def _merged(self, ids: np.ndarray, new_ids: np.ndarray, new_at: RowsAt | None
                ) -> np.ndarray:
        """Rows ``ids`` (sorted): the new ones where they have them, else the pending."""
        out = np.empty((ids.size, self._cols), self._dtype)
        if not new_ids.size:  # (a fold: the pending rows, gathered straight into ``out``)
            return self._rows(np.searchsorted(self.ids, ids), out)
        assert new_at is not None
        pos = np.minimum(np.searchsorted(new_ids, ids), new_ids.size - 1)
        fresh = new_ids[pos] == ids
        if fresh.any():
            out[fresh] = new_at(pos[fresh]).reshape(-1, self._cols)
        old = np.flatnonzero(~fresh)
        if old.size:
            out[old] = self._rows(np.searchsorted(self.ids, ids[old]))
        return out

    def fold(self, txn: Transaction, how: str = "chunks") -> None:
        """The pending rows of a commit that drops the version's deltas (a compaction, or a
        write that folds them in and did not touch this array): written into the array's
        chunks (``inner.write``), (``how="delta"``) as one delta file, or (``"dense"``)
        the dense units' into the chunks and the rest as one delta file."""
        if self.ids.size and self._combined is not txn:
            if how == "dense":
                self.fold_dense(txn, self.keep_rows)
            else:
                self._put(how, np.empty(0, np.int64), None, txn)

    def append(self, values: np.ndarray, txn: Transaction) -> None:
        self.inner.append(values, txn)

    def publish_rows(self, rows: int, txn: Transaction) -> None:
        self.inner.publish_rows(rows, txn)

    def refresh(self) -> None:
        self.inner.refresh()

    def close(self) -> None:
        self.inner.close()


class Overlays:
    """The overlay of each row array of one version (``wrap`` is the hook
    :func:`~embstore.store.source.open_source` and
    :func:`~embstore.store.norms.source.attach_norms` call on each array they open)."""

    def __init__(self, snap: Path, manifest: dict, *, writable: bool):
        self.snap, self.entries, self.writable = Path(snap), manifest["deltas"], writable
        self.made: list[OverlaySource] = []

    def wrap(self, name: str, src: RowSource) -> RowSource:
        mine = [e for e in self.entries if e["array"] == name]
        if not mine and not self.writable:
            return src  # nothing to overlay, nothing to write: the plain fast path
        cols, dt = src.shape[1], src.dtype
        parts = [read_delta(self.snap / DELTAS / e["name"], name, cols, dt, src.shape[0])
                 for e in mine]
        ov = OverlaySource(src, name, parts, cols, dt)
        self.made.append(ov)
        return ov

    @property
    def pending_rows(self) -> int:
        """Rows of ``vectors`` in deltas (what a compaction would fold)."""
        return sum(int(o.ids.size) for o in self.made if o.name == "vectors")

    @property
    def pending_bytes(self) -> int:
        return sum(o.nbytes for o in self.made)

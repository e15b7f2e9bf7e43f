"""Rows written since the last compaction: delta files and the overlay that reads them
(docs/FORMAT.md §6c).

A ``write`` on a format-2 table does not rewrite the chunks its rows lie in: each row array
it changes (``vectors``, and ``row_scale`` / ``norms`` where the table has them) gets one
delta file, ``deltas/<N>.<array>`` of the version N it makes, holding the sorted unique ids
and their rows as stored (codes).  A delta file is::

    b"EMBDELTA" | uint32 header length | header (JSON: array, rows, cols, dtype) |
    zero padding to 8 bytes | int64 ids[rows] | values[rows, cols] | uint32 crc32c

all little-endian, the crc32c over every byte before it.  Bytes written: the rows, their
ids, 8 per id, and a few dozen more.

:class:`OverlaySource` reads a row array with its version's deltas on top: the deltas'
ids are merged once at open (newest wins) into one sorted array, and a gather finds its
ids in it with one ``np.searchsorted`` and copies those rows over the gathered ones.
Compaction (:func:`embstore.store.versions.compact`) folds them into the chunks.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptStoreError
from ...fs.checksum import crc32c
from ...fs.files import create_new, open_regular
from ..base import Transaction, RowSource
from .snapshot import DELTAS

#: a unit (chunk, shard) is folded when its pending rows take 1/DENSE of its bytes in deltas
DENSE = 8

__all__ = ["write_delta", "read_delta", "check_delta", "OverlaySource", "Overlays", "MAGIC",
           "write_framed", "read_framed"]

MAGIC = b"EMBDELTA"
MAX_HEADER = 1 << 16


def write_framed(path: Path, magic: bytes, header: dict, parts: Iterable[Any], *,
                 fsync: bool = True) -> int:
    """Write (and fsync, unless the caller does) the new file ``path``: ``magic`` (8
    bytes), the JSON ``header`` with its length, zero padding to 8, ``parts`` (buffers,
    possibly made one at a time), then the crc32c of all of it; returns its size (the
    frame of delta files and key delta files)."""
    head = json.dumps(header).encode()
    head = magic + struct.pack("<I", len(head)) + head
    crc, size = 0, 0
    fd = create_new(path)
    with os.fdopen(fd, "wb") as f:
        for p in itertools.chain([head + b"\0" * (-len(head) % 8)], parts):  # per part
            crc = crc32c(p, crc)
            size += f.write(p)
        f.write(struct.pack("<I", crc))
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return size + 4


def read_framed(path: Path, magic: bytes, what: str, body_size, *,
                mapped: bool = False) -> tuple[dict, Any, int]:
    """``(header, data, start)`` of a file written by :func:`write_framed`: the magic, the
    header (``body_size(header)``: the bytes after it it announces, checked against the
    file's size before the rest is read) and the crc32c checked; :class:`CorruptStoreError`
    naming the file (``what``: "delta", "key delta").  ``mapped``: ``data`` is a read-only
    memory map of the file (its pages are the page cache's, not the process's: a trainer's
    deltas do not count against its memory), else bytes."""
    def bad(why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{path}: {why}: the {what} is damaged", path=str(path))
    try:
        fd = open_regular(path, nofollow=True)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: missing (a {what} of this version; the table was "
                                "removed or vacuumed under this reader: reopen it)",
                                path=str(path)) from None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 12 + MAX_HEADER, 0)
        if size < 16 or head[:8] != magic:
            raise bad(f"not a {what} file (magic)")
        (hlen,) = struct.unpack_from("<I", head, 8)
        if hlen > MAX_HEADER or 12 + hlen > size:
            raise bad(f"header length {hlen}")
        try:  # the header, checked before the rest is read (its size the file's)
            h = json.loads(head[12: 12 + hlen].decode("utf-8"))
            body = int(body_size(h))
        except (ValueError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as exc:
            raise bad(f"header ({exc})") from None
        start = 12 + hlen + (-(12 + hlen) % 8)
        if start + body + 4 != size:
            raise bad(f"{size} bytes, the header says {start + body + 4}")
        if mapped:
            data: Any = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        else:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
    finally:
        os.close(fd)
    if len(data) != size:
        raise bad("changed while read")
    (stored,) = struct.unpack_from("<I", data, size - 4)
    if crc32c(memoryview(data)[: size - 4]) != stored:
        raise bad("crc32c mismatch")
    return h, data, start


def write_delta(path: Path, array: str, ids: np.ndarray, values: np.ndarray | None, *,
                blocks: Iterable[np.ndarray] = (), cols: int = 0, dtype=None) -> int:
    """Write (and fsync) the delta file ``path`` of rows ``ids`` (sorted, unique) of
    ``array``: ``values``, or (None) the row blocks ``blocks`` in order (``cols`` values
    of ``dtype`` each: a delta larger than memory); returns its size."""
    if values is not None:
        values = np.ascontiguousarray(values)
        if values.ndim == 1:
            values = values[:, None]
        blocks, cols, dtype = [values], values.shape[1], values.dtype
    dt = np.dtype(dtype).newbyteorder("<")
    return write_framed(path, MAGIC, {"array": array, "rows": int(ids.size),
                                      "cols": int(cols), "dtype": dt.str},
                        itertools.chain([np.ascontiguousarray(ids, dtype="<i8").tobytes()],
                                        (np.ascontiguousarray(b, dtype=dt).reshape(-1)
                                         .view(np.uint8) for b in blocks)))


def _parse(path: Path, limit_rows: int | None = None) -> tuple[dict, np.ndarray, np.ndarray]:
    """``(header, ids, values)`` of the delta file ``path``: its checksum, sizes and order
    checked (:class:`CorruptStoreError` naming the file)."""
    def body(h: dict) -> int:
        n, c, dt = int(h["rows"]), int(h["cols"]), np.dtype(h["dtype"])
        if dt.hasobject or c < 1 or n < 0 or (limit_rows is not None and n > limit_rows):
            raise ValueError(f"{n} rows of {c} x {dt}")
        return n * 8 + n * c * dt.itemsize
    h, data, start = read_framed(path, MAGIC, "delta", body, mapped=True)
    n, c, dt = int(h["rows"]), int(h["cols"]), np.dtype(h["dtype"])
    ids = np.frombuffer(data, dtype="<i8", count=n, offset=start).astype(np.int64)
    values = np.frombuffer(data, dtype=dt, count=n * c, offset=start + n * 8).reshape(n, c)
    if n and (ids[0] < 0 or (np.diff(ids) <= 0).any()):
        raise CorruptStoreError(f"{path}: ids not sorted and unique: the delta is damaged",
                                path=str(path))
    return h, ids, values


def check_delta(path: Path) -> None:
    """``verify``'s check of one delta file (raises :class:`CorruptStoreError`)."""
    _parse(path)


def read_delta(path: Path, array: str, cols: int, dtype: np.dtype,
               limit_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, values)`` of the delta file ``path`` of rows of ``array`` (``cols`` values
    of ``dtype`` each, ids below ``limit_rows``), everything checked."""
    h, ids, values = _parse(path, limit_rows)
    want = np.dtype(dtype).newbyteorder("<")
    if h.get("array") != array or values.shape[1] != cols or values.dtype != want:
        raise CorruptStoreError(f"{path}: expected rows of {array} ({cols} x "
                                f"{np.dtype(dtype).name}), got {h.get('array')!r} "
                                f"({values.shape[1]} x {values.dtype}): the delta is damaged",
                                path=str(path))
    if ids.size and ids[-1] >= limit_rows:
        raise CorruptStoreError(f"{path}: row {int(ids[-1])} past the {limit_rows} rows of "
                                "the version: the delta is damaged", path=str(path))
    return ids, values.astype(np.dtype(dtype), copy=False)


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
        elif parts:
            ids = np.concatenate([p[0] for p in parts])
            ptr = np.concatenate([(np.int64(k) << np.int64(40)) + np.arange(p[0].size)
                                  for k, p in enumerate(parts)])  # (a loop per file)
            self.ids, last = np.unique(ids[::-1], return_index=True)  # newest wins
            self._ptr = ptr[::-1][last]
        else:
            self.ids = np.empty(0, np.int64)
        self.cheap_reads = inner.cheap_reads
        #: how a write of this commit treats the pending rows (set by the table for one
        #: commit): None, a delta file of its own; ``"delta"``/``"chunks"``: see write
        self.combine: str | None = None
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

    def _rows(self, pos: np.ndarray) -> np.ndarray:
        """Rows at positions ``pos`` of :attr:`ids`, gathered from the delta files."""
        if self._ptr is None:
            return (self._parts[0][pos] if self._parts else
                    np.empty((0, self._cols), self._dtype))
        ptr = self._ptr[pos]
        part, at = ptr >> np.int64(40), ptr & np.int64((1 << 40) - 1)
        out = np.empty((pos.size, self._cols), self._dtype)
        for k in np.unique(part).tolist():  # a loop per delta file (at most 32)
            m = part == k
            out[m] = self._parts[k][at[m]]
        return out

    def _over(self, ids: np.ndarray, out: np.ndarray) -> None:
        d = self.ids
        if not d.size or not ids.size:
            return
        hit = np.flatnonzero((self._bits[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1)
        if hit.size:
            pos = np.searchsorted(d, ids[hit])
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
        """A write's rows (stored values): a new delta file, or, when the table's commit
        folds the pending rows in (``combine``: ``"delta"`` or ``"chunks"``), the pending
        rows and these merged (newest wins) into one delta file or into the chunks."""
        if self.combine is None:
            write_delta(txn.delta(self.name), self.name, ids, values)
            return
        self._combined = txn
        self._put(self.combine, ids, values.reshape(ids.size, self._cols), txn)

    def _put(self, how: str, new_ids: np.ndarray, new_values: np.ndarray,
             txn: Transaction, only: np.ndarray | None = None) -> None:
        """The pending rows and ``new_*`` (newest wins) as one delta file, or into the
        chunks, a block of rows at a time (blocks of whole shards or chunks: never all of
        the pending rows in memory at once); ``only``: those pending rows alone."""
        ids = only if only is not None else np.union1d(self.ids, new_ids) if new_ids.size \
            else self.ids
        cuts = self._cuts(ids)
        blocks = (self._merged(ids[a:b], new_ids, new_values)
                  for a, b in zip(cuts[:-1], cuts[1:]))
        if how == "delta":
            write_delta(txn.delta(self.name), self.name, ids, None, blocks=blocks,
                        cols=self._cols, dtype=self._dtype)
            return
        for (a, b), vals in zip(zip(cuts[:-1], cuts[1:]), blocks):  # a loop per block
            self.inner.write(ids[a:b], vals, txn)

    def fold_units(self, keep_rows: int) -> np.ndarray:
        """Which pending rows a dense fold writes into the layout (a mask over ``ids``):
        whole units (chunks or shards) in order of their pending rows, most first: every
        unit whose pending rows take at least 1/DENSE of its bytes in a delta (rewriting it
        costs less than keeping them), then more until at most ``keep_rows`` rows are
        left pending.  Rows scattered thinly over many units stay in one delta file."""
        lay = self.inner.layout
        unit = int(lay.get("shard_rows") or lay.get("chunk_rows") or 0)
        ids = self.ids
        if not unit or not ids.size:
            return np.ones(ids.size, bool)
        u = ids // unit
        counts = np.bincount(u)
        units = np.flatnonzero(counts)
        c = counts[units]
        order = np.argsort(-c, kind="stable")
        row_bytes = 8 + self._cols * self._dtype.itemsize  # (a row in a delta: id + values)
        dense = int((c[order] * row_bytes * DENSE >= unit * self._cols * self._dtype.itemsize)
                    .sum())
        left = ids.size - np.cumsum(c[order])  # rows pending after folding the first j + 1
        enough = int(np.searchsorted(-left, -keep_rows)) + 1 if ids.size > keep_rows else 0
        chosen = units[order[: max(dense, enough)]]
        mark = np.zeros(int(u[-1]) + 1, bool)
        mark[chosen] = True
        return mark[u]

    def fold_dense(self, txn: Transaction, keep_rows: int) -> int:
        """The pending rows of a commit that drops the version's deltas: those of the units
        :meth:`fold_units` picks written into the layout, the others as one delta file of
        the commit.  Returns the rows written into the layout."""
        if not self.ids.size:
            return 0
        into = self.fold_units(keep_rows)
        empty_ids, empty = np.empty(0, np.int64), np.empty((0, self._cols), self._dtype)
        for how, sel in (("chunks", into), ("delta", ~into)):  # (two: layout, then delta)
            if sel.any():
                self._put(how, empty_ids, empty, txn, only=self.ids[sel])
        return int(into.sum())

    def _cuts(self, ids: np.ndarray, block: int = 1 << 16) -> list[int]:
        """Block bounds over ``ids``: about ``block`` rows each, cut only where a shard
        (or a chunk) of the layout begins, so that each block rewrites whole units."""
        lay = self.inner.layout
        unit = int(lay.get("shard_rows") or lay.get("chunk_rows") or 0)
        if not unit or ids.size <= block:
            return [0, int(ids.size)]
        firsts = ids[::block] // unit * unit  # (the first row of the unit of every block-th)
        starts = np.unique(np.searchsorted(ids, firsts))
        return sorted({0, *starts.tolist(), int(ids.size)})

    def _merged(self, ids: np.ndarray, new_ids: np.ndarray,
                new_values: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (sorted): from ``new_*`` where it has them, else the pending."""
        out = np.empty((ids.size, self._cols), self._dtype)
        fresh = np.zeros(ids.size, bool)
        if new_ids.size:
            pos = np.minimum(np.searchsorted(new_ids, ids), new_ids.size - 1)
            fresh = new_ids[pos] == ids
            out[fresh] = new_values[pos[fresh]]
        old = np.flatnonzero(~fresh)
        if old.size:
            out[old] = self._rows(np.searchsorted(self.ids, ids[old]))
        return out

    def fold(self, txn: Transaction, how: str = "chunks") -> None:
        """The pending rows of a commit that drops the version's deltas (a compaction, or a
        write that folds them in and did not touch this array): written into the array's
        chunks (``inner.write``), or (``how="delta"``) as one delta file."""
        if self.ids.size and self._combined is not txn:
            self._put(how, np.empty(0, np.int64), np.empty((0, self._cols), self._dtype),
                      txn)

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

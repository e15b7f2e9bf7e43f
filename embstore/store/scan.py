"""Whole-table scans in blocks of rows, zero-copy where the layout allows
(:func:`scan_blocks`, used by the exact search of :mod:`embstore.search.exact`).

A format-2 table's rows are one view of its mapped chunk files (:meth:`PagedSource.rows_view`).
In format 1, an uncompressed float table stores each inner chunk's rows back to back, followed by the
chunk's 4-byte crc32c; zarr writes the chunks of a shard back to back.  A run of rows is
then one strided view of the shard's memory map: ``(rows, dim)`` with a row stride of
``row_bytes + 4`` when a chunk holds one row (BLAS takes such a matrix as is: a leading
dimension larger than ``dim``), or ``(chunks, chunk_rows, dim)`` copied into one block
otherwise (into one buffer reused from block to block with ``reuse=True``: no fresh pages
to fault in per block).  Each chunk's crc32c is checked on its first touch, as lookups do.
Anything else (compressed, quantised, another tool's layout, remote, in memory) reads its
blocks through :meth:`Table.iter_blocks` (a copy).  :func:`scan_unread` leaves the format-2
blocks this handle has not checked yet to its caller, to read them checked in pieces that
stay in cache for what it computes (:func:`read_checked`, then :func:`rows_view`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..table import Table
from .shard.file import ShardFile
from .shard.read import ShardReader
from .rows.source import PagedSource
from .source import ShardSource
from .table import ZarrTable

__all__ = ["scan_blocks", "scan_unread", "rows_in_place", "read_checked", "rows_view",
           "prefetch_rows"]


def _view(reader: ShardReader, sf: ShardFile, a: int, b: int,
          buf: list | None) -> np.ndarray | None:
    """Rows ``a..b-1`` of shard ``sf`` (shard-relative) without a copy when the chunks lie
    back to back (else None: the caller reads them).  Chunks of several rows are copied
    into one block (into ``buf[0]``, reused from block to block, when ``buf`` is given)."""
    L = reader.layout
    cr = L.chunk_rows
    whole = sf.scan_rows
    if whole is not None and sf.all_verified:  # one-row chunks, the whole shard in a row
        return whole[a:b]
    c0, c1 = a // cr, (b - 1) // cr + 1
    step = L.chunk_bytes + (4 if L.has_crc else 0)
    if not sf.back_to_back(c0, c1, step):
        return None
    off = sf.offsets[c0:c1]
    if not sf.all_verified:
        todo = c0 + np.flatnonzero(~sf.verified[c0:c1])
        if todo.size:
            sf.willneed(int(off[0]), int(off[-1]) + step)  # read ahead: a loop per chunk
            sf.verify(todo, L)
    item = L.dtype.itemsize
    if cr == 1:
        if c0 == 0 and sf.back_to_back(0, L.n_inner, step):  # kept for the next scans
            every = np.ndarray((L.n_inner, L.dim), dtype=L.dtype, buffer=sf.mm,
                               offset=int(off[0]), strides=(step, item))
            every.flags.writeable = False
            sf.scan_rows = every
            return every[:b]
        return np.ndarray((b - a, L.dim), dtype=L.dtype, buffer=sf.mm, offset=int(off[0]),
                          strides=(step, item))
    v3 = np.ndarray((c1 - c0, cr, L.dim), dtype=L.dtype, buffer=sf.mm, offset=int(off[0]),
                    strides=(step, L.row_bytes, item))
    first = a - c0 * cr
    if buf is None:
        return v3.reshape(-1, L.dim)[first: first + b - a]  # (a copy of the chunks)
    need = (c1 - c0) * cr
    if buf[0] is None or buf[0].shape[0] < need or buf[0].dtype != L.dtype or \
            buf[0].shape[1] != L.dim:
        buf[0] = np.empty((need, L.dim), L.dtype)
    np.copyto(buf[0][:need].reshape(c1 - c0, cr, L.dim), v3)
    return buf[0][first: first + b - a]


def _mapped(source: Any, kind: Any) -> bool:
    """Whether ``source`` is a ``kind`` source over files its place maps."""
    return type(source) is kind and source.fast_path


def rows_in_place(table: Table) -> bool:
    """Whether :func:`scan_blocks` gives ``table``'s rows as views of its mapped shards (an
    uncompressed table of one-row chunks: nothing copied, whatever the block's size)."""
    if not isinstance(table, ZarrTable):
        return False
    src = table.row_source
    if _mapped(src, PagedSource):  # every row at a fixed stride
        return True
    return _mapped(src, ShardSource) and src.layout["compression"] == "none" and \
        src.reader.layout.chunk_rows == 1


def _read(source, start: int, stop: int, buf: list | None = None) -> np.ndarray:
    """Rows ``start..stop-1`` of ``source``: a view when it can be one, else a copy."""
    if _mapped(source, PagedSource):
        return source.rows_view(start, stop)
    if _mapped(source, ShardSource) and source.layout["compression"] == "none":
        reader = source.reader
        sr = reader.layout.shard_rows
        k = start // sr
        if stop <= (k + 1) * sr:
            rows = _view(reader, reader.shard(k), start - k * sr, stop - k * sr, buf)
            if rows is not None:
                return rows
    return source.read(start, stop)


def _bounds(n: int, block_rows: int, *sources) -> Iterator[tuple[int, int]]:
    """Blocks of at most ``block_rows`` rows that cross no shard of any of ``sources``."""
    shards = [s.layout["shard_rows"] for s in sources if type(s) is ShardSource]
    start = 0
    while start < n:  # a loop per block
        stop = min([n, start + block_rows] + [(start // sr + 1) * sr for sr in shards])
        yield start, stop
        start = stop


def scan_blocks(table: Table, block_rows: int, *, reuse: bool = False
                ) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
    """``(start, rows, norms)`` for consecutive blocks of at most ``block_rows`` rows of
    ``table``; ``norms`` (1-D) are the rows' stored norms (None when the table stores
    none).  ``rows`` and ``norms`` may be read-only views of the table's files; with
    ``reuse``, rows copied out of chunks of several rows go to one buffer reused from block
    to block (a block is then valid until the next one is asked for)."""
    if not isinstance(table, ZarrTable):
        for start, rows in table.iter_blocks(block_rows):
            yield start, rows, None
        return
    for start, _, got, norms in _blocks(table, block_rows, reuse, False):
        assert got is not None
        yield start, got, norms


def scan_unread(table: Table, block_rows: int, *, reuse: bool = False
                ) -> Iterator[tuple[int, int, np.ndarray | None, np.ndarray | None]]:
    """``(start, stop, rows, norms)`` as :func:`scan_blocks` gives them, except that a block
    of format-2 rows with stored norms whose pages this handle has not checked yet comes as
    ``rows = None``: the caller reads it, checked, with :func:`read_checked` (in pieces that
    stay in cache for what it computes from them: a first scan reads the rows once, where
    checking the mapped pages and then computing read them twice, through page faults),
    then may take the view with :func:`rows_view`."""
    assert isinstance(table, ZarrTable)
    return _blocks(table, block_rows, reuse, True)


def _blocks(table: ZarrTable, block_rows: int, reuse: bool, unread: bool
            ) -> Iterator[tuple[int, int, np.ndarray | None, np.ndarray | None]]:
    src, norms = table.row_source, table.norms_source
    rbuf: list | None = [None] if reuse else None
    for start, stop in _bounds(table.vocab_size, block_rows, src, norms):
        rows: np.ndarray | None = None
        if not (unread and norms is not None and _mapped(src, PagedSource) and
                not src.checked(start, stop)):
            rows = _read(src, start, stop, rbuf) if type(src) in (ShardSource, PagedSource) \
                else table[start:stop]
        yield start, stop, rows, None if norms is None else _read(norms, start, stop)[:, 0]


def prefetch_rows(table: Table, start: int, stop: int) -> None:
    """Ask for the pages of format-2 rows ``start..stop-1`` at once when they are cold (a
    block :func:`scan_unread` gave as ``None``, before reading it piece by piece)."""
    assert isinstance(table, ZarrTable)
    table.row_source.prefetch(start, stop)


def read_checked(table: Table, start: int, stop: int, out: np.ndarray) -> np.ndarray:
    """Rows ``start..stop-1`` of the format-2 ``table`` read into ``out`` (``(stop - start,
    dim)``), their pages checked and marked so (a block ``scan_blocks(unread=True)`` gave
    as ``None``)."""
    assert isinstance(table, ZarrTable)
    return table.row_source.read(start, stop, out=out)


def rows_view(table: Table, start: int, stop: int) -> np.ndarray:
    """Rows ``start..stop-1`` of the format-2 ``table`` as a view of its mapped files (their
    pages checked first if they are not: nothing to do after :func:`read_checked`)."""
    assert isinstance(table, ZarrTable)
    return table.row_source.rows_view(start, stop)

"""Staging a rewritten chunk of a row array (a compaction, an append into a chunk a table
copied without its hard links, or one never written): the new chunk file is made in the
transaction's staging area and filled through a shared mapping of it, a block of rows at a
time: the rows it keeps, then the new rows of that block (asked for block by block:
``fill``), then the block's finished pages checksummed, written out (``msync``) and
dropped from the mapping.  So neither the chunk nor its new rows are ever in the process's
memory at once: at most a block of new rows (4 MiB) and a block of dirty page cache.
Under a memory limit a 64 MiB anonymous copy a chunk (or 64 MiB of dirty pages charged
to the group until the final fsync) is what a checkpoint of a large table could not
afford (issue 40).
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..base import Transaction
from .layout import PAGE
from .pages import crcs_at, encode_crc_file

__all__ = ["stage_chunk", "Fill", "BLOCK_BYTES"]

#: a :class:`~embstore.store.rows.source.PagedSource` (typed loosely: it imports this module)
Source = Any
#: ``fill(a, b)``: the new values of rows ``local[a:b]`` (``(b - a, dim)``, stored dtype)
Fill = Callable[[int, int], np.ndarray]

#: rows kept (or generated) and new rows patched into the new chunk at a time
BLOCK_BYTES = 4 << 20


def stage_chunk(src: Source, txn: Transaction, k: int, local: np.ndarray, fill: Fill,
                rows_after: int) -> None:
    """Stage chunk ``k`` of ``src`` with rows ``local`` (chunk-relative, ascending) set to
    ``fill(a, b)`` (the values of ``local[a:b]``, asked for a block of rows at a time), and
    its page checksums, as new files of ``txn``; the live files are not touched."""
    old = src.row_layout
    L = replace(old, rows=rows_after)
    path = txn.file("/".join([src.name, *L.chunk_key(k).split(L.separator)]))
    end = L.chunk_end(k)
    crcs = np.zeros(L.pages_per_chunk, dtype="<u4")
    with open(path, "w+b") as f:
        f.truncate(L.chunk_bytes)  # (a hole where no row is written)
        _allocate(f.fileno(), end)  # (a full disk: ENOSPC here, not SIGBUS)
        mm = mmap.mmap(f.fileno(), L.chunk_bytes)
        try:
            _fill(src, k, mm, local, fill, crcs, L, keep=k < old.n_chunks)
        finally:
            try:
                mm.close()
            except BufferError:  # (a view held by the traceback of what failed: the
                pass  # mapping goes with it; the error raised is the one that matters)
        os.fsync(f.fileno())
    crc = txn.file("/".join([src.crc_name, *L.chunk_key(k).split(L.separator)]))
    with open(crc, "wb") as f:
        f.write(encode_crc_file(crcs))
        f.flush()
        os.fsync(f.fileno())


def _fill(src: Source, k: int, mm: mmap.mmap, local: np.ndarray, fill: Fill,
          crcs: np.ndarray, L, *, keep: bool) -> None:
    """The new chunk's bytes into ``mm``, a block of rows at a time (``keep``: the rows
    chunk ``k`` holds now first), and ``crcs``, its page checksums."""
    buf = np.frombuffer(mm, dtype=L.dtype).reshape(L.chunk_rows, L.dim)
    raw = np.frombuffer(mm, dtype=np.uint8)
    end = L.chunk_end(k)
    rows = end // L.row_bytes
    step = max(1, BLOCK_BYTES // max(64, L.row_bytes))  # (narrow rows: their positions too)
    bounds = np.searchsorted(local, np.arange(0, rows + step, step))
    done = 0  # pages checksummed and written out
    try:
        for j, a in enumerate(range(0, rows, step)):  # a loop per block of rows
            b = min(rows, a + step)
            if keep:
                _keep_rows(src, k, buf, a, b)
            c, d = int(bounds[j]), int(bounds[j + 1])
            if d > c:
                buf[local[c:d]] = fill(c, d)
            ready = -(-end // PAGE) if b >= rows else b * L.row_bytes // PAGE
            if ready > done:  # the block's finished pages: checksummed, written, let go
                crcs[done:ready] = crcs_at(raw, np.arange(done, ready) * PAGE, end)
                lo, n = done * PAGE, min(ready * PAGE, L.chunk_bytes) - done * PAGE
                mm.flush(lo, n)
                mm.madvise(mmap.MADV_DONTNEED, lo, n)
                done = ready
    finally:
        del buf, raw


def _allocate(fd: int, size: int) -> None:
    """The blocks of the first ``size`` bytes of ``fd`` reserved before they are written
    through a mapping: a store through a mapping that finds the disk full is a SIGBUS that
    kills the process, a reservation that does is an OSError (ENOSPC) the commit reports
    (nothing staged is kept).  File systems without fallocate (EOPNOTSUPP) are left to the
    mapping."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def _keep_rows(src: Source, k: int, buf: np.ndarray, a: int, b: int) -> None:
    """Rows ``a..b-1`` (chunk-relative) that chunk ``k`` holds now (stored, checked; or
    generated if never written) into ``buf``, the new chunk's rows."""
    L = src.row_layout
    lo = k * L.chunk_rows
    a, b = lo + a, min(L.rows, lo + b)
    if b <= a:
        return
    if src.is_lazy(k):  # (never written: its generated rows, stored from now on)
        src._generated(np.arange(a, b, dtype=np.int64), buf[a - lo: b - lo])
    else:
        buf[a - lo: b - lo] = src._ready_range(a, b)[a:b]  # (pages checked)

"""Staging a rewritten chunk of a row array (a compaction, an append into a chunk a table
copied without its hard links, or one never written): the new chunk file is made in the
transaction's staging area and filled through a shared mapping of it, a block of rows at a
time, so that the rows it holds are page cache (written back and reclaimed by the kernel
as any file's), never a chunk-sized buffer of the process's own: under a memory limit a
64 MiB anonymous copy a chunk is what a checkpoint of a large table could not afford.
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import replace
from typing import Any

import numpy as np

from ..base import Transaction
from .pages import encode_crc_file, page_crcs

__all__ = ["stage_chunk"]

#: a :class:`~embstore.store.rows.source.PagedSource` (typed loosely: it imports this module)
Source = Any

_BLOCK_BYTES = 4 << 20  # rows copied (or generated) into the new chunk at a time


def stage_chunk(src: Source, txn: Transaction, k: int, local: np.ndarray, values: np.ndarray,
                rows_after: int) -> None:
    """Stage chunk ``k`` of ``src`` with rows ``local`` (chunk-relative) set to ``values``,
    and its page checksums, as new files of ``txn``; the live files are not touched."""
    old = src.row_layout
    L = replace(old, rows=rows_after)
    path = txn.file("/".join([src.name, *L.chunk_key(k).split(L.separator)]))
    with open(path, "w+b") as f:
        f.truncate(L.chunk_bytes)  # (a hole where no row is written)
        _allocate(f.fileno(), L.chunk_end(k))  # (a full disk: ENOSPC here, not SIGBUS)
        mm = mmap.mmap(f.fileno(), L.chunk_bytes)
        try:
            buf = np.frombuffer(mm, dtype=L.dtype).reshape(L.chunk_rows, L.dim)
            if k < old.n_chunks:  # an existing chunk: its rows are kept
                _keep_rows(src, k, buf)
            buf[local] = values
            crcs = page_crcs(np.frombuffer(mm, dtype=np.uint8), L.chunk_end(k),
                             L.pages_per_chunk)
            del buf
            mm.flush()
        finally:
            mm.close()
        os.fsync(f.fileno())
    crc = txn.file("/".join([src.crc_name, *L.chunk_key(k).split(L.separator)]))
    with open(crc, "wb") as f:
        f.write(encode_crc_file(crcs))
        f.flush()
        os.fsync(f.fileno())


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


def _keep_rows(src: Source, k: int, buf: np.ndarray) -> None:
    """The rows chunk ``k`` holds now (stored, checked; or generated if never written) into
    ``buf``, the new chunk's rows, a block at a time."""
    L = src.row_layout
    lo = k * L.chunk_rows
    hi = min(L.rows, lo + L.chunk_rows)
    lazy = src.is_lazy(k)
    step = max(1, _BLOCK_BYTES // L.row_bytes)
    for a in range(lo, hi, step):  # a loop per block of rows (4 MiB)
        b = min(hi, a + step)
        if lazy:  # (never written: its generated rows, stored from now on)
            src._generated(np.arange(a, b, dtype=np.int64), buf[a - lo: b - lo])
        else:
            buf[a - lo: b - lo] = src._ready_range(a, b)[a:b]  # (pages checked)

"""Appending rows to a format-2 row array (docs/FORMAT.md §3a, §7a): into the padding of the last
chunk file, in place, and into new chunk files; only page checksums are restaged.

The padding of the last chunk lies past the rows of every version (versions only grow), so
no reader reads it and no checksum covers it: writing there changes nothing any version
holds.  A killed append leaves bytes in the padding that the next one overwrites.  New chunk
files are written up to their rows and truncated to their full size (the padding a hole).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...fs.checksum import crc32c
from ..codecs import pool
from ..base import Transaction
from .layout import PAGE, RowLayout, open_chunk
from .pages import crcs_at, encode_crc_file, page_crcs, read_crc_file

__all__ = ["append_rows"]

#: a :class:`~embstore.store.rows.source.PagedSource` (typed loosely: it imports this module)
Source = Any


def append_rows(src: Source, values: np.ndarray, txn: Transaction) -> None:
    L: RowLayout = src.row_layout
    n0, n1 = L.rows, L.rows + values.shape[0]
    after = replace(L, rows=n1)
    for k in range(n0 // L.chunk_rows, -(-n1 // L.chunk_rows)):  # a loop per chunk
        a, b = max(n0, k * L.chunk_rows), min(n1, (k + 1) * L.chunk_rows)
        part = np.ascontiguousarray(values[a - n0: b - n0], dtype=L.dtype)
        lo = (a - k * L.chunk_rows) * L.row_bytes
        if k < L.n_chunks and src.is_lazy(k):  # never written: staged whole (rows generated)
            src._stage_chunk(txn, k, np.arange(a, b) - k * L.chunk_rows, part, n1)
        elif k < L.n_chunks and _shared_with_live(src, k):
            _in_place(src, txn, k, lo, part, after)
        elif k < L.n_chunks:  # (a copied table: the version's file is not the live one)
            src._stage_chunk(txn, k, np.arange(a, b) - k * L.chunk_rows, part, n1)
        else:
            _new_chunk(src, txn, k, part)


def _shared_with_live(src: Source, k: int) -> bool:
    """Whether chunk ``k`` as ``src`` reads it is the live file too (one inode: a version's
    snapshot links it; a table copied without its hard links has two)."""
    L = src.row_layout
    live = src.live_root / src.name / Path(*L.chunk_key(k).split(L.separator))
    try:
        a, b = os.stat(src.chunk_path(k)), os.lstat(live)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _stage_crcs(src: Source, txn: Transaction, k: int, crcs: np.ndarray) -> None:
    L = src.row_layout
    live = "/".join([src.crc_name, *L.chunk_key(k).split(L.separator)])
    path = txn.file(live)
    with open(path, "wb") as f:
        f.write(encode_crc_file(crcs))
    txn.sync_later(path)


def _in_place(src: Source, txn: Transaction, k: int, lo: int, part: np.ndarray,
              after: RowLayout) -> None:
    path = src.chunk_path(k)
    fd, _ = open_chunk(path, k, src.row_layout)  # (a regular file of the chunk's size)
    os.close(fd)
    fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    raw = part.reshape(-1).view(np.uint8)
    try:
        view = memoryview(raw.data)
        done = 0
        while done < len(view):  # a loop per system call (one, but for signals)
            done += os.pwrite(fd, view[done:], lo + done)
        txn.sync_later(path)
        q0 = lo // PAGE  # the first page whose checksum changes: it may hold old rows
        head = os.pread(fd, lo - q0 * PAGE, q0 * PAGE)
    finally:
        os.close(fd)
    h = len(head)
    assert q0 * PAGE + h + raw.size == after.chunk_end(k)
    crcs = read_crc_file(src.crc_path(k), src.row_layout.pages_per_chunk).copy()
    crcs[q0] = crc32c(raw[: PAGE - h], crc32c(head))  # the old bytes, then the new
    rest = np.arange(PAGE - h, raw.size, PAGE)  # the next pages: new bytes only
    crcs[q0 + 1: q0 + 1 + rest.size] = crcs_at(raw, rest, raw.size)
    _stage_crcs(src, txn, k, crcs)


def _new_chunk(src: Source, txn: Transaction, k: int, part: np.ndarray) -> None:
    L = src.row_layout
    live = "/".join([src.name, *L.chunk_key(k).split(L.separator)])
    data = part.reshape(-1).view(np.uint8)
    path = txn.file(live)
    crcs = pool().submit(page_crcs, data, data.size, L.pages_per_chunk)  # (while it is written)
    with open(path, "wb") as f:
        f.write(data.data)
        f.truncate(L.chunk_bytes)  # the padding: a hole, zeros when read
    txn.sync_later(path)
    _stage_crcs(src, txn, k, crcs.result())

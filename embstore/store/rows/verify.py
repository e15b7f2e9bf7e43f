"""``verify`` of a format-2 row array: every chunk file's size, every page checksum chunk's
own crc32c, and every page of committed rows against its checksum (the chunks split between
two threads: crc32c releases the GIL).  Each chunk is read in pieces of 4 MiB into a buffer
reused piece after piece, so the page checks (a crc32c call per group of pages,
:mod:`.runs`) and the norms' check run on bytes in cache: 1M x 256 float32 warm, 0.38 s
with a 64 MiB read and a call per page; 0.25-0.39 s in pieces (``benchmarks`` scans, load
4-5, ``np.load`` of the same bytes 0.46-0.90 s there)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError
from ...fs.files import open_regular
from ..codecs import pool
from .layout import PAGE, RowLayout, crc_array
from .runs import GROUP
from .pages import bad_pages, read_crc_file

__all__ = ["verify_rows"]

Problem = tuple[str, int | None, str]


PIECE = 4 << 20  # bytes read at a time: the checks and the norms run on them in cache


def _piece_bytes(L: RowLayout) -> int:
    """Bytes of a piece: whole groups of pages (:mod:`.runs`), at least two rows."""
    span = GROUP * PAGE
    return span * -(-max(PIECE, 2 * L.row_bytes) // span)


def _chunk(root: Path, name: str, L: RowLayout, k: int, buf: np.ndarray,
           on_rows=None) -> list[Problem]:
    key = Path(*L.chunk_key(k).split(L.separator))
    path, crc_path = str(root / name / key), str(root / crc_array(name) / key)
    try:
        stored = read_crc_file(crc_path, L.pages_per_chunk)
    except FileNotFoundError:
        return [(crc_path, k, f"{crc_path}: missing (the page checksums of chunk {k})")]
    except CorruptStoreError as exc:
        return [(crc_path, k, str(exc))]
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return [(path, k, f"{path}: missing (chunk {k} of the rows)")]
    except CorruptStoreError as exc:
        return [(path, k, str(exc))]
    try:
        size = os.fstat(fd).st_size
        if size != L.chunk_bytes:
            return [(path, k, f"{path}: {size} bytes, expected {L.chunk_bytes}")]
        end = L.chunk_end(k)
        # cold: the chunk's reads all in flight at once (0.2 ms warm; A/B, 1M x 256, pages
        # evicted: 0.58-0.83 s against 0.74-1.28 s without, a dd of the files 0.67-0.90 s)
        os.posix_fadvise(fd, 0, end, os.POSIX_FADV_WILLNEED)
        bad = _pieces(fd, path, L, k, end, stored, buf, on_rows)
        if isinstance(bad, str):
            return [(path, k, bad)]
    finally:
        os.close(fd)
    used = -(-end // PAGE)  # pages of committed rows; the padding's entries are 0
    bad = np.r_[bad, used + np.flatnonzero(stored[used:] != 0)]
    if not bad.size:
        return []
    shown = ", ".join(str(int(p)) for p in bad[:5]) + (" ..." if bad.size > 5 else "")
    return [(path, k, f"{path}: crc32c mismatch in {bad.size} of its {-(-L.chunk_end(k) // PAGE)}"
                      f" pages ({shown}): the stored {'rows' if name == 'vectors' else name} are damaged")]


def _read(fd: int, dst: np.ndarray, at: int) -> int:
    """Read ``dst.size`` bytes at ``at`` into ``dst``; the bytes read (fewer: the file ends)."""
    done = 0
    while done < dst.size:
        n = os.preadv(fd, [dst[done:].data], at + done)
        if n <= 0:
            break
        done += n
    return done


def _pieces(fd: int, path: str, L: RowLayout, k: int, end: int, stored: np.ndarray,
            buf: np.ndarray, on_rows) -> np.ndarray | str:
    """The damaged pages of chunk ``k`` (open as ``fd``), read a piece at a time into
    ``buf`` (a piece, then the partial row carried over from the one before), each piece's
    pages checked and its whole rows given to ``on_rows`` while they are in cache (rows of
    damaged pages too: verify reports no norm problem of a damaged table); a message if
    the file is short."""
    piece, rb = _piece_bytes(L), L.row_bytes
    bad: list[np.ndarray] = []
    carry = 0  # bytes of a row begun in the last piece, at the front of ``buf``
    for lo in range(0, end, piece):  # a loop per piece
        n = min(piece, end - lo)
        got = _read(fd, buf[carry: carry + n], lo)
        if got < n:
            return f"{path}: ends at byte {lo + got}"
        part = buf[carry: carry + n]
        qs = np.arange(lo // PAGE, (lo + n - 1) // PAGE + 1)
        bad.append(bad_pages(part, -lo, qs, end, stored))
        whole = (carry + n) // rb
        if on_rows is not None and whole:
            row0 = (lo - carry) // rb
            on_rows(k * L.chunk_rows + row0, buf[: whole * rb].view(L.dtype).reshape(-1, L.dim))
        left = carry + n - whole * rb
        buf[:left] = buf[whole * rb: whole * rb + left]
        carry = left
    return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


def verify_rows(root: Path, layout: RowLayout, name: str = "vectors",
                on_rows=None) -> Iterator[Problem]:
    """``(file, chunk, message)`` for every damage found in the row array ``name``;
    ``on_rows(start, rows)`` gets the rows as they are read, a piece at a time (from two
    threads; rows of damaged pages too: a check of derived data reports nothing then)."""
    n = layout.n_chunks
    half = n // 2
    size = _piece_bytes(layout) + layout.row_bytes
    bufs = [np.empty(size, dtype=np.uint8) for _ in range(2 if n > 1 else 1)]
    other = pool().submit(lambda: [p for k in range(half, n) for p in _chunk(
        root, name, layout, k, bufs[-1], on_rows)])
    try:
        for k in range(half):  # a loop per chunk file
            yield from _chunk(root, name, layout, k, bufs[0], on_rows)
    finally:
        rest = other.result()
    yield from rest

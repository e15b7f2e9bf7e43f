"""``verify`` of a format-2 row array: every chunk file's size, every page checksum chunk's
own crc32c, and every page of committed rows against its checksum (the chunks split between
two threads: crc32c releases the GIL)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError
from ...fs.files import open_regular
from ..codecs import pool
from .layout import PAGE, RowLayout, crc_array
from .pages import page_crcs, read_crc_file

__all__ = ["verify_rows"]

Problem = tuple[str, int | None, str]


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
        done = 0
        while done < end:  # into the caller's buffer, reused chunk after chunk: no page faults
            n = os.preadv(fd, [buf[done:end].data], done)
            if n <= 0:
                return [(path, k, f"{path}: ends at byte {done}")]
            done += n
        got = page_crcs(buf[:end], end, L.pages_per_chunk)
    finally:
        os.close(fd)
    bad = np.flatnonzero(got != stored)
    if not bad.size:
        if on_rows is not None and end:  # the rows, checked: for a check of derived data
            on_rows(k * L.chunk_rows, buf[:end].view(L.dtype).reshape(-1, L.dim))
        return []
    shown = ", ".join(str(int(p)) for p in bad[:5]) + (" ..." if bad.size > 5 else "")
    return [(path, k, f"{path}: crc32c mismatch in {bad.size} of its {-(-L.chunk_end(k) // PAGE)}"
                      f" pages ({shown}): the stored {'rows' if name == 'vectors' else name} are damaged")]


def verify_rows(root: Path, layout: RowLayout, name: str = "vectors",
                on_rows=None) -> Iterator[Problem]:
    """``(file, chunk, message)`` for every damage found in the row array ``name``;
    ``on_rows(start, rows)`` gets the rows of each chunk that passed (from two threads)."""
    n = layout.n_chunks
    half = n // 2
    bufs = [np.empty(layout.chunk_bytes, dtype=np.uint8) for _ in range(2 if n > 1 else 1)]
    other = pool().submit(lambda: [p for k in range(half, n) for p in _chunk(
        root, name, layout, k, bufs[-1], on_rows)])
    try:
        for k in range(half):  # a loop per chunk file
            yield from _chunk(root, name, layout, k, bufs[0], on_rows)
    finally:
        rest = other.result()
    yield from rest

"""``verify`` of a row array, on any place: every chunk's size, every page checksum chunk's
own crc32c, and every page of committed rows against its checksum (the chunks split between
the place's readers: crc32c releases the GIL, requests wait on the network).  Each chunk is
read in pieces of 4 MiB into a buffer reused piece after piece, so the page checks (a
crc32c call per group of pages, :mod:`.runs`) and the norms' check run on bytes in cache:
1M x 256 float32 warm, 0.38 s with a 64 MiB read and a call per page; 0.25-0.39 s in pieces
(``benchmarks`` scans, load 4-5, ``np.load`` of the same bytes 0.46-0.90 s there)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import CorruptStoreError
from ..place.base import Place
from .layout import PAGE, RowLayout, crc_array
from .runs import GROUP
from .pages import MARKER, bad_pages, decode_crc_file

__all__ = ["verify_rows"]

Problem = tuple[str, int | None, str]


PIECE = 4 << 20  # bytes read at a time: the checks and the norms run on them in cache


def _piece_bytes(L: RowLayout) -> int:
    """Bytes of a piece: whole groups of pages (:mod:`.runs`), at least two rows."""
    span = GROUP * PAGE
    return span * -(-max(PIECE, 2 * L.row_bytes) // span)


def _stored_crcs(place: Place, rel: str, L: RowLayout, k: int
                 ) -> np.ndarray | Problem | None:
    """The page checksums of chunk ``k``; None: the chunk is marked never written (its
    array names an initialisation, docs/FORMAT.md §3e); a problem if damaged."""
    where = place.where(rel)
    try:
        raw = place.get(rel, limit=8 * L.pages_per_chunk + 4096)
        if raw is None:
            return (where, k, f"{where}: missing (the page checksums of chunk {k})")
        if L.init is not None and bytes(raw) == MARKER:
            return None
        return decode_crc_file(raw, L.pages_per_chunk, where)
    except CorruptStoreError as exc:
        return (where, k, str(exc))


def _chunk(place: Place, name: str, L: RowLayout, k: int, buf: np.ndarray,
           on_rows=None) -> list[Problem]:
    key = L.chunk_key(k)
    rel = f"{name}/{key}"
    stored = _stored_crcs(place, f"{crc_array(name)}/{key}", L, k)
    if isinstance(stored, tuple):
        return [stored]
    path = place.where(rel)
    try:
        size = place.size(rel)
    except CorruptStoreError as exc:
        return [(path, k, str(exc))]
    if size is None:
        return [(path, k, f"{path}: missing (chunk {k} of the rows)")]
    if size != L.chunk_bytes:
        return [(path, k, f"{path}: {size} bytes, expected {L.chunk_bytes}")]
    if stored is None:  # never written: no stored row to check (they are generated)
        return []
    end = L.chunk_end(k)
    place.will_read(rel, 0, end)
    bad = _pieces(place, rel, L, k, end, stored, buf, on_rows)
    if isinstance(bad, str):
        return [(path, k, bad)]
    used = -(-end // PAGE)  # pages of committed rows; the padding's entries are 0
    bad = np.r_[bad, used + np.flatnonzero(stored[used:] != 0)]
    if not bad.size:
        return []
    shown = ", ".join(str(int(p)) for p in bad[:5]) + (" ..." if bad.size > 5 else "")
    return [(path, k, f"{path}: crc32c mismatch in {bad.size} of its {-(-L.chunk_end(k) // PAGE)}"
                      f" pages ({shown}): the stored {'rows' if name == 'vectors' else name} are damaged")]


def _pieces(place: Place, rel: str, L: RowLayout, k: int, end: int, stored: np.ndarray,
            buf: np.ndarray, on_rows) -> np.ndarray | str:
    """The damaged pages of chunk ``k`` (object ``rel``), read a piece at a time into
    ``buf`` (a piece, then the partial row carried over from the one before), each piece's
    pages checked and its whole rows given to ``on_rows`` while they are in cache (rows of
    damaged pages too: verify reports no norm problem of a damaged table); a message if
    the object is short."""
    piece, rb = _piece_bytes(L), L.row_bytes
    bad: list[np.ndarray] = []
    carry = 0  # bytes of a row begun in the last piece, at the front of ``buf``
    for lo in range(0, end, piece):  # a loop per piece
        n = min(piece, end - lo)
        got = place.read_into(rel, lo, buf[carry: carry + n])
        if got < n:
            return f"{place.where(rel)}: ends at byte {lo + got}"
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


def verify_rows(place: Place, layout: RowLayout, name: str = "vectors",
                on_rows=None) -> Iterator[Problem]:
    """``(file, chunk, message)`` for every damage found in the row array ``name``;
    ``on_rows(start, rows)`` gets the rows as they are read, a piece at a time (from the
    place's reader threads; rows of damaged pages too: a check of derived data reports
    nothing then)."""
    n = layout.n_chunks
    workers = max(1, min(place.readers, n))
    size = _piece_bytes(layout) + layout.row_bytes
    bufs = [np.empty(size, dtype=np.uint8) for _ in range(workers)]

    def part(w: int) -> list[Problem]:  # chunks w, w + workers, ...: one buffer each
        return [p for k in range(w, n, workers) for p in _chunk(place, name, layout, k,
                                                                 bufs[w], on_rows)]
    if workers == 1:
        yield from part(0)
        return
    with ThreadPoolExecutor(max_workers=workers - 1,
                            thread_name_prefix="embstore-verify") as threads:
        futures = [threads.submit(part, w) for w in range(1, workers)]
        try:
            mine = part(0)
        finally:
            rest = [f.result() for f in futures]
    yield from mine
    for r in rest:
        yield from r

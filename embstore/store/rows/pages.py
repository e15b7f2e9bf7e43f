"""Page checksums of a format-2 row array: a crc32c per aligned 4 KiB page of every chunk
file, kept in the side array ``page_crc`` (one Zarr chunk of ``pages_per_chunk`` uint32 per
chunk of rows, itself followed by its own crc32c as Zarr's ``crc32c`` codec writes it).

Entry ``p`` of chunk ``k`` covers bytes ``[4096 p, min(4096 (p + 1), end))`` of the chunk
file, ``end`` the end of its committed rows; pages past ``end`` (padding) have entry 0 and
are never read.  A reader checks each page the first time it reads from it (a bit per page);
the checks of a batch run in two threads (crc32c releases the GIL).

The check of a batch's pages is one call into ``_pagecrc`` (the loop over pages in C, four
pages hashed in lockstep with the SSE 4.2 instruction, the GIL released) where that optional
extension was built at install and the CPU has the instruction; else groups of pages with
one google-crc32c call each (:mod:`.runs`, :func:`~embstore.fs.checksum.mismatched`).  Both
report the same pages.  Measured (15,800 scattered 4 KiB pages of a warm 64 MiB buffer, one
thread, load ~20): one call 4.4 ms, a google-crc32c call a page 17.8 ms.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from types import ModuleType

import numpy as np

from ...errors import CorruptStoreError
from ...fs.checksum import as_bytes_array, crc32c, mismatched, value
from ...fs.files import open_regular, read_small
from ..codecs import pool
from ..place.base import Place
from .layout import PAGE, RowLayout
from .runs import check_groups

__all__ = ["page_crcs", "encode_crc_file", "decode_crc_file", "PageChecks", "PageMismatch",
           "crcs_at", "read_crc_file", "bad_pages", "load_crcs", "cached_crcs", "page_spans",
           "pages_in_chunk", "MARKER", "is_marker"]

_PARALLEL_PAGES = 1024  # fewer pages than this are checked on the calling thread


def _compiled() -> ModuleType | None:
    """The optional C page check (``_pagecrc``), if it was built and the CPU runs it."""
    try:
        mod = importlib.import_module(f"{__package__}._pagecrc")
    except ImportError:
        return None
    return mod if mod.HARDWARE else None


#: the compiled check, or None (then pages are checked through google-crc32c from Python);
#: ``EMBSTORE_PURE_PAGE_CHECK=1`` turns it off (the tests run both)
COMPILED = None if os.environ.get("EMBSTORE_PURE_PAGE_CHECK") == "1" else _compiled()


_HEAD = b"EMBLAZY1\x01\x00\x00"  # magic, version 1, two reserved bytes
#: a never-written chunk's page-checksum file: 15 bytes, never the size of one of
#: checksums (4 P + 4), so neither is taken for the other
MARKER = _HEAD + crc32c(_HEAD).to_bytes(4, "little")


def is_marker(path: str) -> bool:
    """Whether the page-checksum file at ``path`` is :data:`MARKER` (its chunk never
    written); a missing file or one of checksums is not (the page checks judge those)."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_size != len(MARKER):
            return False
        data = read_small(fd, path, limit=len(MARKER) + 1)
    finally:
        os.close(fd)
    if data != MARKER:
        raise CorruptStoreError(f"{path}: {len(MARKER)} bytes that are not the mark of a "
                                "chunk never written (nor page checksums): damaged",
                                path=path)
    return True


def crcs_at(raw: np.ndarray, offsets: np.ndarray, end: int) -> np.ndarray:
    """crc32c of the pages of the uint8 array ``raw`` that start at ``offsets`` (each ends at
    the next page or at ``end``, whichever is first).  One library call a page (it has no
    batch call), in a list comprehension over uint8 slices: about 0.3 us of Python a page
    beside the checksum itself."""
    offs = offsets.tolist()
    if not offs:
        return np.zeros(0, dtype="<u4")
    short = offs[-1] + PAGE > end  # only the page holding ``end`` can be short
    got = [value(raw[o: o + PAGE]) for o in (offs[:-1] if short else offs)]
    if short:
        got.append(value(raw[offs[-1]: end]))
    return np.array(got, dtype="<u4")


def bad_pages(raw: np.ndarray, base: int, qs: np.ndarray, end: int,
              stored: np.ndarray) -> np.ndarray:
    """The pages among ``qs`` (sorted, unique, below ``end``) of the chunk whose bytes start
    at ``raw[base]`` whose crc32c is not ``stored[q]``: whole groups of pages with one call
    each (:mod:`.runs`), the others (and the pages of a group that fails) gathered a few
    dozen a call (:func:`~embstore.fs.checksum.mismatched`)); all of them in one call
    where the compiled check is there (:data:`COMPILED`)."""
    if COMPILED is not None:
        starts = base + qs * PAGE
        stops = np.minimum(starts + PAGE, base + end)
        out = np.empty(qs.size, dtype=np.int64)
        n = COMPILED.mismatched(raw, starts, stops, np.ascontiguousarray(stored[qs],
                                                                         dtype=np.uint32), out)
        return qs[out[:n]]
    _, rest = check_groups(raw, base, qs, end, stored)
    starts = base + rest * PAGE
    return rest[mismatched(raw, starts, np.minimum(starts + PAGE, base + end), stored[rest])]


def page_crcs(data, end: int, pages: int) -> np.ndarray:
    """``pages`` crc32c values of the pages of ``data`` (a chunk's bytes) below ``end``."""
    out = np.zeros(pages, dtype="<u4")
    n = -(-end // PAGE)
    out[:n] = crcs_at(as_bytes_array(data), np.arange(n) * PAGE, end)
    return out


def encode_crc_file(crcs: np.ndarray) -> bytes:
    """The bytes of one ``page_crc`` chunk: the values, then their own crc32c (Zarr's codec)."""
    body = np.ascontiguousarray(crcs, dtype="<u4").tobytes()
    return body + crc32c(body).to_bytes(4, "little")


def decode_crc_file(data: bytes, pages: int, where: str) -> np.ndarray:
    """The page checksums in ``data`` (one ``page_crc`` chunk), checked."""
    if len(data) != 4 * pages + 4:
        raise CorruptStoreError(f"{where}: expected {4 * pages + 4} bytes ({pages} page "
                                f"checksums and their crc32c), got {len(data)}", path=where)
    body, tail = data[:-4], data[-4:]
    if crc32c(body) != int.from_bytes(tail, "little"):
        raise CorruptStoreError(f"{where}: crc32c mismatch (the page checksums are damaged)",
                                path=where)
    return np.frombuffer(body, dtype="<u4")


def read_crc_file(path: str, pages: int) -> np.ndarray:
    fd = open_regular(path)
    try:
        data = read_small(fd, path, limit=4 * pages + 4 + 1)
    finally:
        os.close(fd)
    return decode_crc_file(data, pages, path)


def load_crcs(place: Place, rel: str, pages: int, what: str) -> np.ndarray:
    """The page checksums of ``what`` (a chunk of rows), object ``rel`` of ``place``,
    checked (through the place's on-disk cache, if it has one)."""
    where = place.where(rel)

    def load():
        data = place.get(rel, limit=8 * pages + 4096)  # (decode names a wrong size)
        if data is None:
            raise CorruptStoreError(f"{where}: missing (the page checksums of {what})",
                                    path=where)
        return data
    return place.cached(rel, CRCS_ENTRY, load, _decoder(place, rel, pages))


def cached_crcs(place: Place, rel: str, pages: int) -> np.ndarray | None:
    """:func:`load_crcs` from the place's on-disk cache only (no request), else None."""
    return place.peek(rel, CRCS_ENTRY, _decoder(place, rel, pages))


CRCS_ENTRY = "crcs"  # the name of a chunk's page checksums in a place's on-disk cache


def _decoder(place: Place, rel: str, pages: int):
    where = place.where(rel)
    return lambda data: decode_crc_file(bytes(data), pages, where)


def _row_pages(at: np.ndarray, row_bytes: int) -> np.ndarray:
    """The pages rows starting at byte offsets ``at`` lie on (unsorted, with repeats)."""
    first, last = at // PAGE, (at + row_bytes - 1) // PAGE
    if row_bytes <= PAGE:  # a row lies on one page or two
        return np.concatenate((first, last)) if (first != last).any() else first
    n = last - first + 1  # wide rows: every page between (a loop-free expansion)
    return np.repeat(first, n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))


def _unique_sorted(cand: np.ndarray) -> np.ndarray:
    if cand.size > 1:
        cand = np.sort(cand)
        cand = cand[np.r_[True, cand[1:] != cand[:-1]]]
    return cand


def pages_in_chunk(at: np.ndarray, row_bytes: int) -> np.ndarray:
    """The pages (sorted, unique) that rows starting at byte offsets ``at`` lie on."""
    return _unique_sorted(_row_pages(at, row_bytes))


def page_spans(at: np.ndarray, row_bytes: int, end) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)``: the bytes of the whole pages rows starting at ``at`` lie on (chunk
    offsets; a chunk's last page ends at ``end``, its committed bytes)."""
    lo = at // PAGE * PAGE
    hi = np.minimum((at + row_bytes - 1) // PAGE * PAGE + PAGE, end)
    return lo, hi


class PageMismatch(CorruptStoreError):
    """A page that fails its checksum (chunk ``k``, page ``q``): damage, unless a commit
    replaced the chunk's files while this process read them (see ``PagedSource``)."""

    def __init__(self, k: int, q: int, message: str, path: str):
        super().__init__(message, path=path)
        self.chunk, self.page = k, q


class PageChecks:
    """Which pages of a row array this process has checked, and the check itself."""

    def __init__(self, layout: RowLayout, place: Place, crc_name: str,
                 chunk_path: Callable[[int], str]):
        self.layout = layout
        self.place, self.crc_name = place, crc_name
        self.chunk_path = chunk_path
        self.ppc = layout.pages_per_chunk
        self.checked = np.zeros(layout.n_chunks * self.ppc, dtype=bool)
        self._crcs: dict[int, np.ndarray] = {}
        self.ends: dict[int, int] = {}  # chunks checked against a later commit's checksums
        self._lock = threading.Lock()

    def _crc_rel(self, k: int) -> str:
        return f"{self.crc_name}/{self.layout.chunk_key(k)}"

    def prefetch(self, pages: np.ndarray) -> None:
        """Start reading the checksum files of the chunks of ``pages`` (sorted) not loaded
        yet, without waiting: a cold batch asks for them before its rows, so the check does
        not wait for them one by one afterwards (2 GiB table, 16,384 cold ids: 32 files
        read in turn took 19 of 200 ms)."""
        if not pages.size or not hasattr(os, "posix_fadvise") or not self.place.maps_files:
            return
        ks = pages // self.ppc
        for k in ks[np.r_[True, ks[1:] != ks[:-1]]].tolist():  # a loop per chunk
            if k in self._crcs:
                continue
            try:
                fd = open_regular(self.place.path(self._crc_rel(k)))
            except OSError:
                continue  # (the check reports it)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def crcs(self, k: int) -> np.ndarray:
        got = self._crcs.get(k)
        if got is None:
            got = load_crcs(self.place, self._crc_rel(k), self.ppc, self.chunk_path(k))
            with self._lock:
                self._crcs[k] = got
        return got

    def forget(self, chunks=None) -> None:
        with self._lock:
            if chunks is None:
                self._crcs.clear()
                self.checked[:] = False
                return
            for k in chunks:
                self._crcs.pop(int(k), None)
                self.checked[int(k) * self.ppc: (int(k) + 1) * self.ppc] = False

    def pages_of(self, ids: np.ndarray) -> np.ndarray:
        """The global pages rows ``ids`` occupy that are not checked yet (sorted, unique)."""
        rb = self.layout.row_bytes
        cand = _row_pages(ids * rb, rb)  # (global: chunks are whole pages side by side)
        return _unique_sorted(cand[~self.checked[cand]])

    def check(self, pages: np.ndarray, raw: np.ndarray) -> None:
        """Check ``pages`` (global, unchecked) of the mapped bytes ``raw`` (all chunk files
        side by side); mark them checked, or raise :class:`CorruptStoreError`."""
        if not pages.size:
            return
        if pages.size >= _PARALLEL_PAGES and not threading.current_thread().name.startswith(
                "embstore-codec"):  # (a task of the pool itself would wait on the pool)
            half = pages.size // 2
            fut = pool().submit(self._check, pages[half:], raw)
            try:
                self._check(pages[:half], raw)
            finally:
                fut.result()
        else:
            self._check(pages, raw)
        self.checked[pages] = True

    def _check(self, pages: np.ndarray, raw: np.ndarray) -> None:
        L, ppc = self.layout, self.ppc
        ks = pages // ppc
        cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, pages.size].tolist()):
            k = int(ks[a])  # a loop per chunk (its pages checked in groups)
            stored = self.crcs(k)
            end = self.ends.get(k, L.chunk_end(k))
            base = k * L.chunk_bytes
            qs = pages[a:b] - k * ppc
            qs = qs[qs * PAGE < end]  # pages of padding only: never read, never checksummed
            bad = bad_pages(raw, base, qs, end, stored)
            if bad.size:
                q = int(bad[0])
                lo = q * PAGE
                path = self.chunk_path(k)
                raise PageMismatch(k, q, f"{path}: crc32c mismatch in page {q} (bytes "
                                        f"{lo}..{min(lo + PAGE, end) - 1}): the stored "
                                        f"rows are damaged", path)

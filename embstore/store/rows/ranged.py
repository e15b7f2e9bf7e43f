"""Rows of a row array read by ranges: the read path of :class:`~.source.PagedSource` on a
place whose files are not mapped (object storage; any place, in tests).

For a batch of ids it

1. loads, all at once, the ``page_crc`` chunk of each chunk of rows it touches for the first
   time (through the place's cache, if any; kept for the handle);
2. serves the rows it can from the place's on-disk cache (``cache_dir=``): entries are byte
   ranges of chunk objects fetched before (by any process), every page a row lies on checked
   against its crc32c on every read from the cache (a damaged entry is dropped and fetched
   again);
3. reads the others by the place's cost model (:mod:`embstore.store.place.costs`): the page
   ranges of the rows, gaps that cost less to read than another request read through,
   regions cut into requests of at most ``max_request_bytes`` at offsets that are both row
   and page boundaries (so every row and page lies in one request), all issued concurrently;
4. checks the pages of the rows in each response against their crc32c (whole runs of pages
   with one call, :mod:`.runs`) and scatters the rows (vectorised per request); the
   response is kept in the place's cache, if any.

Nothing is read at open beyond the metadata: a row's place is arithmetic.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ...errors import CorruptStoreError
from ..place.base import Place
from ..place.costs import merge_ranges, split_regions
from .layout import PAGE, RowLayout
from .pages import bad_pages, cached_crcs, load_crcs, page_spans, pages_in_chunk

__all__ = ["RangedRows"]

class RangedRows:
    """The ranged reads of row array ``name`` (layout ``layout``) of ``place``."""

    def __init__(self, place: Place, layout: RowLayout, name: str, crc_name: str):
        self.place, self.layout, self.name, self.crc_name = place, layout, name, crc_name
        self.cache = place.cache
        costs = place.costs
        self.gap, self.cap = costs.gap_bytes, costs.max_request_bytes
        self.step = math.lcm(layout.row_bytes, PAGE)  # requests are cut at these offsets only
        self._crcs: dict[int, np.ndarray] = {}
        self._crc_lock = threading.Lock()

    def _object(self, name: str, k: int) -> str:
        return f"{name}/{self.layout.chunk_key(k)}"

    # -- page checksums -----------------------------------------------------------------------
    def _need_crcs(self, chunks: np.ndarray) -> None:
        todo = [k for k in chunks.tolist() if k not in self._crcs]  # a loop per chunk
        pages = self.layout.pages_per_chunk
        if self.cache is not None and todo:  # local files first, on this thread
            hits = [cached_crcs(self.place, self._object(self.crc_name, k), pages)
                    for k in todo]  # a loop per chunk
            with self._crc_lock:
                self._crcs.update((k, c) for k, c in zip(todo, hits) if c is not None)
            todo = [k for k, c in zip(todo, hits) if c is None]
        got = self.place.map(lambda k: load_crcs(self.place, self._object(self.crc_name, k),
                                                 pages, f"chunk {k} of {self.name}"), todo)
        for k, crcs in zip(todo, got):
            with self._crc_lock:
                self._crcs[k] = crcs

    def _bad_page(self, buf: np.ndarray, lo: int, k: int, at: np.ndarray) -> int | None:
        """The first page (chunk-local) of rows ``at`` whose bytes in ``buf`` (chunk bytes
        from ``lo``) fail their crc32c, or None."""
        qs = pages_in_chunk(at, self.layout.row_bytes)
        bad = bad_pages(buf, -lo, qs, self.layout.chunk_end(k), self._crcs[k])
        return int(bad[0]) if bad.size else None

    # -- reads --------------------------------------------------------------------------------
    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        if ids.size == 0:
            return
        L = self.layout
        chunk = ids // L.chunk_rows
        at = (ids % L.chunk_rows) * L.row_bytes  # byte offset of each row in its chunk
        order = np.lexsort((at, chunk))  # rows by chunk, then offset
        chunk, at = chunk[order], at[order]
        heads = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
        self._need_crcs(chunk[heads])
        view = out.view(np.dtype((np.void, L.row_bytes))).reshape(-1)
        if self.cache is not None:
            left = self._from_disk(chunk, at, order, heads, view)
            if not left.all():
                chunk, at, order = chunk[left], at[left], order[left]
            if not order.size:
                return
        self._fetch_rows(chunk, at, order, view)

    def plan(self, chunk: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
        """The requests for rows ``at`` of chunks ``chunk`` (sorted by chunk, then offset):
        ``(chunk, start, stop)`` of each (chunk byte offsets), by the cost model."""
        L = self.layout
        ends = (np.minimum(L.rows, (chunk + 1) * L.chunk_rows) - chunk * L.chunk_rows) * \
            L.row_bytes
        lo, hi = page_spans(at, L.row_bytes, ends)
        # (sorted by offset, the spans' ends never decrease: overlapping spans merge too)
        region, rs, re = merge_ranges(chunk, lo, hi, self.gap)
        first = np.flatnonzero(np.r_[True, region[1:] != region[:-1]])
        plo, phi, preg = split_regions(rs, re, self.cap, self.step)
        return chunk[first][preg], plo, phi

    def _fetch_rows(self, chunk: np.ndarray, at: np.ndarray, pos: np.ndarray,
                    view: np.ndarray) -> None:
        pk, plo, phi = self.plan(chunk, at)
        cb = self.layout.chunk_bytes
        part = np.searchsorted(pk * cb + plo, chunk * cb + at, side="right") - 1
        cuts = np.searchsorted(part, np.arange(pk.size + 1)).tolist()
        jobs = [(int(pk[r]), int(plo[r]), int(phi[r]), pos[cuts[r]: cuts[r + 1]],
                 at[cuts[r]: cuts[r + 1]]) for r in range(pk.size)  # a loop per request
                if cuts[r + 1] > cuts[r]]
        self.place.map(lambda job: self._fetch_part(job[0], job[1], job[2], job[3], job[4],
                                                    view), jobs)

    def _fetch_part(self, k: int, lo: int, hi: int, pos: np.ndarray, at: np.ndarray,
                    view: np.ndarray) -> None:
        """One request: bytes ``lo..hi-1`` of chunk ``k``, for the rows ``at`` going to
        ``view[pos]``."""
        obj = self._object(self.name, k)
        where = self.place.where(obj)
        data = self.place.get_range(obj, lo, hi)
        buf = np.frombuffer(data, dtype=np.uint8)
        if buf.size != hi - lo:
            raise CorruptStoreError(f"{where}: got {buf.size} bytes for range {lo}-{hi} "
                                    "(object truncated?)", path=where)
        q = self._bad_page(buf, lo, k, at)
        if q is not None:
            raise CorruptStoreError(f"{where}: crc32c mismatch in page {q}: the stored rows "
                                    "are damaged", path=where)
        _rows_to(view, pos, buf, lo, at)
        if self.cache is not None:
            self.cache.put(obj, f"{lo}-{hi}", data)

    # -- the disk cache -----------------------------------------------------------------------
    def _from_disk(self, chunk: np.ndarray, at: np.ndarray, pos: np.ndarray,
                   heads: np.ndarray, view: np.ndarray) -> np.ndarray:
        """Serve rows from cached ranges of their chunk objects; the mask of rows left."""
        assert self.cache is not None  # (only called with a disk cache)
        L = self.layout
        left = np.ones(chunk.size, dtype=bool)
        jobs = []
        bounds = np.r_[heads, chunk.size].tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):  # a loop per chunk touched
            k = int(chunk[a])
            obj = self._object(self.name, k)
            elo, ehi = self.cache.ranges(obj)
            if not elo.size:
                continue
            lo, hi = page_spans(at[a:b], L.row_bytes, np.int64(L.chunk_end(k)))
            e = np.searchsorted(elo, lo, side="right") - 1
            ok = (e >= 0) & (ehi[np.maximum(e, 0)] >= hi)
            rows = np.flatnonzero(ok) + a
            e = e[ok]
            cuts = np.flatnonzero(np.r_[True, e[1:] != e[:-1]]).tolist() + [e.size]
            for i, j in zip(cuts[:-1], cuts[1:]):  # a loop per cache entry used
                jobs.append((obj, k, int(elo[e[i]]), int(ehi[e[i]]), rows[i:j]))
        for obj, k, start, stop, sel in jobs:  # a loop per cache entry used: local files,
            if self._cached(obj, k, start, stop, pos[sel], at[sel], view):  # on this thread
                left[sel] = False  # (a pool's threads cost more to start than this takes)
        return left

    def _cached(self, obj: str, k: int, lo: int, hi: int, pos: np.ndarray, at: np.ndarray,
                view: np.ndarray) -> bool:
        """Rows ``at`` from the cached bytes ``lo..hi-1`` of chunk ``k``, each page checked;
        False (the entry dropped) if the entry is gone, short or damaged."""
        assert self.cache is not None
        name = f"{lo}-{hi}"
        mm = self.cache.map(obj, name)
        if mm is None:
            return False
        buf = np.frombuffer(mm, dtype=np.uint8)
        if buf.size != hi - lo or self._bad_page(buf, lo, k, at) is not None:
            self.cache.drop(obj, name)
            return False
        _rows_to(view, pos, buf, lo, at)
        return True

    def refresh(self) -> None:
        self._crcs.clear()


def _rows_to(view: np.ndarray, pos: np.ndarray, buf: np.ndarray, lo: int,
             at: np.ndarray) -> None:
    """``view[pos]`` = the rows at chunk offsets ``at`` of ``buf`` (bytes from ``lo``)."""
    rb = view.dtype.itemsize
    rows = np.ndarray(shape=(buf.size - rb + 1,), dtype=np.dtype((np.void, rb)),
                      buffer=buf, strides=(1,))
    view[pos] = rows[at - lo]

"""Reading (and changing) a format-2 row array: :class:`PagedSource`.

The chunk files are mapped side by side in one reserved address range, each the first time
a read reaches it, so rows are one ``(rows, dim)`` view and a gather is one ``np.take``:
no index, no per-chunk grouping.  Before rows are returned, the pages they lie on that this
process has not checked yet are checked against ``page_crc`` (:mod:`.pages`); cold pages are
asked for all at once (:mod:`embstore.store.shard.prefetch`), by a pool thread a slice at a
time while the caller checks the slices already asked for.  A write stages new chunk files
(copies of the touched chunks with the rows patched in, their page checksums updated)
through the table's transaction, as format 1 stages shards.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError, FormatError, ReadOnlyError, unpinned
from ..shard import arena, prefetch
from ..codecs import pool
from ..base import LayoutSource, Transaction
from ..meta import read_json, set_rows
from ..place.base import Place
from .append import append_rows
from .stage import stage_chunk
from .layout import PAGE, RowLayout, crc_array, open_chunk
from .pages import PageChecks, PageMismatch, bad_pages, crcs_at, read_crc_file
from .mapped import MappedChunks, release_rows
from .lazy import LazyChunks
from .ranged import RangedRows

__all__ = ["PagedSource"]

def _shifted(rows_at, a: int, c: int, d: int) -> np.ndarray:
    return rows_at(np.arange(a + c, a + d))


def _chunk_file(array: Path, k: int) -> str:
    return str(array / "c" / str(k) / "0")  # (RowLayout.from_metadata: separator "/" only)


class PagedSource(LayoutSource):
    """A row array (``name``, default ``vectors``) of the table at ``place``: mapped and
    gathered in one ``np.take`` where the place maps its files, else read by ranges
    (:class:`~.ranged.RangedRows`)."""

    release = release_rows  # (mapped.release_rows: pages of a trainer's misses let go)

    def __init__(self, place: Place, layout: RowLayout, name: str = "vectors",
                 crc_name: str | None = None):
        self.place, self.name = place, name
        self.crc_name = crc_array(name) if crc_name is None else crc_name
        self._rl = layout
        self.fast_path = self.cheap_reads = place.maps_files
        self._ranged = None if place.maps_files else RangedRows(place, layout, name,
                                                                self.crc_name)
        if place.maps_files:
            if not arena.available():
                raise CorruptStoreError(f"{place.url}: format-2 tables are read on 64-bit "
                                        "Linux only for now", path=place.url)
            self.root = Path(place.url)
            # the table's own directory (a version's snapshot in it, held open, or itself)
            real = Path(unpinned(str(self.root)))
            snap = real.parent.name == "versions" and real.parent.parent.name == ".embstore"
            self.live_root = real.parents[3] if snap else real
        self._lock = threading.Lock()
        self._range: MappedChunks | None = None
        self._checks: PageChecks | None = None
        self._lazy: LazyChunks | None = None
        self.cold_hint = False
        if layout.init is not None and not place.maps_files:  # (docs/FORMAT.md §3e)
            raise FormatError(f"{place.url}: {name} has chunks never written (create(init=)): "
                              "not read from object storage yet; upload a copy saved whole "
                              "(embstore.save writes every row)", path=place.url)

    # -- geometry (shape and dtype: LayoutSource's, from the row layout) -------------------
    @property
    def _layout(self) -> RowLayout:  # type: ignore[override]
        return self._rl

    @property
    def layout(self) -> dict:
        L = self._rl
        return {"chunk_rows": L.chunk_rows, "shard_rows": L.chunk_rows, "compression": "none",
                "fast_path": self.fast_path, "format": 2, "checksummed": True}

    @property
    def row_layout(self) -> RowLayout:
        return self._rl

    def chunk_path(self, k: int) -> str:
        return _chunk_file(self.root / self.name, k)

    def crc_path(self, k: int) -> str:
        L = self._rl
        return str(self.root / self.crc_name / Path(*L.chunk_key(k).split(L.separator)))

    def _state(self) -> tuple[MappedChunks, PageChecks]:
        r, c = self._range, self._checks
        if r is None or c is None:
            with self._lock:
                if self._range is None or self._checks is None:
                    # (a function of the path, not a bound method: no cycle, so a source
                    # a refresh left goes, and its version's lease with it, when unused)
                    where = partial(_chunk_file, self.root / self.name)
                    self._range = MappedChunks(self._rl, where)
                    self._checks = PageChecks(self._rl, self.place, self.crc_name, where)
                r, c = self._range, self._checks
        return r, c

    def reads_cold(self) -> bool:
        return self.cold_hint

    def _lazy_chunks(self) -> LazyChunks | None:
        """The chunks never written (:mod:`.lazy`) if the array names an initialisation."""
        if self._rl.init is None:
            return None
        with self._lock:
            if self._lazy is None:
                self._lazy = LazyChunks(self._rl, self.crc_path)
            return self._lazy

    def _generated(self, ids: np.ndarray, out: np.ndarray) -> None:
        self._lazy_chunks().rows(ids, out)  # type: ignore[union-attr]  # (never written)

    def is_lazy(self, k: int) -> bool:
        """Whether chunk ``k`` was never written (its rows are generated)."""
        z = self._lazy_chunks()
        return z is not None and k < self._rl.n_chunks and z.chunk(k)

    # -- reads ----------------------------------------------------------------------------------
    def _ready(self, ids: np.ndarray) -> np.ndarray:
        """The rows view, with the chunks of ``ids`` mapped and their pages checked."""
        r, checks = self._state()
        L = self._rl
        r.ensure(ids // L.chunk_rows)
        pages = checks.pages_of(ids)
        cold = False
        if pages.size >= prefetch.MIN_PAGES:  # pages read for the first time: ask for all
            checks.prefetch(pages)  # (their checksums first)
            # cold only if a sample of them is not in memory (pages this process never
            # checked may well be in the page cache: a row cache admits rows by this)
            self.cold_hint = prefetch.is_cold(r.base + pages * PAGE)
            # (asked for by a pool thread a slice at a time, each checked once asked for)
            prefetch.willneed_and(r.base + pages * PAGE, PAGE,
                                  lambda a, b: self._check_pages(pages[a:b], r, checks))
            return r.view
        if ids.size >= 512:
            k = min(prefetch.SAMPLES, ids.size // 512)
            at = r.base + ids * L.row_bytes
            if prefetch.is_cold(at, k):
                prefetch.willneed(at, at + L.row_bytes)
                cold = True
        self.cold_hint = cold
        self._check_pages(pages, r, checks)
        return r.view

    def _check_pages(self, pages: np.ndarray, r: MappedChunks, checks: PageChecks) -> None:
        """``checks.check``, with a mismatch confirmed before it is called damage: a commit
        (an append) may have replaced a chunk's files after this handle read its layout; rows
        it holds are unchanged then, but the checksum of the page holding their end covers
        more bytes (:meth:`_confirm`)."""
        for _ in range(3):
            try:
                checks.check(pages, r.raw)
                return
            except PageMismatch as exc:
                self._confirm(exc, r, checks)
                pages = pages[~checks.checked[pages]]
        checks.check(pages, r.raw)

    def _confirm(self, exc: PageMismatch, r: MappedChunks, checks: PageChecks) -> None:
        """Re-read chunk ``exc.chunk`` as the table now stands (once its commit is rolled
        forward) and check the page against the checksums written with it, over the rows
        committed now; raise ``exc`` if it fails that too (damage)."""
        k, q = exc.chunk, exc.page
        self.place.settle()  # (a local place: only those map their files)
        meta = read_json(self.root / self.name / "zarr.json", f"{self.name}/zarr.json")
        now = replace(self._rl, rows=max(int(meta["shape"][0]), self._rl.rows))
        fresh = read_crc_file(self.crc_path(k), now.pages_per_chunk)
        with r.lock:
            r.mapped[k], r.all_mapped = False, False
        r.ensure(np.array([k]))  # the current file in the same slot: the rows held are the same
        end = now.chunk_end(k)
        lo, hi = q * PAGE, min(q * PAGE + PAGE, end)
        base = k * now.chunk_bytes
        if crcs_at(r.raw, np.array([base + lo]), base + hi)[0] != fresh[q]:
            raise exc
        with checks._lock:
            checks._crcs[k], checks.ends[k] = fresh, end

    def _ready_range(self, start: int, stop: int) -> np.ndarray:
        r, checks = self._state()
        L = self._rl
        if stop <= start:
            return r.view
        r.ensure(np.arange(start // L.chunk_rows, (stop - 1) // L.chunk_rows + 1))
        p0, p1 = start * L.row_bytes // PAGE, ((stop * L.row_bytes) - 1) // PAGE + 1
        pages = np.arange(p0, p1)
        pages = pages[~checks.checked[pages]]
        if pages.size:
            lo, hi = int(pages[0]), int(pages[-1]) + 1
            if hi - lo == pages.size:  # one run (a first scan): asked for whole if it is cold
                at = np.array([r.base + lo * PAGE])
                if prefetch.is_cold(at + (np.arange(prefetch.SAMPLES) * (hi - lo) //
                                          prefetch.SAMPLES) * PAGE):
                    prefetch.willneed(at, at + (hi - lo) * PAGE)
            else:
                prefetch.willneed(r.base + pages * PAGE, r.base + pages * PAGE + PAGE)
            self._check_pages(pages, r, checks)
        return r.view

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        if self._ranged is not None:
            self._ranged.gather(ids, out)
        elif ids.size:
            z = self._lazy_chunks()
            lazy = None if z is None else z.mask(ids)
            if z is not None and lazy is not None:  # chunks never written: rows generated
                dst = out.view(self._rl.dtype)
                dst[lazy] = z.rows(ids[lazy])
                ids, out = ids[~lazy], np.empty((int((~lazy).sum()), self._rl.dim),
                                                dtype=self._rl.dtype)
                if ids.size:
                    view = self._ready(ids)
                    np.take(view, ids, axis=0, out=out, mode="clip")
                    dst[~lazy] = out
                return
            view = self._ready(ids)
            np.take(view, ids, axis=0, out=out.view(view.dtype), mode="clip")  # ids checked

    def take(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((ids.size, self._rl.dim), dtype=self.dtype)
        self.gather(ids, out)
        return out

    def read(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start..stop-1`` read from the chunk files into a new array (or into ``out``,
        C-contiguous ``(stop - start, dim)``) (``preadv``: the kernel fills the fresh pages as
        ``np.load`` does, 4-5x faster here than copying from the mapping into them), each
        page checked in that array the first time."""
        L = self._rl
        if out is None:
            out = np.empty((max(0, stop - start), L.dim), dtype=self.dtype)
        if stop <= start:
            return out
        if self._ranged is not None:
            self._ranged.gather(np.arange(start, stop, dtype=np.int64), out)
            return out
        dst = out.reshape(-1).view(np.uint8)
        rb, cr = L.row_bytes, L.chunk_rows

        def one(k: int) -> None:  # a chunk file: read, then its pages checked
            a, b = max(start, k * cr), min(stop, (k + 1) * cr)
            lo, hi = (a - k * cr) * rb, (b - k * cr) * rb
            part = dst[(a - start) * rb: (b - start) * rb]
            if self.is_lazy(k):  # never written: its rows generated
                self._generated(np.arange(a, b, dtype=np.int64),
                                part.view(L.dtype).reshape(b - a, L.dim))
                return
            self._read_chunk(k, lo, part)
            self._check_read(k, lo, hi, part)
        ks = list(range(start // cr, (stop - 1) // cr + 1))
        if len(ks) == 1 or threading.current_thread().name.startswith("embstore-codec"):
            for k in ks:  # (inside a task of the pool itself: waiting on it could deadlock)
                one(k)
        else:  # chunks read and checked side by side (reads and crc32c release the GIL)
            for fut in [pool().submit(one, k) for k in ks]:
                fut.result()
        return out

    def _read_chunk(self, k: int, lo: int, part: np.ndarray) -> None:
        path = self.chunk_path(k)
        fd, _ = open_chunk(path, k, self._rl)
        try:
            done = 0
            while done < part.size:  # a loop per system call (one, but for signals)
                n = os.preadv(fd, [part[done:].data], lo + done)
                if n <= 0:
                    raise CorruptStoreError(f"{path}: ends at byte {lo + done}", path=path)
                done += n
        finally:
            os.close(fd)

    def _check_read(self, k: int, lo: int, hi: int, part: np.ndarray) -> None:
        """Check the pages of chunk ``k`` that bytes ``lo..hi-1`` (read into ``part``) cover and
        that are not checked yet: those lying wholly in ``part`` there, the (at most two)
        others through the mapping."""
        r, checks = self._state()
        L = self._rl
        end = L.chunk_end(k)
        qs = np.arange(lo // PAGE, (min(hi, end) - 1) // PAGE + 1)
        g = k * L.pages_per_chunk + qs
        qs, g = qs[~checks.checked[g]], g[~checks.checked[g]]
        if not qs.size:
            return
        inside = (qs * PAGE >= lo) & (np.minimum((qs + 1) * PAGE, end) <= hi)
        edge = g[~inside]
        if edge.size:
            r.ensure(np.array([k]))
            self._check_pages(edge, r, checks)
        bad = bad_pages(part, -lo, qs[inside], min(hi, end), checks.crcs(k))
        if bad.size:
            q = int(bad[0])
            path = self.chunk_path(k)
            raise CorruptStoreError(f"{path}: crc32c mismatch in page {q} (bytes {q * PAGE}.."
                                    f"{min((q + 1) * PAGE, end) - 1}): the stored rows are "
                                    "damaged", path=path)
        checks.checked[g[inside]] = True

    def prefetch(self, start: int, stop: int) -> None:
        """Ask for the pages of rows ``start..stop-1`` all at once if a sample of them is not
        in memory (a block a scan is about to read: its reads then find them arriving)."""
        r, _ = self._state()
        L = self._rl
        if stop <= start:
            return
        r.ensure(np.arange(start // L.chunk_rows, (stop - 1) // L.chunk_rows + 1))
        lo, hi = r.base + start * L.row_bytes, r.base + stop * L.row_bytes
        if prefetch.is_cold(lo + (np.arange(prefetch.SAMPLES) * (hi - lo)) // prefetch.SAMPLES):
            prefetch.willneed(np.array([lo]), np.array([hi]))

    def checked(self, start: int, stop: int) -> bool:
        """Whether every page of rows ``start..stop-1`` is checked (by this handle)."""
        _, checks = self._state()
        L = self._rl
        rb = L.row_bytes
        if stop <= start:
            return True
        pages = checks.checked[start * rb // PAGE: (stop * rb - 1) // PAGE + 1]
        if L.init is not None and not pages.all():  # (pages of chunks never written: none)
            p = np.arange(start * rb // PAGE, (stop * rb - 1) // PAGE + 1)
            ks = p // L.pages_per_chunk
            lazy = [self.is_lazy(k) for k in range(int(ks[0]), int(ks[-1]) + 1)]  # per chunk
            return bool((pages | np.asarray(lazy)[ks - ks[0]]).all())
        return bool(pages.all())

    def rows_view(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start..stop-1`` as a read-only view of the mapped files (checked); valid
        while the table is open.  Rows of chunks never written are generated: then a new
        (read-only) array."""
        L = self._rl
        if L.init is not None and stop > start and any(
                self.is_lazy(k) for k in range(start // L.chunk_rows,  # a loop per chunk
                                               (stop - 1) // L.chunk_rows + 1)):
            got = self.read(start, stop).view(self.dtype)
            got.flags.writeable = False
            return got
        return self._ready_range(start, stop)[start:stop].view(self.dtype)

    # -- writes ---------------------------------------------------------------------------------
    def _stage_chunk(self, txn: Transaction, k: int, local: np.ndarray, values: np.ndarray,
                     rows_after: int) -> None:
        """Stage chunk ``k`` with rows ``local`` set to ``values`` (:mod:`.stage`)."""
        stage_chunk(self, txn, k, local, lambda a, b: values[a:b], rows_after)

    def _local(self) -> None:
        if self._ranged is not None:
            raise ReadOnlyError(f"{self.place.url}: tables on object storage are read-only "
                                "(write a local table and upload it with embstore.copy)")

    def write(self, ids: np.ndarray, values: np.ndarray, txn: Transaction) -> None:
        self._local()
        L = self._rl
        ks = ids // L.chunk_rows
        cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, ids.size].tolist()):  # per chunk
            k = int(ks[a])
            self._stage_chunk(txn, k, ids[a:b] - k * L.chunk_rows, values[a:b], L.rows)
        txn.after(self.refresh)

    def write_blocks(self, ids: np.ndarray, rows_at, txn: Transaction,
                     block_rows: int = 0) -> None:
        """Each touched chunk staged a block of rows at a time (:mod:`.stage`), ``rows_at``
        asked for the new rows of each block: no chunk-sized array, whatever
        ``block_rows``."""
        self._local()
        L = self._rl
        if not ids.size:
            return
        k0, cr = int(ids[0]) // L.chunk_rows, L.chunk_rows  # (where each chunk's ids begin:
        at = np.searchsorted(ids, np.arange(k0, int(ids[-1]) // cr + 2) * cr)  # no id temp)
        for k in (np.flatnonzero(np.diff(at)) + k0).tolist():  # a loop per chunk written
            a, b = int(at[k - k0]), int(at[k - k0 + 1])
            stage_chunk(self, txn, k, ids[a:b] - k * L.chunk_rows,
                        partial(_shifted, rows_at, a), L.rows)
        txn.after(self.refresh)

    def append(self, values: np.ndarray, txn: Transaction) -> None:
        """New rows go into the padding of the last chunk file in place and into new chunk
        files (:mod:`.append`)."""
        self._local()
        append_rows(self, values, txn)
        txn.after(self.refresh)

    def publish_rows(self, rows: int, txn: Transaction) -> None:
        self._local()
        n_chunks = -(-rows // self._rl.chunk_rows)
        set_rows(str(self.root), n_chunks, self.crc_name, txn)
        set_rows(str(self.root), rows, self.name, txn)

        def publish() -> None:
            self._rl = replace(self._rl, rows=rows)
            self.refresh()
        txn.after(publish)

    # -- housekeeping -----------------------------------------------------------------------
    def refresh(self) -> None:
        if self._ranged is not None:
            self._ranged.refresh()
        with self._lock:  # the range goes once no view of it and no gather on it is left
            self._range, self._checks, self._lazy = None, None, None

    def close(self) -> None:
        self.refresh()

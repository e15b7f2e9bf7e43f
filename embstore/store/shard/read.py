"""The fast read path over the shard files of the ``vectors`` array.

A shard file is ``[chunk]...[index: n x (uint64 offset, uint64 nbytes)][crc32c]`` (see
docs/FORMAT.md).  :class:`ShardReader` keeps each shard's index (a NumPy array), a
read-only memory map of the file and a bitset of the chunks whose crc32c it has checked.
Uncompressed rows are gathered straight from the mapping (on Linux from all shards mapped
side by side, :mod:`embstore.store.shard.arena`, in one gather); compressed chunks are decoded (only
the needed ones, in a thread pool) in bounded batches.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from . import arena as joined
from . import prefetch
from ...errors import CorruptStoreError
from ...fs.forksafe import renew_after_fork
from ..codecs import Layout, check_chunk, make_codec, pool
from .codec import ChunkDecoding
from .file import ShardFile
from .file import crcs as _crcs
from ...ids import unique_ints

__all__ = ["ShardReader", "ShardFile"]


class ShardReader(ChunkDecoding):
    """Row gathers from the shard files of one ``vectors`` array."""

    def __init__(self, root: str, layout: Layout):
        self.root = root
        self.layout = layout
        self.codec = make_codec(layout.compression, layout.dtype.itemsize) if (
            layout.compression != "none") else None
        self._shards: dict[int, ShardFile] = {}
        #: shard -> the crc32c of its tag the manifest of the version this reader's root
        #: is records (docs/FORMAT.md §3b; None: a table read without versions).  Set once,
        #: before any shard is read, and never changed: a reader over another version's
        #: files is another reader (a commit's handle moves to a new Version)
        self.pins: dict[int, int] | None = None
        self._lock = threading.RLock()
        renew_after_fork(self, "_lock")  # a thread of the parent may hold it at a fork
        self._jm = None  # JoinedMap of the uncompressed layout (Linux), built on first use
        self._jm_ok = layout.compression == "none" and joined.available()
        #: whether the last batch checked was found not resident (it was prefetched)
        self.cold_hint = False

    def shard(self, k: int) -> ShardFile:
        sf = self._shards.get(k)
        if sf is None:
            with self._lock:
                sf = self._shards.get(k)
                if sf is None:
                    sf = ShardFile(os.path.join(self.root, *self.layout.shard_key(k).split(
                        self.layout.separator)), self.layout, os.path.dirname(self.root),
                        self.pin_of(k))
                    if self.codec is not None:
                        sf.decode_check = self.decode_check
                    self._shards[k] = sf
        return sf

    def pin_of(self, k: int) -> int | None:
        """The tag crc32c the version pins shard ``k`` with, or None."""
        return None if self.pins is None else self.pins.get(k)

    def forget(self, shards=None) -> None:
        """Drop kept indexes and maps (all, or of the given shards) after they changed."""
        with self._lock:
            if shards is None:
                self._shards.clear()
            else:
                for k in shards:
                    self._shards.pop(int(k), None)
            jm, self._jm = self._jm, None
        if jm is not None:
            with jm.lock:
                jm.retired = True
                if jm.users == 0:
                    jm.close()

    def _acquire_joined(self):
        """The joined map (built if needed) with one more user, or None."""
        if not self._jm_ok or self.layout.rows == 0:
            return None
        with self._lock:
            jm = self._jm
            if jm is None:
                try:
                    L = self.layout
                    jm = self._jm = joined.JoinedMap(L.n_shards, joined.stride_for(L), L.n_inner,
                                                     L.row_bytes)
                except (OSError, MemoryError):  # no address range or index that large
                    self._jm_ok = False
                    return None
            with jm.lock:
                jm.users += 1
        return jm

    @staticmethod
    def _release_joined(jm) -> None:
        with jm.lock:
            jm.users -= 1
            if jm.retired and jm.users == 0:
                jm.close()

    def take(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (validated 1-D int64) as a new ``(n, dim)`` array."""
        L = self.layout
        rows = self._via_joined(ids) if ids.size else None
        if rows is not None:
            return rows.view(L.dtype).reshape(ids.size, L.dim)
        out = np.empty((ids.size, L.dim), dtype=L.dtype)
        self.gather(ids, out)
        return out

    def _via_joined(self, ids: np.ndarray):
        """Rows ``ids`` gathered from the joined map, or None where it cannot serve them."""
        jm = self._acquire_joined()
        if jm is None:
            return None
        try:
            return self._take_joined(jm, ids)
        finally:
            self._release_joined(jm)

    def _take_joined(self, jm, ids: np.ndarray):
        """One gather from the joined map, or None if a shard does not fit it."""
        L = self.layout
        cr = L.chunk_rows
        gc = ids // cr
        g = jm.goff[gc]
        if g.min() < 0:
            todo = unique_ints(gc[g == -2] // L.n_inner)
            if todo.size:
                with self._lock:
                    if jm.retired:
                        return None
                    try:
                        for k in todo.tolist():
                            if jm.goff[k * L.n_inner] == -2:
                                jm.add(k, self.shard(k))
                    except ValueError:  # a shard larger than the layout writes: not ours
                        self._jm_ok = False
                        return None
                g = jm.goff[gc]
        at = g + (ids - gc * cr) * L.row_bytes
        absent = g < 0
        seen = None if jm.all_verified else jm.gver[gc]
        fresh = None if seen is None or seen.all() else unique_ints(gc[~seen])
        cold = self._prefetch_joined(jm, at, absent, seen, fresh)
        if fresh is not None:
            self._check_first_touch(jm, fresh, cold)
        if not absent.any():
            return jm.view[at]
        rows = np.empty(ids.size, dtype=jm.view.dtype)
        rows[~absent] = jm.view[at[~absent]]  # never touch the slot of an absent shard
        rows.view(L.dtype).reshape(ids.size, L.dim)[absent] = L.fill_value
        return rows

    def _check_first_touch(self, jm, cs: np.ndarray, cold: bool = False) -> None:
        """Check the crc32c of global chunks ``cs`` (sorted, not yet checked) and mark them.

        The bytes are read through the joined map, so a page is never resident in two
        mappings (RSS counts both).  Uncompressed chunks all have the same stored size, so
        the stored checksums are gathered at once and the loop per chunk only hashes.
        """
        L = self.layout
        off = jm.goff[cs]
        present = off >= 0
        if L.has_crc and present.any():
            po = off[present]
            n = L.chunk_bytes  # payload bytes (the index was checked to say chunk_bytes + 4)
            stored = np.ndarray(shape=(jm.total - 3,), dtype="<u4", buffer=jm.raw,
                                strides=(1,))[po + n]
            mv = memoryview(jm.raw)
            # a loop per chunk, first touch only; cold, the GIL is let go around each chunk
            # (the last pages asked for may still be on their way)
            if cold and po.size >= 256:  # faults inside crc32c run without the GIL: split
                parts = np.array_split(po, 2 * pool()._max_workers)
                got = np.concatenate([f.result() for f in [pool().submit(
                    _crcs, mv, p.tolist(), n, 1) for p in parts]])
            else:
                got = _crcs(mv, po.tolist(), n, 0)
            bad = np.flatnonzero(got != stored)
            if bad.size:
                c = int(cs[present][bad[0]])
                k, i = divmod(c, L.n_inner)
                sf = self.shard(k)
                o = int(jm.goff[c])
                where = f"shard {sf.path}, chunk {i}"
                check_chunk(jm.raw[o: o + int(sf.nbytes[i])], where)  # raises, with the reason
                raise CorruptStoreError(f"{where}: crc32c mismatch (stored bytes are damaged)",
                                        path=sf.path)
        ks = cs // L.n_inner
        cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        if L.has_crc and present.any():  # each chunk against its shard's tag (if it has one)
            pcs = cs[present]
            pk = pcs // L.n_inner
            pcuts = np.flatnonzero(pk[1:] != pk[:-1]) + 1
            for a, b in zip(np.r_[0, pcuts].tolist(), np.r_[pcuts, pcs.size].tolist()):
                k = int(pk[a])  # (a loop per shard)
                self.shard(k).check_pinned(pcs[a:b] - k * L.n_inner, stored[a:b])
        jm.gver[cs] = True
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, cs.size].tolist()):  # per shard
            k = int(ks[a])
            self.shard(k).verified[cs[a:b] - k * L.n_inner] = True
        jm.all_verified = bool(jm.gver.all())

    def _prefetch_joined(self, jm, at, absent, seen, fresh):
        """Start reading, all at once, what the batch needs and is not resident (see
        embstore/store/shard/prefetch.py); returns whether anything was asked for.

        The advice is given here, before the batch reads anything: it returns once the last
        read is queued (the device queue holds a few hundred), and the checks and the
        gather then find the pages arrived or arriving.  Given from a second thread while
        the checks fault pages in, it was slower and far less steady (2 GiB table, 16,384
        ids, pages evicted, load 4.5: median 509 ms, 417-1,582, against 316 ms, 298-337).

        - Chunks touched for the first time (``fresh``) are read whole for their crc32c
          check, a loop per chunk anyway: they are always asked for (about 0.7 us a chunk
          when they turn out resident), when there are at least ``MIN_PAGES`` of them.
        - Rows of checked chunks: ``mincore`` on one row per 512 (at most ``SAMPLES``; a
          call costs 4-7 us here, so a small warm batch pays nothing, a warm batch of
          16,384 rows ~60-100 us); any of them not resident and all the rows are asked for.
        """
        L = self.layout
        parts = []
        if fresh is not None and fresh.size >= prefetch.MIN_PAGES:
            off = jm.goff[fresh]
            off = off[off >= 0]
            parts.append((off, off + (L.chunk_bytes + (4 if L.has_crc else 0))))
        known = ~absent if seen is None else seen & ~absent
        n = int(np.count_nonzero(known))
        k = min(prefetch.SAMPLES, n // 512)
        cold = False
        if k:
            rows_at = at[known]
            cold = prefetch.is_cold(jm.base + rows_at, k)
            if cold:
                parts.append((rows_at, rows_at + L.row_bytes))
        self.cold_hint = cold or bool(parts)
        if not parts:
            return False
        starts = np.concatenate([p[0] for p in parts])
        stops = np.concatenate([p[1] for p in parts])
        prefetch.willneed(jm.base + starts, jm.base + stops)
        return True

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (n, dim) with rows ``ids`` (validated 1-D int64)."""
        if ids.size == 0:
            return
        if self.layout.compression == "none":
            rows = self._via_joined(ids)
            if rows is not None:
                out.view(rows.dtype).reshape(-1)[:] = rows
                return
            self._gather_raw(ids, out)
        else:
            self._gather_decoded(ids, out)

    def _groups(self, ids: np.ndarray):
        """``(shard, positions or None)`` for the shards the ids fall in."""
        sr = self.layout.shard_rows
        lo, hi = int(ids.min()) // sr, int(ids.max()) // sr
        if lo == hi:
            yield lo, None
            return
        sh = ids // sr
        if hi < 65536:  # NumPy radix-sorts 16-bit keys: O(n)
            sh = sh.astype(np.uint16)
        order = np.argsort(sh, kind="stable")
        ss = sh[order]
        cuts = np.flatnonzero(ss[1:] != ss[:-1]) + 1
        starts = np.concatenate(([0], cuts))
        stops = np.concatenate((cuts, [ids.size]))
        for a, b in zip(starts.tolist(), stops.tolist()):
            yield int(ss[a]), order[a:b]

    def _gather_raw(self, ids: np.ndarray, out: np.ndarray) -> None:
        L = self.layout
        cr, rb = L.chunk_rows, L.row_bytes
        out_rows = out.view(np.dtype((np.void, rb))).reshape(-1)
        for k, pos in self._groups(ids):
            local = (ids if pos is None else ids[pos]) - k * L.shard_rows
            sf = self.shard(k)
            inner = local // cr
            if not sf.all_verified:
                seen = sf.verified[inner]
                if not seen.all():
                    sf.verify(unique_ints(inner[~seen]), L)
            off = sf.offsets[inner]
            absent = off < 0
            if absent.any():
                fill_at = np.flatnonzero(absent) if pos is None else pos[absent]
                out[fill_at] = L.fill_value
                keep = ~absent
                pos = np.flatnonzero(keep) if pos is None else pos[keep]
                off, local, inner = off[keep], local[keep], inner[keep]
                if off.size == 0:
                    continue
            assert sf.rowview is not None  # uncompressed, row-aligned shards only
            src = sf.rowview[off + (local - inner * cr) * rb]
            if pos is None:
                out_rows[:] = src
            else:
                out_rows[pos] = src

    def existing_shards(self) -> list[int]:
        """Numbers ``k < n_shards`` of the shard files present (by listing, not by counting
        to ``n_shards``, which a hostile row count makes astronomically large)."""
        L = self.layout
        if L.separator == "/":
            d = os.path.join(self.root, "c")
            names = os.listdir(d) if os.path.isdir(d) else []
        else:
            names = [n[2:-2] for n in os.listdir(self.root) if n.startswith("c.")
                     and n.endswith(".0")]
        return sorted({int(n) for n in names if n.isdigit() and int(n) < L.n_shards})

    def verify_all(self, progress=None) -> list[tuple[str, int | None, str]]:
        """Check every shard index and every chunk: ``(shard file, chunk or None, message)``."""
        L = self.layout
        problems: list[tuple[str, int | None, str]] = []
        self.checked_chunks = 0
        for k in self.existing_shards():  # absent shards read as zeros: nothing to check
            path = os.path.join(self.root, *L.shard_key(k).split(L.separator))
            try:
                sf = ShardFile(path, L, os.path.dirname(self.root), self.pin_of(k))
            except CorruptStoreError as exc:
                problems.append((path, None, str(exc)))
                continue
            if sf.mm is not None:  # read whole: read-ahead back on (the maps say RANDOM)
                prefetch.advise_sequential(sf.addr, sf.mm.size)
            for i in np.flatnonzero(sf.offsets >= 0).tolist():
                self.checked_chunks += 1
                try:
                    buf = sf.chunk(i, L)
                    if self.codec is not None:
                        size = memoryview(self.codec.decode(buf)).nbytes
                        if size != L.chunk_bytes:
                            raise ValueError(f"{size} bytes, expected {L.chunk_bytes}")
                except CorruptStoreError as exc:
                    problems.append((path, i, str(exc)))
                except Exception as exc:  # noqa: BLE001
                    problems.append((path, i, f"shard {path}, chunk {i}: cannot decode ({exc})"))
            if progress is not None:
                progress(k + 1)
        return problems

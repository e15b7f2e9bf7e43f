"""The fast read path over the shard files of the ``vectors`` array.

A shard file is ``[chunk]...[index: n x (uint64 offset, uint64 nbytes)][crc32c]`` (see
docs/FORMAT.md).  :class:`ShardReader` keeps each shard's index (a NumPy array), a
read-only memory map of the file and a bitset of the chunks whose crc32c it has checked.
Uncompressed rows are gathered straight from the mapping (on Linux from all shards mapped
side by side, :mod:`embstore.joined`, in one gather); compressed chunks are decoded (only
the needed ones, in a thread pool) in bounded batches.
"""

from __future__ import annotations

import os
import threading

import numpy as np
from crc32c import crc32c

from . import arena as joined
from . import prefetch
from ..errors import CorruptStoreError, ResourceLimitError
from ..files import map_file, open_regular
from ..forksafe import renew_after_fork
from .codecs import ABSENT, Layout, ZstdDecoder, check_chunk, make_codec, pool

__all__ = ["ShardReader", "ShardFile"]

_DECODE_BATCH_BYTES = 32 << 20  # decoded chunks held at once by a compressed gather


class ShardFile:
    """One shard as read: its index, memory map, and which chunks passed their crc32c."""

    def __init__(self, path: str, layout: Layout, root: str | None = None):
        self.path = path  # root: the table's directory, which the file must not leave
        n = layout.n_inner
        self.mm = None
        self.rowview = None
        self.offsets = np.broadcast_to(np.int64(-1), (n,))  # until the index is read
        self.nbytes = np.broadcast_to(np.int64(0), (n,))
        self.verified = np.zeros(n, dtype=bool)
        self.all_verified = False
        self.ident = None
        # size, index and map all from one open file: a writer may rename a new shard into
        # place at any moment, and the size of one file with the bytes of another is garbage.
        # The mapping keeps no descriptor (a table of 10,000 shards under ulimit -n 1024).
        try:
            fd = open_regular(path, root=root)
        except FileNotFoundError:
            self.all_verified = True  # an absent shard: every chunk is the fill value
            return
        except (CorruptStoreError, ResourceLimitError):  # a FIFO, a symlink out, no fds
            raise
        except OSError as exc:  # unreadable, ...
            raise CorruptStoreError(f"shard {path}: cannot open ({exc.strerror or exc})",
                                    path=path) from None
        try:
            st = os.fstat(fd)
            size, self.ident = st.st_size, (st.st_dev, st.st_ino)
            index_len = 16 * n + (4 if layout.index_crc else 0)
            if size < index_len:
                raise CorruptStoreError(
                    f"shard {path}: {size} bytes, shorter than its {index_len}-byte index "
                    "(truncated?)", path=path)
            # the index with one read (a fault on the map would read ahead megabytes around
            # it, or with MADV_RANDOM fault its pages in one at a time)
            tail = os.pread(fd, index_len, size - index_len)
            if len(tail) != index_len:
                raise CorruptStoreError(f"shard {path}: index truncated while reading",
                                        path=path)
            mm = map_file(fd, size, f"shard {path}")
        finally:
            os.close(fd)
        body = tail[: 16 * n]
        stored = int.from_bytes(tail[16 * n:], "little")
        if layout.index_crc and crc32c(body) != stored:
            raise CorruptStoreError(f"shard {path}: the shard index fails its crc32c "
                                    "(damaged or truncated)", path=path)
        index = np.frombuffer(body, dtype="<u8").reshape(n, 2)
        present = index[:, 0] != ABSENT
        off = index[:, 0].astype(np.int64)
        nb = index[:, 1].astype(np.int64)
        data_len = size - index_len
        bad = present & ((index[:, 0] > data_len) | (index[:, 1] > data_len - np.minimum(
            index[:, 0], data_len)))
        want = layout.chunk_bytes + (4 if layout.has_crc else 0)
        if layout.compression == "none":
            bad |= present & (nb != want)
        if bad.any():
            i = int(np.argmax(bad))
            raise CorruptStoreError(
                f"shard {path}, chunk {i}: index says offset {int(index[i, 0])}, {int(nb[i])} "
                f"bytes, outside the {data_len} data bytes or not the {want} expected",
                path=path)
        self.offsets = np.where(present, off, -1)
        if layout.compression == "none":  # all the same (checked above): 8 bytes a chunk less
            self.nbytes = np.broadcast_to(np.int64(want), (n,))
        else:
            self.nbytes = np.where(present, nb, 0)
        self.mm = mm
        self.buf = memoryview(mm).cast("B")  # type: ignore[arg-type]  # slicing a memoryview is cheap, a memmap's is not
        self.addr = mm.ctypes.data if size else 0
        prefetch.advise_random(self.addr, size)  # see embstore/store/prefetch.py
        self.all_verified = not layout.has_crc
        self.verified[~present] = True
        rb = layout.row_bytes
        if layout.compression == "none" and data_len >= rb:
            self.rowview = np.ndarray(shape=(data_len - rb + 1,), dtype=np.dtype((np.void, rb)),
                                      buffer=mm, offset=0, strides=(1,))

    def willneed(self, lo: int, hi: int) -> None:
        """Start reading bytes ``lo:hi`` of the file (before a sequential copy of them)."""
        if self.mm is not None and hi > lo:
            prefetch.willneed(np.array([self.addr + lo]), np.array([self.addr + hi]))

    def chunk(self, i: int, layout: Layout):
        """The stored bytes of inner chunk ``i`` after their crc32c check (None if absent)."""
        off = int(self.offsets[i])
        if off < 0:
            return None
        buf = self.buf[off: off + int(self.nbytes[i])]
        if layout.has_crc:
            payload = buf[:-4]
            if len(buf) < 4 or crc32c(payload) != int.from_bytes(buf[-4:], "little"):
                check_chunk(buf, f"shard {self.path}, chunk {i}")  # raises, with the reason
            return payload
        return buf

    def verify(self, inner: np.ndarray, layout: Layout) -> None:
        for i in inner.tolist():  # a loop per chunk, each checked once per process
            self.chunk(i, layout)
            self.verified[i] = True
        if self.verified.all():
            self.all_verified = True


def _crcs(mv: memoryview, offsets: list, n: int, mode: int) -> np.ndarray:
    """crc32c of ``mv[o:o+n]`` for each ``o`` (a loop per chunk)."""
    return np.fromiter((crc32c(mv[o: o + n], gil_release_mode=mode) for o in offsets),
                       dtype=np.int64, count=len(offsets))


class ShardReader:
    """Row gathers from the shard files of one ``vectors`` array."""

    def __init__(self, root: str, layout: Layout):
        self.root = root
        self.layout = layout
        self.codec = make_codec(layout.compression, layout.dtype.itemsize) if (
            layout.compression != "none") else None
        self._shards: dict[int, ShardFile] = {}
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
                        self.layout.separator)), self.layout, os.path.dirname(self.root))
                    self._shards[k] = sf
        return sf

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
            todo = np.unique(gc[g == -2] // L.n_inner)
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
        fresh = None if seen is None or seen.all() else np.unique(gc[~seen])
        pending = self._prefetch_joined(jm, at, absent, seen, fresh)
        try:
            if fresh is not None:
                self._check_first_touch(jm, fresh, pending is not None)
            if not absent.any():
                return jm.view[at]
            rows = np.empty(ids.size, dtype=jm.view.dtype)
            rows[~absent] = jm.view[at[~absent]]  # never touch the slot of an absent shard
            rows.view(L.dtype).reshape(ids.size, L.dim)[absent] = L.fill_value
            return rows
        finally:
            if pending is not None:  # the advice names addresses of this map: done before
                pending.exception()  # it may be unmapped (advice errors do not matter)

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
            # (its page may still be on its way) so the prefetch thread keeps asking
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
        jm.gver[cs] = True
        ks = cs // L.n_inner
        cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, cs.size].tolist()):  # per shard
            k = int(ks[a])
            self.shard(k).verified[cs[a:b] - k * L.n_inner] = True
        jm.all_verified = bool(jm.gver.all())

    def _prefetch_joined(self, jm, at, absent, seen, fresh):
        """Start reading, all at once, what the batch needs and is not resident (see
        embstore/store/prefetch.py); returns the pending advice or None.

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
            return None
        starts = np.concatenate([p[0] for p in parts])
        stops = np.concatenate([p[1] for p in parts])
        return prefetch.willneed_async(jm.base + starts, jm.base + stops)

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
                    sf.verify(np.unique(inner[~seen]), L)
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

    def _gather_decoded(self, ids: np.ndarray, out: np.ndarray) -> None:
        L = self.layout
        cr = L.chunk_rows
        chunks, inv = np.unique(ids // cr, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        inv_sorted = inv[order]
        per_batch = max(1, _DECODE_BATCH_BYTES // L.chunk_bytes)
        for j0 in range(0, chunks.size, per_batch):
            batch = chunks[j0: j0 + per_batch]
            dec = self.decode_chunks(batch)
            a, b = np.searchsorted(inv_sorted, [j0, j0 + batch.size])
            pos = order[a:b]
            sel = (inv[pos] - j0) * cr + ids[pos] % cr
            out[pos] = dec.reshape(-1, L.dim)[sel]

    def _locate(self, chunks: np.ndarray):
        """Where global chunks ``chunks`` are stored: ``(shard files, shard of each chunk (an
        index into the first), address, payload bytes, stored crc32c)``; address -1 for an
        absent chunk (or one too short for its checksum).  NumPy work per shard."""
        L = self.layout
        n = chunks.size
        ks = chunks // L.n_inner
        ins = chunks - ks * L.n_inner
        order = np.argsort(ks, kind="stable")
        kss = ks[order]
        cuts = np.flatnonzero(kss[1:] != kss[:-1]) + 1
        files, which = [], np.empty(n, dtype=np.intp)
        addr = np.full(n, -1, dtype=np.int64)
        size = np.zeros(n, dtype=np.int64)
        want = np.zeros(n, dtype=np.int64)
        for g, (a, b) in enumerate(zip(np.r_[0, cuts].tolist(), np.r_[cuts, n].tolist())):
            sf = self.shard(int(kss[a]))  # a loop per shard
            files.append(sf)
            js = order[a:b]
            which[js] = g
            off = sf.offsets[ins[js]]
            m = sf.nbytes[ins[js]]
            ok = (off >= 0) & (m >= (4 if L.has_crc else 0))
            if sf.mm is None or not ok.any():
                continue
            js, off, m = js[ok], off[ok], m[ok]
            addr[js] = sf.addr + off
            if L.has_crc:
                size[js] = m - 4
                u4 = np.ndarray(shape=(max(0, sf.mm.size - 3),), dtype="<u4", buffer=sf.mm,
                                strides=(1,))
                want[js] = u4[off + m - 4]
            else:
                size[js] = m
        return files, which, addr, size, want

    def _prefetch_chunks(self, addr: np.ndarray, size: np.ndarray) -> None:
        """If the stored chunks at ``addr`` are not resident, start reading them all at once."""
        ok = addr >= 0
        a, m = addr[ok], size[ok] + (4 if self.layout.has_crc else 0)
        if not a.size:
            return
        # decoding costs ~5-15 us a chunk: one mincore (4-7 us) per 64 chunks is noise
        if prefetch.is_cold(a, min(prefetch.SAMPLES, max(1, a.size // 64))):
            self.cold_hint = True
            prefetch.willneed(a, a + np.maximum(m, 1))
        else:
            self.cold_hint = False

    def _decode_zstd(self, chunks, loc, dec: np.ndarray, fast) -> None:
        """Many zstd chunks: addresses and stored checksums by shard with NumPy, then per
        chunk only a crc32c call and one foreign decode call, split over the codec pool."""
        L = self.layout
        files, which, addr, size, want = loc
        cap = L.chunk_bytes
        absent = addr < 0
        if absent.any():
            for j in np.flatnonzero(absent).tolist():
                sf, i = files[which[j]], int(chunks[j] % L.n_inner)
                if sf.offsets[i] >= 0:
                    sf.chunk(i, L)  # stored, but too short for its checksum: raises
            dec[absent] = L.fill_value
        base = dec.ctypes.data
        todo = np.flatnonzero(~absent)

        def fail(j):
            sf, i = files[which[j]], int(chunks[j] % L.n_inner)
            sf.chunk(i, L)  # raises CorruptStoreError with the reason
            raise CorruptStoreError(f"shard {sf.path}, chunk {i}: cannot decode (not a valid "
                                    "zstd frame of the chunk's size)", path=sf.path)

        def run(idx):
            bufs = [files[g].buf for g in which[idx].tolist()]
            o = (addr[idx] - np.array([getattr(f, "addr", 0) for f in files])[which[idx]]).tolist()
            m = size[idx].tolist()
            got = np.fromiter((crc32c(v[x: x + y], gil_release_mode=0)
                               for v, x, y in zip(bufs, o, m)), dtype=np.int64, count=len(m))
            bad = np.flatnonzero(got != want[idx])
            if bad.size:
                fail(int(idx[bad[0]]))
            k = fast.decode_many(addr[idx].tolist(), m, (base + idx * cap).tolist(), cap)
            if k >= 0:
                fail(int(idx[k]))

        parts = np.array_split(todo, max(1, min(2 * pool()._max_workers, todo.size // 32)))
        for f in [pool().submit(run, p) for p in parts]:
            f.result()

    def decode_chunks(self, chunks: np.ndarray) -> np.ndarray:
        """Decoded global chunks ``chunks`` as an array (len, chunk_rows, dim)."""
        L = self.layout
        per_shard = L.n_inner
        dec = np.empty((chunks.size, L.chunk_rows, L.dim), dtype=L.dtype)
        loc = self._locate(chunks)
        if chunks.size >= prefetch.MIN_PAGES:
            self._prefetch_chunks(loc[2], loc[3])
        fast = ZstdDecoder.load() if L.compression == "zstd" and L.has_crc else None
        if fast is not None and chunks.size >= 64:
            self._decode_zstd(chunks, loc, dec, fast)
            return dec
        files, which = loc[0], loc[1]
        jobs = [(j, files[g], c % per_shard)
                for j, (g, c) in enumerate(zip(which.tolist(), chunks.tolist()))]

        flat = dec.reshape(chunks.size, -1).view(np.uint8)
        decode = self.codec.decode if self.codec is not None else None
        cap = L.chunk_bytes
        base = dec.ctypes.data

        def run(part):
            for j, sf, i in part:
                off = sf.offsets[i]
                if fast is not None and off >= 0:
                    off, nb = int(off), int(sf.nbytes[i])
                    buf = sf.buf[off: off + nb]
                    if nb < 4 or crc32c(buf[:-4], gil_release_mode=1) != int.from_bytes(
                            buf[-4:], "little"):
                        sf.chunk(i, L)  # raises CorruptStoreError with the reason
                    if not fast.decode(sf.addr + off, nb - 4, base + j * cap, cap):
                        raise CorruptStoreError(f"shard {sf.path}, chunk {i}: cannot decode "
                                                "(not a valid zstd frame of the chunk's size)",
                                                path=sf.path)
                    continue
                buf = sf.chunk(i, L)
                if buf is None:
                    dec[j] = L.fill_value
                elif decode is None:
                    flat[j] = np.frombuffer(buf, dtype=np.uint8)
                else:
                    try:
                        decode(buf, out=flat[j])
                    except Exception as exc:  # noqa: BLE001 - a codec's own error type
                        raise CorruptStoreError(
                            f"shard {sf.path}, chunk {i}: cannot decode ({exc})",
                            path=sf.path) from exc
        if len(jobs) < 4:
            run(jobs)
            return dec
        step = max(1, len(jobs) // (4 * pool()._max_workers))
        for f in [pool().submit(run, jobs[s: s + step]) for s in range(0, len(jobs), step)]:
            f.result()
        return dec

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
                sf = ShardFile(path, L, os.path.dirname(self.root))
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

"""Compressed chunks decoded on demand: the part of :class:`~embstore.store.shardread.ShardReader`
that locates a batch's chunks, checks their crc32c and decodes them (zstd through libzstd in a
thread pool, other codecs through numcodecs), in bounded batches."""

from __future__ import annotations


from typing import Any

import numpy as np
from crc32c import crc32c

from . import prefetch
from ..errors import CorruptStoreError
from .codecs import Layout, ZstdDecoder, pool
from .shardfile import ShardFile

__all__ = ["ChunkDecoding"]

_DECODE_BATCH_BYTES = 32 << 20  # decoded chunks held at once by a compressed gather


class ChunkDecoding:
    """Mixin of :class:`~embstore.store.shardread.ShardReader`: the decoded read path."""

    layout: Layout
    codec: Any

    def shard(self, k: int) -> ShardFile:  # provided by ShardReader
        raise NotImplementedError

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

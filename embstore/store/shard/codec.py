"""Compressed chunks decoded on demand: the part of :class:`~embstore.store.shard.read.ShardReader`
that locates a batch's chunks, checks their crc32c and decodes them (zstd through python-zstandard's
batched decoder in a thread pool, other codecs through numcodecs), in bounded batches."""

from __future__ import annotations


from typing import Any, NoReturn

import numpy as np
import zstandard
from ...fs.checksum import as_bytes_array, value as crc_value

from . import prefetch
from ...errors import CorruptStoreError
from ..codecs import Layout, pool
from .file import ShardFile

__all__ = ["ChunkDecoding"]

_DECODE_BATCH_BYTES = 32 << 20  # decoded chunks held at once by a compressed gather


class ChunkDecoding:
    """Mixin of :class:`~embstore.store.shard.read.ShardReader`: the decoded read path."""

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
        index into the first), address, payload bytes, crc32c already checked)``; address -1
        for an absent chunk (or one too short for its checksum).  NumPy work per shard, and
        nothing read from the chunks: they may not be resident before the prefetch (a stored
        checksum read here cost a serial page fault per chunk: 4.7 s for 16,384 cold ids)."""
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
        seen = np.ones(n, dtype=bool)
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
            seen[js] = sf.verified[ins[js]]
            size[js] = m - 4 if L.has_crc else m
        return files, which, addr, size, seen

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

    def _decode_zstd(self, chunks, loc, dec: np.ndarray) -> None:
        """zstd chunks, one ``multi_decompress_to_buffer`` call (python-zstandard: a loop in
        C over the frames, the GIL let go) per shard and part, split over the codec pool.

        The crc32c of a chunk is checked the first time this process reads it (as the
        uncompressed path does: shard files are replaced, never rewritten in place), so a
        batch of chunks read before costs no Python call per chunk.  Measured on 1,000,000
        x 256 float32, 16,384 distinct 1-row chunks, page cache warm (CPU time, the machine
        shared): a ctypes call of ``ZSTD_decompressDCtx`` per chunk 133 ms, this 90 ms;
        the crc32c loop 29 ms; ``threads=2`` in the call gains nothing on 2 cores.
        """
        L = self.layout
        files, which, addr, size, seen = loc
        cap = L.chunk_bytes
        absent = addr < 0
        if absent.any():
            for j in np.flatnonzero(absent).tolist():
                sf, i = files[which[j]], int(chunks[j] % L.n_inner)
                if sf.offsets[i] >= 0:
                    sf.chunk(i, L)  # stored, but too short for its checksum: raises
            dec[absent] = L.fill_value
        flat = dec.reshape(chunks.size, -1).view(np.uint8)
        todo = np.flatnonzero(~absent)
        if not todo.size:
            return
        todo = todo[np.argsort(which[todo], kind="stable")]  # by shard
        w = which[todo]
        cuts = np.flatnonzero(w[1:] != w[:-1]) + 1
        step = max(256, -(-todo.size // (2 * pool()._max_workers)))
        parts = [todo[a: b][s: s + step] for a, b in zip(np.r_[0, cuts].tolist(),
                                                         np.r_[cuts, todo.size].tolist())
                 for s in range(0, b - a, step)]

        def run(idx):  # positions in ``chunks`` of one shard's chunks
            sf = files[which[idx[0]]]
            off = addr[idx] - sf.addr
            if L.has_crc:
                new = np.flatnonzero(~seen[idx])
                if new.size:
                    v = as_bytes_array(sf.buf)
                    at, m = off[new], size[idx[new]]
                    # cold, a chunk's page may still be on its way: the GIL is let go
                    got = np.fromiter((crc_value(v[x: x + y]) for x, y in zip(
                        at.tolist(), m.tolist())), dtype=np.int64, count=new.size)
                    u4 = np.ndarray(shape=(max(0, sf.mm.size - 3),), dtype="<u4", buffer=sf.mm,
                                    strides=(1,))
                    stored = u4[at + m]
                    bad = np.flatnonzero(got != stored)
                    if bad.size:
                        self._bad_chunk(files, which, chunks, idx[new[bad[:1]]])
                    sf.check_pinned(chunks[idx[new]] % L.n_inner, stored)
            seg = np.empty((idx.size, 2), dtype=np.uint64)
            seg[:, 0] = off
            seg[:, 1] = size[idx]
            try:
                out = zstandard.ZstdDecompressor().multi_decompress_to_buffer(
                    zstandard.BufferWithSegments(sf.buf, seg.tobytes()),
                    decompressed_sizes=np.full(idx.size, cap, dtype=np.uint64).tobytes(),
                    threads=1)
            except zstandard.ZstdError:
                self._bad_chunk(files, which, chunks, idx)
            flat[idx] = np.frombuffer(b"".join(out), dtype=np.uint8).reshape(idx.size, cap)
            if L.has_crc and new.size:
                sf.verified[chunks[idx[new]] % L.n_inner] = True

        if len(parts) == 1:
            run(parts[0])
            return
        for f in [pool().submit(run, p) for p in parts]:
            f.result()

    def decode_check(self, payload, where: str) -> None:
        """Raise CorruptStoreError naming ``where`` unless the stored chunk ``payload``
        (its crc32c left off) decodes to one chunk (bounded: never more than its size)."""
        L = self.layout
        try:
            if L.compression == "zstd":
                size = len(zstandard.ZstdDecompressor().decompress(
                    payload, max_output_size=L.chunk_bytes))
            else:
                size = memoryview(self.codec.decode(
                    payload, out=np.empty(L.chunk_bytes, np.uint8))).nbytes
        except Exception as exc:  # noqa: BLE001 - each codec fails with its own type
            raise CorruptStoreError(f"{where}: cannot decode ({exc})", path=where) from None
        if size != L.chunk_bytes:
            raise CorruptStoreError(f"{where}: cannot decode ({size} bytes, expected "
                                    f"{L.chunk_bytes})", path=where)

    def _bad_chunk(self, files, which, chunks, idx) -> NoReturn:
        """Raise CorruptStoreError for the first of chunks ``chunks[idx]`` that fails its
        crc32c or does not decode to one chunk (an error path: a loop per chunk)."""
        L = self.layout
        d = zstandard.ZstdDecompressor()
        for j in idx.tolist():
            sf, i = files[which[j]], int(chunks[j] % L.n_inner)
            payload = sf.chunk(i, L)  # raises CorruptStoreError with the reason
            try:
                ok = len(d.decompress(payload, max_output_size=L.chunk_bytes)) == L.chunk_bytes
            except zstandard.ZstdError:
                ok = False
            if not ok:
                raise CorruptStoreError(f"shard {sf.path}, chunk {i}: cannot decode (not a valid "
                                        "zstd frame of the chunk's size)", path=sf.path)
        sf = files[which[idx[0]]]
        raise CorruptStoreError(f"shard {sf.path}: a chunk does not decode", path=sf.path)

    def decode_chunks(self, chunks: np.ndarray) -> np.ndarray:
        """Decoded global chunks ``chunks`` as an array (len, chunk_rows, dim)."""
        L = self.layout
        per_shard = L.n_inner
        dec = np.empty((chunks.size, L.chunk_rows, L.dim), dtype=L.dtype)
        loc = self._locate(chunks)
        if chunks.size >= prefetch.MIN_PAGES:
            self._prefetch_chunks(loc[2], loc[3])
        if L.compression == "zstd":
            self._decode_zstd(chunks, loc, dec)
            return dec
        files, which = loc[0], loc[1]
        jobs = [(j, files[g], c % per_shard)
                for j, (g, c) in enumerate(zip(which.tolist(), chunks.tolist()))]

        flat = dec.reshape(chunks.size, -1).view(np.uint8)
        decode = self.codec.decode if self.codec is not None else None

        def run(part):
            for j, sf, i in part:
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

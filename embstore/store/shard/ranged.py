"""Chunks of a sharded array read by ranges: the read path of
:class:`~embstore.store.source.ShardSource` on a place whose files are not mapped (object
storage; any place, in tests).

For a batch of ids it

1. fetches the index of each touched shard it has not seen yet: one suffix-range read of
   ``16 * n_inner + 4`` bytes per shard, all at once, crc32c checked, kept for the handle;
2. looks the touched chunks up in the place's on-disk chunk cache (``cache_dir=``), if any;
3. coalesces the other chunks of a shard into byte ranges by the place's cost model
   (:mod:`embstore.store.place.costs`: a gap is read through when that costs less than
   another request; requests of at most ``max_request_bytes``) and issues every request
   concurrently;
4. checks each chunk's crc32c as its bytes arrive, decodes it (zstd, blosc), and scatters
   the rows into the output (vectorised per request).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import CorruptStoreError
from ...fs.checksum import crc32c
from ..codecs import Layout, check_chunk, make_codec
from ..place.base import Place
from ..place.costs import merge_ranges, split_units
from .file import parse_index

__all__ = ["RangedShards", "regions"]


def regions(shard: np.ndarray, off: np.ndarray, nb: np.ndarray, gap: int, cap: int):
    """Cut chunks (sorted by shard, offset) into requests: ``[(first, stop), ...]``, by the
    cost model's rule (:mod:`.costs`: gaps up to ``gap`` read through, requests of about
    ``cap`` bytes at most, cut between chunks)."""
    if off.size == 0:
        return []
    region, starts, _ = merge_ranges(shard, off, off + nb, gap)
    req = split_units(region, off - starts[region], cap)
    heads = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
    return list(zip(heads.tolist(), np.r_[heads[1:], off.size].tolist()))


class _Batch:
    """One gather: ids, their unique chunks (``inv`` maps ids to them), and the output."""

    def __init__(self, ids, inv, chunks, out):
        self.ids, self.inv, self.chunks, self.out = ids, inv, chunks, out
        self.off = self.nb = None


class RangedShards:
    """The ranged reads of sharded array ``name`` (layout ``layout``) of ``place``."""

    def __init__(self, place: Place, layout: Layout, name: str = "vectors"):
        self.place, self.name, self.layout = place, name, layout
        self.cache = place.cache
        costs = place.costs
        self.gap = costs.gap_bytes  # (the cost model's rule: see embstore.store.place.costs)
        self.cap = max(costs.max_request_bytes, layout.chunk_bytes + 4)
        self.codec = make_codec(layout.compression, layout.dtype.itemsize)
        self._index: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def _layout(self) -> Layout:
        return self.layout

    def shard_object(self, k: int) -> str:
        return f"{self.name}/{self._layout.shard_key(k)}"

    # -- shard indexes ------------------------------------------------------------------------
    def _index_len(self) -> int:
        return 16 * self._layout.n_inner + (4 if self._layout.index_crc else 0)

    def _load_index(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        obj = self.shard_object(k)
        where = self.place.where(obj)
        if self.cache is not None:
            hit = self.cache.get(obj, "index")
            if hit is not None and len(hit) >= 8:
                size = int.from_bytes(hit[:8], "little", signed=True)
                try:
                    return self._parsed(hit[8:], size, where)
                except CorruptStoreError:
                    self.cache.drop(obj, "index")  # a damaged cache entry: fetch again
        got = self.place.get_tail(obj, self._index_len())
        size, tail = (-1, b"") if got is None else (got[1], got[0])
        if got is None and self.place.get_tail("zarr.json", 1) is None:  # never the fill value
            raise CorruptStoreError(f"{where}: the table was removed under this reader "
                                    "(reopen it)", path=where)
        parsed = self._parsed(tail, size, where)
        if self.cache is not None:
            self.cache.put(obj, "index", int(size).to_bytes(8, "little", signed=True)
                           + bytes(tail))
        return parsed

    def _parsed(self, tail, size: int, where: str):
        if size < 0:  # no object: an absent shard, every chunk the fill value
            n = self._layout.n_inner
            return np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
        return parse_index(tail, size, self._layout, where)

    def _indexes(self, shards: list[int]) -> None:
        todo = [k for k in shards if k not in self._index]
        loaded: list[Any] = self.place.map(self._load_index, todo)
        for k, idx in zip(todo, loaded):
            self._index[k] = idx

    # -- reads --------------------------------------------------------------------------------
    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        if ids.size == 0:
            return
        L = self._layout
        per = L.n_inner
        chunks, inv = np.unique(ids // L.chunk_rows, return_inverse=True)
        b = _Batch(ids, inv.reshape(-1), chunks, out)
        shard = chunks // per
        bounds = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]]).tolist() + [chunks.size]
        self._indexes([int(shard[a]) for a in bounds[:-1]])
        b.off = np.empty(chunks.size, dtype=np.int64)
        b.nb = np.empty(chunks.size, dtype=np.int64)
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # a loop per shard
            o, n = self._index[int(shard[lo])]
            b.off[lo:hi], b.nb[lo:hi] = o[chunks[lo:hi] % per], n[chunks[lo:hi] % per]
        todo = b.off >= 0
        absent = ~todo[b.inv]
        if absent.any():
            out[absent] = L.fill_value
        if self.cache is not None:
            todo &= ~self._from_cache(b, todo)
        sel = np.flatnonzero(todo)
        if sel.size == 0:
            return
        sel = sel[np.lexsort((b.off[sel], shard[sel]))]  # by shard, then by offset
        reqs = regions(shard[sel], b.off[sel], b.nb[sel], self.gap, self.cap)
        # ids grouped by request: one argsort, then a slice per request
        region_of_chunk = np.full(chunks.size, -1, dtype=np.int64)
        for r, (lo, hi) in enumerate(reqs):
            region_of_chunk[sel[lo:hi]] = r
        rid = region_of_chunk[b.inv]
        order = np.argsort(rid, kind="stable")
        cuts = np.searchsorted(rid[order], np.arange(len(reqs) + 1)).tolist()
        jobs = [(sel[lo:hi], order[cuts[r]: cuts[r + 1]]) for r, (lo, hi) in enumerate(reqs)]
        self.place.map(lambda job: self._fetch(b, *job), jobs)

    def _where(self, b: _Batch, j: int) -> str:
        k, i = divmod(int(b.chunks[j]), self._layout.n_inner)
        return f"shard {self.place.where(self.shard_object(k))}, chunk {i}"

    def _fetch(self, b: _Batch, js: np.ndarray, pos: np.ndarray) -> None:
        """One request: chunks ``js`` (one shard, by offset) for the ids at ``pos``."""
        L = self._layout
        obj = self.shard_object(int(b.chunks[js[0]]) // L.n_inner)
        start, stop = int(b.off[js[0]]), int(b.off[js[-1]] + b.nb[js[-1]])
        buf = np.frombuffer(self.place.get_range(obj, start, stop), dtype=np.uint8)
        if buf.size != stop - start:
            raise CorruptStoreError(f"shard {self.place.where(obj)}: got {buf.size} bytes "
                                    f"for range {start}-{stop} (object truncated?)",
                                    path=self.place.where(obj))
        payloads = []
        for j in js.tolist():  # a loop per chunk: its checksum, and the disk cache
            a = int(b.off[j]) - start
            raw = buf[a: a + int(b.nb[j])]
            payloads.append(self._check(raw, b, j))
            if self.cache is not None:
                self.cache.put(obj, f"{int(b.off[j])}-{int(b.nb[j])}", raw.tobytes())
        if self.codec is None:  # rows straight from the response buffer
            rb = L.row_bytes
            at = b.off[b.inv[pos]] - start + (b.ids[pos] % L.chunk_rows) * rb
            rows = np.ndarray(shape=(buf.size - rb + 1,), dtype=np.dtype((np.void, rb)),
                              buffer=buf, strides=(1,))
            b.out.view(np.dtype((np.void, rb))).reshape(-1)[pos] = rows[at]
            return
        self._scatter(b, js, payloads, pos)

    def _check(self, raw, b: _Batch, j: int):
        """The payload of a stored chunk after its crc32c check (the codecs release the GIL)."""
        if not self._layout.has_crc:
            return raw
        mv = memoryview(raw).cast("B")
        if len(mv) < 4 or crc32c(mv[:-4]) != int.from_bytes(
                mv[-4:], "little"):
            check_chunk(mv, self._where(b, j))  # raises, with the reason and the place
        return mv[:-4]

    def _scatter(self, b: _Batch, js, payloads, pos) -> None:
        """Decode the chunks ``js`` (stored ``payloads``) and copy rows to ``out[pos]``."""
        L = self._layout
        dec = np.empty((len(js), L.chunk_rows, L.dim), dtype=L.dtype)
        flat = dec.reshape(len(js), -1).view(np.uint8)
        for s, (j, p) in enumerate(zip(js, payloads)):  # a loop per chunk
            try:
                if self.codec is None:
                    flat[s] = np.frombuffer(p, dtype=np.uint8)
                else:
                    self.codec.decode(p, out=flat[s])
            except Exception as exc:  # noqa: BLE001 - a codec's own error type
                raise CorruptStoreError(f"{self._where(b, int(j))}: cannot decode ({exc})",
                                        path=self.place.url) from exc
        slot = np.empty(b.chunks.size, dtype=np.int64)
        slot[js] = np.arange(len(js))
        b.out[pos] = dec.reshape(-1, L.dim)[slot[b.inv[pos]] * L.chunk_rows
                                            + b.ids[pos] % L.chunk_rows]

    def _from_cache(self, b: _Batch, todo: np.ndarray) -> np.ndarray:
        """Serve chunks from the disk cache; returns the mask of chunks served."""
        L = self._layout
        served = np.zeros(b.chunks.size, dtype=bool)
        js, payloads = [], []
        for j in np.flatnonzero(todo).tolist():  # a loop per chunk
            obj = self.shard_object(int(b.chunks[j]) // L.n_inner)
            name = f"{int(b.off[j])}-{int(b.nb[j])}"
            assert self.cache is not None  # only called with a disk cache
            raw = self.cache.get(obj, name)
            if raw is None or len(raw) != int(b.nb[j]):
                continue
            try:
                payloads.append(self._check(raw, b, j))
            except CorruptStoreError:
                self.cache.drop(obj, name)  # damaged in the cache: fetched again
                continue
            js.append(j)
            served[j] = True
        if js:
            self._scatter(b, np.array(js, dtype=np.int64), payloads,
                          np.flatnonzero(served[b.inv]))
        return served

    def forget(self) -> None:
        self._index.clear()

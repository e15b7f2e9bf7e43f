"""Shard files of the ``vectors`` array: layout, chunk codecs, and the fast read path.

A shard file is ``[chunk]...[index: n x (uint64 offset, uint64 nbytes)][crc32c]`` (see
docs/FORMAT.md).  :class:`ShardReader` keeps each shard's index (a NumPy array), a
read-only memory map of the file and a bitset of the chunks whose crc32c it has checked.
Uncompressed rows are gathered straight from the mapping; compressed chunks are decoded
(only the needed ones, in a thread pool) in bounded batches.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from crc32c import crc32c

from .errors import CorruptStoreError

__all__ = ["Layout", "ShardReader", "encode_chunks", "shard_bytes", "check_chunk", "pool"]

ABSENT = np.uint64(2**64 - 1)
COMPRESSIONS = ("none", "zstd", "blosc")
_DECODE_BATCH_BYTES = 32 << 20  # decoded chunks held at once by a compressed gather

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The shared thread pool for (de)compression (the codecs release the GIL)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2),
                                       thread_name_prefix="embstore-codec")
        return _pool


def make_codec(compression: str, itemsize: int):
    """The numcodecs codec writing ``compression`` chunks (None for ``"none"``)."""
    if compression == "none":
        return None
    from numcodecs import Blosc, Zstd
    if compression == "zstd":
        return Zstd(level=0, checksum=False)
    if compression == "blosc":
        return Blosc(cname="zstd", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0,
                     typesize=itemsize)
    raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")


@dataclass(frozen=True)
class Layout:
    """What the fast path needs to know about a ``vectors`` array."""

    rows: int
    dim: int
    dtype: np.dtype
    chunk_rows: int
    shard_rows: int
    compression: str  # "none", "zstd" or "blosc"
    has_crc: bool
    index_crc: bool
    separator: str
    fill_value: float

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize

    @property
    def chunk_bytes(self) -> int:  # decoded
        return self.chunk_rows * self.row_bytes

    @property
    def n_inner(self) -> int:
        return self.shard_rows // self.chunk_rows

    @property
    def n_shards(self) -> int:
        return -(-self.rows // self.shard_rows)

    def shard_key(self, k: int) -> str:
        return f"c{self.separator}{k}{self.separator}0"

    @classmethod
    def from_metadata(cls, meta: dict) -> Layout | None:
        """The layout of a Zarr v3 array's ``zarr.json``, or None if the fast path cannot read it."""
        try:
            shape = meta["shape"]
            dtype = np.dtype(meta["data_type"]) if isinstance(meta["data_type"], str) else None
            grid = meta["chunk_grid"]
            cke = meta["chunk_key_encoding"]
            codecs = meta["codecs"]
            if (len(shape) != 2 or dtype is None or dtype.kind != "f" or meta.get(
                    "storage_transformers") or grid["name"] != "regular"
                    or cke["name"] != "default" or len(codecs) != 1
                    or codecs[0]["name"] != "sharding_indexed"):
                return None
            sep = cke.get("configuration", {}).get("separator", "/")
            shard_shape = grid["configuration"]["chunk_shape"]
            conf = codecs[0]["configuration"]
            inner_shape = conf["chunk_shape"]
            dim = shape[1]
            if (shard_shape[1] != dim or inner_shape[1] != dim or dim < 1
                    or shard_shape[0] % inner_shape[0] or conf.get("index_location", "end") != "end"):
                return None
            names = [c["name"] for c in conf["codecs"]]
            if not names or names[0] != "bytes" or _endian(conf["codecs"][0]) != "little":
                return None
            has_crc = names[-1] == "crc32c"
            middle = names[1:-1] if has_crc else names[1:]
            if middle not in ([], ["zstd"], ["blosc"]):
                return None
            inames = [c["name"] for c in conf.get("index_codecs", [])]
            if inames not in (["bytes", "crc32c"], ["bytes"]) or _endian(
                    conf["index_codecs"][0]) != "little":
                return None
            fill = float(meta.get("fill_value") or 0.0)
        except (KeyError, TypeError, IndexError, ValueError):
            return None
        return cls(rows=int(shape[0]), dim=int(dim), dtype=dtype.newbyteorder("<"),
                   chunk_rows=int(inner_shape[0]), shard_rows=int(shard_shape[0]),
                   compression=middle[0] if middle else "none", has_crc=has_crc,
                   index_crc=inames == ["bytes", "crc32c"], separator=sep, fill_value=fill)


def _endian(codec: dict) -> str:
    return codec.get("configuration", {}).get("endian", "little")


# -- writing ------------------------------------------------------------------------------
def encode_chunks(rows: np.ndarray, layout: Layout, codec) -> list[bytes]:
    """Encoded chunks (data + crc32c) of ``rows``: whole chunks, the last one zero-padded."""
    cr = layout.chunk_rows
    n = -(-rows.shape[0] // cr)
    if rows.shape[0] != n * cr:
        padded = np.zeros((n * cr, layout.dim), dtype=layout.dtype)
        padded[: rows.shape[0]] = rows
        rows = padded
    raw = np.ascontiguousarray(rows, dtype=layout.dtype).reshape(n, cr * layout.dim)
    if codec is None:
        parts = [raw[i].tobytes() for i in range(n)]
    else:
        parts = list(pool().map(codec.encode, raw, chunksize=max(1, n // 32)))
        parts = [bytes(p) for p in parts]
    if layout.has_crc:
        parts = [p + crc32c(p).to_bytes(4, "little") for p in parts]
    return parts


def shard_bytes(chunks: list[bytes | None], layout: Layout) -> list:
    """The pieces of a shard file (chunks back to back, then the index): write them in order."""
    index = np.full((layout.n_inner, 2), ABSENT, dtype="<u8")
    pos = 0
    pieces: list = []
    for i, c in enumerate(chunks):
        if c is None:
            continue
        index[i] = (pos, len(c))
        pieces.append(c)
        pos += len(c)
    body = index.tobytes()
    pieces.append(body)
    if layout.index_crc:
        pieces.append(crc32c(body).to_bytes(4, "little"))
    return pieces


def check_chunk(buf, where: str) -> memoryview:
    """The payload of a stored chunk after checking its trailing crc32c."""
    mv = memoryview(buf).cast("B")
    if len(mv) < 4:
        raise CorruptStoreError(f"{where}: {len(mv)} bytes, too short for its checksum",
                                path=where)
    payload = mv[:-4]
    if crc32c(payload) != int.from_bytes(mv[-4:], "little"):
        raise CorruptStoreError(f"{where}: crc32c mismatch (stored bytes are damaged)",
                                path=where)
    return payload


# -- reading ------------------------------------------------------------------------------
class ShardFile:
    """One shard as read: its index, memory map, and which chunks passed their crc32c."""

    def __init__(self, path: str, layout: Layout):
        self.path = path
        n = layout.n_inner
        self.mm = None
        self.rowview = None
        self.offsets = np.full(n, -1, dtype=np.int64)
        self.nbytes = np.zeros(n, dtype=np.int64)
        self.verified = np.zeros(n, dtype=bool)
        self.all_verified = False
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            self.all_verified = True  # an absent shard: every chunk is the fill value
            return
        index_len = 16 * n + (4 if layout.index_crc else 0)
        if size < index_len:
            raise CorruptStoreError(
                f"shard {path}: {size} bytes, shorter than its {index_len}-byte index "
                "(truncated?)", path=path)
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        tail = mm[size - index_len:]
        body = tail[: 16 * n]
        if layout.index_crc and crc32c(body) != int.from_bytes(bytes(tail[16 * n:]), "little"):
            raise CorruptStoreError(f"shard {path}: the shard index fails its crc32c "
                                    "(damaged or truncated)", path=path)
        index = np.frombuffer(bytes(body), dtype="<u8").reshape(n, 2)
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
        self.nbytes = np.where(present, nb, 0)
        self.mm = mm
        self.all_verified = not layout.has_crc
        self.verified[~present] = True
        rb = layout.row_bytes
        if layout.compression == "none" and data_len >= rb:
            self.rowview = np.ndarray(shape=(data_len - rb + 1,), dtype=np.dtype((np.void, rb)),
                                      buffer=mm, offset=0, strides=(1,))

    def chunk(self, i: int, layout: Layout):
        """The stored bytes of inner chunk ``i`` after their crc32c check (None if absent)."""
        off = int(self.offsets[i])
        if off < 0:
            return None
        buf = self.mm[off: off + int(self.nbytes[i])]
        if layout.has_crc:
            return check_chunk(buf, f"shard {self.path}, chunk {i}")
        return memoryview(buf)

    def verify(self, inner: np.ndarray, layout: Layout) -> None:
        for i in inner.tolist():  # a loop per chunk, each checked once per process
            self.chunk(i, layout)
            self.verified[i] = True
        if self.verified.all():
            self.all_verified = True


class ShardReader:
    """Row gathers from the shard files of one ``vectors`` array."""

    def __init__(self, root: str, layout: Layout):
        self.root = root
        self.layout = layout
        self.codec = make_codec(layout.compression, layout.dtype.itemsize) if (
            layout.compression != "none") else None
        self._shards: dict[int, ShardFile] = {}
        self._lock = threading.Lock()

    def shard(self, k: int) -> ShardFile:
        sf = self._shards.get(k)
        if sf is None:
            with self._lock:
                sf = self._shards.get(k)
                if sf is None:
                    sf = ShardFile(os.path.join(self.root, *self.layout.shard_key(k).split(
                        self.layout.separator)), self.layout)
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

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (n, dim) with rows ``ids`` (validated 1-D int64)."""
        if ids.size == 0:
            return
        if self.layout.compression == "none":
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

    def decode_chunks(self, chunks: np.ndarray) -> np.ndarray:
        """Decoded global chunks ``chunks`` as an array (len, chunk_rows, dim)."""
        L = self.layout
        per_shard = L.n_inner
        dec = np.empty((chunks.size, L.chunk_rows, L.dim), dtype=L.dtype)
        jobs = [(j, self.shard(c // per_shard), c % per_shard)
                for j, c in enumerate(chunks.tolist())]

        def run(part):
            for j, sf, i in part:
                buf = sf.chunk(i, L)
                if buf is None:
                    dec[j] = L.fill_value
                elif self.codec is None:
                    dec[j] = np.frombuffer(buf, dtype=L.dtype).reshape(L.chunk_rows, L.dim)
                else:
                    try:
                        self.codec.decode(buf, out=dec[j])
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

    def verify_all(self, progress=None) -> list[tuple[str, int | None, str]]:
        """Check every shard index and every chunk: ``(shard file, chunk or None, message)``."""
        L = self.layout
        problems = []
        self.checked_chunks = 0
        for k in range(L.n_shards):
            path = os.path.join(self.root, *L.shard_key(k).split(L.separator))
            try:
                sf = ShardFile(path, L)
            except CorruptStoreError as exc:
                problems.append((path, None, str(exc)))
                continue
            for i in np.flatnonzero(sf.offsets >= 0).tolist():
                self.checked_chunks += 1
                try:
                    buf = sf.chunk(i, L)
                    if self.codec is not None:
                        self.codec.decode(buf)
                except CorruptStoreError as exc:
                    problems.append((path, i, str(exc)))
                except Exception as exc:  # noqa: BLE001
                    problems.append((path, i, f"shard {path}, chunk {i}: cannot decode ({exc})"))
            if progress is not None:
                progress(k + 1)
        return problems

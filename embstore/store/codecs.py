"""Format-v1 building blocks: the ``vectors`` layout as read from its ``zarr.json``, its
default (:func:`choose_layout`, docs/FORMAT.md §3b), the chunk codecs, and the byte
layout of a shard file (see docs/FORMAT.md)."""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import DTypeLike

from ..fs.checksum import crc32c

from ..dtypes import DTYPES, check_storage
from ..errors import CorruptStoreError, InvalidOptionError
from ..ids import positive_int

__all__ = ["Layout", "choose_layout", "pow2_below", "SIDE_CHUNK_ROWS", "ABSENT", "COMPRESSIONS",
           "Compression", "make_codec", "encode_chunks", "check_chunk", "pool"]

ABSENT = np.uint64(2**64 - 1)
COMPRESSIONS: tuple[str, ...] = ("none", "zstd", "blosc")
Compression = Literal["none", "zstd", "blosc"]
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


def _forget_pool_in_child() -> None:
    """A forked child has none of the parent's pool threads: a copied pool would take work
    and never run it (a DataLoader worker hung forever).  Start afresh."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


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
    raise InvalidOptionError(f"compression must be one of "
                             f"{', '.join(map(repr, COMPRESSIONS))}, got {compression!r}")


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
            dtype = _code_dtype(meta["data_type"])
            grid = meta["chunk_grid"]
            cke = meta["chunk_key_encoding"]
            codecs = meta["codecs"]
            if (len(shape) != 2 or dtype is None or meta.get(
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


def _code_dtype(data_type) -> np.dtype | None:
    """The NumPy dtype of the stored values (bfloat16: its uint16 codes), or None."""
    record = DTYPES.get(data_type) if isinstance(data_type, str) else None
    return None if record is None else record.code


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


#: bytes per inner chunk (uncompressed).  A cold random row costs the pages of its chunk (its
#: crc32c is checked on first touch): a 1 KiB chunk + 4-byte checksum spans 1.25 pages on
#: average, a 4 KiB one always 2 (docs/design/format-rationale.md has the measurements)
CHUNK_TARGET = 1 << 10
#: compressed chunks are decoded whole on every read and read whole when cold: 1 KiB as well
#: (16,384 uniform ids on 1M x 256 float32 decode 16 MiB instead of 64; the price is size:
#: random normal floats store at 96% of raw instead of 90% with 4 KiB chunks)
CHUNK_TARGET_COMPRESSED = 1 << 10
SHARD_TARGET = 128 << 20  # bytes per shard
SIDE_CHUNK_ROWS = 512  # rows per chunk of a side array (row_scale): 4 KiB, a page per cold touch


def pow2_below(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1.0, x)))))


def choose_layout(dim: int, dtype: DTypeLike, rows: int | None = None, *,
                  chunk_rows: int | None = None, shard_rows: int | None = None,
                  compression: str = "none") -> tuple[int, int]:
    """``(chunk_rows, shard_rows)``: the given values, or the defaults of docs/FORMAT.md.

    Rows per chunk and per shard are sized by the stored row (codes for bfloat16 and int8):
    about 1 KiB chunks, so a cold chunk read is about a page whatever the dtype, and the
    20 bytes each chunk adds (its crc32c and index entry) stay 2% of what is stored.  (With
    16 KiB chunks, sizing by the logical row made compact tables' cold reads 2-4x smaller;
    at 1 KiB it would only make their chunks 256-512 bytes and the overhead 4-8%.)
    """
    name = check_storage(dtype)
    rb = dim * DTYPES[name].code.itemsize
    for what, v in (("chunk_rows", chunk_rows), ("shard_rows", shard_rows)):
        if v is not None:
            positive_int(v, what)
    cr = chunk_rows
    if cr is None:
        cr = pow2_below((CHUNK_TARGET if compression == "none" else CHUNK_TARGET_COMPRESSED)
                         / rb)
        if shard_rows is not None:
            cr = math.gcd(cr, int(shard_rows))
        elif rows is not None:
            cr = max(1, min(cr, rows))
    sr = shard_rows
    if sr is None:
        sr = cr * pow2_below(SHARD_TARGET / (cr * rb))
        if rows is not None:
            sr = min(sr, max(cr, -(-rows // cr) * cr))
    if sr % cr:
        raise InvalidOptionError(f"shard_rows must be a multiple of chunk_rows: got "
                                 f"shard_rows={sr}, chunk_rows={cr}")
    return int(cr), int(sr)

"""The on-disk backend: :class:`ZarrTable` and ``create``/``save``/``open``/``verify``.

Format v1 is described in docs/FORMAT.md.  Reads go through :mod:`embstore.shards` (shard
index kept, memory-mapped gathers, crc32c checked once per chunk) unless the ``vectors``
array has a layout that path does not know, in which case zarr-python reads it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..cache import CacheInfo, RowCache, parse_bytes
from ..errors import CorruptStoreError, EmbstoreError, FormatError, ShapeMismatchError
from ..ids import as_ids
from ..keys.index import DiskVocab
from ..keys.mapped import read_array_meta
from ..memory import check_table_array
from .meta import read_table_meta
from .codecs import Layout
from .shardread import ShardReader
from ..table import Table, as_key_array
from .verify import Damage, VerifyReport, verify
from .writer import TableWriter, check_dtype, rewrite_shard, set_rows

__all__ = ["ZarrTable", "TableWriter", "create", "save", "open", "verify", "VerifyReport",
           "Damage"]

_SAVE_BLOCK_BYTES = 64 << 20


class ZarrTable(Table):
    """A table stored as a sharded Zarr v3 group (format v1).  Use :func:`open`."""

    def __init__(self, path, *, mode: str = "r", cache_bytes="256MiB"):
        if mode not in ("r", "r+"):
            raise ValueError(f"mode must be 'r' or 'r+', got {mode!r}")
        self.path = Path(os.fspath(path)).absolute()
        self.mode = mode
        self._lock = threading.RLock()  # writers, vocab opening, refresh
        self._closed = False
        self._load_meta()
        cap = parse_bytes(cache_bytes)
        self._cache = RowCache(cap, self.dim, self.dtype) if cap else None
        if self._cache is not None:  # reading an uncompressed row costs about a cached one
            self._cache.cheap_reads = (self._layout is not None
                                       and self._layout.compression == "none")

    def _load_meta(self) -> None:
        self._attrs, meta = read_table_meta(self.path)
        self._layout = Layout.from_metadata(meta)
        self._zarr = None
        self._reader = None
        if self._layout is None:  # a layout the fast path does not know: zarr-python reads
            import zarr
            try:
                self._zarr = zarr.open_array(str(self.path / "vectors"), mode=self.mode)
            except Exception as exc:  # noqa: BLE001 - zarr refuses bad metadata in many ways
                raise CorruptStoreError(f"{self.path / 'vectors'}: zarr cannot open the array "
                                        f"({type(exc).__name__}: {exc})",
                                        path=str(self.path)) from None
            if self._zarr.ndim != 2:
                raise FormatError(f"vectors must be 2-D, got shape {self._zarr.shape}",
                                  path=str(self.path))
            check_dtype(self._zarr.dtype)
        else:
            self._reader = ShardReader(str(self.path / "vectors"), self._layout)
        self._has_keys = bool(self._attrs.get("has_keys", (self.path / "keys").is_dir()))
        self._vocab_obj = None
        if self._has_keys:
            self._check_key_count()

    def _check_key_count(self) -> None:
        """Keys must cover every row (more keys: an append in flight, they are capped)."""
        shape = read_array_meta(self.path, "keys").get("shape")
        if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int
                and shape[0] >= self.vocab_size):
            raise CorruptStoreError(f"{self.path}/keys: expected {self.vocab_size} keys (one "
                                    f"per row), got shape {shape!r}", path=str(self.path))

    # -- geometry ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        if self._layout is not None:
            return (self._layout.rows, self._layout.dim)
        return tuple(int(s) for s in self._zarr.shape)  # type: ignore[return-value]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._layout.dtype.name if self._layout else self._zarr.dtype)

    @property
    def writable(self) -> bool:
        return self.mode == "r+" and not self._closed

    @property
    def layout(self) -> dict:
        """``chunk_rows``, ``shard_rows`` and ``compression`` of ``vectors`` (None if unknown)."""
        if self._layout is None:
            shards = getattr(self._zarr, "shards", None)
            return {"chunk_rows": int(self._zarr.chunks[0]),
                    "shard_rows": int(shards[0]) if shards else None, "compression": None,
                    "fast_path": False}
        return {"chunk_rows": self._layout.chunk_rows, "shard_rows": self._layout.shard_rows,
                "compression": self._layout.compression, "fast_path": True}

    def info(self) -> dict:
        """What ``embstore info --json`` prints."""
        stored = sum(os.path.getsize(os.path.join(d, f))
                     for d, _, files in os.walk(self.path) for f in files)
        return {"format": self._attrs.get("format"), "path": str(self.path),
                "vocab_size": self.vocab_size, "dim": self.dim, "dtype": self.dtype.name,
                **{k: v for k, v in self.layout.items() if k != "fast_path"},
                "has_keys": self._has_keys, "nbytes": self.nbytes, "stored_bytes": stored,
                "attributes": {k: v for k, v in self._attrs.items() if k not in (
                    "format", "dim", "dtype", "chunk_rows", "shard_rows", "compression",
                    "has_keys")}}

    # -- reads ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EmbstoreError(f"{self.path} is closed")

    def _fetch(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Rows ``ids`` from the store (no row cache)."""
        self._check_open()
        if self._reader is not None:
            self._reader.gather(ids, out)
            return
        uniq, inv = np.unique(ids, return_inverse=True)
        try:
            rows = self._zarr.get_orthogonal_selection((uniq, slice(None)))
        except (ValueError, RuntimeError, OSError) as exc:
            raise CorruptStoreError(f"{self.path}/vectors: cannot read rows ({exc})",
                                    path=str(self.path)) from exc
        out[:] = rows[inv]

    def lookup(self, ids, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None or self._reader is None:
            return super().lookup(ids, out=out)
        ids = as_ids(ids, self.vocab_size)  # gather straight into the result
        self._check_open()
        flat = ids.reshape(-1)
        if self._cache is not None and self._cache.slots:
            rows = self._cache.gather(flat, None, self._fetch, self._reader.take)
        else:
            rows = self._reader.take(flat)
        return rows.reshape(ids.shape + (self.dim,))

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        if self._cache is not None and self._cache.slots:
            self._check_open()
            self._cache.gather(ids, out, self._fetch)
        else:
            self._fetch(ids, out)

    def _read_rows(self, start: int, stop: int) -> np.ndarray:  # scans bypass the row cache
        out = np.empty((stop - start, self.dim), dtype=self.dtype)
        if stop > start:
            self._fetch(np.arange(start, stop, dtype=np.int64), out)
        return out

    def warm(self, ids) -> int:
        """Load rows ``ids`` (most important first) into the row cache; returns rows loaded."""
        ids = as_ids(ids, self.vocab_size).reshape(-1)
        if self._cache is None:
            return 0
        return self._cache.warm(ids, self._fetch)

    # -- keys -------------------------------------------------------------------------------
    def _vocab(self):
        if not self._has_keys:
            return None
        if self._vocab_obj is None:
            with self._lock:
                if self._vocab_obj is None:
                    # no zarr import on the read path: DiskVocab opens the group when it writes
                    # rows: keys past the committed row count belong to an append in flight
                    vocab = DiskVocab.open(None, self.path, rows=self.vocab_size)
                    if vocab is None or len(vocab) != self.vocab_size:
                        raise CorruptStoreError(
                            f"{self.path}: expected {self.vocab_size} keys (has_keys), got "
                            f"{'no keys array' if vocab is None else len(vocab)}",
                            path=str(self.path))
                    self._vocab_obj = vocab
        return self._vocab_obj

    # -- writes -----------------------------------------------------------------------------
    def _write_rows(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._check_open()
        uniq, last = np.unique(ids[::-1], return_index=True)  # the last write of an id wins
        vals = vectors[::-1][last]
        with self._lock:
            if self._reader is None:
                self._zarr.set_orthogonal_selection((uniq, slice(None)), vals)
            else:
                L = self._layout
                sr = L.shard_rows
                sh = uniq // sr
                cuts = np.flatnonzero(sh[1:] != sh[:-1]) + 1
                for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, uniq.size].tolist()):
                    k = int(sh[a])
                    rewrite_shard(self._reader, k, uniq[a:b] - k * sr, vals[a:b],
                                  min(sr, L.rows - k * sr))
            if self._cache is not None:
                self._cache.invalidate(uniq)

    def _append_rows(self, vectors: np.ndarray, keys: list[str] | None) -> None:
        self._check_open()
        with self._lock:
            n0, n = self.vocab_size, vectors.shape[0]
            n1 = n0 + n
            if n == 0:
                return
            if self._reader is None:
                self._zarr.resize((n1, self.dim))
                self._zarr[n0:n1] = vectors
            else:
                L = self._layout
                sr = L.shard_rows
                for k in range(n0 // sr, (n1 - 1) // sr + 1):
                    a, b = max(n0, k * sr), min(n1, (k + 1) * sr)
                    rewrite_shard(self._reader, k, np.arange(a, b) - k * sr,
                                  vectors[a - n0: b - n0], b - k * sr)
            if keys is not None:
                self._vocab().append(keys)
            if self._reader is not None:
                set_rows(str(self.path), n1)  # last: readers see the new rows only now
                self._layout = replace(self._layout, rows=n1)
                self._reader.layout = self._layout

    def refresh(self) -> None:
        """See changes made by other processes since opening (row count, shards, keys)."""
        with self._lock:
            self._check_open()
            self._load_meta()
            if self._cache is not None:
                self._cache.clear(keep_stats=True)

    # -- housekeeping -----------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        if self._cache is None:
            return CacheInfo()
        return self._cache.info()

    def cache_clear(self) -> None:
        if self._cache is not None:
            self._cache.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._reader is not None:
                self._reader.forget()  # unmaps once no thread is reading
            if self._cache is not None:
                self._cache.clear(keep_stats=True)
            close = getattr(self._vocab_obj, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return (f"ZarrTable({str(self.path)!r}, mode={self.mode!r}, vocab_size="
                f"{self.vocab_size}, dim={self.dim}, dtype={self.dtype})")


# -- module functions ---------------------------------------------------------------------
def open(path, mode: str = "r", cache_bytes="256MiB") -> ZarrTable:  # noqa: A001
    """Open the table at ``path`` (``mode`` ``"r"`` or ``"r+"``) with a row cache of
    ``cache_bytes`` (an int or a string like ``"256MiB"``; 0 disables it)."""
    return ZarrTable(path, mode=mode, cache_bytes=cache_bytes)


def create(path, shape, dtype="float32", keys=None, chunk_rows=None, shard_rows=None,
           compression: str = "none", overwrite: bool = False,
           cache_bytes="256MiB") -> ZarrTable:
    """A new table of zeros, ``shape=(vocab_size, dim)``, opened writable (``r+``)."""
    try:
        rows, dim = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ShapeMismatchError(f"shape must be (vocab_size, dim), got {shape!r}") from None
    if rows < 0:
        raise ShapeMismatchError(f"vocab_size must be >= 0, got {rows}")
    key_list = None
    if keys is not None:
        key_list = [str(k) for k in as_key_array(list(keys)).reshape(-1)]
        if len(key_list) != rows:
            raise ShapeMismatchError(f"got {len(key_list)} keys for a table of {rows} rows")
    w = TableWriter(path, dim=dim, dtype=dtype, has_keys=key_list is not None,
                    chunk_rows=chunk_rows, shard_rows=shard_rows, compression=compression,
                    overwrite=overwrite, expected_rows=rows)
    try:
        if key_list is not None:
            _check_unique(w._keys.add(key_list), key_list)
        w._declare_zero_rows(rows)
    except BaseException:
        w.abort()
        raise
    w.commit()
    return ZarrTable(path, mode="r+", cache_bytes=cache_bytes)


def _check_unique(mask, keys, base: int = 0) -> None:
    mask = np.asarray(mask, dtype=bool)
    if not mask.all():
        i = int(np.argmin(mask))
        raise ShapeMismatchError(f"key {keys[i]!r} at row {base + i} repeats an earlier key "
                                 "(keys must be distinct)")


def save(path, array_or_table, keys=None, *, chunk_rows=None, shard_rows=None,
         compression: str = "none", overwrite: bool = False, dtype=None,
         cache_bytes="256MiB") -> ZarrTable:
    """Write a whole table (an array, ``np.memmap`` or any :class:`Table`) to ``path``.

    Streamed in blocks: the source is never held in memory whole.  Returns the new table,
    opened read-only.  ``keys`` (default: the source table's keys) must be distinct.
    """
    src = array_or_table
    if isinstance(src, Table):
        rows, dim = src.shape
        src_dtype = src.dtype
        if keys is None and src.keys is not None:
            keys = src.keys
        blocks = lambda n: src.iter_blocks(n)  # noqa: E731
    else:
        arr = check_table_array(src)
        rows, dim = arr.shape
        src_dtype = arr.dtype
        blocks = lambda n: ((s, arr[s: s + n]) for s in range(0, rows, n))  # noqa: E731
    if keys is not None and len(keys) != rows:
        raise ShapeMismatchError(f"got {len(keys)} keys for a table of {rows} rows")
    dt = check_dtype(dtype if dtype is not None else src_dtype)
    block = max(1, _SAVE_BLOCK_BYTES // max(1, dim * dt.itemsize))
    with TableWriter(path, dim=dim, dtype=dt, has_keys=keys is not None,
                     chunk_rows=chunk_rows, shard_rows=shard_rows, compression=compression,
                     overwrite=overwrite, expected_rows=rows) as w:
        w._strict_keys = True
        for start, part in blocks(block):
            if keys is None:
                w.add(part)
                continue
            kb = [str(k) for k in as_key_array(list(keys[start: start + part.shape[0]]))]
            w.add(part, kb)
    return ZarrTable(path, mode="r", cache_bytes=cache_bytes)

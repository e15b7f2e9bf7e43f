"""Writing whole tables: :func:`create` (zeros, opened writable) and :func:`save` (an array
or any table, streamed in blocks), locally or to object storage."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from .._types import Bytes, KeysLike, PathLike
from ..dtypes import check_storage
from ..errors import ShapeMismatchError
from ..memory import check_table_array
from ..ids import key_list
from ..table import Table
from .codecs import Compression
from .subword.ngrams import subword_attrs
from ..dtypes import DTYPES
from ..dtypes.bfloat16 import is_ml_bfloat16
from .table import ZarrTable
from .history import refuse_in_place, whole_table_at
from .writer import TableWriter
from .annfiles import retarget
from .meta import table_id
from .versions.commit import last_commit
from .rowinit import check_init, init_rows

__all__ = ["create", "save", "upgrade"]

_SAVE_BLOCK_BYTES = 64 << 20


def create(path: PathLike, shape: tuple[int, int], dtype: DTypeLike = "float32",
           keys: KeysLike | None = None, chunk_rows: int | None = None,
           shard_rows: int | None = None, compression: Compression = "none",
           overwrite: bool = False, cache_bytes: Bytes = "auto",
           lock_timeout: float | None = None, format_version: int | None = None,
           init=None) -> ZarrTable:
    """A new table of zeros, ``shape=(vocab_size, dim)``, opened writable (``r+``).
    ``format_version=2``: an uncompressed table of the format-2 row layout (docs/FORMAT.md).
    ``init``: deterministic initial rows instead of zeros, ``"uniform"``, ``"normal"`` or
    a dict with a seed and a scale (:mod:`embstore.store.rowinit`).  Lazily: no row is
    written, a row never written reads as generated from ``(seed, row)``, the same every
    time, and a written row overrides it (docs/FORMAT.md §3e); compressed (sharded) and
    int8 tables are written whole at creation instead, with the same values."""
    refuse_in_place(path, "tables on object storage are written whole (save, copy), not "
                    "created empty and written in place")
    try:
        rows, dim = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ShapeMismatchError(f"shape must be (vocab_size, dim), got {shape!r}") from None
    if rows < 0:
        raise ShapeMismatchError(f"vocab_size must be >= 0, got {rows}")
    names = None
    if keys is not None:
        names = key_list(list(keys))
        if len(names) != rows:
            raise ShapeMismatchError(f"got {len(names)} keys for a table of {rows} rows")
    spec = check_init(init, dim)
    with TableWriter(path, dim=dim, dtype=dtype, has_keys=names is not None,
                     chunk_rows=chunk_rows, shard_rows=shard_rows, compression=compression,
                     overwrite=overwrite, expected_rows=rows, duplicate_keys="error",
                     format_version=format_version, init=spec) as w:
        if spec is None:
            w.add_zeros(rows, names)
        elif w.lazy_ok:  # nothing written: readers generate the rows (FORMAT.md §3e)
            w.add_init(rows, names)
        else:  # (int8, sharded layouts: written at creation)
            step = max(1, _SAVE_BLOCK_BYTES // max(1, 8 * dim))
            for a in range(0, rows, step):  # a loop per block
                b = min(rows, a + step)
                w.add(init_rows(spec, a, b, dim), None if names is None else names[a:b])
    return ZarrTable(path, mode="r+", cache_bytes=cache_bytes, lock_timeout=lock_timeout)


def save(path: PathLike, array_or_table: ArrayLike | Table, keys: KeysLike | None = None, *,
         chunk_rows: int | None = None, shard_rows: int | None = None,
         compression: Compression = "none", overwrite: bool = False,
         dtype: DTypeLike | None = None, cache_bytes: Bytes = "auto",
         storage_options: dict | None = None,
         format_version: int | None = None) -> ZarrTable:
    """Write a whole table (an array, ``np.memmap`` or any :class:`Table`) to ``path``.

    ``dtype`` is the storage dtype (default: the source's): ``float16``, ``float32``,
    ``float64``, ``bfloat16`` (rounded to nearest even) or ``int8`` (quantised row-wise).
    ``format_version=2`` writes an uncompressed table in the format-2 row layout (rows at a
    fixed stride in ~64 MiB chunks, a crc32c per 4 KiB page: docs/FORMAT.md).

    Streamed in blocks: the source is never held in memory whole.  Returns the new table,
    opened read-only.  ``keys`` (default: the source table's keys) must be distinct.
    """
    with whole_table_at(path, overwrite, storage_options) as (folder, over):
        _write(folder, array_or_table, keys, chunk_rows=chunk_rows, shard_rows=shard_rows,
               compression=compression, overwrite=over, dtype=dtype,
               format_version=format_version)
    if storage_options is None:
        return ZarrTable(path, cache_bytes=cache_bytes)
    return ZarrTable(path, cache_bytes=cache_bytes, storage_options=storage_options)


def _write(path: PathLike, src: ArrayLike | Table, keys: KeysLike | None, *,
           chunk_rows: int | None, shard_rows: int | None, compression: Compression,
           overwrite: bool, dtype: DTypeLike | None, format_version: int | None,
           attrs: dict | None = None, staging: Callable[[str], None] | None = None) -> None:
    """``save``'s work: ``src`` streamed into a :class:`TableWriter` at ``path`` (``attrs``
    added to the group's, ``staging(dir)`` run on the staging directory before the commit)."""
    sub = None
    attrs = dict(attrs or {})
    if isinstance(src, Table):
        rows, dim = src.shape
        src_dtype = src.storage_dtype
        if keys is None and src.keys is not None:
            keys = src.keys
        sub = src.subwords  # a fastText table's n-grams go along
        if sub is not None:
            attrs["subwords"] = subword_attrs(minn=sub.minn, maxn=sub.maxn, bucket=sub.bucket)
        blocks = lambda n: src.iter_blocks(n)  # noqa: E731
    else:
        arr = np.asarray(src)
        if not (is_ml_bfloat16(arr) and arr.ndim == 2):  # ml_dtypes: stored as is
            arr = check_table_array(src)
        rows, dim = arr.shape
        src_dtype = arr.dtype.name
        blocks = lambda n: ((s, arr[s: s + n]) for s in range(0, rows, n))  # noqa: E731
    if keys is not None and len(keys) != rows:
        raise ShapeMismatchError(f"got {len(keys)} keys for a table of {rows} rows")
    dt = check_storage(dtype if dtype is not None else src_dtype)
    block = max(1, _SAVE_BLOCK_BYTES // max(1, dim * DTYPES[dt].logical.itemsize))
    with TableWriter(path, dim=dim, dtype=dt, has_keys=keys is not None,
                     chunk_rows=chunk_rows, shard_rows=shard_rows, compression=compression,
                     overwrite=overwrite, expected_rows=rows, duplicate_keys="error",
                     attrs=attrs, format_version=format_version) as w:
        if sub is not None:
            sub.copy_into(w.staging, dt, compression, _SAVE_BLOCK_BYTES)
        for start, part in blocks(block):
            if keys is None:
                w.add(part)
                continue
            kb = key_list(list(keys[start: start + part.shape[0]]))
            w.add(part, kb)
        if staging is not None:
            staging(w.staging)


_LAYOUT_ATTRS = ("format", "dim", "dtype", "chunk_rows", "shard_rows", "compression",
                 "has_keys", "created_by", "subwords")


def upgrade(path: PathLike, *, cache_bytes: Bytes = "auto") -> ZarrTable:
    """Rewrite the format-1 table at ``path`` as format 2 (docs/FORMAT.md), in one step: the
    new table is written beside it and swapped in as ``save(..., overwrite=True)`` does, with
    its keys, n-grams, provenance attributes and approximate index; rows read back the same.
    Uncompressed rows become a row array (fixed stride, a crc32c per page); a compressed
    table keeps its codec, chunks and shards.  A format-2 table is left as it is.  Returns
    the table, opened read-only."""
    refuse_in_place(path, "upgrade a local copy and copy it to object storage")
    with ZarrTable(path, cache_bytes=0) as src:
        info = src.info()
        if info.get("format") == 2:
            return ZarrTable(path, cache_bytes=cache_bytes)
        extra = {k: v for k, v in info.get("attributes", {}).items() if k not in _LAYOUT_ATTRS}
        extra["table_id"] = table_id(extra) or secrets.token_hex(16)  # (kept, or the first)
        ann = Path(os.fspath(path)) / "vectors" / ".embstore" / "ann"
        rows, commit = len(src), last_commit(Path(os.fspath(path)))

        def carry(staged: str) -> None:  # the approximate index: its rows did not change
            if ann.is_dir() and not ann.is_symlink():
                area = Path(staged) / "vectors" / ".embstore"
                area.mkdir(parents=True, exist_ok=True)
                shutil.copytree(ann, area / "ann", symlinks=False)
                retarget(area / "ann", rows=rows, commit=commit, table_id=extra["table_id"],
                         version=1)
        packed = info["compression"] not in ("none", None)  # (its codec, chunks and shards)
        _write(path, src, None, chunk_rows=info["chunk_rows"] if packed else None,
               shard_rows=info["shard_rows"] if packed else None,
               compression=info["compression"] if packed else "none",
               overwrite=True, dtype=src.storage_dtype, format_version=2, attrs=extra,
               staging=carry)
    return ZarrTable(path, cache_bytes=cache_bytes)

"""Writing format-v1 tables: the default layout, the streaming :class:`TableWriter`, and the
copy-on-write shard rewrite used by ``write``/``append`` (see docs/FORMAT.md)."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from .._version import __version__
from ..errors import DestinationExistsError, ShapeMismatchError
from ..keys.writer import KeyIndexWriter

from .codecs import COMPRESSIONS, Layout, make_codec
from .quant import (SCALE_ARRAY, STORAGE_DTYPES, bf16_decode, bf16_encode, bf16_finite,
                    code_dtype, int8_quantise, logical_dtype, storage_name)
from .shardwrite import RowStream, rewrite_shard

__all__ = ["TableWriter", "choose_layout", "rewrite_shard", "set_rows", "check_dtype",
           "check_storage"]

#: bytes per inner chunk (uncompressed).  A cold random row costs the pages of its chunk (its
#: crc32c is checked on first touch): a 1 KiB chunk + 4-byte checksum spans 1.25 pages on
#: average, a 4 KiB one always 2 (docs/FORMAT.md section 3 has the measurements)
CHUNK_TARGET = 1 << 10
#: compressed chunks are decoded whole on every read and read whole when cold: 1 KiB as well
#: (16,384 uniform ids on 1M x 256 float32 decode 16 MiB instead of 64; the price is size:
#: random normal floats store at 96% of raw instead of 90% with 4 KiB chunks)
CHUNK_TARGET_COMPRESSED = 1 << 10
SHARD_TARGET = 128 << 20  # bytes per shard
FLOAT_DTYPES = ("float16", "float32", "float64")
SCALE_CHUNK_ROWS = 512  # row_scale rows per chunk: 4 KiB, one page per cold touch


def check_storage(dtype) -> str:
    """The storage dtype name of ``dtype``: float16/32/64, bfloat16 or int8."""
    name = storage_name(dtype)
    if name is None:
        raise ShapeMismatchError(f"dtype must be one of {STORAGE_DTYPES}, got {dtype}")
    return name


def check_dtype(dtype) -> np.dtype:
    """A float dtype rows can be held in (the storage dtypes that NumPy has)."""
    dt = np.dtype(dtype)
    if dt.name not in FLOAT_DTYPES:
        raise ShapeMismatchError(f"dtype must be one of {FLOAT_DTYPES}, got {dt}")
    return dt


def _pow2_below(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1.0, x)))))


def choose_layout(dim: int, dtype, rows: int | None = None, *, chunk_rows: int | None = None,
                  shard_rows: int | None = None,
                  compression: str = "none") -> tuple[int, int]:
    """``(chunk_rows, shard_rows)``: the given values, or the defaults of docs/FORMAT.md.

    Rows per chunk and per shard are sized by the stored row (codes for bfloat16 and int8):
    about 1 KiB chunks, so a cold chunk read is about a page whatever the dtype, and the
    20 bytes each chunk adds (its crc32c and index entry) stay 2% of what is stored.  (With
    16 KiB chunks, sizing by the logical row made compact tables' cold reads 2-4x smaller;
    at 1 KiB it would only make their chunks 256-512 bytes and the overhead 4-8%.)
    """
    name = check_storage(dtype)
    rb = dim * code_dtype(name).itemsize
    for name, v in (("chunk_rows", chunk_rows), ("shard_rows", shard_rows)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    cr = chunk_rows
    if cr is None:
        cr = _pow2_below((CHUNK_TARGET if compression == "none" else CHUNK_TARGET_COMPRESSED)
                         / rb)
        if shard_rows is not None:
            cr = math.gcd(cr, int(shard_rows))
        elif rows is not None:
            cr = max(1, min(cr, rows))
    sr = shard_rows
    if sr is None:
        sr = cr * _pow2_below(SHARD_TARGET / (cr * rb))
        if rows is not None:
            sr = min(sr, max(cr, -(-rows // cr) * cr))
    if sr % cr:
        raise ValueError(f"shard_rows must be a multiple of chunk_rows: got shard_rows={sr}, "
                         f"chunk_rows={cr}")
    return int(cr), int(sr)


DECIDE_BYTES = 8 << 20  # pending bytes that make a table "large" (default layout)


def _replace_json(path: str, update) -> None:
    """Edit a JSON file atomically (temporary file + rename)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    update(doc)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def set_rows(root: str, rows: int, name: str = "vectors") -> None:
    """Set the row count of the array ``name`` at ``root`` (its zarr.json, atomically)."""
    def upd(doc):
        doc["shape"][0] = int(rows)
    _replace_json(os.path.join(root, name, "zarr.json"), upd)


class TableWriter:
    """Stream rows into a new table at ``path``; ``commit()`` renames it into place.

    Rows go to ``<path>.tmp-<random>`` beside ``path``.  At most one shard of rows is held in
    memory.  With ``has_keys``, ``add`` takes one key per row and drops rows whose key repeats
    an earlier one (the first occurrence wins; ``duplicates`` counts them).  Used as a context
    manager, it commits on success and aborts on an exception.
    """

    def __init__(self, path, *, dim: int, dtype="float32", has_keys: bool = False,
                 chunk_rows=None, shard_rows=None, compression="none", overwrite=False,
                 expected_rows: int | None = None, attrs: dict | None = None):
        import zarr
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ShapeMismatchError(f"dim must be a positive integer, got {dim!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.path = Path(os.fspath(path)).absolute()
        self.dim, self.storage = int(dim), check_storage(dtype)
        self.dtype = logical_dtype(self.storage)  # rows are checked as this, stored as codes
        self.compression, self.overwrite = compression, bool(overwrite)
        self._layout_args = (chunk_rows, shard_rows)
        choose_layout(self.dim, self.storage, expected_rows, chunk_rows=chunk_rows,
                      shard_rows=shard_rows, compression=compression)  # check arguments now
        self._check_dest()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.mkdtemp(prefix=f"{self.path.name}.tmp-", dir=self.path.parent)
        self.rows = 0
        self._seen = 0
        self._pending: list[tuple[np.ndarray, np.ndarray | None]] = []  # (codes, row_scale)
        self._pending_rows = 0
        self._streams: list[RowStream] = []  # vectors (and row_scale), once decided
        self._layout: Layout | None = None
        self._attrs = dict(attrs or {})
        self._done = False
        self._strict_keys = False  # save/create: duplicate keys are an error, not dropped
        try:
            self._group = zarr.open_group(self._tmp, mode="w")
            self._keys = None
            if has_keys:
                self._keys = KeyIndexWriter(self._group, expected=expected_rows)
            if shard_rows is not None or expected_rows is not None:
                self._decide(expected_rows)
        except BaseException:
            self.abort()
            raise

    def _check_dest(self) -> None:
        if os.path.lexists(self.path) and not self.overwrite:
            raise DestinationExistsError(
                f"{self.path} already exists (pass overwrite=True to replace it)")

    @property
    def duplicates(self) -> int:
        return 0 if self._keys is None else int(self._keys.duplicates)

    def _decide(self, rows: int | None) -> None:
        from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec
        cr, sr = choose_layout(self.dim, self.storage, rows, chunk_rows=self._layout_args[0],
                               shard_rows=self._layout_args[1], compression=self.compression)
        codes = code_dtype(self.storage)
        comp = {"none": [], "zstd": [ZstdCodec(level=0, checksum=False)],
                "blosc": [BloscCodec(cname="zstd", clevel=5, shuffle="shuffle",
                                     typesize=codes.itemsize)]}[self.compression]
        arr = self._group.create_array(
            "vectors", shape=(0, self.dim), dtype=codes, chunks=(cr, self.dim),
            shards=(sr, self.dim), serializer=BytesCodec(endian="little"),
            compressors=comp + [Crc32cCodec()], fill_value=0, dimension_names=("row", "dim"))
        meta = arr.metadata.to_dict()
        if self.storage == "bfloat16":  # zarr-python 3.1 has no bfloat16: written as uint16
            meta["data_type"] = "bfloat16"
            _replace_json(os.path.join(self._tmp, "vectors", "zarr.json"),
                          lambda doc: doc.update(data_type="bfloat16"))
        layout = Layout.from_metadata(meta)
        assert layout is not None and layout.has_crc
        self._layout = layout
        self._streams = [RowStream(os.path.join(self._tmp, "vectors"), layout,
                                   make_codec(self.compression, codes.itemsize))]
        if self.storage == "int8":
            scr = min(SCALE_CHUNK_ROWS, cr * _pow2_below(SCALE_CHUNK_ROWS / cr))
            ssr = max(scr, sr // scr * scr)
            sarr = self._group.create_array(
                SCALE_ARRAY, shape=(0, 2), dtype="float32", chunks=(scr, 2), shards=(ssr, 2),
                serializer=BytesCodec(endian="little"), compressors=[Crc32cCodec()],
                fill_value=0, dimension_names=("scale_row", "scale_field"))
            slayout = Layout.from_metadata(sarr.metadata.to_dict())
            assert slayout is not None
            self._streams.append(RowStream(os.path.join(self._tmp, SCALE_ARRAY), slayout, None))

    def add(self, vectors: np.ndarray, keys: list[str] | None = None) -> int:
        """Append a block of rows ``(n, dim)`` (with ``has_keys``, one key per row).

        Returns the rows kept (rows with a duplicate key are dropped).
        """
        if self._done:
            raise ValueError("this TableWriter is already committed or aborted")
        vec = np.asarray(vectors)
        if vec.dtype.name == "bfloat16" and vec.dtype.itemsize == 2:  # ml_dtypes: widen (exact)
            vec = bf16_decode(vec.view(np.uint16).reshape(vec.shape),
                              np.empty(vec.shape, np.float32))
        if vec.ndim != 2 or vec.shape[1] != self.dim or vec.dtype.kind not in "fiu":
            raise ShapeMismatchError(f"expected numeric vectors of shape (n, {self.dim}), got "
                                     f"shape {vec.shape} and dtype {vec.dtype}")
        with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
            vec = np.ascontiguousarray(vec, dtype=self.dtype)
        finite = np.isfinite(vec).all(axis=1)
        codes, scales = self._encode(vec)
        if self.storage == "bfloat16":
            finite &= bf16_finite(codes)  # the largest float32 values round to infinity
        if not finite.all():
            i = int(np.argmin(finite))
            err = ShapeMismatchError(
                f"input row {self._seen + i} (row {i} of this block) holds NaN or infinity"
                + (f" after conversion to {self.storage}" if np.isfinite(
                    np.asarray(vectors)[i]).all() else ""))
            err.row = self._seen + i
            raise err
        if self._keys is not None:
            if keys is None or len(keys) != vec.shape[0]:
                raise ShapeMismatchError(f"expected {vec.shape[0]} keys for {vec.shape[0]} "
                                         f"rows, got {'none' if keys is None else len(keys)}")
            mask = np.asarray(self._keys.add(keys), dtype=bool)
            if self._strict_keys and not mask.all():
                i = int(np.argmin(mask))
                raise ShapeMismatchError(f"key {keys[i]!r} at row {self._seen + i} repeats an "
                                         "earlier key (keys must be distinct)")
            if not mask.all():
                codes = codes[mask]
                scales = None if scales is None else scales[mask]
        elif keys is not None:
            raise ShapeMismatchError("this writer has no keys (has_keys=False), got keys")
        self._seen += len(finite)
        if codes.shape[0]:
            self._pending.append((codes, scales))
            self._pending_rows += codes.shape[0]
            self.rows += codes.shape[0]
            self._flush(final=False)
        return int(codes.shape[0])

    def _encode(self, vec: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(codes, row_scale)`` of finite-checked rows (row_scale for int8 only)."""
        if self.storage == "bfloat16":
            return bf16_encode(vec), None
        if self.storage == "int8":
            ok = np.isfinite(vec).all(axis=1)
            return int8_quantise(np.where(ok[:, None], vec, 0))
        return vec, None

    def _flush(self, *, final: bool) -> None:
        """Write every whole inner chunk that is pending (all rows when ``final``).

        The layout is fixed once ``DECIDE_BYTES`` are pending (the table is large: the
        default layout) or at the end (a small table: shards fitted to its size).  After
        that, chunks stream into the current shard file as they fill, so memory holds less
        than one chunk of rows beyond the block being added, never a whole shard.
        """
        if self._layout is None:
            if self._pending_rows * self.dim * self.dtype.itemsize < DECIDE_BYTES and not final:
                return
            self._decide(None if not final else self._pending_rows)
        for codes, scales in self._pending:
            self._streams[0].add(codes)
            if scales is not None:
                self._streams[1].add(scales)
        self._pending, self._pending_rows = [], 0
        if final:
            for stream in self._streams:
                stream.add(np.empty((0, stream.layout.dim), stream.layout.dtype), final=True)

    def _declare_zero_rows(self, n: int) -> None:
        """``create``: a table of ``n`` rows of zeros (no shard files: absent reads as zeros)."""
        if self.rows or self._layout is not None and self._streams[0].shards_done:
            raise ValueError("zero rows can only be declared on an empty writer")
        if self._layout is None:
            self._decide(n)
        self.rows = n
        for stream in self._streams:
            stream.skip_to(n)

    def commit(self) -> None:
        """Finish and rename the new table into place (open it with :func:`embstore.open`)."""
        if self._done:
            raise ValueError("this TableWriter is already committed or aborted")
        try:
            self._flush(final=True)
            if self._layout is None:
                self._decide(self.rows)
            if self._keys is not None:
                self._keys.finish()
            L = self._layout
            meta = {"format": 1, "dim": self.dim, "dtype": self.storage,
                    "chunk_rows": L.chunk_rows, "shard_rows": L.shard_rows,
                    "compression": self.compression, "has_keys": self._keys is not None,
                    "created_by": _created_by()}
            self._group.update_attributes({"embstore": {**self._attrs, **meta}})
            if self.storage == "int8":
                set_rows(self._tmp, self.rows, SCALE_ARRAY)
            set_rows(self._tmp, self.rows)
            self._check_dest()
            self._swap_in()
        except BaseException:
            self.abort()
            raise
        self._done = True

    def _swap_in(self) -> None:
        aside = None
        if os.path.lexists(self.path):
            aside = f"{self.path}.old-{uuid.uuid4().hex[:8]}"
            os.rename(self.path, aside)
        try:
            os.rename(self._tmp, self.path)
        except BaseException:
            if aside is not None:
                os.rename(aside, self.path)
            raise
        if aside is not None:
            if os.path.isdir(aside) and not os.path.islink(aside):
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.remove(aside)

    def abort(self) -> None:
        """Remove the temporary directory; ``path`` is left as it was."""
        self._done = True
        for stream in getattr(self, "_streams", ()):
            stream.abort()
        keys = getattr(self, "_keys", None)
        if keys is not None and hasattr(keys, "close"):
            keys.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _created_by() -> str:
    return f"embstore {__version__}"

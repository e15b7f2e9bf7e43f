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
from crc32c import crc32c

from .._version import __version__
from ..errors import DestinationExistsError, ShapeMismatchError
from ..keys.writer import KeyIndexWriter

from .codecs import ABSENT, COMPRESSIONS, Layout, encode_chunks, make_codec
from .shardread import ShardReader

__all__ = ["TableWriter", "choose_layout", "rewrite_shard", "set_rows", "check_dtype"]

CHUNK_TARGET = 16 << 10  # bytes per inner chunk (uncompressed)
CHUNK_TARGET_COMPRESSED = 4 << 10  # compressed chunks are decoded whole: keep them small
SHARD_TARGET = 128 << 20  # bytes per shard
FLOAT_DTYPES = ("float16", "float32", "float64")


def check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.name not in FLOAT_DTYPES:
        raise ShapeMismatchError(f"dtype must be one of {FLOAT_DTYPES}, got {dt}")
    return dt


def _pow2_below(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1.0, x)))))


def choose_layout(dim: int, dtype, rows: int | None = None, *, chunk_rows: int | None = None,
                  shard_rows: int | None = None,
                  compression: str = "none") -> tuple[int, int]:
    """``(chunk_rows, shard_rows)``: the given values, or the defaults of docs/FORMAT.md."""
    rb = dim * np.dtype(dtype).itemsize
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
STREAM_CHUNKS = 256  # inner chunks encoded per write while streaming a shard


class _ShardStream:
    """One shard file being written: chunks appended as they come, the index at the end."""

    def __init__(self, path: str, layout: Layout, codec):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.f = open(path, "wb")
        self.layout, self.codec = layout, codec
        self.index = np.full((layout.n_inner, 2), ABSENT, dtype="<u8")
        self.pos = 0
        self.chunks = 0

    def write(self, rows: np.ndarray) -> None:
        """Rows for the next whole chunks (the last chunk of the table may be partial)."""
        for part in encode_chunks(rows, self.layout, self.codec):
            self.f.write(part)
            self.index[self.chunks] = (self.pos, len(part))
            self.pos += len(part)
            self.chunks += 1

    def close(self) -> None:
        body = self.index.tobytes()
        self.f.write(body)
        if self.layout.index_crc:
            self.f.write(crc32c(body).to_bytes(4, "little"))
        self.f.close()


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


def set_rows(root: str, rows: int) -> None:
    """Set the row count of the ``vectors`` array at ``root`` (its zarr.json, atomically)."""
    def upd(doc):
        doc["shape"][0] = int(rows)
    _replace_json(os.path.join(root, "vectors", "zarr.json"), upd)


def rewrite_shard(reader: ShardReader, k: int, local: np.ndarray, values: np.ndarray,
                  valid_rows: int) -> None:
    """Rewrite shard ``k`` with rows ``local`` (shard-relative, distinct) set to ``values``.

    ``valid_rows`` rows of the shard are inside the array after the change.  Untouched chunks
    are copied as stored; touched ones are decoded, patched and encoded again.  The new shard
    replaces the old file by an atomic rename, so readers see the old or the new shard whole.
    """
    L = reader.layout
    cr = L.chunk_rows
    old = reader.shard(k)
    n_valid = -(-valid_rows // cr)
    touched = np.unique(local // cr)
    dec = reader.decode_chunks(k * L.n_inner + touched)
    slot = np.searchsorted(touched, local // cr)
    dec.reshape(-1, L.dim)[slot * cr + local % cr] = values
    fresh = encode_chunks(dec.reshape(-1, L.dim), L, reader.codec)
    # segments of the new file: each touched chunk alone, and runs of untouched chunks that
    # lie back to back in the old file (copied with one write each, not chunk by chunk)
    offs, nbs = old.offsets[:n_valid], old.nbytes[:n_valid]
    is_t = np.zeros(n_valid, dtype=bool)
    is_t[touched] = True
    present = offs >= 0
    joined = np.zeros(n_valid, dtype=bool)
    joined[1:] = ((offs[1:] == offs[:-1] + nbs[:-1]) & present[1:] & present[:-1]
                  & ~is_t[1:] & ~is_t[:-1])
    starts = np.flatnonzero(~joined).tolist() + [n_valid]
    slot_of = {int(c): j for j, c in enumerate(touched.tolist())}
    index = np.full((L.n_inner, 2), ABSENT, dtype="<u8")
    path = old.path
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        os.makedirs(os.path.dirname(tmp), exist_ok=True)  # a shard never written before
        with open(tmp, "wb") as f:
            pos = 0
            for a, b in zip(starts[:-1], starts[1:]):  # a loop per segment
                if is_t[a]:
                    piece = fresh[slot_of[a]]
                    f.write(piece)
                    index[a] = (pos, len(piece))
                    pos += len(piece)
                elif present[a]:
                    lo, hi = int(offs[a]), int(offs[b - 1] + nbs[b - 1])
                    f.write(old.buf[lo:hi])
                    index[a:b, 0] = pos + (offs[a:b] - lo)
                    index[a:b, 1] = nbs[a:b]
                    pos += hi - lo
            body = index.tobytes()
            f.write(body)
            if L.index_crc:
                f.write(crc32c(body).to_bytes(4, "little"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    reader.forget([k])


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
        self.dim, self.dtype = int(dim), check_dtype(dtype)
        self.compression, self.overwrite = compression, bool(overwrite)
        self._layout_args = (chunk_rows, shard_rows)
        choose_layout(self.dim, self.dtype, expected_rows, chunk_rows=chunk_rows,
                      shard_rows=shard_rows, compression=compression)  # check arguments now
        self._check_dest()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.mkdtemp(prefix=f"{self.path.name}.tmp-", dir=self.path.parent)
        self.rows = 0
        self._seen = 0
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0
        self._shards_done = 0
        self._stream: _ShardStream | None = None
        self._layout: Layout | None = None
        self._codec = None
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
        cr, sr = choose_layout(self.dim, self.dtype, rows, chunk_rows=self._layout_args[0],
                               shard_rows=self._layout_args[1], compression=self.compression)
        comp = {"none": [], "zstd": [ZstdCodec(level=0, checksum=False)],
                "blosc": [BloscCodec(cname="zstd", clevel=5, shuffle="shuffle",
                                     typesize=self.dtype.itemsize)]}[self.compression]
        arr = self._group.create_array(
            "vectors", shape=(0, self.dim), dtype=self.dtype, chunks=(cr, self.dim),
            shards=(sr, self.dim), serializer=BytesCodec(endian="little"),
            compressors=comp + [Crc32cCodec()], fill_value=0)
        layout = Layout.from_metadata(arr.metadata.to_dict())
        assert layout is not None and layout.has_crc
        self._layout = layout
        self._codec = make_codec(self.compression, self.dtype.itemsize)

    def add(self, vectors: np.ndarray, keys: list[str] | None = None) -> int:
        """Append a block of rows ``(n, dim)`` (with ``has_keys``, one key per row).

        Returns the rows kept (rows with a duplicate key are dropped).
        """
        if self._done:
            raise ValueError("this TableWriter is already committed or aborted")
        vec = np.asarray(vectors)
        if vec.ndim != 2 or vec.shape[1] != self.dim or vec.dtype.kind not in "fiu":
            raise ShapeMismatchError(f"expected numeric vectors of shape (n, {self.dim}), got "
                                     f"shape {vec.shape} and dtype {vec.dtype}")
        with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
            vec = np.ascontiguousarray(vec, dtype=self.dtype)
        finite = np.isfinite(vec).all(axis=1)
        if not finite.all():
            i = int(np.argmin(finite))
            err = ShapeMismatchError(
                f"input row {self._seen + i} (row {i} of this block) holds NaN or infinity"
                + (f" after conversion to {self.dtype}" if np.isfinite(
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
                vec = vec[mask]
        elif keys is not None:
            raise ShapeMismatchError("this writer has no keys (has_keys=False), got keys")
        self._seen += len(finite)
        if vec.shape[0]:
            self._pending.append(vec)
            self._pending_rows += vec.shape[0]
            self.rows += vec.shape[0]
            self._flush(final=False)
        return int(vec.shape[0])

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
        cr = self._layout.chunk_rows
        block = (np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
                 if self._pending else np.empty((0, self.dim), self.dtype))
        whole = block.shape[0] if final else block.shape[0] // cr * cr
        start = 0
        while start < whole:
            if self._stream is None:
                self._stream = _ShardStream(self._shard_path(self._shards_done), self._layout,
                                            self._codec)
            room = (self._layout.n_inner - self._stream.chunks) * cr
            take = min(whole - start, room, STREAM_CHUNKS * cr)
            self._stream.write(block[start: start + take])
            start += take
            if self._stream.chunks == self._layout.n_inner:
                self._stream.close()
                self._stream = None
                self._shards_done += 1
        rest = block[whole:]
        self._pending = [rest] if rest.shape[0] else []
        self._pending_rows = rest.shape[0]
        if final and self._stream is not None:
            self._stream.close()
            self._stream = None
            self._shards_done += 1

    def _shard_path(self, i: int) -> str:
        L = self._layout
        return os.path.join(self._tmp, "vectors", *L.shard_key(i).split(L.separator))

    def _declare_zero_rows(self, n: int) -> None:
        """``create``: a table of ``n`` rows of zeros (no shard files: absent reads as zeros)."""
        if self.rows or self._layout is not None and self._shards_done:
            raise ValueError("zero rows can only be declared on an empty writer")
        if self._layout is None:
            self._decide(n)
        self.rows = n
        self._shards_done = -(-n // self._layout.shard_rows)

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
            meta = {"format": 1, "dim": self.dim, "dtype": self.dtype.name,
                    "chunk_rows": L.chunk_rows, "shard_rows": L.shard_rows,
                    "compression": self.compression, "has_keys": self._keys is not None,
                    "created_by": _created_by()}
            self._group.update_attributes({"embstore": {**self._attrs, **meta}})
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
        if getattr(self, "_stream", None) is not None:
            self._stream.f.close()
            self._stream = None
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

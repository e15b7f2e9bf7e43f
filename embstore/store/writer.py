"""Writing new tables (format 2, versioned, whatever the layout of their row arrays: rows at
a fixed stride, or sharded chunks with a codec): the default layout and the streaming
:class:`TableWriter` (see docs/FORMAT.md; shard files are written by
:mod:`embstore.store.shard.write`, row chunks by :mod:`embstore.store.rows.stream`)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import DTypeLike

from ..fs import atomic
from .._types import PathLike
from .._version import __version__
from ..dtypes import check_dtype, check_storage
from ..errors import InvalidOptionError, ShapeMismatchError
from ..ids import non_negative_int, one_of, positive_int
from ..keys.writer import KeyIndexWriter

from ..fs.beside import fsync_path as _fsync, fsync_tree
from .codecs import (COMPRESSIONS, SIDE_CHUNK_ROWS, Compression, Layout, choose_layout,
                     make_codec, pow2_below)
from .norms.calc import NORMS_ARRAY, create_norms_stream, create_paged_side
from .rows.norms import decoded_norms
from ..dtypes import DTYPES
from ..dtypes.bfloat16 import widen
from .versions.commit import first_version
from .meta import FORMATS, MAX_DIM, replace_json, set_data_type, set_rows
from .rowinit import ATTR, norms_init
from .shard import arena
from .rows.layout import PAGE, choose_chunk_rows, min_chunk_rows
from .rows.stream import PagedStream, create_row_arrays
from .shard.write import AsyncWrites, BackgroundSync, RowStream

__all__ = ["TableWriter", "check_dtype", "check_storage"]

DECIDE_BYTES = 8 << 20  # pending bytes that make a table "large" (default layout)


def rows_layout(row_bytes: int, chunk_rows: int | None, shard_rows: int | None,
                compression: str, asked: int | None) -> bool:
    """Whether ``vectors`` of a new table is a row array (rows at a fixed stride, a crc32c
    per page: docs/FORMAT.md, "Array layouts") rather than sharded chunks with a codec.
    By default: uncompressed rows where this system maps them, unless a sharded layout is
    asked for (``chunk_rows`` or ``shard_rows``: inner chunks and shards).  With
    ``format_version=2`` (``asked``) a row array's ~64 MiB chunks are asked for with
    ``chunk_rows``; ``format_version=1`` (legacy tables) is always sharded.  The layout is
    the writer's choice of speed or size: readers see the same versioned table either
    way."""
    if asked == 1 or compression != "none" or row_bytes <= 0 or shard_rows is not None:
        return False
    if asked == 2:
        return True
    return chunk_rows is None and arena.available()


class TableWriter:
    """Stream rows into a new table at ``path``; ``commit()`` renames it into place.

    Rows go to a temporary directory beside ``path`` (see :mod:`embstore.fs.atomic`); at most
    one shard of rows is held in memory.  Used as a context manager, it commits on success
    and aborts on an exception::

        with TableWriter(path, dim=300, has_keys=True) as w:
            for vectors, keys in blocks:
                w.add(vectors, keys)        # rows kept; w.rows, w.duplicates so far

    - ``dim``, ``dtype`` (a storage dtype, :mod:`embstore.dtypes`), ``chunk_rows``,
      ``shard_rows``, ``compression``: the table's layout (defaults: docs/FORMAT.md);
      ``expected_rows`` (when known) fits the default layout to a small table.
    - ``has_keys``: ``add`` takes one key per row.  ``duplicate_keys="drop"`` (the default)
      drops a row whose key repeats an earlier one (the first occurrence wins;
      ``duplicates`` counts them); ``"error"`` raises :class:`ShapeMismatchError` naming it.
    - ``add_zeros(n, keys)``: on an empty writer, a table of ``n`` rows of zeros without
      writing them (absent chunks read as zeros); nothing can be added after it.
    - ``overwrite``: replace an existing ``path`` (else :class:`DestinationExistsError`);
      ``attrs``: more fields for the group's ``embstore`` attributes.
    - ``commit()`` renames the table into place (open it with :func:`embstore.open`);
      ``abort()`` removes the temporary directory.
    """

    def __init__(self, path: PathLike, *, dim: int, dtype: DTypeLike = "float32",
                 has_keys: bool = False, chunk_rows: int | None = None,
                 shard_rows: int | None = None, compression: Compression = "none",
                 overwrite: bool = False, expected_rows: int | None = None,
                 attrs: dict | None = None,
                 duplicate_keys: Literal["drop", "error"] = "drop",
                 format_version: int | None = None, init: dict | None = None):
        import zarr
        if dim == 0 and not isinstance(dim, bool):  # as torch's nn.Embedding(n, 0)
            raise ShapeMismatchError("a stored table needs dim >= 1 (Zarr chunks of 0-value "
                                     "rows hold nothing); a MemoryTable takes dim 0")
        if positive_int(dim, "dim", error=ShapeMismatchError) > MAX_DIM:  # the reader's bound
            raise ShapeMismatchError(f"dim {dim}: more than the {MAX_DIM} values a table's row "
                                     "may hold (no reader would open the table)")
        one_of(compression, "compression", COMPRESSIONS)
        self.path = Path(os.fspath(path)).absolute()
        self.dim, self.storage = int(dim), check_storage(dtype)
        self.record = DTYPES[self.storage]
        self.dtype = self.record.logical  # rows are checked as this, stored as codes
        self.compression, self.overwrite = compression, bool(overwrite)
        if format_version is not None and format_version not in FORMATS:
            raise InvalidOptionError(f"format_version must be one of {FORMATS}, got "
                                     f"{format_version!r}")
        # every new table is format 2 (versioned); its row arrays' layout is chosen here
        self.format = 1 if format_version == 1 else 2
        self.rows_layout = rows_layout(self.dim * self.record.code.itemsize, chunk_rows,
                                       shard_rows, compression, format_version)
        self._layout_args = (chunk_rows, shard_rows)
        choose_layout(self.dim, self.storage, expected_rows, chunk_rows=chunk_rows,
                      shard_rows=shard_rows, compression=compression)  # check arguments now
        atomic.check_dest(self.path, self.overwrite)
        self._tmp = atomic.temp_dir(self.path)  # (killed writers' leftovers swept first)
        self._sync = BackgroundSync()  # shard files are fsynced while the next is encoded
        self._io = AsyncWrites()  # a block is written while the next is encoded
        self.rows = 0
        self._seen = 0
        self._pending: list[list[np.ndarray]] = []  # codes, [row_scale], norms: per stream
        self._pending_rows = 0
        self._streams: list[Any] = []  # vectors, (row_scale), norms, once decided
        self._layout: Layout | None = None
        self._attrs = dict(attrs or {})
        self._done = False
        self._strict_keys = one_of(duplicate_keys, "duplicate_keys", ("drop", "error")) == "error"
        self._zeros = False  # add_zeros() was called: the table is complete
        # init (complete) where add_init() can leave rows unwritten (format-2 float rows)
        self._init: dict | None = dict(init) if init is not None and self.rows_layout and \
            self.format == 2 and self.record.side is None else None
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

    @property
    def staging(self) -> str:  # the directory written (renamed to path by commit): add arrays
        return os.fspath(self._tmp)

    @property
    def duplicates(self) -> int:
        return 0 if self._keys is None else int(self._keys.duplicates)

    @property
    def duplicate_keys(self) -> list[str]:
        """The first few keys dropped as duplicates (up to 5), in the order met."""
        return [] if self._keys is None else list(self._keys.duplicate_keys)

    def _decide(self, rows: int | None) -> None:
        from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec
        cr, sr = choose_layout(self.dim, self.storage, rows, chunk_rows=self._layout_args[0],
                               shard_rows=self._layout_args[1], compression=self.compression)
        record = self.record
        codes = record.code
        by_name: dict[str, list[Any]] = {
            "none": [], "zstd": [ZstdCodec(level=0, checksum=False)],
            "blosc": [BloscCodec(cname="zstd", clevel=5, shuffle="shuffle",
                                 typesize=codes.itemsize)]}
        comp = by_name[self.compression]
        if self.rows_layout:  # every row array: rows at a fixed stride (FORMAT.md §3a)
            vectors_chunk_rows = self._decide_rows(rows)
            side_rows = None if self._init is not None else rows  # (lazy: chunks aligned)
            self._streams += create_paged_side(self._group, self._tmp, record, side_rows,
                                               self._sync,
                                               vectors_chunk_rows)
            return
        arr = self._group.create_array(
            "vectors", shape=(0, self.dim), dtype=record.zarr_dtype, chunks=(cr, self.dim),
            shards=(sr, self.dim), serializer=BytesCodec(endian="little"),
            compressors=comp + [Crc32cCodec()], fill_value=0, dimension_names=("row", "dim"))
        meta = arr.metadata.to_dict()
        if record.zarr_dtype != record.name:  # zarr-python 3.1 has no bfloat16: uint16 first
            meta["data_type"] = record.name
            set_data_type(os.path.join(self._tmp, "vectors", "zarr.json"), record.name)
        layout = Layout.from_metadata(meta)
        assert layout is not None and layout.has_crc
        self._layout = layout
        self._streams = [RowStream(os.path.join(self._tmp, "vectors"), layout,
                                   make_codec(self.compression, codes.itemsize), self._sync)]
        side = record.side
        if side is not None:  # int8's row scales: an array of their own, 4 KiB chunks
            scr = min(SIDE_CHUNK_ROWS, cr * pow2_below(SIDE_CHUNK_ROWS / cr))
            ssr = max(scr, sr // scr * scr)
            sarr = self._group.create_array(
                side.name, shape=(0, side.columns), dtype=side.dtype, chunks=(scr, side.columns),
                shards=(ssr, side.columns), serializer=BytesCodec(endian="little"),
                compressors=[Crc32cCodec()], fill_value=0, dimension_names=side.dimension_names)
            slayout = Layout.from_metadata(sarr.metadata.to_dict())
            assert slayout is not None
            self._streams.append(RowStream(os.path.join(self._tmp, side.name), slayout, None,
                                           self._sync))
        self._streams.append(create_norms_stream(self._group, self._tmp, self.storage, cr, sr,
                                                 self._sync))  # the rows' norms (norms/calc.py)

    def _decide_rows(self, rows: int | None) -> int:
        """Make ``vectors`` a format-2 row array (docs/FORMAT.md §3a); return its chunk rows."""
        rb = self.dim * self.record.code.itemsize
        cr = self._layout_args[0] or choose_chunk_rows(rb, rows)
        if (cr * rb) % PAGE and (rows is None or rows > cr):
            raise InvalidOptionError(f"chunk_rows={cr} makes chunks of {cr * rb} bytes: "
                                     f"format 2 needs whole 4 KiB pages (a multiple of "
                                     f"{min_chunk_rows(rb)} rows)")
        stream, rl = create_row_arrays(self._group, self._tmp, self.record, self.dim, cr,
                                       self._sync, set_data_type)
        self._streams = [stream]
        self._layout = Layout(rows=0, dim=self.dim, dtype=rl.dtype, chunk_rows=cr, shard_rows=cr,
                              compression="none", has_crc=False, index_crc=False,
                              separator="/", fill_value=0.0)  # (what commit records)
        return cr

    def add(self, vectors: np.ndarray, keys: list[str] | None = None) -> int:
        """Append a block of rows ``(n, dim)`` (with ``has_keys``, one key per row).

        Returns the rows kept (rows with a duplicate key are dropped).
        """
        self._check_open()
        if self._zeros:
            raise ValueError("add_zeros() made this table complete; nothing can be added")
        vec = widen(np.asarray(vectors))  # ml_dtypes' bfloat16 arrays: float32 (exact)
        if vec.ndim != 2 or vec.shape[1] != self.dim or vec.dtype.kind not in "fiu":
            raise ShapeMismatchError(f"expected numeric vectors of shape (n, {self.dim}), got "
                                     f"shape {vec.shape} and dtype {vec.dtype}")
        with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
            vec = np.ascontiguousarray(vec, dtype=self.dtype)
        codes, scales = self.record.encode(vec)
        norms = decoded_norms(self.record, codes, scales)  # (NaN or inf: a row that is, or
        finite = np.isfinite(norms[:, 0])  # a float64 one whose squares overflow: rechecked)
        if self.record.side is not None:  # int8 codes a non-finite row as zeros: the input
            finite = np.isfinite(vec).all(axis=1)
        elif not finite.all():
            bad = np.flatnonzero(~finite)
            finite[bad] = np.isfinite(vec[bad]).all(axis=1)
        coded_finite = self.record.finite(codes)  # bfloat16: the largest float32 round to inf
        if coded_finite is not None:
            finite &= coded_finite
        if not finite.all():
            i = int(np.argmin(finite))
            err = ShapeMismatchError(
                f"input row {self._seen + i} (row {i} of this block) holds NaN or infinity"
                + (f" after conversion to {self.storage}" if np.isfinite(
                    np.asarray(vectors)[i]).all() else ""))
            err.row = self._seen + i
            raise err
        return self._keep(codes, scales, norms, keys)

    def add_stored(self, codes: np.ndarray, side: np.ndarray | None = None,
                   keys: list[str] | None = None) -> int:
        """Append rows as a table stores them: codes (and side rows, int8's row scales),
        not encoded again (re-quantising decoded int8 rows changes codes).  Returns the
        rows kept."""
        self._check_open()
        if self._zeros:
            raise ValueError("add_zeros() made this table complete; nothing can be added")
        codes = np.ascontiguousarray(codes, dtype=self.record.code)
        if codes.ndim != 2 or codes.shape[1] != self.dim or (self.record.side is None) != (
                side is None):
            raise ShapeMismatchError(f"expected {self.storage} codes of shape (n, {self.dim})"
                                     f"{' with row scales' if self.record.side else ''}, got "
                                     f"shape {codes.shape}")
        return self._keep(codes, side, decoded_norms(self.record, codes, side), keys)

    def _keep(self, codes: np.ndarray, scales: np.ndarray | None, norms: np.ndarray,
              keys: list[str] | None) -> int:
        """Keep encoded rows (those whose key is new, with ``has_keys``) for writing."""
        n = codes.shape[0]
        if self._keys is not None:
            if keys is None or len(keys) != codes.shape[0]:
                raise ShapeMismatchError(f"expected {codes.shape[0]} keys for {codes.shape[0]} "
                                         f"rows, got {'none' if keys is None else len(keys)}")
            mask = self._add_keys(keys)  # (names rows from _seen: counted after)
            if not mask.all():
                codes, norms = codes[mask], norms[mask]
                scales = None if scales is None else scales[mask]
        elif keys is not None:
            raise ShapeMismatchError("this writer has no keys (has_keys=False), got keys")
        self._seen += n
        if codes.shape[0]:
            self._pending.append([codes] + ([] if scales is None else [scales]) + [norms])
            self._pending_rows += codes.shape[0]
            self.rows += codes.shape[0]
            self._flush(final=False)
        return int(codes.shape[0])

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
        pending, self._pending, self._pending_rows = self._pending, [], 0

        def write() -> None:
            for parts in pending:
                for stream, part in zip(self._streams, parts):
                    stream.add(part)
        self._io.submit(write)
        if final:
            self._io.wait()
            for stream in self._streams:
                stream.add(np.empty((0, stream.layout.dim), stream.layout.dtype), final=True)

    def _check_open(self) -> None:
        if self._done:
            raise ValueError("this TableWriter is already committed or aborted")

    def _add_keys(self, keys: Sequence[str]) -> np.ndarray:
        """Record keys of the next rows; the mask of rows kept (see ``duplicate_keys``)."""
        assert self._keys is not None
        mask = np.asarray(self._keys.add(keys), dtype=bool)
        if self._strict_keys and not mask.all():
            i = int(np.argmin(mask))
            raise ShapeMismatchError(f"key {keys[i]!r} at row {self._seen + i} repeats an "
                                     "earlier key (keys must be distinct)")
        return mask

    def add_zeros(self, n: int, keys: Sequence[str] | None = None) -> None:
        """Make this (empty) writer a table of ``n`` rows of zeros, one key per row with
        ``has_keys``.  No shard files are written: absent chunks read as zeros."""
        self._check_open()
        n = non_negative_int(n, "n")
        if self._seen or self._zeros:
            raise ValueError("add_zeros() needs an empty writer")
        if self._keys is not None:
            if keys is None or len(keys) != n:
                raise ShapeMismatchError(f"expected {n} keys for {n} rows, got "
                                         f"{'none' if keys is None else len(keys)}")
            self._add_keys(keys)
        elif keys is not None:
            raise ShapeMismatchError("this writer has no keys (has_keys=False), got keys")
        if self._layout is None:
            self._decide(n)
        self.rows = self._seen = n
        for stream in self._streams:  # (never written: format-2 row arrays only)
            stream.skip_to(n, **({"never_written": True} if self._init is not None else {}))
        self._zeros = True

    def add_init(self, n: int, keys: Sequence[str] | None = None) -> None:
        """Make this (empty) writer a table of ``n`` rows initialised by its ``init`` (a
        complete ``check_init`` spec) without writing them (docs/FORMAT.md §3e), where
        :attr:`lazy_ok`; nothing can be added after it."""
        spec = self._init
        if spec is None:
            raise ValueError("add_init() needs init= and format-2 row arrays of a float dtype")
        self.add_zeros(n, keys)  # (the layout, the keys: as zeros, the chunks marked)
        vectors = os.path.join(self._tmp, "vectors", "zarr.json")
        replace_json(vectors, lambda d: d.setdefault("attributes", {}).update({ATTR: spec}))
        replace_json(os.path.join(self._tmp, NORMS_ARRAY, "zarr.json"), lambda d: d.setdefault(
            "attributes", {}).update({ATTR: norms_init(spec, self.dim, self.storage)}))

    lazy_ok = property(lambda self: self._init is not None,
                       doc="Whether add_init() can (init given; format-2 float row arrays)")

    def commit(self) -> None:
        """Finish and rename the new table into place (open it with :func:`embstore.open`)."""
        self._check_open()
        try:
            self._flush(final=True)
            self._io.close()
            if self._layout is None:
                self._decide(self.rows)
            if self._keys is not None:
                self._keys.finish()
            L = self._layout
            assert L is not None
            meta = {"format": self.format, "dim": self.dim, "dtype": self.storage,
                    "chunk_rows": L.chunk_rows, "shard_rows": L.shard_rows,
                    "compression": self.compression, "has_keys": self._keys is not None,
                    "created_by": f"embstore {__version__}"}
            if self.format == 2:  # (format 1 as it was: no id, docs/FORMAT.md section 2)
                meta["table_id"] = self._attrs.get("table_id") or secrets.token_hex(16)
            self._group.update_attributes({"embstore": {**self._attrs, **meta}})
            if self.record.side is not None:
                set_rows(self._tmp, self.rows, self.record.side.name)
            set_rows(self._tmp, self.rows, NORMS_ARRAY)
            for s in self._streams:
                if isinstance(s, PagedStream):  # format 2: chunks of page checksums
                    set_rows(self._tmp, -(-self.rows // s.layout.chunk_rows),
                             os.path.basename(s.crc_root))
            set_rows(self._tmp, self.rows)
            if self.format == 2:  # its first version, whatever its layout (FORMAT.md §6e)
                first_version(Path(self._tmp), {"kind": "save", "rows": int(self.rows)})
            atomic.check_dest(self.path, self.overwrite)
            self._swap_in()
        except BaseException:
            self.abort()
            raise
        self._done = True

    def _swap_in(self) -> None:
        self._sync.wait()
        fsync_tree(self._tmp)  # the new table is on disk before it takes the name
        atomic.replace(self._tmp, self.path)  # one atomic exchange where the system has one
        try:
            _fsync(self.path.parent, directory=True)
        except OSError:
            pass

    def abort(self) -> None:
        """Remove the temporary directory; ``path`` is left as it was.  Never raises: on a
        full disk, closing the open shard file fails too, and the files must go anyway."""
        self._done = True
        if getattr(self, "_io", None) is not None:
            self._io.close()  # (a block in flight finishes or fails first)
        for stream in getattr(self, "_streams", ()):
            stream.abort()
        sync = getattr(self, "_sync", None)
        if sync is not None:
            sync.close()
        keys = getattr(self, "_keys", None)
        if keys is not None and hasattr(keys, "close"):
            try:
                keys.close()
            except OSError:
                pass
        if getattr(self, "_tmp", None) is not None:
            atomic.remove(self._tmp)  # never raises: a full disk must not hide the error

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()


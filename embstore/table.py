"""The contract every backend shares.

A :class:`Table` is a ``(vocab_size, dim)`` matrix of floats, optionally with one string
key per row.  Subclasses implement a handful of primitives (``_gather``, ``_read_rows``,
``_write_rows``, ``_append_rows``, and a vocabulary object); everything the user calls -
id validation, shapes, ``out=`` buffers, slices, keys - is written once here.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from ._types import KeysLike
from .cache.rows import CacheInfo
from .dasktable import to_dask, to_xarray
from .dtypes.bfloat16 import widen
from .errors import (ClosedTableError, InvalidOptionError, KeyNotFoundError, ReadOnlyError,
                     ShapeMismatchError, table_label)
from .ids import (alloc_result, as_ids, as_key_array, at_position, check_out,
                  check_result_size, memory_refused, position_of, positive_int,
                  refuse_existing)
from .ids import key_list as ids_key_list
from .oov import KEY_OOV_MODES, OOV, NgramMatrix, check_oov, map_oov, subword_rows

__all__ = ["Table", "Vocab"]


class Vocab(abc.ABC):
    """Keys <-> ids.  Backends provide one; :class:`Table` builds the key API on it."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row ids (int64) of a 1-D array of ``str`` keys, -1 where absent."""

    @abc.abstractmethod
    def key_at(self, ids: np.ndarray) -> list[str]:
        """Keys of the given (validated, 1-D int64) row ids."""

    def keys_between(self, start: int, stop: int) -> list[str]:
        return self.key_at(np.arange(start, stop, dtype=np.int64))

    def utf8_between(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``(utf8, lengths)``: the UTF-8 bytes of keys ``start..stop-1`` back to back (uint8)
        and each key's length in bytes (int64), for writers of keys as bytes, where the
        vocabulary holds the bytes (no ``str`` made a key); None where it holds ``str``."""
        return None


class KeySequence(Sequence):
    """The read-only, lazy ``Table.keys`` view: ``len``, index, slice, iteration in blocks."""

    _BLOCK = 65536

    def __init__(self, vocab: Vocab):
        self._vocab = vocab

    def __len__(self) -> int:
        return len(self._vocab)

    def __getitem__(self, index):
        n = len(self._vocab)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return self._vocab.keys_between(start, max(start, stop))
            return self._vocab.key_at(np.arange(start, stop, step, dtype=np.int64))
        if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)) \
                and -n <= index < 0:
            index = int(index) + n  # Python sequence semantics for a single negative index
        ids = as_ids(index, n)
        if ids.ndim == 0:
            return self._vocab.key_at(ids.reshape(1))[0]
        return self._vocab.key_at(ids.reshape(-1))

    def utf8_between(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Keys ``start..stop-1`` (clamped as a slice is) as UTF-8 bytes back to back and
        their lengths in bytes, or None: :meth:`Vocab.utf8_between`."""
        start, stop, _ = slice(start, stop).indices(len(self._vocab))
        return self._vocab.utf8_between(start, max(start, stop))

    def __iter__(self) -> Iterator[str]:
        n = len(self._vocab)
        for start in range(0, n, self._BLOCK):
            yield from self._vocab.keys_between(start, min(n, start + self._BLOCK))

    def __contains__(self, key) -> bool:
        if not isinstance(key, str):
            return False
        return bool(self._vocab.find(np.array([key], dtype=object))[0] >= 0)

    def index(self, key, start=0, stop=None) -> int:  # O(log n), not a scan
        i = int(self._vocab.find(np.array([key], dtype=object))[0])
        if i < 0:
            raise ValueError(f"{key!r} is not in the keys")
        return i

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(repr(k) for k in self[: min(n, 5)])
        return f"KeySequence([{head}{', ...' if n > 5 else ''}], len={n})"


class Table(abc.ABC):
    """An embedding table: ``vocab_size`` rows of ``dim`` values, optional keys."""

    _closed = False

    # -- what a backend provides -------------------------------------------------
    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, int]: ...

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype: ...

    @property
    def writable(self) -> bool:
        return False

    def _vocab(self) -> Vocab | None:
        return None

    @abc.abstractmethod
    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (shape ``(len(ids), dim)``, C-contiguous) with rows ``ids``.

        ``ids`` is a validated 1-D int64 array (any order, duplicates allowed).
        """

    def _read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start..stop-1`` as a new array (backends override with a contiguous read)."""
        out = alloc_result((stop - start, self.dim), self.dtype)
        self._gather(np.arange(start, stop, dtype=np.int64), out)
        return out

    def _write_rows(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        raise ReadOnlyError(f"{table_label(self)} is read-only")

    def _append_rows(self, vectors: np.ndarray, keys: list[str] | None) -> int | None:
        """Store rows at the end; returns the first new id (None: ``vocab_size`` before)."""
        raise ReadOnlyError(f"{table_label(self)} is read-only")

    # -- geometry ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.shape[0]

    @property
    def dim(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.vocab_size * self.dim * self.dtype.itemsize

    @property
    def storage_dtype(self) -> str:
        """The dtype rows are stored in (on-disk tables may store ``bfloat16`` or ``int8``
        codes and return :attr:`dtype` rows); here the same as :attr:`dtype`."""
        return self.dtype.name

    # -- what a backend may have (declared here, so callers need no getattr probes) ------
    path: Any = None
    """Where the table is stored (a directory, or a URL on object storage); None in memory."""
    version: int = 0
    """The version this handle reads (docs/FORMAT.md §6a); 0: a table without versions."""
    _appends_check_keys = False  # _append_rows refuses keys the table holds (on disk)

    @property
    def is_remote(self) -> bool:
        """Whether the rows are on object storage (a URL)."""
        return False

    @property
    def layout(self) -> dict | None:
        """How stored rows are cut (``chunk_rows``, ``shard_rows``, ``compression``, ...);
        None for a table not stored in shards."""
        return None

    @property
    def subwords(self) -> NgramMatrix | None:
        """The n-gram matrix of a fastText model (``oov="subword"``); None for others."""
        return None

    def raw(self, ids) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(codes, scale, offset)`` of rows ``ids`` as stored: for a table that stores its
        dtype, the rows themselves and None, None (see ``ZarrTable.raw``)."""
        return self.lookup(ids), None, None

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, dim={self.dim}, "
                f"dtype={self.dtype}, keys={'yes' if self._vocab() is not None else 'no'})")

    def _check_open(self) -> None:
        """Every method of a closed table raises :class:`ClosedTableError` (one message)."""
        if self._closed:
            where = self.path
            what = "the table" if where is None else f"the table at {where}"
            raise ClosedTableError(f"{what} is closed (open it again to use it)")

    # -- lookup -------------------------------------------------------------------------
    def lookup(self, ids: ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
        """Rows for ``ids`` of any shape: an array of shape ``ids.shape + (dim,)``."""
        self._check_open()
        ids = as_ids(ids, self.vocab_size, row_bytes=0 if out is not None else self._row_bytes)
        given, out = out, self._check_out(out, ids.shape)
        with memory_refused(out.shape, self.dtype):  # (a gather's own buffers, too)
            self._gather(ids.reshape(-1), out.reshape(-1, self.dim))
        return out if given is None or isinstance(given, np.ndarray) else given  # a tensor

    @property
    def _row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize

    def _check_out(self, out, shape) -> np.ndarray:
        return check_out(out, tuple(shape) + (self.dim,), self.dtype)

    def __call__(self, ids: ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
        return self.lookup(ids, out=out)

    def __getitem__(self, ids: ArrayLike | slice) -> np.ndarray:
        self._check_open()
        if isinstance(ids, slice):
            start, stop, step = ids.indices(self.vocab_size)
            if step == 1:
                return self._read_rows(start, max(start, stop))
            return self.lookup(np.arange(start, stop, step, dtype=np.int64))
        return self.lookup(ids)

    def iter_blocks(self, block_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, rows)`` for consecutive blocks of at most ``block_rows`` rows."""
        self._check_open()
        block_rows = positive_int(block_rows, "block_rows")
        for start in range(0, self.vocab_size, block_rows):
            yield start, self._read_rows(start, min(self.vocab_size, start + block_rows))

    def to_numpy(self) -> np.ndarray:
        """The whole table as one in-memory array."""
        self._check_open()
        check_result_size(self.vocab_size, self._row_bytes)
        return self._read_rows(0, self.vocab_size)

    def to_dask(self, block_rows: int | None = None):
        """The table as a lazy ``dask.array``: blocks of whole shards read by the fast path,
        ``x[ids]`` a lookup per block of ids (:mod:`embstore.dasktable`)."""
        return to_dask(self, block_rows)

    def to_xarray(self, block_rows: int | None = None):
        """xarray ``vectors (row, dim)`` over :meth:`to_dask`; keys a coordinate of ``row``."""
        return to_xarray(self, block_rows)

    # -- NumPy and Python protocols ---------------------------------------------------------
    _ARRAY_BLOCK_BYTES = 64 << 20  # __array__ with a dtype change converts 64 MiB at a time

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(t)``: the whole table, read in large blocks (never row by row).

        NumPy 2 signature: ``copy=False`` raises ``ValueError`` because a table's
        rows must be copied out of it.
        """
        if copy is False:
            raise ValueError(f"{type(self).__name__} cannot give an array without a copy; "
                             f"use np.asarray(table) or table.to_numpy()")
        want = self.dtype if dtype is None else np.dtype(dtype)
        if want == self.dtype:
            return self.to_numpy()
        out = alloc_result(self.shape, want)
        block = max(1, self._ARRAY_BLOCK_BYTES // max(1, self.dim * self.dtype.itemsize))
        for start, rows in self.iter_blocks(block):
            out[start:start + len(rows)] = rows
        return out

    _ITER_BLOCK_ROWS = 4096

    def __iter__(self) -> Iterator[np.ndarray]:
        """Rows one at a time, read in blocks (use :meth:`iter_blocks` for whole blocks)."""
        for _, rows in self.iter_blocks(self._ITER_BLOCK_ROWS):
            yield from rows

    def __contains__(self, key) -> bool:
        """``"king" in t``: whether ``key`` is one of the table's keys (False without keys)."""
        if not isinstance(key, str):
            raise TypeError(f"'in' tests keys (str) of a table, got {type(key).__name__} "
                            f"{key!r}; ids are 0 <= id < len(table)")
        vocab = self._vocab()
        return vocab is not None and bool(vocab.find(np.array([key], dtype=object))[0] >= 0)

    # -- keys -------------------------------------------------------------------------
    @property
    def keys(self) -> KeySequence | None:
        self._check_open()
        vocab = self._vocab()
        return None if vocab is None else KeySequence(vocab)

    def _require_vocab(self) -> Vocab:
        self._check_open()
        vocab = self._vocab()
        if vocab is None:
            raise KeyNotFoundError("this table has no keys", key=None, position=None)
        return vocab

    def ids_of(self, keys: ArrayLike, missing: Literal["error", -1] = "error") -> np.ndarray:
        """int64 row ids for ``keys`` of any shape; ``missing=-1`` puts -1 for unknown keys."""
        if not (isinstance(missing, str) and missing == "error") and not (
                isinstance(missing, int) and missing == -1):
            raise InvalidOptionError(f"missing must be 'error' or -1, got {missing!r}")
        arr = as_key_array(keys)
        vocab = self._require_vocab()
        ids = vocab.find(arr.reshape(-1)).reshape(arr.shape)
        if missing == "error" and ids.size and (ids < 0).any():
            i = int(np.argmax(ids.reshape(-1) < 0))
            key = arr.reshape(-1)[i]
            pos = position_of(i, arr.shape)
            raise KeyNotFoundError(f"key {key!r}{at_position(pos, arr.shape)} is not in the table",
                                   key=key, position=pos)
        return ids

    def lookup_keys(self, keys: ArrayLike, oov: OOV = "error",
                    unk_id: int | None = None) -> np.ndarray:
        """Vectors by key; unknown keys: oov error, zero, unk (row unk_id) or subword."""
        check_oov(oov, unk_id, KEY_OOV_MODES)
        self._check_open()
        if oov == "error":
            return self.lookup(self.ids_of(keys))
        ids = self.ids_of(keys, missing=-1)
        missing = ids < 0
        if oov == "unk":
            unk = int(as_ids(unk_id, self.vocab_size))
            return self.lookup(map_oov(ids, missing, "unk", unk_id=unk))
        out = self.lookup(map_oov(ids, missing, "zero", zero_id=0) if self.vocab_size else ids)
        out[missing] = 0 if oov == "zero" else subword_rows(self, as_key_array(keys)[missing])
        return out

    # -- updates ------------------------------------------------------------------------
    def _check_writable(self) -> None:
        self._check_open()  # a closed r+ table is closed, not read-only
        if not self.writable:
            raise ReadOnlyError(f"{table_label(self)} is read-only (open it with mode='r+')")

    def _check_vectors(self, vectors, lead_shape, what: str) -> np.ndarray:
        vec = np.asarray(vectors)
        want = tuple(lead_shape) + (self.dim,)
        if vec.shape != want:
            raise ShapeMismatchError(f"{what}: expected vectors of shape {want}, got {vec.shape}")
        vec = widen(vec)  # ml_dtypes' NumPy bfloat16: widened exactly
        if vec.dtype.kind not in "fiu":
            raise ShapeMismatchError(f"{what}: expected numeric vectors, got dtype {vec.dtype}")
        vec = np.ascontiguousarray(vec, dtype=self.dtype)
        if vec.dtype.kind == "f" and vec.size and not np.isfinite(vec).all():
            flat = np.isfinite(vec).reshape(-1, self.dim).all(axis=1)
            i = int(np.argmin(flat))
            raise ShapeMismatchError(
                f"{what}: vector {position_of(i, tuple(lead_shape))} holds NaN or infinity")
        return vec

    def write(self, ids: ArrayLike, vectors: ArrayLike) -> None:
        """Overwrite rows ``ids`` (any shape) with ``vectors`` (shape ``ids.shape + (dim,)``)."""
        self._check_writable()
        ids = as_ids(ids, self.vocab_size)
        vec = self._check_vectors(vectors, ids.shape, "write")
        self._write_rows(ids.reshape(-1), vec.reshape(-1, self.dim))

    def append(self, vectors: ArrayLike, keys: KeysLike | None = None) -> np.ndarray:
        """Add rows at the end; returns their new ids (int64)."""
        self._check_writable()
        vec = np.asarray(vectors)
        if vec.ndim == 1:
            vec = vec.reshape(1, -1)
        vec = self._check_vectors(vec, (vec.shape[0],) if vec.ndim == 2 else vec.shape[:-1],
                                  "append")
        n = vec.shape[0]
        vocab = self._vocab()
        key_list = None
        if vocab is not None:
            if keys is None:
                raise KeyNotFoundError("this table has keys: append needs one key per row",
                                       key=None, position=None)
            key_list = ids_key_list(keys) if not isinstance(keys, str) else [keys]
            if len(key_list) != n:
                raise ShapeMismatchError(f"append: got {n} vectors but {len(key_list)} keys")
            if len(set(key_list)) != n:
                raise ShapeMismatchError("append: the new keys hold duplicates")
            if not self._appends_check_keys:  # (else: under the writer's lock, once)
                refuse_existing(vocab.find(np.array(key_list, dtype=object)), key_list)
        elif keys is not None:
            raise ShapeMismatchError("append: this table has no keys, so keys cannot be given")
        start = self.vocab_size
        first = self._append_rows(vec, key_list)  # on disk: after other writers' rows
        start = start if first is None else int(first)
        return np.arange(start, start + n, dtype=np.int64)

    # -- housekeeping ---------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:  # statistics stay readable after close()
        return CacheInfo()

    def cache_clear(self) -> None:  # (backends with a cache override it)
        return None

    def warm(self, ids: ArrayLike) -> int:
        """Load rows ``ids`` (any shape: distinct ids hottest first, or a sample of traffic,
        ranked by count) into the row cache up to its capacity, held there (traffic does
        not evict them); returns the rows held.  Without a row cache (``MemoryTable``,
        ``cache_bytes=0``, or ``"auto"`` on an uncompressed local table) it only checks
        the ids and returns 0."""
        self._check_open()
        as_ids(ids, self.vocab_size)
        return 0

    def close(self) -> None:
        """Release the table; later calls raise ClosedTableError (but ``close``,
        ``cache_info`` and ``cache_clear``)."""
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""MemoryTable: the in-memory NumPy backend for small tables."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._types import KeysLike
from .dtypes import dtype_list, is_float_dtype
from .errors import ShapeMismatchError
from .ids import as_ids, as_key_array
from .table import Table, Vocab

__all__ = ["MemoryTable", "DictVocab", "check_table_array"]



def check_table_array(array) -> np.ndarray:
    arr = np.asarray(array)
    if arr.ndim != 2:
        raise ShapeMismatchError(f"a table is 2-D (vocab_size, dim), got shape {arr.shape}")
    if not is_float_dtype(arr.dtype):
        raise ShapeMismatchError(f"a table holds {dtype_list()} values, got {arr.dtype}")
    return arr


class DictVocab(Vocab):
    """Keys in a Python list plus a dict key -> row (the first occurrence wins)."""

    def __init__(self, keys):
        self._keys: list[str] = [str(k) for k in as_key_array(list(keys)).reshape(-1)]
        self._index: dict[str, int] = {}
        for i, k in enumerate(self._keys):
            self._index.setdefault(k, i)
        self.duplicates = len(self._keys) - len(self._index)

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, keys: np.ndarray) -> np.ndarray:
        get = self._index.get
        return np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=len(keys))

    def key_at(self, ids: np.ndarray) -> list[str]:
        keys = self._keys
        return [keys[i] for i in ids.tolist()]

    def keys_between(self, start: int, stop: int) -> list[str]:
        return self._keys[start:stop]

    def extend(self, keys: list[str]) -> None:
        base = len(self._keys)
        self._keys.extend(keys)
        for i, k in enumerate(keys):
            self._index.setdefault(k, base + i)


class MemoryTable(Table):
    """A table held in RAM.  Wraps a C-contiguous 2-D float array without copying.

    A non-contiguous array is copied once.  A read-only array (for example
    ``np.load(..., mmap_mode="r")``) gives a read-only table.  ``append``
    reallocates, so the table stops sharing memory with the array it wrapped.
    """

    def __init__(self, array: ArrayLike, keys: KeysLike | None = None):
        arr = check_table_array(array)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        self._array = arr
        self._keys = None
        if keys is not None:
            vocab = DictVocab(keys)
            if len(vocab) != arr.shape[0]:
                raise ShapeMismatchError(
                    f"got {len(vocab)} keys for a table of {arr.shape[0]} rows")
            if vocab.duplicates:  # a key lookup could never reach the later rows
                row, first = next((i, vocab._index[k]) for i, k in enumerate(vocab._keys)
                                  if vocab._index[k] != i)
                raise ShapeMismatchError(f"keys: key {vocab._keys[row]!r} at row {row} repeats "
                                         f"row {first} ({vocab.duplicates} duplicate(s); keys "
                                         "must be unique)")
            self._keys = vocab

    @property
    def shape(self) -> tuple[int, int]:
        return self._array.shape

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def writable(self) -> bool:
        return bool(self._array.flags.writeable)

    @property
    def array(self) -> np.ndarray:
        """The wrapped array (shared, not a copy)."""
        return self._array

    def _vocab(self):
        return self._keys

    def lookup(self, ids, out=None):
        if out is None:  # the fast path: validated ids straight into NumPy's gather
            self._check_open()
            ids = as_ids(ids, self.vocab_size, row_bytes=self._row_bytes)
            if ids.ndim == 0:  # a 0-d index would return a view into the table
                return self._array[int(ids)].copy()
            return np.take(self._array, ids, axis=0)  # measured faster than E[ids]
        return super().lookup(ids, out=out)

    def _gather(self, ids, out):
        np.take(self._array, ids, axis=0, out=out, mode="clip")  # ids already validated

    def _read_rows(self, start, stop):
        return self._array[start:stop].copy()

    def _write_rows(self, ids, vectors):
        self._array[ids] = vectors

    def _append_rows(self, vectors, keys):
        self._array = np.concatenate([self._array, vectors.astype(self.dtype, copy=False)])
        if keys is not None:
            self._keys.extend(keys)

    def to_numpy(self):
        self._check_open()
        return self._array.copy()


def embedding_lookup(table_or_array, ids, out=None):
    """Rows of ``table_or_array`` (a :class:`Table` or a 2-D array) for ``ids`` of any shape."""
    table = table_or_array if isinstance(table_or_array, Table) else MemoryTable(table_or_array)
    return table.lookup(ids, out=out)

"""A table as a dask array (:meth:`embstore.Table.to_dask`); dask is imported on first use.

Blocks are whole shards (or a multiple of them) of an on-disk table, read with
``table[a:b]``, the contiguous fast path; slicing the array reads only the rows
sliced (dask fuses the slice into the block read).  Indexing the array with
integer ids (``x[ids]``, ``da.take(x, ids)``, NumPy or dask ids of any shape) does
not go through dask's shuffle, which would read every touched block whole: each
block of ids becomes one ``table.lookup`` (the gather, through the row cache).
Negative ids count from the end, as in NumPy.

:func:`to_xarray` labels the same array for xarray: a ``DataArray`` named ``vectors``
with dimensions ``(row, dim)`` and, for a keyed table, the keys as a lazy coordinate
``key`` along ``row`` (read block by block, like the rows: ``da.sel`` on it, or
``.swap_dims(row="key")``, are xarray's).  ``xr.open_zarr(path)`` on the store itself
shows every stored array, the key index's included: this is the view for users.

The graph holds the table itself; an on-disk table pickles as its path (for
distributed workers), a :class:`~embstore.MemoryTable` as its array.
"""

from __future__ import annotations

import uuid

import numpy as np

from .errors import InvalidOptionError
from .ids import as_ids
from .optional import require

__all__ = ["to_dask", "to_xarray", "block_rows_of"]

_BLOCK_BYTES = 64 << 20  # target bytes of a block (and of a block of looked-up rows)
_ARRAY_CLASS = None


def block_rows_of(table) -> int:
    """Rows per block: whole shards, as many as fit ``_BLOCK_BYTES`` (at least one)."""
    row_bytes = max(1, table.dim * table.dtype.itemsize)
    fit = max(1, _BLOCK_BYTES // row_bytes)
    shard = (table.layout or {}).get("shard_rows")
    if shard:
        return int(shard) * max(1, fit // int(shard))
    return int(fit)


class _Rows:
    """What ``dask.array.from_array`` reads: ``rows[a:b, c:d]`` is ``table[a:b][:, c:d]``."""

    def __init__(self, table):
        self.table = table
        self.shape = tuple(table.shape)
        self.dtype = table.dtype
        self.ndim = 2

    def __getitem__(self, index):
        rows, cols = index if isinstance(index, tuple) else (index, slice(None))
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self.shape[0])
            if step == 1:
                out = self.table[start:max(start, stop)]  # the contiguous read
            else:
                out = self.table.lookup(np.arange(start, stop, step, dtype=np.int64))
        else:
            out = self.table.lookup(rows)
        return out if isinstance(cols, slice) and cols == slice(None) else out[..., cols]


def _lookup(ids: np.ndarray, table) -> np.ndarray:
    return table.lookup(np.where(ids < 0, ids + table.vocab_size, ids))


def _is_id_array(index) -> bool:
    da = _dask_array()
    if isinstance(index, da.Array):
        return index.dtype.kind in "iu"
    if isinstance(index, (list, np.ndarray)):
        arr = np.asarray(index)
        return arr.ndim >= 1 and (arr.dtype.kind in "iu" or arr.size == 0 and
                                  arr.dtype.kind == "f")
    return False


def _dask_array():
    return require("dask.array", extra="dask", feature="Table.to_dask")


def _array_class():
    """The dask array subclass (built once, on first use: dask is optional)."""
    global _ARRAY_CLASS
    if _ARRAY_CLASS is not None:
        return _ARRAY_CLASS
    da = _dask_array()
    class TableArray(da.Array):
        """A dask array of a table's rows whose integer-id indexing is a table lookup."""

        __slots__ = ("_table",)

        def __getitem__(self, index):
            rest = index[1:] if isinstance(index, tuple) else ()
            first = index[0] if isinstance(index, tuple) and index else index
            if _is_id_array(first) and all(r == slice(None) or r is Ellipsis for r in rest):
                return _take(self._table, first, self.dtype)
            return super().__getitem__(index)

    TableArray.__qualname__ = "TableArray"
    TableArray.__module__ = __name__
    _ARRAY_CLASS = TableArray
    return TableArray


def _take(table, ids, dtype):
    """Rows ``ids`` (NumPy or dask, any shape) as a dask array, one lookup per block of ids."""
    da = _dask_array()
    n, dim = table.shape
    per_block = max(1, _BLOCK_BYTES // max(1, dim * dtype.itemsize))
    if not isinstance(ids, da.Array):
        arr = np.asarray(ids)
        arr = as_ids(np.where((arr < 0) & (arr >= -n), arr + n, arr), n)  # NumPy's negatives
        ids = da.from_array(arr, chunks=(per_block,) + arr.shape[1:], name=False)
    return ids.map_blocks(_lookup, table, dtype=dtype, new_axis=ids.ndim,
                          chunks=ids.chunks + ((dim,),),
                          meta=np.empty((0,) * (ids.ndim + 1), dtype=dtype))


def to_dask(table, block_rows: int | None = None):
    """The table as a dask array ``(vocab_size, dim)`` in blocks of ``block_rows`` rows
    (default: whole shards, about 64 MiB or more per block); see the module doc."""
    table._check_open()  # (a closed table made a graph that failed only when computed)
    da = _dask_array()
    rows = block_rows_of(table) if block_rows is None else block_rows
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise InvalidOptionError(f"block_rows must be a positive integer, got {rows!r}")
    plain = da.from_array(_Rows(table), chunks=(int(rows), table.dim), asarray=False,
                          lock=False, name=f"embstore-table-{uuid.uuid4().hex}",
                          meta=np.empty((0, 0), dtype=table.dtype))
    out = _array_class()(plain.dask, plain.name, plain.chunks, meta=plain._meta)
    out._table = table
    return out


class _Keys:
    """What ``dask.array.from_array`` reads for the keys: ``keys[a:b]`` as an object array."""

    ndim = 1

    def __init__(self, table):
        self.table = table
        self.shape = (table.vocab_size,)
        self.dtype = np.dtype(object)

    def __getitem__(self, index):
        index = index[0] if isinstance(index, tuple) else index
        start, stop, step = index.indices(self.shape[0])
        out = np.empty(len(range(start, stop, step)), dtype=object)
        out[:] = self.table.keys[start:stop:step] if step == 1 else [
            self.table.keys[i] for i in range(start, stop, step)]  # (dask asks for slices)
        return out


def to_xarray(table, block_rows: int | None = None):
    """The table as an ``xarray.DataArray`` (see the module doc); needs xarray and dask."""
    xr = require("xarray", extra="dask", feature="Table.to_xarray")
    x = to_dask(table, block_rows)
    coords = {}
    if table.keys is not None:
        da = _dask_array()
        keys = da.from_array(_Keys(table), chunks=(x.chunks[0],), asarray=False, lock=False,
                             name=f"embstore-keys-{uuid.uuid4().hex}",
                             meta=np.empty((0,), dtype=object))
        coords["key"] = ("row", keys)
    return xr.DataArray(x, dims=("row", "dim"), coords=coords, name="vectors",
                        attrs={"vocab_size": table.vocab_size, "dim": table.dim})

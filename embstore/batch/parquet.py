"""Batch lookups over Parquet: a column of ids or keys in, a Parquet file of vectors out.

``lookup_parquet(table, input, output, column=...)`` (and :func:`embstore.lookup_file`
with a ``.parquet`` input) reads ``column`` in batches of rows (bounded memory: about
``DEFAULT_BLOCK_BYTES`` of output vectors per batch, whatever the row groups), looks
every value up and writes each batch as row groups of ``output``:

- a column of integer ids, or of strings (keys), gives a column ``vector_column`` of
  ``fixed_size_list<float>[dim]``; a column of lists of ids or keys gives a column of
  ``list<fixed_size_list<float>[dim]>`` (one vector per element);
- the input columns named in ``keep`` are copied beside it;
- a null value (or a null list) gives a null vector (list); unknown keys and
  out-of-range ids follow ``oov``: ``"error"`` (naming the row and the position in
  its list), ``"zero"`` (zero vectors) or ``"unk"`` (row ``unk_id``).

pyarrow is optional (``pip install embstore[parquet]``) and imported on first use.
The output is written beside ``output`` and renamed into place when complete.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import DestinationExistsError, FormatError, InvalidIdError, KeyNotFoundError
from ..ids import as_ids
from ..optional import require
from ..progress import Progress, Tally
from ..table import Table
from ..atomic import remove, replace, temp_path
from .io import DEFAULT_CACHE_BYTES, lookup_into, open_table

__all__ = ["lookup_parquet", "is_parquet"]

DEFAULT_BLOCK_BYTES = 16 << 20  # output vector bytes per batch of rows


def is_parquet(path) -> bool:
    return os.fspath(path).lower().endswith((".parquet", ".parq"))


def _batch_rows(pf, col_index: int, row_bytes: int, block_bytes: int) -> int:
    """Rows per batch so that a batch's vectors take about ``block_bytes``."""
    meta = pf.metadata
    rows = sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    values = sum(meta.row_group(i).column(col_index).num_values
                 for i in range(meta.num_row_groups))
    per_row = max(1.0, values / max(1, rows))  # list columns: elements (and nulls) per row
    return max(1, int(block_bytes / (per_row * row_bytes)))


class _Column:
    """The value type of the input column: ids or keys, scalar or lists."""

    def __init__(self, pa, field, path: str):
        t = field.type
        self.is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
        leaf = t.value_type if self.is_list else t
        if pa.types.is_integer(leaf):
            self.keys = False
        elif pa.types.is_string(leaf) or pa.types.is_large_string(leaf):
            self.keys = True
        else:
            raise FormatError(f"column {field.name!r} must hold integer ids or string keys "
                              f"(or lists of them), got {t}", path=path)


def _leaf_ids(table: Table, values, col: _Column, *, oov: str, unk_id, where,
              path: str) -> np.ndarray:
    """int64 row ids of the leaf values (-1: a zero vector), following ``oov``."""
    valid = np.asarray(values.is_valid())
    if col.keys:
        keys = values.to_numpy(zero_copy_only=False)
        keys[~valid] = ""
        ids = table.ids_of(keys, missing=-1) if keys.size else np.zeros(0, np.int64)
        bad = (ids < 0) & valid
    else:
        # uint64 beyond int64 wraps to negative here: out of range either way
        ids = values.fill_null(0).to_numpy().astype(np.int64, copy=False) if len(values) else \
            np.zeros(0, np.int64)
        bad = ((ids < 0) | (ids >= table.vocab_size)) & valid
    if bad.any():
        i = int(np.argmax(bad))
        if oov == "error":
            row, pos = where(i)
            at = f"{path}, row {row}" + ("" if pos is None else f", position {pos}")
            if col.keys:
                raise KeyNotFoundError(f"{at}: key {keys[i]!r} is not in the table",
                                       key=keys[i], position=(row,) if pos is None else
                                       (row, pos))
            v = values[i].as_py()
            raise InvalidIdError(f"{at}: id {v} is out of range for a table of "
                                 f"{table.vocab_size} rows", id=v, position=(row,) if pos is
                                 None else (row, pos), vocab_size=table.vocab_size)
        ids = np.where(bad, np.int64(-1 if oov == "zero" else unk_id), ids)
    return np.where(valid, ids, -1) if not valid.all() else ids


def _vectors(pa, table: Table, column, col: _Column, first_row: int, *, oov, unk_id, path):
    """The output column for one batch of the input column."""
    if col.is_list:
        lens = np.asarray(pa.compute.list_value_length(column).fill_null(0), dtype=np.int64)
        values = column.flatten()
        ends = np.cumsum(lens)

        def where(i):
            r = int(np.searchsorted(ends, i, side="right"))
            return first_row + r, i - (int(ends[r - 1]) if r else 0)
    else:
        values = column

        def where(i):
            return first_row + i, None
    ids = _leaf_ids(table, values, col, oov=oov, unk_id=unk_id, where=where, path=path)
    out = np.empty((ids.size, table.dim), dtype=table.dtype)
    lookup_into(table, ids, out, pads=True)
    null = np.asarray(values.is_null()) if values.null_count else None
    vec = pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)), table.dim,
                                            mask=None if null is None else pa.array(null))
    if not col.is_list:
        return vec
    offsets = np.zeros(lens.size + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    mask = pa.array(np.asarray(column.is_null())) if column.null_count else None
    return pa.ListArray.from_arrays(pa.array(offsets), vec, mask=mask)


def lookup_parquet(table, input, output, *, column: str, keep=(), vector_column: str = "vector",
                   oov: str = "error", unk_id: int | None = None, overwrite: bool = False,
                   batch_rows: int | None = None, cache_bytes=DEFAULT_CACHE_BYTES,
                   on_progress: Progress | None = None) -> dict:
    """Look up ``column`` of the Parquet file ``input`` and write ``output`` (Parquet);
    see the module doc.  Returns a summary dict (``output``, ``rows``, ``ids``,
    ``batches``, ``seconds``)."""
    feature = "a Parquet batch job"
    pa = require("pyarrow", extra="parquet", feature=feature)
    require("pyarrow.compute", extra="parquet", feature=feature)  # pa.compute
    pq = require("pyarrow.parquet", extra="parquet", feature=feature)

    t0 = time.perf_counter()
    input, output = os.fspath(input), os.fspath(output)
    if not is_parquet(output):
        raise FormatError("a Parquet input needs a Parquet output (.parquet)", path=output)
    if oov not in ("error", "zero", "unk"):
        raise ValueError(f"oov must be 'error', 'zero' or 'unk', got {oov!r}")
    if oov == "unk" and unk_id is None:
        raise ValueError("oov='unk' needs unk_id")
    if os.path.lexists(output) and not overwrite:
        raise DestinationExistsError(f"{output} exists (pass overwrite=True to replace it)")
    keep = list(dict.fromkeys([keep] if isinstance(keep, str) else keep))  # once each
    try:
        pf = pq.ParquetFile(input)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        raise FormatError(f"not a readable Parquet file ({exc})", path=input) from None
    schema = pf.schema_arrow
    for name in [column] + keep:
        if schema.get_field_index(name) < 0:
            raise FormatError(f"no column {name!r} (columns: {', '.join(schema.names)})",
                              path=input)
    if vector_column in keep:
        raise ValueError(f"vector_column {vector_column!r} is also a kept column")
    col = _Column(pa, schema.field(column), input)
    owned = not isinstance(table, Table)
    tab = open_table(table, cache_bytes=cache_bytes) if owned else table
    tmp = temp_path(output)
    try:
        if oov == "unk":
            unk_id = int(as_ids(unk_id, tab.vocab_size))
        rows = batch_rows or _batch_rows(pf, _leaf_index(pf, column),
                                         tab.dim * tab.dtype.itemsize, DEFAULT_BLOCK_BYTES)
        stats = _stream(pa, pq, pf, tab, tmp, column, keep, vector_column, col, int(rows),
                        oov=oov, unk_id=unk_id, on_progress=on_progress, pf_path=input)
    except BaseException:
        remove(tmp)
        raise
    finally:
        if owned:
            tab.close()
    replace(tmp, output)
    return {"output": output, **stats, "seconds": time.perf_counter() - t0}


def _leaf_index(pf, column: str) -> int:
    """The Parquet leaf column of ``column`` (a list column's element column)."""
    for i in range(pf.metadata.num_columns):
        path = pf.schema.column(i).path
        if path == column or path.split(".")[0] == column:
            return i
    raise FormatError(f"no Parquet column for {column!r}")


def _writer_options(vector_column: str, keep: list[str]) -> dict:
    """Vectors plain: random floats neither dictionary-encode nor compress, and their
    min/max statistics are of no use (measured: 4.9 s -> 3.3 s for 25.6M floats)."""
    return {"use_dictionary": list(keep), "write_statistics": list(keep),
            "compression": {vector_column: "none", **{k: "snappy" for k in keep}}}


def _stream(pa, pq, pf, tab, tmp, column, keep, vector_column, col, rows, *, oov, unk_id,
            on_progress, pf_path) -> dict:
    """Batch k+1 is looked up while batch k is written (pyarrow writes without the GIL);
    at most two batches of vectors exist at a time."""
    bar = Tally(pf.metadata.num_rows, on_progress, 0)
    options = _writer_options(vector_column, keep)
    writer: Any = None
    pending = None
    done = ids = batches = 0
    with ThreadPoolExecutor(1, "embstore-parquet-write") as pool:
        try:
            read = list(dict.fromkeys([column] + keep))
            for batch in pf.iter_batches(batch_size=rows, columns=read):
                vec = _vectors(pa, tab, batch.column(column), col, done, oov=oov,
                               unk_id=unk_id, path=pf_path)
                out = pa.Table.from_arrays([vec] + [batch.column(k) for k in keep],
                                           names=[vector_column] + keep)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, out.schema, **options)
                if pending is not None:
                    bar.update(pending.result())
                pending = pool.submit(lambda t, n: (writer.write_table(t), n)[1], out,
                                      batch.num_rows)
                ids += len(vec.flatten()) if col.is_list else len(vec)
                done += batch.num_rows
                batches += 1
            if pending is not None:
                bar.update(pending.result())
            if writer is None:  # no rows: an empty file with the output schema
                vt = pa.list_(pa.from_numpy_dtype(tab.dtype), tab.dim)
                fields = [pa.field(vector_column, pa.list_(vt) if col.is_list else vt)] + [
                    pf.schema_arrow.field(k) for k in keep]
                writer = pq.ParquetWriter(tmp, pa.schema(fields), **options)
        finally:
            if pending is not None:
                pending.exception()  # the writer is idle before it is closed
            if writer is not None:
                writer.close()
    return {"rows": done, "ids": ids, "batches": batches}

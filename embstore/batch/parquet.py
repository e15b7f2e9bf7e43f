"""Batch lookups over Parquet: a column of ids or keys in, Parquet vectors out.

``lookup_parquet(table, input, output, column=...)`` (and :func:`embstore.lookup_file`
with a ``.parquet`` input) reads ``column`` in batches of rows (bounded memory: about
``DEFAULT_BLOCK_BYTES`` of output vectors per batch, whatever the row groups), looks
every value up and writes each batch as a row group of ``output``:

- a column of integer ids, or of strings (keys), gives a column ``vector_column`` of
  ``fixed_size_list<float>[dim]``; a column of lists of ids or keys gives a column of
  ``list<fixed_size_list<float>[dim]>`` (one vector per element);
- the input columns named in ``keep`` are copied beside it;
- a null value (or a null list) gives a null vector (list); unknown keys and
  out-of-range ids follow ``oov``: ``"error"`` (naming the row and the position in
  its list), ``"zero"`` (zero vectors) or ``"unk"`` (row ``unk_id``).

On one machine the output is one Parquet file.  With ``scheduler=`` (Dask) the input
is split into parts of whole row groups (about ``PART_BYTES`` of vectors each); each
task opens the table and the input itself and writes its own file, so ``output`` is a
Parquet dataset directory ``output/part-00000.parquet``, ``part-00001.parquet``, ...
(in input order; ``pyarrow.parquet.read_table(output)``, pandas, Spark and DuckDB read
it as one table; the rows equal those of the local job).

pyarrow is optional (``pip install embstore[parquet]``) and imported on first use.
The output is written beside ``output`` and renamed into place when complete.  The
per-batch work is in :mod:`embstore.batch.arrowio`.
"""

from __future__ import annotations

import os
import time

from ..fs.atomic import check_dest, remove, replace, temp_dir, temp_path
from ..errors import FormatError, InvalidOptionError
from ..ids import as_ids, one_of, positive_int
from ..optional import require
from ..progress import Progress, Tally
from ..table import Table
from .arrowio import Column, PartJob, write_part
from .dask import run_parquet_dask
from .io import DEFAULT_CACHE_BYTES, open_table, table_location

__all__ = ["lookup_parquet", "is_parquet", "plan_parts"]

DEFAULT_BLOCK_BYTES = 16 << 20  # output vector bytes per batch of rows
PART_BYTES = 256 << 20  # output vector bytes per part of a Dask job (whole row groups)


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


def plan_parts(pf, col_index: int, row_bytes: int, part_bytes: int) -> list[tuple[int, int]]:
    """Consecutive row groups ``(start, stop)`` with about ``part_bytes`` of vectors each
    (a row group is never split; an input without row groups gives one empty part)."""
    meta = pf.metadata
    parts: list[tuple[int, int]] = []
    start, size = 0, 0.0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        size += max(rg.num_rows, rg.column(col_index).num_values) * row_bytes
        if size >= part_bytes:
            parts.append((start, g + 1))
            start, size = g + 1, 0.0
    if start < meta.num_row_groups or not parts:
        parts.append((start, meta.num_row_groups))
    return parts


def _leaf_index(pf, column: str) -> int:
    """The Parquet leaf column of ``column`` (a list column's element column)."""
    for i in range(pf.metadata.num_columns):
        path = pf.schema.column(i).path
        if path == column or path.split(".")[0] == column:
            return i
    raise FormatError(f"no Parquet column for {column!r}")


ID_NAMES = ("input_ids", "ids", "tokens")  # Hugging Face datasets, and the usual names


def id_column(pa, schema, path: str) -> str:
    """The column of ids a job reads when none is named: ``input_ids`` (or ``ids``,
    ``tokens``) when there is one, else the only column of integers or of lists of them."""
    for name in ID_NAMES:
        if schema.get_field_index(name) >= 0:
            return name

    def ids(t) -> bool:
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            t = t.value_type
        return pa.types.is_integer(t)
    found = [f.name for f in schema if ids(f.type)]
    if len(found) == 1:
        return found[0]
    listing = ", ".join(f"{f.name} ({f.type})" for f in schema)
    raise FormatError(f"expected column= naming the column of ids or keys: "
                      f"{'no' if not found else len(found)} columns of integer ids among "
                      f"{listing}", path=path)


def open_input(pa, pq, path: str):
    """The open ``ParquetFile``; a file that is not Parquet is a :class:`FormatError`.

    ``pre_buffer=False``: pyarrow's default reads ahead every row group a batch iterator
    is given and keeps them (measured: 27 MB of Arrow memory for 2 row groups, 111 MB
    for 10), so memory grew with the input; without it, one row group at a time."""
    try:
        return pq.ParquetFile(path, pre_buffer=False)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FormatError(f"not a readable Parquet file ({first})", path=path) from None


def _modules():
    feature = "a Parquet batch job"
    pa = require("pyarrow", extra="parquet", feature=feature)
    return pa, require("pyarrow.parquet", extra="parquet", feature=feature)


def lookup_parquet(table, input, output, *, column: str | None = None, keep=(), vector_column: str = "vector",
                   oov: str = "error", unk_id: int | None = None, overwrite: bool = False,
                   batch_rows: int | None = None, cache_bytes=DEFAULT_CACHE_BYTES,
                   scheduler: str | None = None, n_workers: int = 2,
                   on_progress: Progress | None = None) -> dict:
    """Look up ``column`` of the Parquet file ``input`` and write ``output`` (Parquet);
    see the module doc.  ``column=None`` takes ``input_ids`` (``ids``, ``tokens``) or the
    only column of integer ids (:func:`id_column`).  Returns a summary dict (``output``, ``rows``, ``ids``,
    ``batches``, ``parts``, ``seconds``, ``scheduler``)."""
    pa, pq = _modules()
    t0 = time.perf_counter()
    input, output = os.fspath(input), os.fspath(output)
    if not is_parquet(output):
        raise FormatError("a Parquet input needs a Parquet output (.parquet)", path=output)
    one_of(oov, "oov", ("error", "zero", "unk"))
    if oov == "unk" and unk_id is None:
        raise ValueError("oov='unk' needs unk_id")
    if batch_rows is not None:
        batch_rows = positive_int(batch_rows, "batch_rows")
    if scheduler is not None:  # before anything is written
        require("dask.distributed", extra="dask", feature="running a batch job on a Dask "
                "scheduler")
    check_dest(output, overwrite)
    keep = list(dict.fromkeys([keep] if isinstance(keep, str) else keep))  # once each
    if vector_column in keep:
        raise InvalidOptionError(f"keep={keep!r}: the output's vector column is named "
                                 f"{vector_column!r}, so a kept input column cannot be; "
                                 "name the vectors otherwise (vector_column=)")
    pf = open_input(pa, pq, input)
    schema = pf.schema_arrow
    if column is None:
        column = id_column(pa, schema, input)
    for name in [column] + keep:
        if schema.get_field_index(name) < 0:
            raise FormatError(f"no column {name!r} (columns: {', '.join(schema.names)})",
                              path=input)
    col = Column(pa, schema.field(column), input)
    if isinstance(table, Table):
        tab, table_path, owned = table, table.path, False
        if scheduler is not None and table_path is None:
            raise ValueError("a Dask job needs a table on disk: pass its path")
    else:
        table_path = table_location(table)
        tab, owned = open_table(table_path, cache_bytes=cache_bytes), True
    try:
        if oov == "unk":
            unk_id = int(as_ids(unk_id, tab.vocab_size))
        row_bytes = tab.dim * tab.dtype.itemsize
        leaf = _leaf_index(pf, column)
        job = PartJob(input=os.path.abspath(input), column=column, keep=tuple(keep),
                      vector_column=vector_column, oov=oov, unk_id=unk_id,
                      batch_rows=int(batch_rows or _batch_rows(pf, leaf, row_bytes,
                                                               DEFAULT_BLOCK_BYTES)),
                      dim=int(tab.dim), dtype=tab.dtype.str, is_list=col.is_list,
                      keys=col.keys)
        bar = Tally(pf.metadata.num_rows, on_progress, 0)
        if scheduler is None:
            stats = _local(pa, pq, pf, tab, job, output, bar, overwrite)
        else:
            stats = _on_dask(pa, pq, pf, job, str(table_path), output, leaf, row_bytes,
                             bar, scheduler=scheduler, n_workers=n_workers,
                             cache_bytes=cache_bytes, overwrite=overwrite)
    finally:
        if owned:
            tab.close()
    return {"output": output, **stats, "seconds": time.perf_counter() - t0,
            "scheduler": scheduler}


def _local(pa, pq, pf, tab, job: PartJob, output: str, bar: Tally, overwrite: bool) -> dict:
    tmp = temp_path(output)
    try:
        stats = write_part(pa, pq, pf, tab, job, tmp, range(pf.metadata.num_row_groups), 0,
                           bar)
        check_dest(output, overwrite)
        replace(tmp, output)
    except BaseException:
        remove(tmp)
        raise
    return {**stats, "parts": 1}


def _on_dask(pa, pq, pf, job: PartJob, table_path: str, output: str, leaf: int,
             row_bytes: int, bar: Tally, *, scheduler, n_workers, cache_bytes,
             overwrite) -> dict:
    """Parts of whole row groups as Dask tasks, each writing ``part-NNNNN.parquet`` of a
    directory made beside ``output`` and renamed into place when every part is done."""
    parts = plan_parts(pf, leaf, row_bytes, PART_BYTES)
    meta = pf.metadata
    firsts, n = [], 0
    for start, stop in parts:
        firsts.append(n)
        n += sum(meta.row_group(g).num_rows for g in range(start, stop))
    tmp = temp_dir(output)
    try:
        stats = run_parquet_dask(job, table_path, cache_bytes, tmp, parts, firsts, scheduler,
                                 n_workers=n_workers, bar=bar)
        check_dest(output, overwrite)
        replace(tmp, output)
    except BaseException:
        remove(tmp)
        raise
    return {**stats, "parts": len(parts)}


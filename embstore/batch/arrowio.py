"""Arrow batches in, Arrow vectors out: the per-batch work of a Parquet job.

:mod:`embstore.batch.parquet` plans a job; this module does the work of one part of
it, the same on one machine and in a Dask task: :func:`write_part` streams row groups
``[first, stop)`` of the input in batches, turns the ids or keys of each batch into
one block of vectors (:func:`vectors`) and writes them with the kept columns to one
Parquet file, looking batch k+1 up while batch k is written (pyarrow encodes and
writes without the GIL).  pyarrow is passed in as ``pa``: it is optional and only the
job imports it.

Where the time goes (20M ids in list columns, dim 64, 2 cores): the Parquet
encoding of the vectors (repetition and definition levels for every float, their
histograms, and copies into pages) costs several times the lookup; reading the list
column of ids costs little.  So the vectors are written plain (no dictionary, no
compression, no statistics: random floats neither dictionary-encode nor compress)
in large write batches, every batch's vectors land in one of two reused buffers
wrapped zero-copy, and the ids are checked in whole-array passes.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import FormatError, InvalidIdError, KeyNotFoundError, ResultTooLargeError
from ..table import Table
from ..progress import Tally
from .io import lookup_into

__all__ = ["PartJob", "Column", "output_schema", "writer_options", "vectors", "write_part"]

WRITE_BATCH_SIZE = 1 << 16  # levels and values handed to the column writer at a time
#: the vectors of one batch of rows at most: larger batches are split; one row larger than
#: this (a list of 40M ids) is refused, since a Parquet row is written whole
MAX_BATCH_BYTES = 1 << 30


class Column:
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


@dataclasses.dataclass(frozen=True)
class PartJob:
    """What a part needs (it travels to Dask workers: plain values only)."""

    input: str
    column: str
    keep: tuple[str, ...]
    vector_column: str
    oov: str
    unk_id: int | None
    batch_rows: int
    dim: int
    dtype: str
    is_list: bool
    keys: bool


def output_schema(pa, input_schema, job: PartJob):
    """The vectors (``fixed_size_list<float>[dim]``, in a list for a list column) and
    the kept input columns, as they are in the input."""
    vt = pa.list_(pa.from_numpy_dtype(np.dtype(job.dtype)), job.dim)
    fields = [pa.field(job.vector_column, pa.list_(vt) if job.is_list else vt)]
    return pa.schema(fields + [input_schema.field(k) for k in job.keep])


def writer_options(job: PartJob) -> dict:
    """Vectors plain: random floats neither dictionary-encode nor compress, and their
    min/max statistics are of no use (measured: 4.9 s -> 3.3 s for 25.6M floats); large
    write batches (65,536 levels instead of 1,024: about 15% less encoding time)."""
    keep = list(job.keep)
    return {"use_dictionary": keep, "write_statistics": keep,
            "compression": {job.vector_column: "none", **{k: "snappy" for k in keep}},
            "write_batch_size": WRITE_BATCH_SIZE}


def _int_dtype(pa, t) -> np.dtype:
    """The NumPy dtype of the Arrow integer type ``t``."""
    return np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")


def _numbers(pa, arr) -> np.ndarray:
    """The values of the integer Arrow array ``arr``, viewed in place (what lies under a
    null is undefined).  Read from its buffer: pyarrow's ``to_numpy`` and ``np.asarray``
    import pandas (about a second, in every process and Dask worker)."""
    dtype = _int_dtype(pa, arr.type)
    data = arr.buffers()[1]
    if data is None or not len(arr):
        return np.zeros(0, dtype)
    return np.frombuffer(data, dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _valid(arr) -> np.ndarray:
    """Where the Arrow array ``arr`` is not null, from its validity bitmap."""
    bitmap = arr.buffers()[0]
    if bitmap is None:
        return np.ones(len(arr), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    return bits[arr.offset: arr.offset + len(arr)].astype(bool)


def _bitmap(pa, mask: np.ndarray):
    """An Arrow validity bitmap of the bool array ``mask``."""
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _bad_ids(ids: np.ndarray, vocab_size: int) -> np.ndarray | None:
    """Where ``ids`` are out of range (``None``: nowhere); one min/max pass when all are
    fine.  uint64 beyond int64 wraps to negative in int64: out of range either way."""
    if not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < vocab_size):
        return None
    return (ids < 0) | (ids >= vocab_size)


def leaf_ids(pa, table: Table, values, job: PartJob, where, path: str) -> np.ndarray:
    """int64 row ids of the leaf values (-1: a zero vector, for nulls and ``oov="zero"``)."""
    nulls = values.null_count
    valid = _valid(values) if nulls else None
    bad: np.ndarray | None
    if job.keys:
        keys = values.to_numpy(zero_copy_only=False)
        if valid is not None:
            keys[~valid] = ""
        ids = table.ids_of(keys, missing=-1) if keys.size else np.zeros(0, np.int64)
        missing = ids < 0
        bad = missing if missing.any() else None
    else:  # what lies under a null may be out of range: masked by ``valid`` below
        ids = _numbers(pa, values).astype(np.int64, copy=False)
        bad = _bad_ids(ids, table.vocab_size)
    if bad is not None and valid is not None:
        bad &= valid
    if bad is not None and bad.any():
        i = int(np.argmax(bad))
        if job.oov == "error":
            row, pos = where(i)
            at = f"{path}, row {row}" + ("" if pos is None else f", position {pos}")
            position = (row,) if pos is None else (row, pos)
            if job.keys:
                raise KeyNotFoundError(f"{at}: key {keys[i]!r} is not in the table (use "
                                       "oov='zero' or oov='unk')",
                                       key=keys[i], position=position)
            v = values[i].as_py()
            raise InvalidIdError(f"{at}: id {v} is out of range for a table of "
                                 f"{table.vocab_size} rows (use oov='zero' or oov='unk')",
                                 id=v, position=position,
                                 vocab_size=table.vocab_size)
        ids = np.where(bad, np.int64(-1 if job.oov == "zero" else job.unk_id or 0), ids)
    return ids if valid is None else np.where(valid, ids, -1)


def vectors(pa, table: Table, column, job: PartJob, first_row: int, buf: np.ndarray, *,
            path: str, schema):
    """The output column for one batch of the input column; the vectors are written
    into ``buf`` (at least ids x dim items) and wrapped without a copy."""
    if job.is_list:
        lens = np.diff(_numbers(pa, column.offsets)).astype(np.int64, copy=False)
        if column.null_count:  # a null list has no elements, whatever its offsets say
            lens[~_valid(column)] = 0
        values = column.flatten()

        def where(i):
            ends = np.cumsum(lens)
            r = int(np.searchsorted(ends, i, side="right"))
            return first_row + r, i - (int(ends[r - 1]) if r else 0)
    else:
        values = column

        def where(i):
            return first_row + i, None
    ids = leaf_ids(pa, table, values, job, where, path)
    out = buf[: ids.size * job.dim].reshape(ids.size, job.dim)
    lookup_into(table, ids, out, pads=True)
    vtype = schema.field(0).type.value_type if job.is_list else schema.field(0).type
    null = _bitmap(pa, _valid(values)) if values.null_count else None
    flat = pa.Array.from_buffers(vtype.value_type, out.size, [None, pa.py_buffer(out)])
    vec = pa.Array.from_buffers(vtype, ids.size, [null], children=[flat])
    if not job.is_list:
        return vec
    offsets = np.zeros(lens.size + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    null = _bitmap(pa, _valid(column)) if column.null_count else None
    return pa.Array.from_buffers(schema.field(0).type, lens.size,
                                 [null, pa.py_buffer(offsets)], children=[vec])


def _read(pa, pf, job: PartJob, columns: list[str], groups: range) -> Iterator[Any]:
    """The batches of row groups ``groups``; a damaged file is a :class:`FormatError`."""
    batches = pf.iter_batches(batch_size=job.batch_rows, columns=columns,
                              row_groups=list(groups))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            if isinstance(exc, (FileNotFoundError, PermissionError)):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FormatError(f"cannot read row groups {groups.start}-{groups.stop - 1}: "
                              f"{first}", path=job.input) from None
        yield batch


def _bounded(batches, job: PartJob, first_row: int) -> Iterator[tuple[Any, int]]:
    """``(batch, ids in it)``: batches whose vectors pass ``MAX_BATCH_BYTES`` halved until
    they fit; a single row that does not fit is refused (it cannot be split)."""
    row_bytes = job.dim * np.dtype(job.dtype).itemsize
    done = first_row
    for batch in batches:
        stack = [batch]
        while stack:  # a loop per split batch (log of its rows), not per row
            b = stack.pop()
            n = len(b.column(job.column).flatten()) if job.is_list else b.num_rows
            if n * row_bytes <= MAX_BATCH_BYTES:
                yield b, n
                done += b.num_rows
            elif b.num_rows > 1:
                half = b.num_rows // 2
                stack += [b.slice(half), b.slice(0, half)]
            else:
                raise ResultTooLargeError(
                    f"{job.input}, row {done}: a list of {n} ids in column {job.column!r}, "
                    f"{n * row_bytes} bytes of vectors: more than the {MAX_BATCH_BYTES} one "
                    "batch of rows may hold (a Parquet row is written whole: split the list)")


def write_part(pa, pq, pf, table: Table, job: PartJob, dest: str, groups: range,
               first_row: int, bar: Tally | None = None) -> dict:
    """Row groups ``groups`` of the open input ``pf`` to the Parquet file ``dest``
    (rows numbered from ``first_row`` in errors); at most two batches of vectors (two
    reused buffers) exist at a time.  Returns ``rows``, ``ids``, ``batches``."""
    schema = output_schema(pa, pf.schema_arrow, job)
    read = list(dict.fromkeys([job.column, *job.keep]))
    bufs: list[np.ndarray] = [np.empty(0, job.dtype), np.empty(0, job.dtype)]
    done = ids = batches = 0
    pending = None
    with pq.ParquetWriter(dest, schema, **writer_options(job)) as writer, \
            ThreadPoolExecutor(1, "embstore-parquet-write") as pool:
        try:
            batches_in = _read(pa, pf, job, read, groups) if len(groups) else iter(())
            for k, (batch, n) in enumerate(_bounded(batches_in, job, first_row)):
                column = batch.column(job.column)
                if bufs[k % 2].size < n * job.dim:
                    bufs[k % 2] = np.empty(n * job.dim, job.dtype)  # grown, never shrunk
                vec = vectors(pa, table, column, job, first_row + done, bufs[k % 2],
                              path=job.input, schema=schema)
                out = pa.Table.from_arrays([vec] + [batch.column(c) for c in job.keep],
                                           schema=schema)
                if pending is not None:  # the buffer of batch k-1 is free after this
                    rows = pending.result()
                    if bar is not None:
                        bar.update(rows)
                pending = pool.submit(lambda t, r: (writer.write_table(t), r)[1], out,
                                      batch.num_rows)
                ids += n
                done += batch.num_rows
                batches += 1
            if pending is not None:
                rows = pending.result()
                if bar is not None:
                    bar.update(rows)
        finally:
            if pending is not None:
                pending.exception()  # the writer is idle before it is closed
    return {"rows": done, "ids": ids, "batches": batches}

"""Parquet tables of words and vectors: one string column (the keys) and one column of
float vectors (``fixed_size_list<float>[dim]``, as embstore's Parquet jobs write, or
``list<float>`` with every list of one length), read in record batches of ``block_rows``.

The key column is the one named ``word``, ``key``, ``token`` or ``text``, else the only
string column; the vector column is ``tensor=`` (``--tensor``), else the only list-of-float
column (the error lists the candidates).  A null key or vector, or a list of another
length, is an error naming its row.  pyarrow is optional (``embstore[parquet]``).
"""

from __future__ import annotations

import os

import numpy as np

from . import DEFAULT_BLOCK_ROWS, Reader, check_finite
from ..optional import require

__all__ = ["read", "ParquetReader"]

KEY_NAMES = ("word", "key", "token", "text")


class ParquetReader(Reader):
    """Blocks of ``(vectors, keys)`` from a Parquet file's key and vector columns."""

    has_keys = True

    def __init__(self, path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
                 tensor: str | None = None, dtype=None):
        super().__init__(path, block_rows=block_rows, limit=limit)
        self.format = "parquet"
        pa = self._pa = require("pyarrow", extra="parquet", feature="reading Parquet files")
        pq = require("pyarrow.parquet", extra="parquet", feature="reading Parquet files")
        try:
            self._pf = pq.ParquetFile(self.path, pre_buffer=False)
        except (pa.ArrowException, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise self.error(f"not a readable Parquet file ({first})") from None
        schema = self._pf.schema_arrow
        self._key = self._key_column(schema)
        self._vec, value_type, size = self._vector_column(schema, tensor)
        self.tensor = self._vec
        self.count = self._pf.metadata.num_rows
        self.progress_total = self.count
        self.dtype = np.dtype(dtype) if dtype is not None else np.dtype(
            value_type.to_pandas_dtype())
        self.dim = size if size is not None else self._first_length()

    def _listing(self, schema) -> str:
        return ", ".join(f"{f.name} ({f.type})" for f in schema)

    def _key_column(self, schema) -> str:
        pa = self._pa
        strings = [f.name for f in schema if pa.types.is_string(f.type) or
                   pa.types.is_large_string(f.type)]
        named = [n for n in KEY_NAMES if n in strings]
        if named:
            return named[0]
        if len(strings) != 1:
            raise self.error(f"expected one string column of keys (or one named "
                             f"{', '.join(KEY_NAMES)}), got {len(strings)} among "
                             f"{self._listing(schema)}")
        return strings[0]

    def _vector_column(self, schema, tensor: str | None):
        pa = self._pa

        def vector(t) -> bool:
            return (pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or
                    pa.types.is_large_list(t)) and pa.types.is_floating(t.value_type)
        if tensor is not None:
            if schema.get_field_index(tensor) < 0 or not vector(schema.field(tensor).type):
                raise self.error(f"expected a column {tensor!r} of float lists, got "
                                 f"{self._listing(schema)}")
            name = tensor
        else:
            found = [f.name for f in schema if vector(f.type)]
            if len(found) != 1:
                raise self.error(f"expected exactly one column of float vectors, got "
                                 f"{len(found)} among {self._listing(schema)}; choose one "
                                 "with tensor=")
            name = found[0]
        t = schema.field(name).type
        size = t.list_size if pa.types.is_fixed_size_list(t) else None
        return name, t.value_type, size

    def _first_length(self) -> int:
        for batch in self._pf.iter_batches(batch_size=1, columns=[self._vec]):
            if batch.num_rows:
                first = batch.column(0)[0]
                if first.is_valid:
                    return len(first)
        raise self.error(f"column {self._vec!r} holds no vector to take the dimension from")

    def blocks(self):
        pa = self._pa
        row = 0
        for batch in self._pf.iter_batches(batch_size=self.block_rows,
                                           columns=[self._key, self._vec]):
            if self.limit is not None and row >= self.limit:
                return
            if self.limit is not None:
                batch = batch.slice(0, self.limit - row)
            keys, vecs = batch.column(0), batch.column(1)
            n = len(batch)
            for col, what in ((keys, "key"), (vecs, "vector")):
                if col.null_count:
                    bad = int(np.argmax(~np.asarray(col.is_valid())))
                    raise self.error(f"row {row + bad + 1}: expected a {what}, got null")
            if not pa.types.is_fixed_size_list(vecs.type):
                lengths = np.asarray(vecs.value_lengths())
                if (lengths != self.dim).any():
                    bad = int(np.argmax(lengths != self.dim))
                    raise self.error(f"row {row + bad + 1}: expected {self.dim} values, got "
                                     f"{int(lengths[bad])}")
            values = vecs.flatten().to_numpy(zero_copy_only=False)
            raw = values.reshape(n, self.dim)
            check_finite(self, raw, row)
            with np.errstate(over="ignore"):
                block = np.array(raw, dtype=self.dtype, order="C")
            if block.dtype.itemsize < raw.dtype.itemsize:
                check_finite(self, block, row)  # narrowed: an overflow is an infinity
            row += n
            self.progress_done = row
            yield block, keys.to_pylist()

    def close(self) -> None:
        pf, self._pf = getattr(self, "_pf", None), None
        if pf is not None:
            pf.close()


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None) -> ParquetReader:
    """Stream the keys and vectors of a Parquet file (see the module doc)."""
    return ParquetReader(os.fspath(path), block_rows=block_rows, limit=limit, tensor=tensor,
                         dtype=dtype)

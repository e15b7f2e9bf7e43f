"""Row norms as stored in the ``norms`` array (docs/FORMAT.md §3d): how they are computed
and the stream a :class:`~embstore.store.writer.TableWriter` writes them with.

``norms[i]`` is the Euclidean norm of row ``i`` *as the table returns it* (after the
bfloat16 widening or the int8 dequantisation), summed in float64 and stored as float32
(float64 for float64 tables), so that an exact cosine scan divides ``rows @ q`` by them
instead of computing norms again (:mod:`embstore.search.exact`).  The array is
``(vocab_size, 1)``: the same 2-D sharded, crc32c-checksummed layout as ``vectors`` and
``row_scale``, read and rewritten by the same code.
"""

from __future__ import annotations

import os

import numpy as np

from ..codecs import Layout
from ...dtypes import StorageDtype
from ..rows.norms import norms_dtype
from ..rows.layout import choose_chunk_rows, min_chunk_rows
from ..rows.stream import PagedStream, create_paged_array
from ..shard.write import BackgroundSync, RowStream

__all__ = ["NORMS_ARRAY", "create_norms_stream",
           "norms_layout", "create_paged_side", "side_chunk_rows"]

NORMS_ARRAY = "norms"
NORM_CHUNK_ROWS = 1024  # 4 KiB chunks: norms are read in long runs, a page per chunk


def norms_layout(shard_rows: int, chunk_rows: int) -> tuple[int, int]:
    """``(chunk_rows, shard_rows)`` of the norms of a table with this layout: 1,024-row
    chunks (or the table's chunk when larger), shards of about the table's shard rows."""
    ncr = max(chunk_rows, NORM_CHUNK_ROWS // chunk_rows * chunk_rows)
    return ncr, max(ncr, shard_rows // ncr * ncr)


def create_norms_stream(group, root: str, storage: str, chunk_rows: int, shard_rows: int,
                        sync: BackgroundSync | None) -> RowStream:
    """Create the empty ``norms`` array in the zarr ``group`` (at ``root``) and return the
    stream its rows are written with."""
    from zarr.codecs import BytesCodec, Crc32cCodec
    ncr, nsr = norms_layout(shard_rows, chunk_rows)
    arr = group.create_array(
        NORMS_ARRAY, shape=(0, 1), dtype=norms_dtype(storage), chunks=(ncr, 1),
        shards=(nsr, 1), serializer=BytesCodec(endian="little"), compressors=[Crc32cCodec()],
        fill_value=0, dimension_names=("row", "norm"))
    layout = Layout.from_metadata(arr.metadata.to_dict())
    assert layout is not None
    return RowStream(os.path.join(root, NORMS_ARRAY), layout, None, sync)


def side_chunk_rows(row_bytes: int, rows: int | None, vectors_chunk_rows: int) -> int:
    """Rows per chunk of a side array (``norms``, ``row_scale``) of ``row_bytes`` a row:
    fitted to ``rows`` when known; otherwise as many rows as a chunk of ``vectors`` holds
    (at least a page), so the side array's padding is a ``dim``-th of the vectors' padding,
    not a 64 MiB file (16M norms) beside a table of 400,000 rows."""
    if rows is not None:
        return choose_chunk_rows(row_bytes, rows)
    return max(min_chunk_rows(row_bytes), vectors_chunk_rows)


def create_paged_side(group, root: str, record: StorageDtype, rows: int | None,
                      sync: BackgroundSync | None, vectors_chunk_rows: int
                      ) -> list[PagedStream]:
    """Format 2: the empty row arrays beside ``vectors`` (``row_scale`` of a record with a
    side array, then ``norms``) as format-2 row arrays with their page checksums, each with
    its own chunk rows (:func:`side_chunk_rows`); their streams, in that order."""
    arrays: list[tuple[str, np.dtype, int, tuple[str, str]]] = [] if record.side is None else [
        (record.side.name, np.dtype(record.side.dtype), record.side.columns,
         record.side.dimension_names)]
    arrays.append((NORMS_ARRAY, norms_dtype(record.name), 1, ("row", "norm")))
    out = []
    for name, dt, cols, dims in arrays:  # a loop per array
        dt = dt.newbyteorder("<")
        out.append(create_paged_array(group, root, name, dt, dt, cols,
                                      side_chunk_rows(cols * dt.itemsize, rows,
                                                      vectors_chunk_rows), sync, dims))
    return out

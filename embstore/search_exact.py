"""The exact cosine scan behind :func:`embstore.search.most_similar`.

One pass over the table in blocks (:func:`embstore.store.scan.scan_blocks`: zero-copy views
of the mapped shards where the layout allows), and per block:

- one matrix product of the rows with the (normalised, negated) queries: ``rows @ -q`` for
  one query (BLAS gemv straight from the strided view), ``-Q @ rows.T`` for a batch, so a
  batch of queries shares one read of the table;
- a division by the rows' stored norms (``norms``, docs/FORMAT.md §2d; computed per block
  for tables without them): a zero row scores 0/0 = NaN, which ``argpartition`` sorts after
  every number, so it never outranks a real neighbour;
- ``argpartition`` for the ``k`` best of the block; where the k-th score is tied across the
  boundary (or is not a number) the block's exact selection (lowest ids among ties,
  :func:`embstore.topk.top_k_columns`) is taken instead.

The candidates of all blocks are merged at the end.  Scores are negated throughout so that
NaN (undefined cosine) lands last in NumPy's partitions without a pass to replace it.
"""

from __future__ import annotations

import numpy as np

from .store.scan import scan_blocks
from .table import Table
from .topk import sort_desc, top_k_columns

__all__ = ["cosine_top_k", "SCAN_BLOCK_BYTES", "scan_block_rows"]

#: bytes of rows per block: large enough that the per-block work (a partition, a few
#: NumPy calls) is small against the product, small enough to stay a few MiB
SCAN_BLOCK_BYTES = 8 << 20


def scan_block_rows(table: Table, n_queries: int) -> int:
    """Rows per block: about ``SCAN_BLOCK_BYTES`` of rows plus their scores."""
    row_bytes = table.dim * table.dtype.itemsize + 8 * max(1, n_queries)
    return int(max(256, min(SCAN_BLOCK_BYTES // row_bytes, max(1, table.vocab_size))))


def _scores(rows: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """``neg @ rows.T`` (``(n, b)``).  One query: ``einsum`` (one thread at memory speed;
    measured on this 2-core machine under load, OpenBLAS's threaded gemv of an 8 MiB block
    took 20-30 ms against 2.5-5 ms); a batch: BLAS (the product is compute-bound)."""
    if neg.shape[0] == 1:
        return np.einsum("ij,j->i", rows, neg[0])[None, :]
    return np.ascontiguousarray((rows @ neg.T).T)  # (b, n) measured 1.3-2x faster than (n, b)


def _block_best(s: np.ndarray, k: int) -> np.ndarray:
    """Columns ``(n, k)``, ascending, of the ``k`` smallest negated scores of each row of
    ``s`` (lowest columns among ties; NaN last)."""
    n, b = s.shape
    if b <= k:
        return np.broadcast_to(np.arange(b), (n, b))
    idx = np.argpartition(s, k - 1, axis=1)[:, :k]
    kth = np.take_along_axis(s, idx, axis=1).max(axis=1)
    exact = np.isfinite(kth) & (np.count_nonzero(s <= kth[:, None], axis=1) == k)
    if not exact.all():  # ties across the boundary, or NaN/inf among the best
        bad = np.flatnonzero(~exact)
        idx[bad] = top_k_columns(-s[bad], k)
    return np.sort(idx, axis=1)


def cosine_top_k(table: Table, q: np.ndarray, k: int, *, exclude: np.ndarray,
                 own: np.ndarray | None, block_rows: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, ids)``, ``(n, k)`` sorted by descending cosine, of the unit queries ``q``
    (``(n, dim)``, the compute dtype; zero rows for zero queries) against every row.

    ``exclude`` (sorted ids) and each query's ``own`` id score ``-inf``: the caller turns
    places holding them into id -1 (fewer rows left than ``k``)."""
    n = q.shape[0]
    dtype = q.dtype
    zero_q = np.flatnonzero(~q.any(axis=1))
    neg = np.ascontiguousarray(-q)
    rows_per = block_rows or scan_block_rows(table, n)
    vals: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for start, rows, norms in scan_blocks(table, rows_per):
            stop = start + rows.shape[0]
            if rows.dtype != dtype:
                rows = rows.astype(dtype)
            s = _scores(rows, neg)
            if norms is None:
                norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
            s /= norms  # a zero row: 0 / 0 = NaN
            if zero_q.size:
                s[zero_q] = np.nan
            gone = exclude[(exclude >= start) & (exclude < stop)]
            if gone.size:
                s[:, gone - start] = np.inf
            if own is not None:
                mine = np.flatnonzero((own >= start) & (own < stop))
                s[mine, own[mine] - start] = np.inf
            cols = _block_best(s, k)
            vals.append(np.take_along_axis(s, cols, axis=1))
            ids.append(cols + start)
    if not vals:
        return np.empty((n, 0), dtype), np.empty((n, 0), np.int64)
    v = -np.concatenate(vals, axis=1)
    i = np.concatenate(ids, axis=1).astype(np.int64, copy=False)
    cols = top_k_columns(v, k)
    return sort_desc(np.take_along_axis(v, cols, axis=1), np.take_along_axis(i, cols, axis=1))

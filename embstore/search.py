"""Streamed scoring against the whole table: tied-output logits and cosine search.

Both read the table with ``Table.iter_blocks(block_rows)``, so at most one
block of rows is in memory at a time (plus the scores of that block), and keep
a running top-k merged block by block.  Ranking is by descending score, ties
broken by lower id; NaN scores rank below every number (but above ``-inf``, the
score of places left empty by ``exclude``).
"""

from __future__ import annotations

import numbers

import numpy as np

from .errors import ShapeMismatchError
from .ids import as_ids, positive_int
from .table import Table, as_key_array

__all__ = ["logits", "most_similar", "top_k_columns", "auto_block_rows"]

BLOCK_BYTES = 32 << 20  # memory budget of one block of rows plus its scores


def auto_block_rows(table: Table, n_queries: int) -> int:
    """Rows per block so that a block and its scores take about ``BLOCK_BYTES``.

    Rounded down to a multiple of the table's ``layout["shard_rows"]`` when it has
    one (so a block reads whole shards of an on-disk table).
    """
    row_bytes = table.dim * table.dtype.itemsize + 3 * 4 * max(1, n_queries)
    rows = max(256, BLOCK_BYTES // max(1, row_bytes))
    layout = getattr(table, "layout", None)  # ZarrTable.layout: chunk_rows, shard_rows, ...
    shard = layout.get("shard_rows") if isinstance(layout, dict) else None
    if isinstance(shard, int) and 0 < shard <= rows:
        rows -= rows % shard
    return int(min(rows, max(1, table.vocab_size)))


def _check_block_rows(table: Table, block_rows, n_queries: int) -> int:
    if block_rows is None:
        return auto_block_rows(table, n_queries)
    return positive_int(block_rows, "block_rows")


def _check_k(k, name: str) -> int:
    return positive_int(k, name)


def _rank_key(values: np.ndarray) -> np.ndarray:
    """``values`` with NaN replaced by the lowest finite number (below all, above -inf)."""
    nan = np.isnan(values)
    if not nan.any():
        return values
    return np.where(nan, -np.finfo(values.dtype).max, values)


def top_k_columns(values: np.ndarray, k: int) -> np.ndarray:
    """Column indices ``(n, k)``, ascending, of the ``k`` largest values of each row.

    Among equal values the leftmost columns win; NaN ranks below every number
    except ``-inf``.  Vectorised:
    one ``np.partition`` finds each row's k-th largest value, the rows where that
    value is tied across the boundary take their leftmost ties.
    """
    n, m = values.shape
    if k >= m:
        return np.broadcast_to(np.arange(m), (n, m))
    key = _rank_key(values)
    kth = np.partition(key, m - k, axis=1)[:, m - k][:, None]
    sel = key > kth
    eq = key == kth
    need = k - sel.sum(axis=1)
    tied = eq.sum(axis=1) > need
    if tied.any():
        first = eq[tied] & (np.cumsum(eq[tied], axis=1) <= need[tied][:, None])
        eq[tied] = first
    sel |= eq
    return np.nonzero(sel)[1].reshape(n, k)


class _RunningTopK:
    """The best ``k`` (value, id) pairs of each row seen so far, kept in id order."""

    def __init__(self, n: int, k: int, dtype):
        self.k = k
        self.values = np.empty((n, 0), dtype=dtype)
        self.ids = np.empty((n, 0), dtype=np.int64)

    def add(self, scores: np.ndarray, start: int) -> None:
        n, b = scores.shape
        if self.values.shape[1] + b > self.k and b > self.k:  # shrink the block first
            cols = top_k_columns(scores, self.k)
            scores = np.take_along_axis(scores, cols, axis=1)
            block_ids = cols + start
        else:
            block_ids = np.broadcast_to(np.arange(start, start + b, dtype=np.int64), (n, b))
        values = np.concatenate([self.values, scores], axis=1)
        ids = np.concatenate([self.ids, block_ids], axis=1)  # ids stay ascending per row
        cols = top_k_columns(values, self.k)
        self.values = np.take_along_axis(values, cols, axis=1)
        self.ids = np.take_along_axis(ids, cols, axis=1)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, ids)`` sorted by descending value, ties by ascending id."""
        order = np.argsort(-_rank_key(self.values), axis=1, kind="stable")
        return (np.take_along_axis(self.values, order, axis=1),
                np.take_along_axis(self.ids, order, axis=1))


def _compute_dtype(table: Table, arr: np.ndarray) -> np.dtype:
    if arr.dtype.kind == "f":
        return np.result_type(np.float32, table.dtype, arr.dtype)
    return np.result_type(np.float32, table.dtype)


def _as_vectors(table: Table, hidden, what: str) -> np.ndarray:
    h = np.asarray(hidden)
    if h.dtype.kind not in "iuf":
        raise ShapeMismatchError(f"{what} must be numeric, got dtype {h.dtype}")
    if h.ndim == 0 or h.shape[-1] != table.dim:
        raise ShapeMismatchError(
            f"{what} must have shape (..., dim) with dim = {table.dim}, got {h.shape}")
    return h


def logits(table: Table, hidden, *, top_k: int | None = None, block_rows: int | None = None):
    """``hidden @ table.T`` streamed by blocks of rows (see :meth:`Embedding.logits`).

    The result dtype is the promotion of float32, the table's dtype and a float
    ``hidden``'s dtype.  ``top_k`` larger than ``vocab_size`` gives ``vocab_size``
    columns.
    """
    h = _as_vectors(table, hidden, "hidden")
    dtype = _compute_dtype(table, h)
    lead = h.shape[:-1]
    h2 = np.ascontiguousarray(h.reshape(-1, table.dim), dtype=dtype)
    n = h2.shape[0]
    rows = _check_block_rows(table, block_rows, n)
    vocab = table.vocab_size
    if top_k is None:
        out = np.empty((n, vocab), dtype=dtype)
        for start, block in table.iter_blocks(rows):
            out[:, start:start + block.shape[0]] = h2 @ block.astype(dtype, copy=False).T
        return out.reshape(lead + (vocab,))
    k = min(_check_k(top_k, "top_k"), vocab)
    best = _RunningTopK(n, k, dtype)
    for start, block in table.iter_blocks(rows):
        best.add(h2 @ block.astype(dtype, copy=False).T, start)
    values, ids = best.result()
    return values.reshape(lead + (k,)), ids.reshape(lead + (k,))


def _resolve_ids_or_keys(table: Table, items) -> np.ndarray:
    """int64 ids of ``items``: ids, keys or a mix of both (any shape, flattened)."""
    if isinstance(items, str):
        return table.ids_of(items).reshape(-1)
    if isinstance(items, np.ndarray):
        if items.dtype.kind in "USO":
            return table.ids_of(items).reshape(-1) if items.dtype.kind != "O" else \
                _resolve_ids_or_keys(table, items.reshape(-1).tolist())
        return as_ids(items, table.vocab_size).reshape(-1)
    if isinstance(items, numbers.Integral):
        return as_ids(items, table.vocab_size).reshape(-1)
    items = list(items)
    keys = [x for x in items if isinstance(x, str)]
    other = [x for x in items if not isinstance(x, str)]
    parts = [np.empty(0, dtype=np.int64)]
    if keys:
        parts.append(table.ids_of(as_key_array(keys)).reshape(-1))
    if other:
        parts.append(as_ids(other, table.vocab_size).reshape(-1))
    return np.concatenate(parts)


def _resolve_query(table: Table, query):
    """``(vectors (n, dim), own ids (n,) or None, single)`` for a query."""
    if isinstance(query, str) or (isinstance(query, numbers.Integral)
                                  and not isinstance(query, (bool, np.bool_))):
        ids = _resolve_ids_or_keys(table, query)
        return table.lookup(ids), ids, True
    if isinstance(query, (list, tuple)) and any(isinstance(x, str) for x in query):
        ids = table.ids_of(as_key_array(list(query))).reshape(-1)
        return table.lookup(ids), ids, False
    arr = np.asarray(query)
    if arr.dtype.kind in "USO" or (arr.dtype.kind in "iub"):
        if arr.ndim > 1:
            raise ShapeMismatchError(f"a query of ids or keys must be 0-D or 1-D, got shape "
                                     f"{arr.shape}")
        if arr.dtype.kind == "O":
            ids = _resolve_ids_or_keys(table, arr.reshape(-1).tolist())
        elif arr.dtype.kind in "US":
            ids = table.ids_of(arr).reshape(-1)
        else:
            ids = as_ids(query, table.vocab_size).reshape(-1)
        return table.lookup(ids), ids, arr.ndim == 0
    vec = _as_vectors(table, arr, "a query vector")
    if vec.ndim > 2:
        raise ShapeMismatchError(f"query vectors must be (dim,) or (n, dim), got {vec.shape}")
    return vec.reshape(-1, table.dim), None, vec.ndim == 1


def most_similar(table: Table, query, *, k: int = 10, exclude=(),
                 block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-``k``: ``(ids, scores)``, streamed by blocks of rows.

    ``query``: a float vector ``(dim,)`` or vectors ``(n, dim)``; an id or key; a
    1-D list/array of ids or keys.  A single query gives ``(k,)`` arrays, a batch
    ``(n, k)``.  A query given as an id or key is left out of its own results (as
    gensim does); ``exclude`` (ids and/or keys) is left out of every result.
    ``cosine = q . row / (|q| |row|)``.  Cosine is undefined for a row or query
    of norm zero: it scores NaN and ranks below every row with a real score
    (so a zero row never outranks a real neighbour, even one of cosine -1).
    When fewer than ``k`` rows remain, the result has as many columns as the
    query with the most candidates; the missing places of other queries hold id
    -1 and score -inf.
    """
    k = _check_k(k, "k")
    q, own, single = _resolve_query(table, query)
    excl = np.unique(_resolve_ids_or_keys(table, exclude)) if exclude is not None else \
        np.empty(0, dtype=np.int64)
    dtype = _compute_dtype(table, q)
    q = np.ascontiguousarray(q, dtype=dtype)
    qnorm = np.sqrt(np.einsum("ij,ij->i", q, q))
    q = q / np.where(qnorm == 0, 1, qnorm)[:, None]
    zero_q = np.flatnonzero(qnorm == 0)
    n = q.shape[0]
    vocab = table.vocab_size
    left = np.full(n, vocab - excl.size, dtype=np.int64)
    if own is not None:
        left -= ~np.isin(own, excl)
    k = int(min(k, max(0, left.max(initial=0))))
    rows = _check_block_rows(table, block_rows, n)
    best = _RunningTopK(n, k, dtype)
    if k:
        for start, block in table.iter_blocks(rows):
            stop = start + block.shape[0]
            b = block.astype(dtype, copy=False)
            norms = np.sqrt(np.einsum("ij,ij->i", b, b))
            scores = q @ b.T
            scores /= np.where(norms == 0, 1, norms)
            scores[:, norms == 0] = np.nan  # undefined cosine: ranks below real scores
            scores[zero_q] = np.nan
            gone = excl[(excl >= start) & (excl < stop)]
            if gone.size:
                scores[:, gone - start] = -np.inf
            if own is not None:
                mine = np.flatnonzero((own >= start) & (own < stop))
                scores[mine, own[mine] - start] = -np.inf
            best.add(scores, start)
    scores, ids = best.result()
    if k:
        invalid = np.isin(ids, excl)
        if own is not None:
            invalid |= ids == own[:, None]
        if invalid.any():
            ids[invalid] = -1
            scores[invalid] = -np.inf
    if single:
        return ids[0], scores[0]
    return ids, scores

"""Streamed scoring against the whole table: tied-output logits and cosine search.

Both read the table with ``Table.iter_blocks(block_rows)``, so at most one
block of rows is in memory at a time (plus the scores of that block), and keep
a running top-k merged block by block.  Ranking is by descending score, ties
broken by lower id; NaN scores rank below every number (but above ``-inf``, the
score of places left empty by ``exclude``).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import InvalidOptionError, ShapeMismatchError
from ..ids import as_ids, as_key_array, non_negative_int, positive_int
from ..table import Table
from .ann import approx_top_k
from .exact import cosine_top_k
from .topk import RunningTopK, top_k_columns

__all__ = ["logits", "most_similar", "top_k_columns", "auto_block_rows"]

BLOCK_BYTES = 32 << 20  # memory budget of one block of rows plus its scores


def auto_block_rows(table: Table, n_queries: int) -> int:
    """Rows per block so that a block and its scores take about ``BLOCK_BYTES``.

    Rounded down to a multiple of the table's ``layout["shard_rows"]`` when it has
    one (so a block reads whole shards of an on-disk table).
    """
    row_bytes = table.dim * table.dtype.itemsize + 3 * 4 * max(1, n_queries)
    rows = max(256, BLOCK_BYTES // max(1, row_bytes))
    layout = table.layout  # ZarrTable.layout: chunk_rows, shard_rows, ...
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
    h2 = np.ascontiguousarray(h.reshape(math.prod(lead), table.dim), dtype=dtype)  # dim 0 too
    n = h2.shape[0]
    rows = _check_block_rows(table, block_rows, n)
    vocab = table.vocab_size
    if top_k is None:
        out = np.empty((n, vocab), dtype=dtype)
        for start, block in table.iter_blocks(rows):
            out[:, start:start + block.shape[0]] = h2 @ block.astype(dtype, copy=False).T
        return out.reshape(lead + (vocab,))
    k = min(_check_k(top_k, "top_k"), vocab)
    best = RunningTopK(n, k, dtype)
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
    return vec.reshape(math.prod(vec.shape[:-1]), table.dim), None, vec.ndim == 1


def _all_scores(table: Table, q: np.ndarray, dtype, excl: np.ndarray, single: bool,
                block_rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``k=None``: every row's cosine, in row order (gensim's ``topn=None``)."""
    q = np.ascontiguousarray(q, dtype=dtype)
    qnorm = np.sqrt(np.einsum("ij,ij->i", q, q))
    q = q / np.where(qnorm == 0, 1, qnorm)[:, None]
    n, vocab = q.shape[0], table.vocab_size
    scores = np.empty((n, vocab), dtype=dtype)
    rows = _check_block_rows(table, block_rows, n)
    for start, block in table.iter_blocks(rows):
        b = block.astype(dtype, copy=False)
        norms = np.sqrt(np.einsum("ij,ij->i", b, b))
        with np.errstate(invalid="ignore", divide="ignore"):  # a zero row: NaN, as gensim
            scores[:, start:start + b.shape[0]] = (q @ b.T) / norms
    scores[:, excl] = -np.inf
    ids = np.broadcast_to(np.arange(vocab, dtype=np.int64), (n, vocab)).copy()
    return (ids[0], scores[0]) if single else (ids, scores)


def most_similar(table: Table, query, *, k: int | None = 10, exclude=(),
                 block_rows: int | None = None, approx: bool = False,
                 ef: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-``k``: ``(ids, scores)``, streamed by blocks of rows.

    ``query``: a float vector ``(dim,)`` or vectors ``(n, dim)``; an id or key; a
    1-D list/array of ids or keys.  A single query gives ``(k,)`` arrays, a batch
    ``(n, k)``.  A query given as an id or key is left out of its own results (as
    gensim does); ``exclude`` (ids and/or keys) is left out of every result.
    ``cosine = q . row / (|q| |row|)``.  Cosine is undefined for a row or query
    of norm zero: it scores NaN and ranks below every row with a real score
    (so a zero row never outranks a real neighbour, even one of cosine -1).
    ``k=0`` gives empty results; ``k=None`` every row's score in row order (ids
    ``0..vocab_size-1``), as gensim's ``topn=None``: the query itself included, rows in
    ``exclude`` scoring -inf (always exact).
    When fewer than ``k`` rows remain, the result has as many columns as the
    query with the most candidates; the missing places of other queries hold id
    -1 and score -inf.

    ``approx=True`` asks the table's approximate index (:func:`embstore.search.ann.build_index`)
    instead, with search effort ``ef`` (default: the index's); its scores are of the
    index's metric.  A stale index (the table changed since) warns
    (:class:`embstore.search.ann.StaleIndexWarning`) and the search runs exactly.
    """
    if k is not None:
        k = non_negative_int(k, "k", error=InvalidOptionError)
    if table.dim == 0:
        raise ShapeMismatchError("cosine similarity needs rows of dim >= 1, the table has dim 0")
    q, own, single = _resolve_query(table, query)
    excl = np.unique(_resolve_ids_or_keys(table, exclude)) if exclude is not None else \
        np.empty(0, dtype=np.int64)
    dtype = _compute_dtype(table, q)
    if k is None:
        if block_rows is not None:
            block_rows = positive_int(block_rows, "block_rows")
        return _all_scores(table, q, dtype, excl, single, block_rows)
    raw = q = np.ascontiguousarray(q, dtype=dtype)
    n = q.shape[0]
    if ef is not None:
        ef = positive_int(ef, "ef")
    vocab = table.vocab_size
    left = np.full(n, vocab - excl.size, dtype=np.int64)
    if own is not None:
        left -= ~np.isin(own, excl)
    k = int(min(k, max(0, left.max(initial=0))))
    if block_rows is not None:
        block_rows = positive_int(block_rows, "block_rows")
    found = approx_top_k(table, raw, k, exclude=excl, own=own, ef=ef) if approx and k else None
    if found is not None:
        scores, ids = found
    elif k:
        qnorm = np.sqrt(np.einsum("ij,ij->i", q, q))
        q = q / np.where(qnorm == 0, 1, qnorm)[:, None]
        scores, ids = cosine_top_k(table, q, k, exclude=excl, own=own, block_rows=block_rows)
    else:
        scores, ids = np.empty((n, 0), dtype), np.empty((n, 0), np.int64)
    if k and (excl.size or own is not None):
        invalid = np.isin(ids, excl)
        if own is not None:
            invalid |= ids == own[:, None]
        if invalid.any():
            ids[invalid] = -1
            scores[invalid] = -np.inf
    if single:
        return ids[0], scores[0]
    return ids, scores

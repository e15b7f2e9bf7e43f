"""Top-k selection shared by the streamed scans (:mod:`embstore.search.stream`,
:mod:`embstore.search.exact`): ranking by descending value, ties by the lower column (id),
NaN below every number but above ``-inf``."""

from __future__ import annotations

import numpy as np

__all__ = ["top_k_columns", "RunningTopK", "rank_key", "sort_desc"]


def rank_key(values: np.ndarray) -> np.ndarray:
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
    key = rank_key(values)
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


class RunningTopK:
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
        order = np.argsort(-rank_key(self.values), axis=1, kind="stable")
        return (np.take_along_axis(self.values, order, axis=1),
                np.take_along_axis(self.ids, order, axis=1))


def sort_desc(values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, ids)`` of each row sorted by descending value (stable: ``ids`` given in
    ascending order stay so among ties)."""
    order = np.argsort(-rank_key(values), axis=1, kind="stable")
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(ids, order, axis=1)

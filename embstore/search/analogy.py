"""What gensim users reach for: analogy queries and unit-normalised rows.

- :func:`analogy_query` turns gensim's ``most_similar(positive=[...], negative=[...])``
  into one query vector and the ids to leave out, with gensim's semantics
  (``KeyedVectors.most_similar``): each key or id counts as its unit-normalised row,
  weighted +1 (positive) or -1 (negative), a vector given as is; the query is the unit
  vector of their mean; every key and id given is left out of the results.
  ``Embedding.most_similar(positive=..., negative=...)`` runs it through the exact search.
- :func:`normalized` is a read-only view of a table whose rows are unit vectors (a zero
  row stays zero), as gensim's ``get_normed_vectors()`` / ``get_vector(key, norm=True)``,
  without copying the table: each lookup normalises the rows it returns.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import ShapeMismatchError
from ..table import Table

__all__ = ["analogy_query", "normalized", "NormalizedTable"]


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return rows / np.where(norms == 0, 1, norms)


def _items(words) -> list:
    if words is None:
        return []
    if isinstance(words, (str, numbers.Integral)) or (
            isinstance(words, np.ndarray) and words.ndim == 1 and words.dtype.kind == "f"):
        return [words]  # one key, id or vector (gensim takes a lone key too)
    return list(words)


def analogy_query(table: Table, positive=None, negative=None) -> tuple[np.ndarray, np.ndarray]:
    """``(query vector (dim,), ids to exclude)`` of gensim's analogy arithmetic (module doc):
    ``positive=["king", "woman"], negative=["man"]`` asks for ``queen``."""
    weighted = [(w, 1.0) for w in _items(positive)] + [(w, -1.0) for w in _items(negative)]
    if not weighted:
        raise ValueError("an analogy query needs at least one positive or negative key")
    parts, own = [], []
    for item, weight in weighted:
        if isinstance(item, str) or (isinstance(item, numbers.Integral)
                                      and not isinstance(item, (bool, np.bool_))):
            i = table.ids_of(item).reshape(-1) if isinstance(item, str) else \
                np.array([item], dtype=np.int64)
            row = table.lookup(i)[0].astype(np.float64)
            parts.append(weight * _unit(row))
            own.append(int(i[0]))
        else:
            vec = np.asarray(item, dtype=np.float64)
            if vec.shape != (table.dim,):
                raise ShapeMismatchError(f"an analogy vector must have shape ({table.dim},), "
                                         f"got {vec.shape}")
            parts.append(weight * vec)
    mean = _unit(np.mean(parts, axis=0))
    return mean.astype(table.dtype), np.unique(np.array(own, dtype=np.int64))


class NormalizedTable(Table):
    """A read-only view of ``table`` whose rows are unit vectors (see the module doc)."""

    def __init__(self, table: Table):
        self._base = table
        self.path = table.path

    @property
    def shape(self) -> tuple[int, int]:
        return self._base.shape

    @property
    def dtype(self) -> np.dtype:
        return self._base.dtype

    @property
    def writable(self) -> bool:
        return False

    def _vocab(self):
        return self._base._vocab()

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        out[...] = _unit(self._base.lookup(ids))

    def _read_rows(self, start: int, stop: int) -> np.ndarray:
        return _unit(self._base[start:stop]).astype(self.dtype, copy=False)

    def close(self) -> None:  # the view owns nothing: the base table stays open
        self._closed = True

    def __repr__(self) -> str:
        return f"normalized({self._base!r})"


def normalized(table: Table) -> NormalizedTable:
    """``table`` with unit-length rows, as a read-only :class:`~embstore.Table` view."""
    return NormalizedTable(table)

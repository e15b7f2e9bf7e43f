"""Keys as queries when unknown keys have subword vectors (``Embedding(..., oov="subword")``,
``embstore similar`` on a table imported from a fastText ``.bin``).

:func:`similar_keys` runs the known keys as keys (each left out of its own results, as
gensim does) and the unknown ones as the vectors composed from their character n-grams
(nothing to leave out), then puts the results back in query order.
"""

from __future__ import annotations

import numpy as np

from .stream import most_similar
from ..ids import as_key_array
from ..table import Table

__all__ = ["holds_keys", "similar_keys"]


def holds_keys(value) -> bool:
    """Whether ``value`` is a key (str) or an array-like of keys, not ids or vectors."""
    if isinstance(value, str):
        return True
    try:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
    except ValueError:  # ragged
        return False
    return arr.dtype.kind in "US" or (arr.dtype == object and arr.size > 0
                                      and isinstance(arr.reshape(-1)[0], str))


def similar_keys(table: Table, query, *, k: int | None = 10, exclude=(),
                 block_rows: int | None = None, approx: bool = False,
                 ef: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``most_similar`` of keys, unknown ones by their subword vectors: ``(ids, scores)`` of
    shape ``keys.shape + (k,)`` (fewer rows than ``k``: missing places hold -1 and -inf)."""
    keys = as_key_array(query)
    flat = keys.reshape(-1)
    known = table.ids_of(flat, missing=-1) >= 0
    parts = []
    for which, q in ((known, flat[known]),
                     (~known, table.lookup_keys(flat[~known], oov="subword"))):
        if which.any():
            parts.append((which, most_similar(table, q, k=k, exclude=exclude,
                                              block_rows=block_rows, approx=approx, ef=ef)))
    width = max((p[1][0].shape[-1] for p in parts), default=0)
    dtype = parts[0][1][1].dtype if parts else np.float32
    ids = np.full((flat.size, width), -1, dtype=np.int64)
    scores = np.full((flat.size, width), -np.inf, dtype=dtype)
    for which, (i, s) in parts:  # the two groups' results, back in query order
        ids[which, :i.shape[-1]] = i
        scores[which, :s.shape[-1]] = s
    return ids.reshape(keys.shape + (width,)), scores.reshape(keys.shape + (width,))

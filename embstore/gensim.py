"""gensim ``KeyedVectors`` in and out of embstore tables (gensim is optional).

``from_gensim(kv, path)`` stores a ``KeyedVectors`` (keys in their order, vectors
exactly); ``to_gensim(table)`` gives one back.  A ``FastTextKeyedVectors`` stores its
word vectors only (the n-gram buckets that build vectors for unknown words are not
part of a table).
"""

from __future__ import annotations

import os

import numpy as np

from .errors import InvalidTypeError, ShapeMismatchError
from .memory import MemoryTable
from .optional import require
from .store.table import open as open_table
from .store.build import save
from .table import Table

__all__ = ["from_gensim", "to_gensim"]


def _keys_of(kv) -> list[str] | None:
    """The keys to store: strings as given, None for gensim's row numbers 0, 1, 2, ..."""
    keys = list(kv.index_to_key)
    if keys and type(keys[0]) is int and keys == list(range(len(keys))):
        return None
    bad = [i for i, k in enumerate(keys) if not isinstance(k, str)][:1]
    if bad:
        i = bad[0]
        raise ShapeMismatchError(f"table keys are strings: the KeyedVectors key at index {i} is "
                                 f"{type(keys[i]).__name__} {keys[i]!r}")
    return keys


def from_gensim(kv, path=None, **layout) -> Table:
    """Store a gensim ``KeyedVectors`` as a table at ``path`` (``layout``: the keyword
    arguments of :func:`embstore.save`: ``chunk_rows``, ``shard_rows``, ``compression``,
    ``overwrite``, ...).  Row ``i`` is ``kv.vectors[i]`` with key ``kv.index_to_key[i]``;
    keys must be strings, except that integer keys ``0, 1, 2, ...`` (gensim's way of
    having no keys) give a table without keys.
    With ``path=None`` the result is a :class:`MemoryTable` sharing ``kv.vectors``.
    """
    vectors = getattr(kv, "vectors", None)
    if not isinstance(vectors, np.ndarray) or not hasattr(kv, "index_to_key"):
        raise InvalidTypeError(f"expected a gensim KeyedVectors, got {type(kv).__name__}")
    keys = _keys_of(kv)
    if keys is not None and len(keys) != vectors.shape[0]:
        raise ShapeMismatchError(f"the KeyedVectors has {len(keys)} keys for "
                                 f"{vectors.shape[0]} vectors")
    if path is None:
        if layout:
            raise InvalidTypeError(f"layout options need a path, got {sorted(layout)}")
        return MemoryTable(vectors, keys=keys)
    return save(path, vectors, keys=keys, **layout)


def to_gensim(path_or_table):
    """A gensim ``KeyedVectors`` holding the whole table (a :class:`Table` or a path).

    Keys and their order are the table's; a table without keys gets the integer keys
    ``0, 1, 2, ...`` (its row numbers).  The vectors are a copy in RAM.  Each key has the
    vector attribute ``count`` that ``load_word2vec_format`` gives a file without a vocab
    file (``vocab_size - row``: descending, in row order).
    """
    KeyedVectors = require("gensim.models", extra="gensim", feature="to_gensim").KeyedVectors
    table = path_or_table
    opened = not isinstance(table, Table)
    if opened:
        if not isinstance(table, (str, os.PathLike)):
            raise InvalidTypeError(f"expected an embstore Table or the path of a table, got "
                            f"{type(table).__name__}")
        table = open_table(table, mode="r", cache_bytes=0)
    try:
        vectors = table.to_numpy()
        keys = list(table.keys) if table.keys is not None else list(range(table.vocab_size))
    finally:
        if opened:
            table.close()
    kv = KeyedVectors(table.dim, count=0, dtype=vectors.dtype)
    kv.add_vectors(keys, vectors)
    # the "count" attribute load_word2vec_format makes up when there is no vocab file:
    # descending, vocab_size - row (gensim's own tests and code read it)
    kv.allocate_vecattrs(attrs=["count"], types=[np.int64])
    kv.expandos["count"][:] = np.arange(len(keys), 0, -1, dtype=np.int64)
    return kv

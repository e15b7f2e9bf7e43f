"""Out-of-vocabulary ids and keys: the one mapping ``Table.lookup_keys``, ``Embedding``
and batch jobs share.

``oov`` says what an unknown key or an out-of-range id becomes:

- ``"error"``: the caller raises, naming the first one and its position;
- ``"zero"``: a zero row (here: the placeholder ``zero_id``, which the caller turns
  into zeros after the lookup);
- ``"unk"``: row ``unk_id``;
- ``"clip"`` (``Embedding`` only): clamped into ``0..vocab_size-1``;
- ``"subword"`` (keys only, tables with a fastText n-gram matrix): the mean of the unknown
  word's character n-gram rows, as fastText and gensim compute it (:func:`subword_rows`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np

from .errors import InvalidIdError, InvalidOptionError, KeyNotFoundError, table_label
from .ids import one_of

__all__ = ["OOV_MODES", "KEY_OOV_MODES", "EMBEDDING_OOV_MODES", "OOV", "check_oov", "map_oov",
           "subword_rows", "NgramMatrix", "MAX_NGRAM_CHARS"]

OOV = Literal["error", "zero", "unk", "subword"]
#: the longest character n-gram accepted (maxn) in a fastText model or a table's n-gram
#: matrix: n-gram work grows with it
MAX_NGRAM_CHARS = 64
OOV_MODES: tuple[str, ...] = ("error", "zero", "unk")  # ids and keys
KEY_OOV_MODES: tuple[str, ...] = OOV_MODES + ("subword",)  # keys: lookup_keys, batch jobs
EMBEDDING_OOV_MODES: tuple[str, ...] = ("error", "unk", "clip", "zero")


def check_oov(oov: object, unk_id: object, modes: tuple[str, ...] = OOV_MODES) -> str:
    """``oov`` if it is one of ``modes`` (and ``"unk"`` comes with an ``unk_id``)."""
    one_of(oov, "oov", modes)
    if oov == "unk" and unk_id is None:
        raise InvalidOptionError("oov='unk' needs unk_id")
    return str(oov)


def map_oov(ids: np.ndarray, bad: np.ndarray, oov: str, *, unk_id: int | None = None,
            zero_id: int = -1, low: np.ndarray | None = None,
            vocab_size: int = 0) -> np.ndarray:
    """int64 ``ids`` with the positions ``bad`` replaced as ``oov`` says.

    ``"unk"``: ``unk_id``; ``"zero"``: ``zero_id``; ``"clip"``: 0 where ``low`` (ids below
    the range) and ``vocab_size - 1`` elsewhere.  ``ids`` itself is not modified.
    """
    if oov == "unk":
        if unk_id is None:
            raise InvalidOptionError("oov='unk' needs unk_id")
        return np.where(bad, np.int64(unk_id), ids)
    if oov == "zero":
        return np.where(bad, np.int64(zero_id), ids)
    if oov == "clip":
        if vocab_size == 0:
            raise InvalidIdError("oov='clip' cannot clamp ids into a table of 0 rows",
                                 id=None, position=None, vocab_size=0)
        below = bad if low is None else low
        return np.where(below, np.int64(0), np.where(bad, np.int64(vocab_size - 1), ids))
    raise InvalidOptionError(f"oov={oov!r} maps no ids (expected 'zero', 'unk' or 'clip')")


class NgramMatrix(Protocol):
    """A fastText model's n-gram matrix, as ``Table.subwords`` gives it
    (:class:`embstore.store.subword.ngrams.Subwords` is one)."""

    minn: int
    maxn: int
    bucket: int

    def vectors(self, words: Sequence[str]) -> np.ndarray:
        """``(len(words), dim)``: each word the mean of its n-gram rows."""

    def copy_into(self, staging: str | os.PathLike[str], dtype: str, compression: str,
                  block_bytes: int) -> None:
        """Stream the matrix into a table being written at ``staging`` (``save``)."""


def subword_rows(table, keys: np.ndarray) -> np.ndarray:
    """Vectors of the unknown ``keys`` (1-D) from ``table.subwords`` (the n-gram matrix of a
    fastText model): each distinct key is composed once."""
    sub = table.subwords
    if sub is None:
        raise InvalidOptionError(f"oov='subword' needs a table with subword n-grams (imported "
                                 f"from a fastText .bin model); {table_label(table)} has none")
    if keys.size == 0:
        return np.zeros((0, table.dim), dtype=table.dtype)
    if sub.bucket == 0:
        raise KeyNotFoundError(f"key {keys[0]!r} is not in the table and the model has no "
                               "n-gram buckets (bucket 0): it has no subword vector",
                               key=keys[0], position=None)
    uniq, inv = np.unique(keys, return_inverse=True)
    return sub.vectors(uniq.tolist())[inv.reshape(-1)]

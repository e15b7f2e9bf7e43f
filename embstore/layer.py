"""Embedding: the operations of a model's embedding layer, on any :class:`Table`.

The layer reads the table only through the public ``Table`` API (``lookup``,
``iter_blocks``, ``ids_of``, geometry), so it works unchanged on the in-memory
and the on-disk backend, and it never writes to the table.

Order of operations of ``emb(ids, mask=..., weights=...)`` (and of each row
that goes into a ``bag``):

1. ids: out-of-range ids follow ``oov``; in-range ids listed in ``unk=`` become
   ``unk_id``;
2. lookup of the resulting ids (``oov="zero"`` positions give zero rows);
3. ``max_norm``: rows whose ``norm_type``-norm exceeds ``max_norm`` are scaled
   by ``max_norm / (norm + 1e-7)``, as ``torch.nn.functional.embedding`` does
   (PyTorch renormalises before it reads, so the order is the same); only the
   returned rows change, never the table;
4. ``mask``: positions where the mask is false/0 become zero rows;
5. ``weights``: each row is multiplied by its weight;
6. ``scale``: every row is multiplied by ``scale`` (or ``sqrt(dim)``).

``padding_idx`` follows PyTorch: a plain lookup returns the stored row at
``padding_idx`` (``torch.nn.Embedding`` with pretrained weights does the same;
it is zero in PyTorch only because a fresh module initialises that row to
zero, and a real model's pad row is not zero).  Bags leave padding entries out
of sums, means (the count) and max, as ``torch.nn.EmbeddingBag`` does.  To zero
padding positions, pass ``mask=ids != padding_idx``.

Results are C-contiguous arrays of the table's dtype.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from .errors import InvalidIdError, InvalidOptionError, InvalidTypeError, ShapeMismatchError, table_label
from .ids import _bad_type, _to_array, as_ids, check_like_ids
from .memory import MemoryTable
from .oov import EMBEDDING_OOV_MODES, check_oov, map_oov
from .pooling import check_bag_mode, pool_bags
from .renorm import renorm
from .search.analogy import analogy_query
from .search.stream import _resolve_ids_or_keys, logits, most_similar
from .search.subword import holds_keys, similar_keys
from .table import Table

__all__ = ["Embedding"]


def _int_id_array(ids) -> np.ndarray:
    """``ids`` as an integer NumPy array without a range check (non-integers raise).

    Python ints beyond int64 come back as an object array (they are out of range
    for any table, so the caller maps them).
    """
    try:
        arr = _to_array(ids)
    except InvalidIdError as exc:
        if not isinstance(exc.id, numbers.Integral) or isinstance(exc.id, (bool, np.bool_)):
            raise
        arr = np.asarray(ids, dtype=object)  # huge Python ints (rare): check each element
        flat = arr.reshape(-1)
        ok = np.fromiter((isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
                          for v in flat), dtype=bool, count=flat.size)
        if not ok.all():
            i = int(np.argmin(ok))
            raise InvalidIdError(f"ids must be integers, got {type(flat[i]).__name__} "
                                 f"{flat[i]!r}", id=flat[i]) from None
        return arr
    if arr.dtype.kind not in "iu":
        raise _bad_type(ids, arr, kind=str(arr.dtype))
    return arr


def _as_table(table) -> Table:
    if isinstance(table, Table):
        return table
    return MemoryTable(np.asarray(table))


def _check_int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


class Embedding:
    """The embedding layer of a model, reading rows from ``table``.

    ``table`` is any :class:`embstore.Table` or a 2-D float array (wrapped in a
    :class:`MemoryTable` without copying).

    - ``padding_idx``: entries of this id are left out of bags (negative values
      count from the end, as in PyTorch); a plain lookup returns the stored row,
      as ``torch.nn.Embedding`` does (use ``mask`` to zero positions).
    - ``oov``: what out-of-range ids do: ``"error"`` raises
      :class:`InvalidIdError`, ``"unk"`` maps them to ``unk_id``, ``"clip"``
      clamps them into ``0..vocab_size-1``, ``"zero"`` gives zero rows.  Ids that
      are not integers always raise.  ``"subword"`` (a table imported from a
      fastText ``.bin``): the layer also takes keys (str), and unknown keys get
      vectors composed from their character n-grams, in lookups and as
      ``most_similar`` queries (ids: as ``"error"``).
    - ``scale``: a float, or ``"sqrt_dim"`` for ``sqrt(dim)``.
    - ``max_norm``, ``norm_type``: renormalise returned rows like
      ``torch.nn.functional.embedding``; the table is never modified.

    The order of operations is in the module docstring.
    """

    def __init__(self, table: Table | ArrayLike, padding_idx: int | None = None,
                 unk_id: int | None = None,
                 oov: Literal["error", "unk", "clip", "zero", "subword"] = "error",
                 scale: float | Literal["sqrt_dim"] | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0):
        self._table = _as_table(table)
        vocab = self._table.vocab_size
        if padding_idx is not None:
            p = _check_int(padding_idx, "padding_idx")
            if not -vocab <= p < vocab:
                raise InvalidIdError(
                    f"padding_idx {p} is out of range for a table of {vocab} rows "
                    f"(valid: {-vocab}..{vocab - 1})", id=p, position=(), vocab_size=vocab)
            padding_idx = p + vocab if p < 0 else p
        self.padding_idx: int | None = padding_idx
        if unk_id is not None:
            unk_id = int(as_ids(_check_int(unk_id, "unk_id"), vocab))
        self.unk_id: int | None = unk_id
        check_oov(oov, unk_id, EMBEDDING_OOV_MODES + ("subword",))
        if oov == "subword" and self._table.subwords is None:
            raise InvalidOptionError(f"oov='subword' needs a table with subword n-grams "
                                     f"(imported from a fastText .bin); {table_label(self._table)} has none")
        self.oov: str = oov
        if isinstance(scale, str):
            if scale != "sqrt_dim":
                raise InvalidOptionError(f"scale must be a number or 'sqrt_dim', got {scale!r}")
        elif scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                                    or not math.isfinite(scale)):
            raise InvalidOptionError(f"scale must be a finite number or 'sqrt_dim', got "
                                     f"{scale!r}")
        self.scale = scale
        if max_norm is not None:
            if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or \
                    not max_norm > 0:
                raise InvalidOptionError(f"max_norm must be a positive number, got {max_norm!r}")
            max_norm = float(max_norm)
        self.max_norm: float | None = max_norm
        if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real) or \
                not norm_type > 0:
            raise InvalidOptionError(f"norm_type must be a positive number (or inf), got "
                                     f"{norm_type!r}")
        self.norm_type: float = float(norm_type)

    # -- geometry ---------------------------------------------------------------------
    @property
    def table(self) -> Table:
        return self._table

    @property
    def vocab_size(self) -> int:
        return self._table.vocab_size

    @property
    def dim(self) -> int:
        return self._table.dim

    @property
    def dtype(self) -> np.dtype:
        return self._table.dtype

    @property
    def scale_factor(self) -> float | None:
        """The number rows are multiplied by (``None`` when there is no scale)."""
        if self.scale is None:
            return None
        return math.sqrt(self.dim) if self.scale == "sqrt_dim" else float(self.scale)

    def __repr__(self) -> str:
        opts = [f"{name}={getattr(self, name)!r}" for name in
                ("padding_idx", "unk_id", "oov", "scale", "max_norm")
                if getattr(self, name) not in (None, "error")]
        return f"Embedding({self._table!r}{', ' if opts else ''}{', '.join(opts)})"

    # -- the pieces every operation shares --------------------------------------------
    def _map_ids(self, ids, unk=None) -> tuple[np.ndarray, np.ndarray | None]:
        """int64 ids to read (steps 1) and the mask of ``oov="zero"`` positions (or None)."""
        vocab = self.vocab_size
        zero = None
        oob = None
        if self.oov in ("error", "subword"):
            idx = as_ids(ids, vocab)
        else:
            raw = _int_id_array(ids)
            low = np.asarray(raw < 0, dtype=bool)
            high = np.asarray(raw >= vocab, dtype=bool)
            oob = low | high
            if raw.dtype == object:
                raw = np.where(oob, 0, raw)
            idx = raw.astype(np.int64, copy=False)  # out-of-range uint64 may wrap: replaced below
            if oob.any():
                idx = map_oov(idx, oob, self.oov, unk_id=self.unk_id, zero_id=0, low=low,
                              vocab_size=vocab)
                if self.oov == "zero":
                    zero = oob
            else:
                oob = None
        if unk is not None:
            if self.unk_id is None:
                raise InvalidOptionError("unk= needs an Embedding with unk_id")
            listed = as_ids(unk, vocab).reshape(-1)
            hit = np.isin(idx, listed)
            if oob is not None:
                hit &= ~oob  # unk= applies to ids that were in range as given
            if hit.any():
                idx = np.where(hit, np.int64(self.unk_id), idx)
        return idx, zero

    def _rows(self, idx: np.ndarray, zero: np.ndarray | None) -> np.ndarray:
        """Steps 2-3: lookup and ``max_norm`` for mapped ids (a new, writable array)."""
        if zero is not None and self.vocab_size == 0:
            rows = np.zeros(idx.shape + (self.dim,), dtype=self.dtype)
        else:
            rows = self._table.lookup(idx)
            if not rows.flags.writeable or not rows.flags.c_contiguous:
                rows = np.array(rows, order="C")
            if zero is not None:
                rows[zero] = 0
        if self.max_norm is not None and rows.size:
            self._renorm(rows.reshape(-1, self.dim))
        return rows

    def _renorm(self, flat: np.ndarray) -> None:
        """Scale rows (in place) whose norm exceeds ``max_norm`` as PyTorch does."""
        if self.max_norm is not None:
            renorm(flat, self.max_norm, self.norm_type)

    def _as_mask(self, mask, shape) -> np.ndarray:
        m = check_like_ids(mask, shape, "mask")
        if m.dtype == bool:
            return m
        if m.dtype.kind not in "iuf":
            raise ShapeMismatchError(f"mask must be bool or 0/1 numbers, got dtype {m.dtype}")
        valid = (m == 0) | (m == 1)
        if not valid.all():
            i = int(np.argmin(valid.reshape(-1)))
            pos = tuple(int(j) for j in np.unravel_index(i, m.shape)) if m.ndim else ()
            bad = m.reshape(-1)[i].item()
            raise ShapeMismatchError(f"mask must hold only 0 and 1, got {bad!r} at position {pos}")
        return m != 0

    def _as_weights(self, weights, shape) -> np.ndarray:
        w = check_like_ids(weights, shape, "weights")
        if w.dtype.kind not in "iuf":
            raise ShapeMismatchError(f"weights must be numbers, got dtype {w.dtype}")
        return w

    # -- the layer --------------------------------------------------------------------
    def __call__(self, ids: ArrayLike, mask: ArrayLike | None = None,
                 weights: ArrayLike | None = None, unk: ArrayLike | None = None) -> np.ndarray:
        """Rows for ``ids`` of any shape: ``ids.shape + (dim,)``, the table's dtype."""
        keyed = self.oov == "subword" and holds_keys(ids)
        if (self.oov == "error" and unk is None and mask is None and weights is None
                and self.max_norm is None and self.scale is None):
            return self._table.lookup(ids)  # the plain lookup: nothing to do on top
        if keyed:  # keys: known ones by row, unknown ones from their n-grams
            if unk is not None:
                raise InvalidOptionError("unk= lists ids; it does not apply to keys")
            rows = np.array(self._table.lookup_keys(ids, oov="subword"), order="C")
            if self.max_norm is not None and rows.size:
                self._renorm(rows.reshape(-1, self.dim))
            shape = rows.shape[:-1]
        else:
            idx, zero = self._map_ids(ids, unk)
            shape = idx.shape
        if mask is not None:
            mask = self._as_mask(mask, shape)
        if weights is not None:
            weights = self._as_weights(weights, shape)
        if not keyed:
            rows = self._rows(idx, zero)
        if mask is not None:
            rows[~mask] = 0
        factor = self.scale_factor
        if weights is not None:
            w = weights.astype(self.dtype)
            if factor is not None:
                w *= self.dtype.type(factor)
            rows *= w[..., None]
        elif factor is not None:
            rows *= self.dtype.type(factor)
        return rows

    def slice(self, ids: ArrayLike, start: int | None, end: int | None, *,
              mask: ArrayLike | None = None, weights: ArrayLike | None = None,
              unk: ArrayLike | None = None) -> np.ndarray:
        """``emb(ids[:, start:end])``: a window of the time axis (axis 1) of 2-D+ ids.

        ``mask`` and ``weights``, if given, have the shape of the whole ``ids`` and are
        sliced the same way.
        """
        try:
            arr = np.asarray(ids) if not isinstance(ids, np.ndarray) else ids
        except ValueError as exc:  # ragged lists
            raise InvalidIdError(f"ids must form a rectangular integer array: {exc}", id=None,
                                 position=None) from None
        if arr.ndim < 2:
            raise ShapeMismatchError(
                f"slice needs ids with at least 2 dimensions (batch, time, ...), got shape "
                f"{arr.shape}")
        window = (slice(None), slice(start, end))
        if mask is not None:
            mask = check_like_ids(mask, arr.shape, "mask")[window]
        if weights is not None:
            weights = check_like_ids(weights, arr.shape, "weights")[window]
        return self(arr[window], mask=mask, weights=weights, unk=unk)

    def contextual(self, ids: ArrayLike, hidden: ArrayLike, projection: ArrayLike, *,
                   mask: ArrayLike | None = None, weights: ArrayLike | None = None,
                   unk: ArrayLike | None = None) -> np.ndarray:
        """``emb(ids) + hidden @ projection``.

        ``hidden`` has shape ``ids.shape + (h,)``, ``projection`` shape ``(h, dim)``;
        the result has the table's dtype.
        """
        rows = self(ids, mask=mask, weights=weights, unk=unk)
        lead = rows.shape[:-1]
        h = np.asarray(hidden)
        p = np.asarray(projection)
        if h.dtype.kind not in "iuf" or p.dtype.kind not in "iuf":
            raise ShapeMismatchError(f"hidden and projection must be numeric, got dtypes "
                                     f"{h.dtype} and {p.dtype}")
        if h.ndim != len(lead) + 1 or h.shape[:-1] != lead:
            raise ShapeMismatchError(f"hidden must have shape ids.shape + (h,) = {lead} + (h,), "
                                     f"got {h.shape}")
        if p.shape != (h.shape[-1], self.dim):
            raise ShapeMismatchError(f"projection must have shape (h, dim) = "
                                     f"{(h.shape[-1], self.dim)}, got {p.shape}")
        extra = np.matmul(h, p)
        rows += extra.astype(self.dtype, copy=False)
        return rows

    def bag(self, ids: ArrayLike, offsets: ArrayLike | None = None,
            weights: ArrayLike | None = None, mode: Literal["sum", "mean", "max"] = "mean",
            include_last_offset: bool = False, *, unk: ArrayLike | None = None) -> np.ndarray:
        """Pooled bags of rows, as ``torch.nn.EmbeddingBag``: shape ``(bags, dim)``.

        2-D ``ids`` are fixed-length bags (``offsets`` must be None); 1-D ``ids``
        with ``offsets`` (first 0, non-decreasing) are variable-length bags, and
        ``include_last_offset=True`` means the last offset is no bag's start (the last bag
        runs to the end of the ids, as torch's with a ``padding_idx``).
        ``mode``: ``"sum"``, ``"mean"`` or ``"max"``.  ``weights`` (the shape of
        ``ids``) multiply rows for ``sum``; for ``mean`` they give the weighted
        average ``sum(w*x)/sum(w)``; ``max`` takes none.  ``padding_idx`` entries
        are left out of their bag (not counted by ``mean``); ``oov="zero"`` entries
        take part as zero rows.  Empty bags, and bags whose weights sum to zero,
        give zeros.  Rows are renormalised by ``max_norm`` and multiplied by
        ``scale`` before pooling.
        """
        check_bag_mode(mode, weights)
        idx, zero = self._map_ids(ids, unk)
        return pool_bags(idx, zero, offsets, weights, self._rows, dim=self.dim,
                         dtype=self.dtype, padding_idx=self.padding_idx,
                         scale_factor=self.scale_factor, mode=mode,
                         include_last_offset=include_last_offset)

    def logits(self, hidden: ArrayLike, top_k: int | None = None, *,
               block_rows: int | None = None) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """``hidden @ table.T`` (a tied output layer), reading the table block by block.

        ``hidden`` has shape ``(..., dim)``; the result ``(..., vocab_size)``, or with
        ``top_k`` a pair ``(values, ids)`` of shape ``(..., k)`` sorted by descending
        value (ties: lower id first).  See :func:`embstore.search.stream.logits`.
        """
        return logits(self._table, hidden, top_k=top_k, block_rows=block_rows)

    def most_similar(self, query: ArrayLike | None = None, k: int | None = 10,
                     exclude: ArrayLike = (), *, positive=None, negative=None,
                     block_rows: int | None = None, approx: bool = False,
                     ef: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact cosine top-``k`` rows for a vector, id or key (or a batch of them);
        ``approx=True``: from the table's approximate index, search effort ``ef``.
        ``positive``/``negative`` (keys, ids, vectors) instead of ``query``: gensim's
        analogy, ``positive=["king", "woman"], negative=["man"]`` (see :mod:`embstore.search.analogy`).

        Returns ``(ids, scores)``, sorted by descending score (ties: lower id first);
        see :func:`embstore.search.stream.most_similar`.
        """
        if positive is not None or negative is not None:
            if query is not None:
                raise InvalidOptionError("pass query, or positive/negative (an analogy), not both")
            query, own = analogy_query(self._table, positive, negative)
            exclude = np.concatenate([own, _resolve_ids_or_keys(self._table, exclude)])
        elif query is None:
            raise InvalidOptionError("most_similar needs a query, or positive/negative keys "
                                     "(an analogy)")
        if self.oov == "subword" and holds_keys(query):
            return similar_keys(self._table, query, k=k, exclude=exclude, block_rows=block_rows,
                                approx=approx, ef=ef)
        return most_similar(self._table, query, k=k, exclude=exclude, block_rows=block_rows,
                            approx=approx, ef=ef)

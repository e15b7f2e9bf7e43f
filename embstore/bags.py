"""Bags of rows pooled by sum, mean or max (``torch.nn.EmbeddingBag`` semantics).

Vectorised over bags: the kept entries (padding left out) are read in one
lookup, then pooled with ``np.add.reduceat`` / ``np.maximum.reduceat`` over the
starts of the non-empty bags; empty bags stay zero.  No Python loop per bag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import ShapeMismatchError

if TYPE_CHECKING:
    from .layer import Embedding

__all__ = ["pool_bags", "bag_bounds"]

_MODES = ("sum", "mean", "max")


def bag_bounds(offsets, n: int, include_last_offset: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` (int64) of the bags of 1-D ids of length ``n`` given ``offsets``.

    As PyTorch: ``offsets[0]`` must be 0 and offsets non-decreasing; without
    ``include_last_offset`` the last bag runs to the end of the ids, with it the
    last offset ends the last bag and must equal ``n``.
    """
    off = np.asarray(offsets)
    if off.ndim != 1:
        raise ShapeMismatchError(f"offsets must be 1-D, got shape {off.shape}")
    if off.size and off.dtype.kind not in "iu":
        raise ShapeMismatchError(f"offsets must be integers, got dtype {off.dtype}")
    if include_last_offset and off.size == 0:
        raise ShapeMismatchError("include_last_offset=True needs at least one offset "
                                 "(the end of the last bag)")
    if off.dtype.kind == "u" and off.size and off.max() > n:
        raise ShapeMismatchError(f"offsets must be <= len(ids) = {n}, got {off.max()}")
    off = off.astype(np.int64, copy=False)
    if off.size:
        if off[0] != 0:
            raise ShapeMismatchError(
                f"offsets[0] must be 0 (the first bag starts at the first id), got {off[0]}")
        step = np.diff(off)
        if (step < 0).any():
            i = int(np.argmax(step < 0)) + 1
            raise ShapeMismatchError(f"offsets must be non-decreasing, got offsets[{i - 1}] = "
                                     f"{off[i - 1]} > offsets[{i}] = {off[i]}")
        if off[-1] > n:
            raise ShapeMismatchError(f"offsets must be <= len(ids) = {n}, got {off[-1]}")
        if include_last_offset and off[-1] != n:
            # PyTorch documents the last offset as len(ids); what it does otherwise
            # differs between its modes, so refuse instead of guessing.
            raise ShapeMismatchError(f"with include_last_offset=True the last offset must be "
                                     f"len(ids) = {n}, got {off[-1]}")
    if include_last_offset:
        return off[:-1], off[1:]
    return off, np.append(off[1:], np.int64(n))


def pool_bags(emb: Embedding, ids, offsets, weights, *, mode: str, include_last_offset: bool,
              unk=None) -> np.ndarray:
    """The body of :meth:`Embedding.bag` (see there for the semantics)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")
    if weights is not None and mode == "max":
        raise ValueError("per-sample weights are supported for mode='sum' and mode='mean', "
                         "not for mode='max'")
    idx, zero = emb._map_ids(ids, unk)
    if idx.ndim == 2:
        if offsets is not None:
            raise ShapeMismatchError(
                f"offsets must be None when ids is 2-D (fixed-length bags), got ids of shape "
                f"{idx.shape} and offsets")
        nbags, length = idx.shape
        starts = np.arange(nbags, dtype=np.int64) * length
        ends = starts + length
    elif idx.ndim == 1:
        if offsets is None:
            raise ShapeMismatchError("1-D ids need offsets (the start of each bag); pass 2-D ids "
                                     "for fixed-length bags")
        starts, ends = bag_bounds(offsets, idx.size, include_last_offset)
        nbags = starts.size
    else:
        raise ShapeMismatchError(
            f"bag takes 2-D ids (fixed-length bags) or 1-D ids with offsets, got shape "
            f"{idx.shape}")
    w = None
    if weights is not None:
        w = emb._check_like_ids(weights, idx.shape, "weights")
        if w.dtype.kind not in "iuf":
            raise ShapeMismatchError(f"weights must be numbers, got dtype {w.dtype}")
        w = w.reshape(-1)
    flat = idx.reshape(-1)
    zero = None if zero is None else zero.reshape(-1)
    dim = emb.dim
    acc = np.result_type(emb.dtype, np.float32)  # float16 tables accumulate in float32
    out = np.zeros((nbags, dim), dtype=acc)
    if nbags == 0:
        return out.astype(emb.dtype)

    # bags cover the ids from 0 to the end; padding entries leave their bag
    keep = None if emb.padding_idx is None else flat != emb.padding_idx
    if keep is not None and not keep.all():
        where = np.flatnonzero(keep)
        csum = np.zeros(flat.size + 1, dtype=np.int64)
        np.cumsum(keep, out=csum[1:])
        starts, ends = csum[starts], csum[ends]
        flat = flat[where]
        zero = None if zero is None else zero[where]
        w = None if w is None else w[where]
    counts = ends - starts
    full = counts > 0
    if not full.any():
        return out.astype(emb.dtype)
    first = starts[full]

    rows = emb._rows(flat, zero).astype(acc, copy=False)
    factor = emb.scale_factor
    if w is not None:
        wk = w.astype(acc)
        rows *= (wk * acc.type(factor) if factor is not None else wk)[:, None]
    elif factor is not None:
        rows *= acc.type(factor)

    if mode == "max":
        out[full] = np.maximum.reduceat(rows, first, axis=0)
    else:
        out[full] = np.add.reduceat(rows, first, axis=0)
        if mode == "mean":
            if w is None:
                denom = counts[full].astype(acc)
            else:
                denom = np.add.reduceat(wk, first)
            nonzero = denom != 0
            sums = out[full]
            sums[nonzero] /= denom[nonzero][:, None]
            sums[~nonzero] = 0
            out[full] = sums
    return out.astype(emb.dtype, copy=False)

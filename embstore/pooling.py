"""Bags of rows pooled by sum, mean or max (``torch.nn.EmbeddingBag`` semantics).

Vectorised over bags, no Python loop per bag.  Fixed-length bags (2-D ids)
reduce a ``(bags, length, dim)`` array along its middle axis.  Variable bags
(1-D ids + offsets) go through :func:`segment_reduce`, which adds whole rows at
a time (``np.add.reduceat`` along axis 0 reduces column by column and runs 3-5x
slower, ``np.maximum.reduceat`` up to 10x); empty bags stay zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .errors import InvalidOptionError, ShapeMismatchError
from .ids import check_like_ids, one_of

__all__ = ["pool_bags", "bag_bounds", "check_bag_mode"]

_MODES = ("sum", "mean", "max")

Rows = Callable[[np.ndarray, np.ndarray | None], np.ndarray]
"""``rows(idx, zero)``: the rows of mapped ids ``idx`` (zeros where ``zero``), as a new,
writable array of shape ``idx.shape + (dim,)`` (for a layer: lookup, then ``max_norm``)."""


class _Bags(NamedTuple):
    """What the bag reducers need: plain values and the row reader."""

    rows: Rows
    dim: int
    padding_idx: int | None
    scale_factor: float | None


def bag_bounds(offsets, n: int, include_last_offset: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` (int64) of the bags of 1-D ids of length ``n`` given ``offsets``.

    As PyTorch: ``offsets[0]`` must be 0 and offsets non-decreasing, at most ``n``; the
    last bag runs to the end of the ids.  With ``include_last_offset`` there is one bag
    fewer than offsets, and the last offset (documented as ``n``) is not an end either:
    a smaller one still leaves the last bag running to the end, as torch does with a
    ``padding_idx`` and in mode ``max`` (torch's test_embeddingbag_include_last_offset).
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
    if include_last_offset:
        off = off[:-1]
    return off, np.append(off[1:], np.int64(n))


#: rows gathered at once by a bag (1e7 ids in one bag: blocks of 64 MiB, not 12 GB at dim 300)
BAG_BLOCK_BYTES = 64 << 20
_SEGMENT_STEPS = 64  # longest segment _steps handles; longer ones are cut into pieces


def _steps(vals: np.ndarray, lens: np.ndarray, op) -> np.ndarray:
    """``op``-reduce consecutive segments of ``vals`` (lengths ``lens``, all >= 1).

    One vectorised step per position inside a segment (at most ``max(lens)``
    steps): segments sorted longest first, so step ``j`` updates a prefix.
    """
    order = np.argsort(-lens, kind="stable")
    by_len = lens[order]
    starts = (np.cumsum(lens) - lens)[order]
    out = vals[starts]
    longer = np.searchsorted(-by_len, -np.arange(1, int(by_len[0])), side="left")
    for j, k in enumerate(longer.tolist(), start=1):  # k segments are longer than j
        op(out[:k], vals[starts[:k] + j], out=out[:k])
    result = np.empty_like(out)
    result[order] = out
    return result


def segment_reduce(vals: np.ndarray, lens: np.ndarray, op) -> np.ndarray:
    """``(len(lens), dim)``: ``op`` (``np.add`` or ``np.maximum``) over consecutive
    segments of rows of ``vals`` with lengths ``lens`` (all >= 1, summing to
    ``len(vals)``).  Segments longer than ``_SEGMENT_STEPS`` are cut into pieces,
    the pieces reduced, and their results reduced again (log-many rounds).
    """
    lens = np.asarray(lens, dtype=np.int64)
    while vals.shape[0] > lens.size:
        if lens.max() <= _SEGMENT_STEPS:
            return _steps(vals, lens, op)
        pieces = -(-lens // _SEGMENT_STEPS)
        piece_lens = np.full(int(pieces.sum()), _SEGMENT_STEPS, dtype=np.int64)
        piece_lens[np.cumsum(pieces) - 1] = lens - _SEGMENT_STEPS * (pieces - 1)
        vals = _steps(vals, piece_lens, op)
        lens = pieces
    return vals


def check_bag_mode(mode: str, weights) -> None:
    """``mode`` one of sum, mean, max; ``weights`` only with sum and mean."""
    one_of(mode, "mode", _MODES)
    if weights is not None and mode == "max":
        raise InvalidOptionError("per-sample weights are supported for mode='sum' and "
                                 "mode='mean', "
                         "not for mode='max'")


def pool_bags(idx: np.ndarray, zero: np.ndarray | None, offsets, weights, rows: Rows, *,
              dim: int, dtype: np.dtype, padding_idx: int | None,
              scale_factor: float | None, mode: str,
              include_last_offset: bool) -> np.ndarray:
    """Pool the rows of mapped ids ``idx`` (int64; ``zero`` marks zero-row entries) into
    bags, as ``dtype``: the body of :meth:`embstore.layer.Embedding.bag` (see there for
    the semantics).  ``rows`` reads the rows of ids (see :data:`Rows`); entries equal to
    ``padding_idx`` leave their bag; rows are multiplied by ``scale_factor``."""
    check_bag_mode(mode, weights)
    if idx.ndim == 2:
        if offsets is not None:
            raise ShapeMismatchError(
                f"offsets must be None when ids is 2-D (fixed-length bags), got ids of shape "
                f"{idx.shape} and offsets")
    elif idx.ndim == 1:
        if offsets is None:
            raise ShapeMismatchError("1-D ids need offsets (the start of each bag); pass 2-D ids "
                                     "for fixed-length bags")
        starts, ends = bag_bounds(offsets, idx.size, include_last_offset)
    else:
        raise ShapeMismatchError(
            f"bag takes 2-D ids (fixed-length bags) or 1-D ids with offsets, got shape "
            f"{idx.shape}")
    emb = _Bags(rows, dim, padding_idx, scale_factor)
    w = None
    if weights is not None:
        w = check_like_ids(weights, idx.shape, "weights")
        if w.dtype.kind not in "iuf":
            raise ShapeMismatchError(f"weights must be numbers, got dtype {w.dtype}")
    acc = np.result_type(dtype, np.float32)  # float16 tables accumulate in float32
    if idx.ndim == 2 and idx.size * emb.dim * acc.itemsize > BAG_BLOCK_BYTES:
        # too many rows to gather at once: as variable-length bags, in blocks of entries
        nbags, length = idx.shape
        starts = np.arange(nbags, dtype=np.int64) * length
        ends = starts + length
        idx = idx.reshape(-1)
        zero = None if zero is None else zero.reshape(-1)
        w = None if w is None else w.reshape(-1)
    if idx.ndim == 2:
        out = _fixed_bags(emb, idx, zero, w, mode, acc)
    else:
        out = _variable_bags(emb, idx, zero, w, starts, ends, mode, acc)
    return out.astype(dtype, copy=False)


def _weighted_rows(emb: _Bags, idx, zero, w, acc) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows (lookup, max_norm) times weight and scale; weights as ``acc``."""
    rows = emb.rows(idx, zero).astype(acc, copy=False)
    factor = emb.scale_factor
    wk = None
    if w is not None:
        wk = w.astype(acc)
        rows *= (wk * acc.type(factor) if factor is not None else wk)[..., None]
    elif factor is not None:
        rows *= acc.type(factor)
    return rows, wk


def _divide(sums: np.ndarray, denom: np.ndarray) -> np.ndarray:
    """``sums / denom`` per bag, zeros where ``denom`` is 0 (empty or zero-weight bags)."""
    ok = denom != 0
    if ok.all():
        sums /= denom[:, None]
        return sums
    sums[ok] /= denom[ok][:, None]
    sums[~ok] = 0
    return sums


def _fixed_bags(emb: _Bags, idx, zero, w, mode, acc) -> np.ndarray:
    nbags, length = idx.shape
    if nbags == 0 or length == 0:
        return np.zeros((nbags, emb.dim), dtype=acc)
    keep = None if emb.padding_idx is None else idx != emb.padding_idx
    if w is not None and keep is not None:
        w = np.where(keep, w, 0)  # a padding entry's weight must not count in a mean
    rows, wk = _weighted_rows(emb, idx, zero, w, acc)
    if keep is not None:  # the stored padding row need not be zero: leave it out
        rows[~keep] = -np.inf if mode == "max" else 0
    if mode == "max":
        out = rows.max(axis=1)
        if keep is not None:
            out[~keep.any(axis=1)] = 0  # bags made only of padding
        return out
    out = rows.sum(axis=1)
    if mode == "sum":
        return out
    if wk is not None:
        denom = wk.sum(axis=1)
    elif keep is not None:
        denom = keep.sum(axis=1).astype(acc)
    else:
        return out / acc.type(length)
    return _divide(out, denom)


def _variable_bags(emb: _Bags, idx, zero, w, starts, ends, mode, acc) -> np.ndarray:
    out = np.zeros((starts.size, emb.dim), dtype=acc)
    if starts.size == 0:
        return out
    keep = None if emb.padding_idx is None else idx != emb.padding_idx
    if keep is not None and not keep.all():  # padding entries leave their bag
        where = np.flatnonzero(keep)
        csum = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(keep, out=csum[1:])
        starts, ends = csum[starts], csum[ends]
        idx = idx[where]
        zero = None if zero is None else zero[where]
        w = None if w is None else w[where]
    counts = ends - starts
    full = counts > 0
    if not full.any():
        return out
    op = np.maximum if mode == "max" else np.add
    step = max(1, BAG_BLOCK_BYTES // (emb.dim * acc.itemsize))
    touched = np.zeros(starts.size, dtype=bool)
    for a in range(0, idx.size, step):  # a loop per block of entries (1e7 ids: ~10 blocks)
        b = min(idx.size, a + step)
        s, e = np.clip(starts, a, b), np.clip(ends, a, b)
        sel = np.flatnonzero(e > s)  # the bags (parts of bags) in this block: they tile it
        rows, _ = _weighted_rows(emb, idx[a:b], None if zero is None else zero[a:b],
                                 None if w is None else w[a:b], acc)
        part = segment_reduce(rows, (e - s)[sel], op)
        again = touched[sel]  # a bag begun in an earlier block: combine
        out[sel[~again]] = part[~again]
        out[sel[again]] = op(out[sel[again]], part[again])
        touched[sel] = True
    if mode == "mean":
        if w is None:
            denom = counts.astype(acc)
        else:
            denom = np.zeros(starts.size, dtype=acc)
            denom[full] = np.add.reduceat(w.astype(acc), starts[full])
        out = _divide(out, denom)
    return out

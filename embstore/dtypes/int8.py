"""``int8``: row-wise affine quantisation, as FBGEMM/TorchRec store recommender tables
(docs/FORMAT.md §3c).

Each row has a ``scale`` and an ``offset`` (float32, in the ``row_scale`` array beside
``vectors``) and its values are ``code * scale + offset`` (float32 arithmetic, codes
-128..127); the codes are ``round((x - offset) / scale)``, so every value is within half a
step (``scale / 2``) of the original, plus the float32 rounding of the result (measured: at
most 0.625 of a unit in the last place of the value, on 25 of the 11.7M MiniLM-L6 embedding
values).  A constant row has scale 0 and offset its value (exact).

Pure NumPy, vectorised, writing into caller buffers in blocks that stay in the CPU cache.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeMismatchError
from .base import SideArray, StorageDtype, blocks

__all__ = ["INT8", "SCALE_ARRAY", "int8_quantise", "int8_dequantise"]

SCALE_ARRAY = "row_scale"  # (vocab_size, 2) float32, [scale, offset] per row
_MAX_RANGE = float(np.finfo(np.float32).max)  # -128 * scale stays finite in float32


def int8_quantise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes int8 (n, dim), row_scale float32 (n, 2))`` of the finite rows ``x``.

    ``scale = (max - min) / 255`` and ``offset = min + 128 * scale`` (both rounded to
    float32 first), then ``code = clip(round((x - offset) / scale), -128, 127)`` computed in
    float64 with the stored scale and offset, so the bound holds for the stored values.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    lo = x.min(axis=1) if x.size else np.zeros(n)
    hi = x.max(axis=1) if x.size else np.zeros(n)
    wide = hi - lo > _MAX_RANGE
    if wide.any():  # code * scale would overflow float32
        i = int(np.argmax(wide))
        err = ShapeMismatchError(f"row {i} of this block spans {hi[i] - lo[i]:.4g} (from "
                                 f"{lo[i]:.4g} to {hi[i]:.4g}); int8 rows hold a range of at "
                                 f"most {_MAX_RANGE:.4g}")
        err.row = i
        raise err
    scale = ((hi - lo) / 255.0).astype(np.float32)
    # a subnormal step keeps few digits: rounded down it may no longer let 255 steps cover
    # the row (a normal step is off by 2**-24 at most, far below half a step): one step up
    short = (scale < np.finfo(np.float32).tiny) & (scale.astype(np.float64) * 255.0 < hi - lo)
    scale[short] = np.nextafter(scale[short], np.float32(np.inf))
    offset = (lo + 128.0 * scale.astype(np.float64)).astype(np.float32)
    s64 = scale.astype(np.float64)
    safe = np.where(s64 > 0, s64, 1.0)
    q = (x - offset.astype(np.float64)[:, None]) / safe[:, None]
    np.rint(q, out=q)
    np.clip(q, -128, 127, out=q)
    q[s64 == 0] = 0
    codes = q.astype(np.int8)
    rs = np.empty((n, 2), dtype=np.float32)
    rs[:, 0], rs[:, 1] = scale, offset
    return codes, rs


def int8_dequantise(codes: np.ndarray, row_scale: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[i] = float32(codes[i]) * scale[i] + offset[i]`` (float32, two roundings, no FMA:
    what ``codes.astype(np.float32) * scale[:, None] + offset[:, None]`` gives in NumPy)."""
    for a, b in blocks(codes.shape[0], codes.shape[1]):
        o = out[a:b]
        np.copyto(o, codes[a:b], casting="unsafe")
        o *= row_scale[a:b, :1]
        o += row_scale[a:b, 1:]
    return out


class Int8(StorageDtype):
    side = SideArray(SCALE_ARRAY, 2, "float32", ("scale_row", "scale_field"),
                     "row scales", "scale, offset per row")

    def encode(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ok = np.isfinite(rows).all(axis=1)  # the writer refuses the others after encoding
        return int8_quantise(rows if ok.all() else np.where(ok[:, None], rows, 0))

    def decode(self, codes: np.ndarray, side: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        assert side is not None
        return int8_dequantise(codes, side, out)

    def raw(self, codes: np.ndarray, side: np.ndarray | None):
        assert side is not None
        return codes, side[:, 0].copy(), side[:, 1].copy()


INT8 = Int8("int8", code="i1", logical="float32")

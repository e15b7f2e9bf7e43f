"""Compact storage dtypes: the codes of ``bfloat16`` and ``int8`` rows (docs/FORMAT.md §2c).

- ``bfloat16``: the high 16 bits of a float32 (NumPy has no such dtype: codes are ``uint16``
  here, ``data_type: "bfloat16"`` on disk).  Stored from float32 rounding to nearest, ties to
  even; read back exactly by a 16-bit shift into a float32.
- ``int8``: row-wise affine quantisation, as FBGEMM/TorchRec store recommender tables.  Each
  row has a ``scale`` and an ``offset`` (float32, in the ``row_scale`` array) and its values
  are ``code * scale + offset`` (float32 arithmetic, codes -128..127); the codes are
  ``round((x - offset) / scale)``, so every value is within half a step (``scale / 2``) of
  the original, plus the float32 rounding of the result (measured: at most 0.625 of a unit
  in the last place of the value, on 25 of the 11.7M MiniLM-L6 embedding values).  A constant row has scale 0 and offset its value (exact).

The functions here are pure NumPy, vectorised, and write into caller buffers in blocks that
stay in the CPU cache (measured: a 16,384 x 256 dequantisation blocked by 1 MiB of output
runs 2x faster than three whole-array passes, about the cost of a float32 row gather).
"""

from __future__ import annotations

import numpy as np

from . import QUANTISED, STORAGE_DTYPES, storage_name
from ..errors import ShapeMismatchError

__all__ = ["STORAGE_DTYPES", "QUANTISED", "SCALE_ARRAY", "storage_name", "code_dtype",
           "logical_dtype", "bf16_encode", "bf16_decode", "int8_quantise", "int8_dequantise"]

SCALE_ARRAY = "row_scale"  # int8 tables: (vocab_size, 2) float32, [scale, offset] per row
_CODES: dict[str, np.dtype] = {"bfloat16": np.dtype("<u2"), "int8": np.dtype("i1")}
_BLOCK_BYTES = 1 << 20  # output bytes per dequantisation block (fits in L2)
_MAX_RANGE = float(np.finfo(np.float32).max)  # -128 * scale stays finite in float32


def code_dtype(name: str) -> np.dtype:
    """The NumPy dtype of the stored values of storage dtype ``name``."""
    return _CODES.get(name) or np.dtype(name).newbyteorder("<")


def logical_dtype(name: str) -> np.dtype:
    """The dtype lookups return for storage dtype ``name`` (float32 for the quantised)."""
    return np.dtype(np.float32) if name in QUANTISED else np.dtype(name)


def _blocks(n: int, dim: int):
    step = max(1, _BLOCK_BYTES // max(1, 4 * dim))
    return ((a, min(n, a + step)) for a in range(0, n, step))


# -- bfloat16 -------------------------------------------------------------------------------
def bf16_encode(x: np.ndarray) -> np.ndarray:
    """bfloat16 codes (``uint16``) of ``x``: round to nearest, ties to even (as PyTorch and
    ``ml_dtypes``); an array that already is bfloat16 (``ml_dtypes``) keeps its bits."""
    x = np.asarray(x)
    if x.dtype.name == "bfloat16" and x.dtype.itemsize == 2:
        return np.ascontiguousarray(x).view(np.uint16)
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # finite inputs only (the writer refuses NaN): the largest float32 rounds up to infinity
    return ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)


def bf16_decode(codes: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Widen bfloat16 ``codes`` into the float32 array ``out`` (exact)."""
    u = out.view(np.uint32)
    for a, b in _blocks(codes.shape[0], codes.shape[-1] if codes.ndim > 1 else 1):
        np.copyto(u[a:b], codes[a:b], casting="unsafe")
        u[a:b] <<= 16
    return out


def bf16_finite(codes: np.ndarray) -> np.ndarray:
    """Per row: no infinity or NaN among the codes."""
    return ((codes & 0x7F80) != 0x7F80).all(axis=-1)


# -- int8 row-wise ----------------------------------------------------------------------------
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
    for a, b in _blocks(codes.shape[0], codes.shape[1]):
        o = out[a:b]
        np.copyto(o, codes[a:b], casting="unsafe")
        o *= row_scale[a:b, :1]
        o += row_scale[a:b, 1:]
    return out

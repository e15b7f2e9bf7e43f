"""``bfloat16``: the high 16 bits of a float32 (docs/FORMAT.md §3c).

NumPy has no such dtype: codes are ``uint16`` here, ``data_type: "bfloat16"`` on disk
(zarr-python 3.1 creates the array as ``uint16``).  Stored from float32 rounding to nearest,
ties to even (as PyTorch and ``ml_dtypes``); read back exactly by a 16-bit shift into a
float32.
"""

from __future__ import annotations

import numpy as np

from .base import StorageDtype, blocks

__all__ = ["BFLOAT16", "bf16_encode", "bf16_decode", "bf16_finite", "widen"]


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """bfloat16 codes (``uint16``) of ``x``: round to nearest, ties to even (as PyTorch and
    ``ml_dtypes``); an array that already is bfloat16 (``ml_dtypes``) keeps its bits."""
    x = np.asarray(x)
    if is_ml_bfloat16(x):
        return np.ascontiguousarray(x).view(np.uint16)
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # finite inputs only (the writer refuses NaN): the largest float32 rounds up to infinity
    return ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)


def bf16_decode(codes: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Widen bfloat16 ``codes`` into the float32 array ``out`` (exact)."""
    u = out.view(np.uint32)
    for a, b in blocks(codes.shape[0], codes.shape[-1] if codes.ndim > 1 else 1):
        np.copyto(u[a:b], codes[a:b], casting="unsafe")
        u[a:b] <<= 16
    return out


def bf16_finite(codes: np.ndarray) -> np.ndarray:
    """Per row: no infinity or NaN among the codes."""
    return ((codes & 0x7F80) != 0x7F80).all(axis=-1)


def is_ml_bfloat16(x: np.ndarray) -> bool:
    """An array of ``ml_dtypes``' NumPy bfloat16 (what JAX and some checkpoints hand over)."""
    return x.dtype.name == "bfloat16" and x.dtype.itemsize == 2


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 if it is an ``ml_dtypes`` bfloat16 array (exact), else ``x``."""
    if not is_ml_bfloat16(x):
        return x
    return bf16_decode(np.ascontiguousarray(x).view(np.uint16).reshape(x.shape),
                       np.empty(x.shape, np.float32))


class Bfloat16(StorageDtype):
    def encode(self, rows: np.ndarray) -> tuple[np.ndarray, None]:
        return bf16_encode(rows), None

    def decode(self, codes: np.ndarray, side: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        return bf16_decode(codes, out)

    def finite(self, codes: np.ndarray) -> np.ndarray:
        return bf16_finite(codes)  # the largest float32 values round to infinity


BFLOAT16 = Bfloat16("bfloat16", code="<u2", logical="float32", zarr_dtype="uint16")

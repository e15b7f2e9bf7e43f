"""Dtypes: the one registry of what a table holds and stores, and their checks.

- ``DTYPES``: one :class:`~embstore.dtypes.base.StorageDtype` record per storage dtype
  (name, stored NumPy dtype, encode, decode, what ``raw`` returns, its golden store), a
  plain dict as numcodecs keeps its codecs; the contract is in :mod:`embstore.dtypes.base`.
  Adding a storage dtype: one file with its record, one entry in ``DTYPES``.
- ``FLOAT_DTYPES`` (float16, float32, float64): rows as NumPy arrays, what a
  ``MemoryTable``, an ``.npy`` file and a lookup hold;
- ``STORAGE_DTYPES``: what a stored table may hold, the float dtypes plus the ``QUANTISED``
  (compact) ones (bfloat16, int8: stored as codes, looked up as float32).

Every module that accepts, stores or reads rows asks here (the writer, the row sources,
the metadata checks, ``verify``, ``MemoryTable``, the format readers, the CLI's ``--dtype``
choices).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from ..errors import ShapeMismatchError
from .base import SideArray, StorageDtype
from .bfloat16 import BFLOAT16
from .floats import FLOAT16, FLOAT32, FLOAT64
from .int8 import INT8

__all__ = ["DTYPES", "StorageDtype", "SideArray", "record", "SIDE_ARRAYS", "FLOAT_DTYPES",
           "QUANTISED", "STORAGE_DTYPES", "is_float_dtype", "dtype_list", "check_dtype",
           "storage_name", "check_storage"]

DTYPES: dict[str, StorageDtype] = {r.name: r for r in (FLOAT16, FLOAT32, FLOAT64, BFLOAT16, INT8)}

FLOAT_DTYPES: tuple[str, ...] = tuple(n for n, r in DTYPES.items() if not r.compact)
QUANTISED: tuple[str, ...] = tuple(n for n, r in DTYPES.items() if r.compact)  # codes
STORAGE_DTYPES: tuple[str, ...] = FLOAT_DTYPES + QUANTISED
SIDE_ARRAYS: tuple[str, ...] = tuple(r.side.name for r in DTYPES.values() if r.side)


def record(name: str) -> StorageDtype:
    """The record of storage dtype ``name`` (a name of :data:`STORAGE_DTYPES`)."""
    return DTYPES[name]


def dtype_list(names: tuple[str, ...] = FLOAT_DTYPES, conjunction: str = "or") -> str:
    """``"float16, float32 or float64"``: an allowlist in prose, for messages."""
    *head, last = names
    return f"{', '.join(head)} {conjunction} {last}" if head else last


def is_float_dtype(dtype: object) -> bool:
    """Whether ``dtype`` (a name, a NumPy dtype or type) is one a table's rows are held in."""
    try:
        return np.dtype(dtype).name in FLOAT_DTYPES  # type: ignore[call-overload]
    except TypeError:
        return False


def check_dtype(dtype: DTypeLike) -> np.dtype:
    """``np.dtype(dtype)``, or :class:`ShapeMismatchError` unless it is a float dtype."""
    dt = np.dtype(dtype)
    if dt.name not in FLOAT_DTYPES:
        raise ShapeMismatchError(f"dtype must be one of {FLOAT_DTYPES}, got {dt}")
    return dt


def storage_name(dtype: object) -> str | None:
    """The storage dtype name of ``dtype`` (a name, a NumPy dtype, ``ml_dtypes.bfloat16``),
    or None if it is not a storage dtype."""
    if isinstance(dtype, str) and dtype in QUANTISED:
        return dtype
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError:
        return None
    return name if name in STORAGE_DTYPES else None


def check_storage(dtype: object) -> str:
    """The storage dtype name of ``dtype``: float16/32/64, bfloat16 or int8."""
    name = storage_name(dtype)
    if name is None:
        raise ShapeMismatchError(f"dtype must be one of {STORAGE_DTYPES}, got {dtype}")
    return name

"""The values of the ``norms`` array (docs/FORMAT.md §3d): the Euclidean norm of each row
*as the table returns it* (after the bfloat16 widening or the int8 dequantisation), summed
in float64, stored as float32 (float64 for float64 tables).  Plain arithmetic over rows,
below every array that stores or generates them (:mod:`embstore.store.norms` writes and reads the
array, :mod:`.lazy` generates the norms of rows never written)."""

from __future__ import annotations

import numpy as np

from ...dtypes import DTYPES, StorageDtype

__all__ = ["decoded_norms", "norms_dtype", "row_norms", "stored_rows"]

_BLOCK_ELEMENTS = 1 << 18  # float64 elements converted at a time (2 MiB)


def norms_dtype(storage: str) -> np.dtype:
    """The dtype of the stored norms of a table of storage dtype ``storage``."""
    return np.dtype("<f8") if storage == "float64" else np.dtype("<f4")


def row_norms(rows: np.ndarray, dtype=np.float32) -> np.ndarray:
    """``(n, 1)`` norms of ``rows`` (``(n, dim)``), summed in float64, as ``dtype``.

    Blocked so that the float64 copy stays small; the sum of each row is the same whatever
    the block (one row is one reduction).  A norm past the largest float32 (a row of values
    near 3.4e38) is stored as inf, quietly: such a row is legal data, its cosine undefined."""
    n, dim = rows.shape
    out = np.empty((n, 1), dtype=dtype)
    step = max(1, _BLOCK_ELEMENTS // max(1, dim))
    buf = np.empty((min(step, n), dim), dtype=np.float64)  # one buffer, reused: a fresh
    with np.errstate(over="ignore"):  # 2 MiB block each time faulted its pages in anew
        for a in range(0, n, step):  # a loop per block of rows
            r = buf[: min(n, a + step) - a]
            np.copyto(r, rows[a: a + step], casting="unsafe")
            out[a: a + step, 0] = np.sqrt(np.einsum("ij,ij->i", r, r))
    return out


def stored_rows(storage: str, values: np.ndarray) -> np.ndarray:
    """The rows a table of storage dtype ``storage`` returns after storing ``values``
    (bfloat16 rounded, int8 quantised; other dtypes: ``values`` themselves)."""
    return DTYPES[storage].stored(values)


def decoded_norms(record: StorageDtype, codes: np.ndarray, side: np.ndarray | None
                  ) -> np.ndarray:
    """Norms of rows given as stored codes (what :class:`TableWriter` holds)."""
    rows = record.decode(codes, side, np.empty(codes.shape, record.logical)) \
        if record.compact else codes
    return row_norms(rows, norms_dtype(record.name))

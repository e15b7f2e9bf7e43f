"""NumPy ``.npy``: a 2-D float array (float16/32/64 kept as is unless a dtype is asked).

Read memory-mapped with ``allow_pickle=False``; written streamed: the ``.npy``
header, then the rows block by block.
"""

from __future__ import annotations

import numpy as np

from . import DEFAULT_BLOCK_ROWS, open_output
from ._array import ArrayReader, write_rows
from ..dtypes import dtype_list, is_float_dtype
from ..errors import FormatError

__all__ = ["read", "write"]


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None) -> ArrayReader:
    """Stream the rows of a 2-D float ``.npy`` file."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - NumPy's header parser raises many types
        # (ValueError, EOFError for an empty file, OverflowError, tokenize.TokenError)
        raise FormatError(f"expected a .npy array of floats, got an unreadable file ({exc})",
                          path=path) from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        raise FormatError("expected a .npy array, got an .npz archive", path=path)
    if arr.ndim != 2:
        raise FormatError(f"expected a 2-D array (rows, dim), got shape {arr.shape}", path=path)
    if not is_float_dtype(arr.dtype):
        raise FormatError(f"expected a {dtype_list()} array, got {arr.dtype}", path=path)
    return ArrayReader(path, arr, format="npy", shape=arr.shape,
                       source_dtype=arr.dtype.newbyteorder("="), block_rows=block_rows,
                       limit=limit, dtype=dtype)


def write(path, table, *, limit: int | None = None, block_rows: int = DEFAULT_BLOCK_ROWS,
          progress=None) -> int:
    """Write ``table`` as a ``.npy`` file (``np.load`` reads it), one block at a time."""
    n = table.vocab_size if limit is None else min(limit, table.vocab_size)
    dtype = np.dtype(table.dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": (n, table.dim)}
    with open_output(path) as f:
        np.lib.format.write_array_header_2_0(f, header) if _needs_v2(header) else \
            np.lib.format.write_array_header_1_0(f, header)
        write_rows(f, table, n, dtype, block_rows=block_rows, progress=progress)
    return n


def _needs_v2(header: dict) -> bool:
    return len(repr(header)) > 65000

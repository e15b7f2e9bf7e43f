"""NumPy ``.npy``: a 2-D float array (float16/32/64 kept as is unless a dtype is asked).

Read memory-mapped with ``allow_pickle=False``, or, from compressed data or a pipe,
streamed: the header parsed by NumPy's own reader, then the rows read in order, block
by block (Fortran-order arrays need random access and are refused there).  Written
streamed: the ``.npy`` header, then the rows block by block.
"""

from __future__ import annotations

import numpy as np

from . import DEFAULT_BLOCK_ROWS, PICKLE_MESSAGE, is_pickle, open_output
from ._array import ArrayReader, write_rows
from .source import Source, open_source
from ..dtypes import dtype_list, is_float_dtype
from ..errors import FormatError

__all__ = ["read", "write"]


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None) -> ArrayReader:
    """Stream the rows of a 2-D float ``.npy`` file (a path or a :class:`~.source.Source`)."""
    src = open_source(path)
    if not src.is_file:
        return _read_stream(src, block_rows=block_rows, limit=limit, dtype=dtype)
    src.close()
    path = src.path
    if not src.head.startswith(b"\x93NUMPY"):  # NumPy would say "allow_pickle=": not ours
        raise FormatError(PICKLE_MESSAGE if is_pickle(src.head) else
                          f"expected a .npy file (starting with b'\\x93NUMPY'), got one starting "
                          f"with {src.head[:8]!r}", path=path)
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - NumPy's header parser raises many types
        # (ValueError, EOFError for an empty file, OverflowError, tokenize.TokenError)
        if "allow_pickle" in str(exc):
            raise FormatError("expected a .npy array of floats, got an array of Python objects "
                              "(pickled: embstore never unpickles)", path=path) from None
        raise FormatError(f"expected a .npy array of floats, got an unreadable file ({exc})",
                          path=path) from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        raise FormatError("expected a .npy array, got an .npz archive", path=path)
    _check(arr.shape, arr.dtype, path)
    return ArrayReader(path, arr, format="npy", shape=arr.shape,
                       source_dtype=arr.dtype.newbyteorder("="), block_rows=block_rows,
                       limit=limit, dtype=dtype)


def _check(shape: tuple, dtype: np.dtype, path: str) -> None:
    if len(shape) != 2:
        raise FormatError(f"expected a 2-D array (rows, dim), got shape {shape}", path=path)
    if not is_float_dtype(dtype):
        raise FormatError(f"expected a {dtype_list()} array, got {dtype}", path=path)


class _RowStream:
    """``source[a:b]`` for an ArrayReader: the next rows of an ``.npy`` body, read in order."""

    def __init__(self, src: Source, dtype: np.dtype, dim: int):
        self._src, self._dtype, self._dim = src, dtype, dim
        self._row = 0

    def __getitem__(self, rows: slice) -> np.ndarray:
        assert rows.start == self._row, "rows are read in order"
        n = rows.stop - rows.start
        want = n * self._dim * self._dtype.itemsize
        data = self._src.read(want)
        if len(data) != want:
            got = self._row + len(data) // max(1, self._dim * self._dtype.itemsize)
            raise FormatError(f"the header promises more rows; the data ends in row {got + 1} "
                              "(the file is truncated)", path=self._src.path)
        self._row = rows.stop
        return np.frombuffer(data, dtype=self._dtype).reshape(n, self._dim)


class _StreamReader(ArrayReader):
    """An ArrayReader whose progress counts stored (compressed) bytes read."""

    _stream: Source

    def blocks(self):
        src = self._stream
        for block, keys in super().blocks():
            self.progress_done = src.consumed()
            yield block, keys


def _read_stream(src: Source, *, block_rows: int, limit: int | None, dtype) -> ArrayReader:
    try:
        major, minor = np.lib.format.read_magic(src.stream)
        header = np.lib.format.read_array_header_1_0 if major == 1 else \
            np.lib.format.read_array_header_2_0
        shape, fortran, arr_dtype = header(src.stream)
    except Exception as exc:  # noqa: BLE001 - NumPy's header parser raises many types
        src.close()
        raise FormatError(f"expected a .npy array of floats, got an unreadable header ({exc})",
                          path=src.path) from None
    try:
        _check(shape, arr_dtype, src.path)
        if fortran and shape[0] > 1 and shape[1] > 1:
            raise FormatError("a Fortran-order .npy cannot be read in order from compressed "
                              "data or a pipe; decompress it to a file first", path=src.path)
    except FormatError:
        src.close()
        raise
    reader = _StreamReader(src.path, _RowStream(src, arr_dtype, int(shape[1])), format="npy",
                           shape=(int(shape[0]), int(shape[1])), source_dtype=arr_dtype.newbyteorder("="),
                           block_rows=block_rows, limit=limit, dtype=dtype, closer=src.close)
    reader._stream = src
    if src.size is not None:
        reader.progress_unit, reader.progress_total = "bytes", src.size
    return reader


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

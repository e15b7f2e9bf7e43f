"""A :class:`Reader` over a 2-D array-like source (a memory-mapped ``.npy`` or
safetensors tensor, a PyTorch tensor): yields row blocks, cast to the asked dtype."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from . import DEFAULT_BLOCK_ROWS, Reader, check_finite

__all__ = ["ArrayReader", "write_rows"]

#: bytes of rows read and written at a time: a block stays in cache between its read (and
#: checks) and its write, its memory reused block after block (1M x 256 float32 to .npy,
#: warm: 64 MiB blocks written through ``tobytes`` 1.3-2.1 s; 4 MiB blocks written as they
#: are 0.35-0.48 s, where ``np.save`` of the mapped ``.npy`` took 0.52-0.82 s)
WRITE_BLOCK_BYTES = 4 << 20


def write_rows(f, table, n: int, dtype, *, block_rows: int, progress=None,
               encode=None) -> None:
    """Write rows ``0..n-1`` of ``table`` to the open file ``f`` as raw ``dtype`` bytes,
    one block of at most ``block_rows`` rows and about ``WRITE_BLOCK_BYTES`` at a time (the
    body of the ``.npy`` and safetensors writers); ``encode`` turns a block into those
    bytes' array when a cast cannot (bfloat16)."""
    dtype = np.dtype(dtype)
    step = max(1, min(block_rows, WRITE_BLOCK_BYTES // max(1, table.dim * dtype.itemsize)))
    for start in range(0, n, step):
        stop = min(n, start + step)
        block = table[start:stop] if encode is None else encode(table[start:stop])
        f.write(np.ascontiguousarray(block, dtype=dtype).reshape(-1).view(np.uint8).data)
        if progress is not None:
            progress(stop - start)


class ArrayReader(Reader):
    count: int  # known up front
    """Blocks of ``source[a:b]`` (``to_numpy`` turns a block into an ndarray).

    ``dtype=None`` keeps the source's float dtype; bfloat16 sources arrive as float32.
    """

    def __init__(self, path, source, *, format: str, shape: tuple[int, int], source_dtype,
                 to_numpy: Callable[[object], np.ndarray] = np.asarray,
                 block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None, dtype=None,
                 closer: Callable[[], None] | None = None):
        super().__init__(path, block_rows=block_rows, limit=limit)
        self.format = format
        self._source = source
        self._to_numpy = to_numpy
        self._closer = closer
        n, self.dim = int(shape[0]), int(shape[1])
        self.count = n if limit is None else min(n, limit)
        self.dtype = np.dtype(dtype) if dtype is not None else np.dtype(source_dtype)
        self.progress_total = self.count
        if self.dim < 1:
            raise self.error(f"expected a 2-D array with at least one column, got shape {tuple(shape)}")

    def size_hint(self) -> int:
        return self.count

    def blocks(self) -> Iterator[tuple[np.ndarray, None]]:
        for start in range(0, self.count, self.block_rows):
            stop = min(self.count, start + self.block_rows)
            raw = self._to_numpy(self._source[start:stop])
            check_finite(self, raw, start)
            with np.errstate(over="ignore"):
                block = np.array(raw, dtype=self.dtype, order="C", copy=True)
            if block.dtype.itemsize < raw.dtype.itemsize:
                check_finite(self, block, start)
            self.progress_done = stop
            yield block, None

    def close(self) -> None:
        self._source = None
        if self._closer is not None:
            closer, self._closer = self._closer, None
            closer()

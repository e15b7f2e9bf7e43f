"""The chunk files of a row array mapped side by side in one reserved address range
(:mod:`embstore.store.shard.arena`), each the first time a read reaches it: the rows are one
``(rows, dim)`` view, and a gather is one ``np.take``."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import numpy.ctypeslib  # (numpy loads it on first use: at open, not in the first lookup)

from ..shard import arena, prefetch
from .layout import PAGE, RowLayout, open_chunk
from ...ids import unique_ints

__all__ = ["MappedChunks", "release_rows"]

_HUGE = 2 << 20  # the range's alignment


class Unmap:
    """Releases a reserved range when the last array over it is gone (it hangs on the ctypes
    array every view of the range leads back to): a view a scan holds, or a gather another
    thread runs, stays valid after ``refresh()`` or ``close()`` replaced the range."""

    def __init__(self, base: int, total: int):
        self.base, self.total = base, total

    def __del__(self) -> None:
        arena.release(self.base, self.total)


class MappedChunks:
    """The chunk files of one layout mapped side by side (a reserved address range)."""

    def __init__(self, layout: RowLayout, chunk_path):
        self.layout, self.chunk_path = layout, chunk_path
        n = max(1, layout.n_chunks)
        self.total = -(-n * layout.chunk_bytes // PAGE) * PAGE
        # 2 MiB-aligned (chunks are whole 2 MiB units when large): the page cache's 2 MiB
        # folios of the chunk files can then be mapped as such, a page table entry each
        whole = self.total + _HUGE
        start = arena.reserve(whole)
        self.base = start + -start % _HUGE
        cells = (ctypes.c_uint8 * self.total).from_address(self.base)
        cells._unmap = Unmap(start, whole)  # type: ignore[attr-defined]
        raw = np.ctypeslib.as_array(cells)
        self.raw = raw
        self.view = raw[: n * layout.chunk_bytes].view(layout.dtype).reshape(
            n * layout.chunk_rows, layout.dim)
        self.view.flags.writeable = False
        self.mapped = np.zeros(n, dtype=bool)
        self.all_mapped = False
        self.lock = threading.Lock()

    def ensure(self, ks: np.ndarray) -> None:
        """Map the chunks ``ks`` (any order, repeats allowed) not mapped yet."""
        if self.all_mapped:
            return
        todo = ks[~self.mapped[ks]]
        if not todo.size:
            return
        with self.lock:
            for k in unique_ints(todo).tolist():  # a loop per chunk file, once
                if self.mapped[k]:
                    continue
                fd, size = open_chunk(self.chunk_path(k), k, self.layout)
                try:
                    arena.map_fixed(self.base + k * self.layout.chunk_bytes, fd, size)
                finally:
                    os.close(fd)
                self.mapped[k] = True
            self.all_mapped = bool(self.mapped.all())


def release_rows(src, ids: np.ndarray) -> int:
    """``PagedSource.release``: let the page cache drop the pages of rows ``ids`` now
    (``MADV_PAGEOUT``, :func:`~embstore.store.shard.prefetch.pageout`; they stay checked): a
    training row cache that copied them keeps a memory limit's page cache from filling.
    Rows of never-written chunks (nothing mapped) and ranged (object storage) sources:
    nothing done.  Returns the pages advised."""
    r = src._range
    if src._ranged is not None or r is None or not ids.size:
        return 0
    lazy = src._lazy_chunks()
    never = None if lazy is None else lazy.mask(ids)
    if never is not None:
        ids = ids[~never]
    at = r.base + ids * src._rl.row_bytes
    return prefetch.pageout(at, at + src._rl.row_bytes)

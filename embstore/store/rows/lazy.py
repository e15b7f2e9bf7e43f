"""Chunks of a row array never written (docs/FORMAT.md §3e): a table made by
``embstore.create(..., init=...)`` stores no rows.  Each chunk file is a hole of its full
size (zeros to other Zarr readers) and its page-checksum file is the 15-byte
:data:`~.pages.MARKER` instead of checksums; the array's ``zarr.json`` names the initialisation
(``attributes.embstore_init``), and a reader generates the rows of such a chunk from it
(:mod:`embstore.store.rowinit`: a counter-based draw per value), the same every time.  The
first write that folds rows into a chunk (a compaction, an append into its padding) stages
it whole, the generated rows with the written ones, and real page checksums: from then on
it is a stored chunk like any other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ...dtypes import DTYPES
from ...ids import unique_ints
from .norms import decoded_norms
from ..rowinit import init_at
from .layout import RowLayout
from .pages import is_marker

__all__ = ["LazyChunks", "lazy_values"]

def lazy_values(spec: dict, ids: np.ndarray, cols: int, data_type: str) -> np.ndarray:
    """The stored values (codes of ``data_type``) of rows ``ids`` of a never-written chunk
    of an array initialised by ``spec`` with ``cols`` columns: what writing
    :func:`~embstore.store.rowinit.init_rows` at creation would have stored."""
    if "norms_of" in spec:
        record = DTYPES[spec["dtype"]]
        codes, scales = _encoded(record, init_at(spec["norms_of"], ids, spec["dim"]))
        return decoded_norms(record, codes, scales).astype(DTYPES[data_type].code,
                                                            copy=False)
    return _encoded(DTYPES[data_type], init_at(spec, ids, cols))[0]


def _encoded(record, values: np.ndarray):
    """``(codes, side)`` of float32 ``values`` as :class:`~embstore.store.writer.TableWriter`
    stores them (cast to the record's logical dtype first: float16 rounds there)."""
    return record.encode(np.ascontiguousarray(values, dtype=record.logical))


class LazyChunks:
    """Which chunks of one row array (of ``layout``, which names an init) are never
    written, learnt a chunk at a time from its page-checksum file (``crc_path(k)``), and
    their rows (:func:`lazy_values`)."""

    def __init__(self, layout: RowLayout, crc_path: Callable[[int], str]):
        assert layout.init is not None
        self.spec, self.chunk_rows, self.cols = layout.init, layout.chunk_rows, layout.dim
        self.data_type = "bfloat16" if layout.dtype == np.dtype("<u2") else layout.dtype.name
        self.crc_path = crc_path
        self.state = np.zeros(max(1, layout.n_chunks), np.int8)  # 0 unknown, 1 lazy, 2 stored
        self._lock = threading.Lock()

    def _learn(self, ks: np.ndarray) -> None:
        todo = ks[self.state[ks] == 0]
        if not todo.size:
            return
        with self._lock:
            for k in unique_ints(todo).tolist():  # a loop per chunk, once
                self.state[k] = 1 if is_marker(self.crc_path(k)) else 2

    def mask(self, ids: np.ndarray) -> np.ndarray | None:
        """Which of ``ids`` lie in never-written chunks (None: none of them)."""
        ks = ids // self.chunk_rows
        self._learn(ks)
        lazy = self.state[ks] == 1
        return lazy if lazy.any() else None

    def chunk(self, k: int) -> bool:
        """Whether chunk ``k`` is never written."""
        self._learn(np.array([k]))
        return bool(self.state[k] == 1)

    def rows(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The stored values of rows ``ids`` (into ``out``, ``(n, cols)``, when given)."""
        if out is not None and self.data_type == "float32" and "norms_of" not in self.spec:
            return init_at(self.spec, ids, self.cols, out=out)  # (no copy: a chunk's worth)
        got = lazy_values(self.spec, ids, self.cols, self.data_type)
        if out is not None:
            out[:] = got
        return got

"""The stored row norms of a table (``norms``, docs/FORMAT.md §3d) as its rows are read and
written: :class:`NormsSource` wraps the row source of a table that has ``norms``: reads go
to the rows; ``write``/``append`` also rewrite the norms of the changed rows *in the same
transaction* (so the journal moves norms and vectors together: all or nothing).  Storing
the norms of a whole table, and checking them: :mod:`embstore.store.stored_norms`.

Tables without ``norms`` still search: their norms are computed on the fly per block.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..._types import PathLike
from ...errors import CorruptStoreError, FormatError
from ..codecs import Layout
from ..meta import read_json
from ..rows.norms import norms_dtype, row_norms, stored_rows
from .calc import NORMS_ARRAY
from ..base import Transaction as Staging, RowSource
from ..rows.layout import RowLayout, crc_array
from ..place.local import LocalDir
from ..rows.source import PagedSource
from ..source import ShardSource, same_array

__all__ = ["NormsSource", "attach_norms", "has_norms", "norms_source", "norms_meta",
           "mismatch", "format1_norms"]


#: rows a write in blocks gathers at a time to compute their norms
NORM_BLOCK_BYTES = 4 << 20


class NormsSource(RowSource):
    """The rows of ``rows`` and their stored norms (``norms``: a ``(V, 1)`` source)."""

    def __init__(self, rows: RowSource, norms: RowSource):
        self.rows, self.norms = rows, norms
        self.cheap_reads = rows.cheap_reads

    def __getattr__(self, name: str):
        """Anything else is the rows' (``reader`` of a shard source, ...): the wrapper stays
        transparent to code written against the rows' source."""
        if name in ("rows", "norms"):
            raise AttributeError(name)
        return getattr(self.rows, name)

    shape = property(lambda self: self.rows.shape)
    layout = property(lambda self: self.rows.layout)
    dtype = property(lambda self: self.rows.dtype)
    storage_dtype = property(lambda self: self.rows.storage_dtype)

    def raw(self, ids):
        return self.rows.raw(ids)

    def reads_cold(self) -> bool:
        return self.rows.reads_cold()

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        self.rows.gather(ids, out)

    def take(self, ids: np.ndarray) -> np.ndarray:
        return self.rows.take(ids)

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.rows.read(start, stop)

    def row_norms(self, start: int, stop: int) -> np.ndarray:
        """Stored norms of rows ``start..stop-1`` (1-D)."""
        return self.norms.read(start, stop)[:, 0]

    def _norms_of(self, values: np.ndarray) -> np.ndarray:
        return row_norms(stored_rows(self.storage_dtype, values), self.norms.dtype)

    def write(self, ids: np.ndarray, values: np.ndarray, txn: Staging) -> None:
        self.norms.write(ids, self._norms_of(values), txn)
        self.rows.write(ids, values, txn)

    def write_blocks(self, ids: np.ndarray, rows_at: Callable[[np.ndarray], np.ndarray],
                     txn: Staging, block_rows: int = 1 << 16) -> None:
        """The norms of each block of rows, then the rows (``rows_at`` asked twice a
        block; for the norms, :data:`NORM_BLOCK_BYTES` of rows at a time, however many
        norms the norms' block holds)."""
        step = max(1, NORM_BLOCK_BYTES // (self.shape[1] * self.dtype.itemsize))

        def norms_at(pos: np.ndarray) -> np.ndarray:
            out = np.empty((pos.size, 1), self.norms.dtype)
            for a in range(0, pos.size, step):  # a loop per block of rows
                out[a: a + step] = self._norms_of(rows_at(pos[a: a + step]))
            return out
        self.norms.write_blocks(ids, norms_at, txn, block_rows)
        self.rows.write_blocks(ids, rows_at, txn, block_rows)

    def append(self, values: np.ndarray, txn: Staging) -> None:
        self.norms.append(self._norms_of(values), txn)
        self.rows.append(values, txn)

    def publish_rows(self, rows: int, txn: Staging) -> None:
        self.norms.publish_rows(rows, txn)  # readers take the row count from vectors: last
        self.rows.publish_rows(rows, txn)

    def refresh(self) -> None:
        self.norms.refresh()
        self.rows.refresh()

    def close(self) -> None:
        self.norms.close()
        self.rows.close()


def norms_meta(root: Path) -> dict | None:
    where = root / NORMS_ARRAY / "zarr.json"
    if not where.is_file():
        return None
    return read_json(where, f"{NORMS_ARRAY}/zarr.json", root=root)


#: norms past the table's rows that are tolerated (left by a write that dropped rows)
EXTRA_NORMS = 1 << 20


def has_norms(root: PathLike) -> bool:
    return (Path(os.fspath(root)) / NORMS_ARRAY / "zarr.json").is_file()


def mismatch(root: Path, rows: RowSource) -> tuple[str, Layout | RowLayout | None]:
    """Why the ``norms`` of the table at ``root`` cannot serve ``rows`` ("" if they can),
    and their layout: a format-2 row array (with ``norms_page_crc``) or format 1's shards."""
    try:
        meta = norms_meta(root)
    except (CorruptStoreError, FormatError) as exc:
        return str(exc), None
    if meta is None:
        return "", None
    paged = RowLayout.from_metadata(meta)
    if paged is not None and not (root / crc_array(NORMS_ARRAY) / "zarr.json").is_file():
        # a row array is checksummed by its page checksums: without them, damage (never
        # read unchecked as a layout without checksums, never silently set aside)
        raise CorruptStoreError(
            f"{root / crc_array(NORMS_ARRAY)}/zarr.json: missing; {NORMS_ARRAY} is a row array, "
            f"whose page checksums live there (store the norms again: store_norms)",
            path=str(root / crc_array(NORMS_ARRAY)))
    layout: Layout | RowLayout | None = paged if paged is not None else \
        Layout.from_metadata(meta)
    want = norms_dtype(rows.storage_dtype)
    n = rows.shape[0]
    if layout is None or layout.dim != 1 or layout.dtype != want or \
            not n <= layout.rows <= n + EXTRA_NORMS:  # (2**40 norms: a hostile size)
        return (f"{root / NORMS_ARRAY}/zarr.json: expected {want.name} of shape [>= "
                f"{n}, 1] (at most {n + EXTRA_NORMS} rows) in one of embstore's layouts (one "
                f"norm per row), got "
                f"{meta.get('data_type')} {meta.get('shape')}; store them again "
                "(store_norms)"), None
    return "", layout


def format1_norms(root: Path) -> Layout | None:
    """The layout of ``norms`` at ``root`` when they are format 1's shards (None: none there,
    or a format-2 row array)."""
    meta = norms_meta(root)
    return None if meta is None else Layout.from_metadata(meta)


def norms_source(root: Path, layout: Layout | RowLayout) -> RowSource:
    if isinstance(layout, RowLayout):
        return PagedSource(LocalDir(root), layout, NORMS_ARRAY, crc_array(NORMS_ARRAY))
    return ShardSource(LocalDir(root), layout, NORMS_ARRAY)


def attach_norms(root: Path, rows: RowSource,
                 wrap: Callable[[str, RowSource], RowSource] = same_array) -> RowSource:
    """``rows`` with their stored norms when the table at ``root`` has a usable ``norms``
    array.  Norms that do not fit the rows (another tool appended rows) are left aside:
    they only save work, searches compute norms instead, and ``verify`` reports them."""
    why, layout = mismatch(root, rows)
    if layout is None:
        return rows
    return NormsSource(rows, wrap(NORMS_ARRAY, norms_source(root, layout)))



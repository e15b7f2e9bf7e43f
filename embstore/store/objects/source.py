"""The rows of one version of a table on object storage: its base table's rows (read by
ranges, :mod:`embstore.store.remote`) with the version's deltas on top, appended rows
included (docs/FORMAT.md §11a).  Deltas hold the stored values (bfloat16 and int8 codes,
int8's row scales beside them): decoded once when the version opens, as stored for
:meth:`ObjectVersionSource.raw` and compaction."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...dtypes import DTYPES
from ...errors import ReadOnlyError
from ..base import RowSource

__all__ = ["ObjectVersionSource"]


class ObjectVersionSource(RowSource):
    """Rows ``0 .. rows-1``: those below the base's row count from ``base``, then the
    deltas' rows (``ids`` sorted, ``codes`` their stored values, ``side`` their side array's
    rows (int8's row scales) or None; appended rows are all in them).  ``doc`` is the
    version's manifest, ``client`` the table's (the commit area's) client."""

    def __init__(self, base: RowSource, doc: dict, ids: np.ndarray, codes: np.ndarray,
                 client: Any, side: np.ndarray | None = None):
        self.base, self.doc, self.client = base, doc, client
        self.record = DTYPES[base.storage_dtype]
        self.ids, self.codes, self.side = ids, codes, side
        self.values = codes if not self.record.compact else self.record.decode(
            codes, side, np.empty(codes.shape, self.record.logical))
        self.rows = int(doc["rows"])
        self.cheap_reads = base.cheap_reads

    shape = property(lambda self: (self.rows, self.base.shape[1]))
    dtype = property(lambda self: self.base.dtype)
    layout = property(lambda self: self.base.layout)
    storage_dtype = property(lambda self: self.base.storage_dtype)

    @property
    def pending_rows(self) -> int:
        """Rows in deltas (what a compaction folds)."""
        return int(self.ids.size)

    def reads_cold(self) -> bool:
        return self.base.reads_cold()

    def raw(self, ids: np.ndarray):
        """``(codes, scale, offset)`` of rows ``ids`` as stored (the base's, the deltas' on
        top)."""
        if not self.record.compact:
            return self.take(ids), None, None
        if not self.ids.size:
            return self.base.raw(ids)
        codes = np.empty((ids.size, self.shape[1]), self.record.code)
        side = None if self.side is None else np.empty((ids.size, self.side.shape[1]),
                                                       self.side.dtype)
        inside = np.flatnonzero(ids < self.base.shape[0])
        if inside.size:
            c, scale, offset = self.base.raw(ids[inside])
            codes[inside] = c
            if side is not None:
                side[inside, 0], side[inside, 1] = scale, offset
        pos = np.minimum(np.searchsorted(self.ids, ids), self.ids.size - 1)
        hit = np.flatnonzero(self.ids[pos] == ids)
        codes[hit] = self.codes[pos[hit]]
        if side is not None:
            assert self.side is not None
            side[hit] = self.side[pos[hit]]
        return self.record.raw(codes, side)

    def _over(self, ids: np.ndarray, out: np.ndarray) -> None:
        d = self.ids
        if not d.size or not ids.size:
            return
        pos = np.minimum(np.searchsorted(d, ids), d.size - 1)
        hit = np.flatnonzero(d[pos] == ids)
        if hit.size:
            out[hit] = self.values[pos[hit]]

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        nb = self.base.shape[0]
        if self.rows == nb and not self.ids.size:
            self.base.gather(ids, out)
            return
        inside = ids < nb
        if inside.all():
            self.base.gather(ids, out)
        else:
            sel = np.flatnonzero(inside)
            if sel.size:
                out[sel] = self.base.take(ids[sel])
        self._over(ids, out)

    def read(self, start: int, stop: int) -> np.ndarray:
        nb = self.base.shape[0]
        out = np.empty((max(0, stop - start), self.shape[1]), dtype=self.dtype)
        if start < min(stop, nb):
            out[: min(stop, nb) - start] = self.base.read(start, min(stop, nb))
        lo, hi = np.searchsorted(self.ids, [start, stop])
        if hi > lo:
            out[self.ids[lo:hi] - start] = self.values[lo:hi]
        return out

    def _refuse(self) -> None:
        raise ReadOnlyError(f"{self.client.url}: rows of a table on object storage are "
                            "written by its handle's commits (write, append)")

    def write(self, ids: np.ndarray, values: np.ndarray, txn: Any = None) -> None:
        self._refuse()

    def append(self, values: np.ndarray, txn: Any = None) -> None:
        self._refuse()

    def publish_rows(self, rows: int, txn: Any = None) -> None:
        self._refuse()

    def refresh(self) -> None:
        self.base.refresh()

    def close(self) -> None:
        self.base.close()
        self.client.close()

"""The row-source interface of :class:`~embstore.store.table.ZarrTable`: where rows leave
(and enter) the store.  Implementations: one per layout, over any place
(:mod:`embstore.store.place`): :mod:`embstore.store.rows.source` (rows at a fixed stride)
and :mod:`embstore.store.source` (sharded chunks; there too zarr-python's source for other
tools' layouts, and the compact dtypes' decoding).

Ids given to a source are validated 1-D int64 arrays; rows are ``(n, dim)`` arrays of the
source's dtype.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .codecs import Layout

__all__ = ["RowSource", "LayoutSource", "Transaction", "Handle", "Versions", "unit_blocks",
           "RowsAt"]

#: ``rows_at(pos)``: the values of rows ``ids[pos]`` of a write given a block at a time
#: (``pos``: ascending positions in its ids)
RowsAt = Callable[[np.ndarray], np.ndarray]


class Transaction(Protocol):
    """What a row source writes through: one commit's staging
    (:class:`embstore.store.versions.commit.Transaction` is the one there is; sources see
    only this much of it)."""

    def file(self, live: str) -> Path:
        """A path to write the new version of the live file ``live`` (relative to the
        table) to; it replaces the live file when the commit applies."""

    def delta(self, array: str) -> Path:
        """A path to write the delta file of ``array`` to (a versioned table's writes)."""

    def sync_later(self, path) -> None:
        """``path`` (staged, or written in place) is fsynced before the commit point."""

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the commit is applied (update in-memory views)."""


@dataclass(frozen=True)
class Handle:
    """What the versions of a place (:class:`Versions`) see of the table handle they
    commit for: the version it reads, how it adopts another (row cache rebound), its key
    index, row cache, compaction setting and lock.  Nothing else of the table."""

    current: Callable[[], Any]  # the Version the handle reads now
    adopt: Callable[[Any], None]  # swap in a Version (one assignment; the cache follows)
    reload: Callable[[], None]  # adopt the newest version
    vocab: Callable[[], Any]  # the current version's key index (opened on first use)
    cache: Callable[[], Any]  # the handle's row cache
    compaction: Callable[[], str]  # "auto" or "deferred" (a trainer's write-backs)
    check_open: Callable[[], None]
    lock: threading.RLock


class Versions(Protocol):
    """The versions of a table where its bytes live, the one thing a table handle asks of
    its place: :class:`embstore.store.versions.local.LocalVersions` (a local folder: hard
    links, a journal rename, leases) and
    :class:`embstore.store.objects.history.ObjectVersions` (object storage: immutable
    objects and manifests created with ``If-None-Match``).  Chosen once, by
    :func:`embstore.store.versions_at`."""

    path: Any  # a Path on disk, a str URL
    remote: bool  # on object storage (reported by ``ZarrTable.is_remote``; never branched on)

    def open(self, old: Any) -> Any:
        """The Version the handle should read (``old``: the one it reads now, or None)."""

    def is_current(self, v: Any) -> bool:
        """Whether ``v`` is still the newest version (``refresh`` has nothing to do)."""

    def moved_on(self) -> bool:
        """Whether another handle committed since this one last read or wrote."""

    def needs_key_index(self, v: Any) -> bool:
        """Whether ``v``'s keys need their index stored now (keys another tool wrote)."""

    def open_vocab(self, v: Any, writable: bool) -> Any:
        """``v``'s key index with its key deltas (None: no keys array)."""

    def open_ngrams(self, v: Any, info: dict, dim: int, mode: str) -> Any: ...

    def stored_bytes(self, v: Any) -> tuple[int, int]:
        """Bytes the table takes where it lives, and those of ``vectors``' chunks."""

    def pending_rows(self, v: Any) -> int: ...

    def write(self, h: Handle, ids: Any, values: Any) -> None: ...

    def write_blocks(self, h: Handle, ids: Any, rows_at: Callable[[Any], Any]) -> None:
        """As :meth:`write`, the values of ``ids[pos]`` given by ``rows_at(pos)``."""

    def append(self, h: Handle, values: Any, keys: list[str] | None) -> int: ...

    def compact(self, h: Handle) -> int: ...

    def compact_if_due(self, h: Handle, dense: bool = False) -> int | None: ...

    def vacuum(self, h: Handle, keep: int | None, cutoff: float | None) -> list[int]: ...


class RowSource(abc.ABC):
    """Rows of one ``vectors`` array: geometry, reads, writes."""

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, int]: ...

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype: ...

    @property
    @abc.abstractmethod
    def layout(self) -> dict:
        """``chunk_rows``, ``shard_rows``, ``compression`` (None if unknown), ``fast_path``."""

    #: reading a row costs about what a row-cache hit costs (uncompressed, memory-mapped)
    cheap_reads = False
    #: writes change stored files in place (zarr-python's writes of a layout embstore does
    #: not know): such a table cannot keep versions, which share unchanged files
    writes_in_place = False

    @property
    def storage_dtype(self) -> str:
        """The dtype of the stored values (``bfloat16`` and ``int8`` are decoded to float32)."""
        return self.dtype.name

    def raw(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(codes, scale, offset)`` of rows ``ids`` as stored (floats: the rows, None, None)."""
        return self.take(ids), None, None

    def reads_cold(self) -> bool:
        """Whether the last reads found their rows out of memory (then no read is cheap)."""
        return False

    @abc.abstractmethod
    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (``(len(ids), dim)``) with rows ``ids``."""

    def take(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` as a new ``(len(ids), dim)`` array."""
        out = np.empty((ids.size, self.shape[1]), dtype=self.dtype)
        if ids.size:
            self.gather(ids, out)
        return out

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start..stop-1`` as a new array."""
        return self.take(np.arange(start, stop, dtype=np.int64))

    @abc.abstractmethod
    def write(self, ids: np.ndarray, values: np.ndarray, txn: Transaction) -> None:
        """Set rows ``ids`` (distinct, ascending) to ``values`` when ``txn`` commits."""

    def write_blocks(self, ids: np.ndarray, rows_at: RowsAt, txn: Transaction,
                     block_rows: int = 1 << 16) -> None:
        """As :meth:`write`, the values of ``ids[pos]`` given by ``rows_at(pos)`` (``pos``
        ascending positions), asked for a block at a time so that a layout can write them
        without holding them all (a fold of pending rows, a trainer's flush:
        :class:`LayoutSource`, :class:`~.versions.delta.OverlaySource`, the norms).  Here:
        all at once, then one :meth:`write` (sources above the layout that need the rows
        whole)."""
        self.write(ids, rows_at(np.arange(ids.size)), txn)

    @abc.abstractmethod
    def append(self, values: np.ndarray, txn: Transaction) -> None:
        """Store rows after the last one when ``txn`` commits (with :meth:`publish_rows`)."""

    @abc.abstractmethod
    def publish_rows(self, rows: int, txn: Transaction) -> None:
        """Make the table ``rows`` rows long when ``txn`` commits (its last file)."""

    def refresh(self) -> None:
        """Forget what was read of the store (another process may have changed it)."""

    def close(self) -> None:
        """Release maps and files (reads in flight finish first)."""


def unit_blocks(ids: np.ndarray, layout: dict, block_rows: int) -> list[tuple[int, int]]:
    """Bounds ``(a, b)`` over ``ids`` (ascending) of blocks of about ``block_rows`` rows,
    cut only where a shard (or a chunk) of ``layout`` begins."""
    unit = int(layout.get("shard_rows") or layout.get("chunk_rows") or 0)
    if not unit or ids.size <= block_rows:
        return [(0, int(ids.size))]
    firsts = ids[::block_rows] // unit * unit  # (the first row of the unit of every n-th)
    cuts = sorted({0, *np.unique(np.searchsorted(ids, firsts)).tolist(), int(ids.size)})
    return list(zip(cuts[:-1], cuts[1:]))


class LayoutSource(RowSource):
    """A source whose geometry (rows, dim, stored dtype) comes from its layout: format-1
    shards (a :class:`Layout`), format-2 rows (a :class:`~embstore.store.rows.layout.RowLayout`)."""

    #: whether reads take the local memory-mapped path (``layout["fast_path"]``)
    fast_path = True

    @property
    @abc.abstractmethod
    def _layout(self) -> Layout: ...

    @property
    def shape(self) -> tuple[int, int]:
        return (self._layout.rows, self._layout.dim)

    def write_blocks(self, ids: np.ndarray, rows_at: RowsAt, txn: Transaction,
                     block_rows: int = 1 << 16) -> None:
        """Blocks of about ``block_rows`` rows, cut only where a unit (shard, chunk) of the
        layout begins, each one :meth:`write` (which rewrites whole units); a layout that
        patches a unit in parts asks for less (:class:`~.rows.source.PagedSource`)."""
        for a, b in unit_blocks(ids, self.layout, block_rows):  # a loop per block
            self.write(ids[a:b], rows_at(np.arange(a, b)), txn)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._layout.dtype.name)

    @property
    def layout(self) -> dict:
        L = self._layout
        return {"chunk_rows": L.chunk_rows, "shard_rows": L.shard_rows,
                "compression": L.compression, "fast_path": self.fast_path}

"""The versions of a table on object storage (docs/FORMAT.md §11a): :class:`ObjectVersions`
opens them (one manifest, then immutable objects) and commits a table handle's writes,
appends, compactions and vacuums by conditional writes (:mod:`.commit`: a manifest created
with ``If-None-Match: *``; a writer that loses a race rebases onto disjoint rows and keys).
No lock, no lease: a handle moves to the version its commit made."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import Handle
from ..remote.open import open_remote_ngrams
from ..subword.ngrams import Subwords
from ..versions.version import Version
from .compact import compact_if_due, compact_objects
from .manifest import DeltaCache
from .source import ObjectVersionSource
from .version import commit_rows, object_vocab, open_version, vacuum_objects

__all__ = ["ObjectVersions"]


class ObjectVersions:
    """The versions of the table at ``url`` for one handle (``want``: the version asked
    for, None the newest; ``remote``: the options of :func:`embstore.open` for object
    storage).  It keeps the deltas the handle has read (they are immutable objects)."""

    remote = True

    def __init__(self, url: str, want: int | None, remote: dict[str, Any]):
        self.path, self.want, self.options = url, want, remote
        self.deltas = DeltaCache()

    # -- reading ----------------------------------------------------------------------------
    def open(self, old: Version | None) -> Version:
        return open_version(self.path, self.want, self.options, self.deltas, old)

    def is_current(self, v: Version) -> bool:
        return False  # (knowing costs the LIST a reopen makes: refresh reopens)

    def moved_on(self) -> bool:
        return False  # (a commit rebases onto what others committed, or names the conflict)

    def needs_key_index(self, v: Version) -> bool:
        return False  # (the upload holds its key index)

    def open_vocab(self, v: Version, writable: bool):
        return object_vocab(v, self.deltas)

    def open_ngrams(self, v: Version, info: dict, dim: int, mode: str) -> Subwords:
        return open_remote_ngrams(v.objects, info, dim)

    def stored_bytes(self, v: Version) -> tuple[int, int]:
        objects = v.objects.client.list()
        return (sum(size for _, size in objects),
                sum(size for name, size in objects if name.startswith("vectors/c/")))

    def pending_rows(self, v: Version) -> int:
        src = v.source
        return src.pending_rows if isinstance(src, ObjectVersionSource) else 0

    # -- commits ----------------------------------------------------------------------------
    def _commit(self, h: Handle, kind: str, ids, values: np.ndarray, keys=None) -> int:
        """A commit: the handle moves to the version it made (on top of the commits it
        rebased onto).  Returns the first appended row."""
        with h.lock:
            h.check_open()
            v = h.current()
            if values.shape[0] == 0:
                return v.source.shape[0]
            vocab = h.vocab() if keys is not None else None
            new, first = commit_rows(v, kind, ids, values, keys, self.deltas, vocab)
            if new is None:  # (rebased onto a compaction: the version it made, on its base)
                new = open_version(self.path, first[1], self.options, self.deltas, v)
                first = first[0]
            h.adopt(new)  # (rows other writers committed: the cache drops them too)
            return first  # (no compaction after it: each commit one version, as locally;
            # `compact_if_due()` / `compact()` fold the deltas, in a commit of their own)

    def _compact_due(self, h: Handle) -> int | None:
        """Compact the handle's version when its deltas are past the threshold
        (:func:`~.compact.compact_if_due`); the version the handle reads then, or None."""
        if compact_if_due(h.current(), self.deltas, self.path,
                          self.options.get("storage_options")) is None:
            return None
        h.reload()
        return h.current().number

    def write(self, h: Handle, ids: np.ndarray, values: np.ndarray) -> None:
        self._commit(h, "write", ids, values)

    def write_blocks(self, h: Handle, ids: np.ndarray, rows_at) -> None:
        """The rows gathered whole, then one write (an upload holds its delta anyway)."""
        self.write(h, ids, rows_at(np.arange(ids.size)))

    def append(self, h: Handle, values: np.ndarray, keys: list[str] | None) -> int:
        return self._commit(h, "append", None, values, keys)

    def compact(self, h: Handle) -> int:
        """A new base table in the commit area (Zarr readers of the URL keep the upload)."""
        with h.lock:
            for _ in range(3):  # (lost to a compaction or an append of keys: again)
                h.reload()  # the newest version
                v = h.current()
                vocab = h.vocab() if v.has_keys else None
                if compact_objects(v, self.deltas, self.path,
                                   self.options.get("storage_options"),
                                   None if vocab is None else vocab.keys_between):
                    break
            h.reload()
            return h.current().number

    def compact_if_due(self, h: Handle, dense: bool = False) -> int | None:
        with h.lock:  # (``dense``: a whole compaction; object storage rewrites the base)
            return self._compact_due(h)

    def vacuum(self, h: Handle, keep: int | None, cutoff: float | None) -> list[int]:
        """Without leases, ``cutoff``: only objects older than that many seconds go
        (default 3,600), so a commit in flight or a reader of a version just past ``keep``
        keeps its own."""
        with h.lock:
            v = h.current()
            src = v.source
            assert isinstance(src, ObjectVersionSource)
            setting = v.attrs.get("retain_versions")  # (the table's, as locally)
            return vacuum_objects(src.client, keep if keep is not None or type(
                setting) is not int else setting, cutoff)

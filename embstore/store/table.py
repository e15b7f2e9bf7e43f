"""The on-disk backend's table: :class:`ZarrTable` and ``open`` (``create``/``save`` are in
:mod:`embstore.store.build`, :class:`~embstore.store.writer.TableWriter` in
:mod:`embstore.store.writer`, ``verify`` in :mod:`embstore.store.verify`).

Rows are read through a version's row source (:mod:`embstore.store.source`: sharded chunks,
rows at a fixed stride, or zarr-python for layouts embstore does not know; docs/FORMAT.md);
versions are opened and committed by the table's place (:mod:`embstore.store.history`: a
local folder's :mod:`~embstore.store.versions.local`, or object storage's
:mod:`~embstore.store.objects.history`).  The table itself never asks where it lives.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .._types import Bytes, OpenMode, PathLike
from ..cache.null import make_cache
from ..cache.rows import CacheInfo, parse_bytes
from ..errors import CorruptStoreError, InvalidIdError, InvalidOptionError, ReadOnlyError
from ..fs.forksafe import renew_after_fork
from ..ids import as_ids, memory_refused
from ..keys.foreign import MemoryKeyIndex
from ..keys.index import DiskVocab
from ..keys.segments import SegmentedVocab
from ..table import Table
from .base import Handle
from .history import versions_at
from .norms.source import NormsSource
from .subword.ngrams import Subwords
from .versions.local import (COMPACT_BYTES, COMPACT_FRACTION, KEYS_FRACTION,
                             MAX_DELTA_FILES, MAX_KEY_DELTAS)
from .versions.version import Version, check_version, plain

__all__ = ["ZarrTable", "open", "COMPACT_FRACTION", "COMPACT_BYTES", "MAX_DELTA_FILES",
           "MAX_KEY_DELTAS", "KEYS_FRACTION"]

DEFAULT_CACHE = "256MiB"  # the row cache of tables whose reads are not cheap


class ZarrTable(Table):
    """A table stored as a Zarr v3 group (docs/FORMAT.md).  Use :func:`open`.

    The handle reads one :class:`~embstore.store.versions.version.Version` (``_v``: its
    directory, row source, attributes, key index) and swaps it for another in one
    assignment.  Rows come from the version's :class:`~embstore.store.base.RowSource`
    through a row cache (a :class:`~embstore.cache.null.NullCache` when
    ``cache_bytes=0``).  Writes, compactions and vacuums are commits of the versions
    where the table lives (``_versions``, a :class:`~embstore.store.base.Versions`), which
    see of the handle only a :class:`~embstore.store.base.Handle`.
    """

    _appends_check_keys = True  # (append's keys are refused under the writer lock)

    # what the handle's version holds (one value, swapped whole)
    _source = property(lambda self: self._v.source)
    _root = property(lambda self: self._v.root)
    _attrs = property(lambda self: self._v.attrs)
    _has_keys = property(lambda self: self._v.has_keys)
    _overlays = property(lambda self: self._v.overlays)
    _version = property(lambda self: self._v.number)
    _versioned = property(lambda self: self._v.versioned)
    _objects = property(lambda self: self._v.objects)  # (object storage: its client, ...)

    def __init__(self, path: PathLike, *, mode: OpenMode = "r", cache_bytes: Bytes = "auto",
                 lock_timeout: float | None = None, version: int | None = None, **remote: Any):
        if mode not in ("r", "r+"):
            raise InvalidOptionError(f"mode must be 'r' or 'r+', got {mode!r}")
        self._want_version = check_version(version, mode)
        self._v: Version  # (set by _load_meta)
        self.mode = mode
        self.lock_timeout = lock_timeout  # seconds a write waits for another writer
        self._lock = threading.RLock()  # writers, vocab opening, refresh
        renew_after_fork(self, "_lock")
        self._closed = False
        #: when a write folds the deltas into the chunks (in its own commit): "auto" past
        #: COMPACT_FRACTION or COMPACT_BYTES; "deferred" (a trainer's write-backs) never
        #: (delta files are merged past MAX_DELTA_FILES); "dense" (a trainer's checkpoint)
        #: past them, only the chunks dense in pending rows
        self.compaction = "auto"
        # the versions where the table lives (its place: a folder, object storage); a
        # handle opened r+ finishes or clears interrupted writes there first
        self._versions = versions_at(path, mode, self._want_version, lock_timeout, remote)
        self.path: Any = self._versions.path  # (a Path on disk, a str for a URL)
        self._handle = Handle(current=lambda: self._v, adopt=self._adopt,
                              reload=self._reload, vocab=self._vocab,
                              cache=lambda: self._cache, compaction=lambda: self.compaction,
                              check_open=self._check_open, lock=self._lock)
        self._load_meta()
        self._cache = make_cache(self._cache_budget(cache_bytes), self.dim, self.dtype,
                                 self.vocab_size)
        self._cache.bind(self._source)
        self._cache.cheap_reads = self._source.cheap_reads
        self._cache.reads_cold = lambda: self._source.reads_cold()

    def _cache_budget(self, cache_bytes: Bytes) -> int:
        """``"auto"``: no cache for rows mapped from local files (a warm gather beats a hit:
        4.2 ms vs 11.7 ms, (32, 512) ids, 1M x 256), else ``DEFAULT_CACHE``."""
        if cache_bytes == "auto":
            return 0 if self._source.cheap_reads else parse_bytes(DEFAULT_CACHE)
        return parse_bytes(cache_bytes)

    def _load_meta(self) -> None:
        v = self._versions.open(getattr(self, "_v", None))
        self._v = v  # one step: threads sharing the handle see the old state or the new
        self.version = v.number  # (Table.version: what the handle reads)
        if self._versions.needs_key_index(v):
            self._vocab()  # keys written by another tool: store their index now

    # -- geometry ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self._source.shape

    @property
    def dtype(self) -> np.dtype:
        return self._source.dtype

    @property
    def storage_dtype(self) -> str:
        """The dtype rows are stored in: ``float16``/``32``/``64``, or ``bfloat16`` and ``int8``
        (then lookups return float32, :attr:`dtype`, and :meth:`raw` gives the codes)."""
        return self._source.storage_dtype

    @property
    def writable(self) -> bool:
        return self.mode == "r+" and not self._closed

    @property
    def is_remote(self) -> bool:
        """Whether the table is on object storage (opened from a URL)."""
        return self._versions.remote

    @property
    def layout(self) -> dict:
        """``chunk_rows``, ``shard_rows`` and ``compression`` of ``vectors`` (None if unknown)."""
        return self._source.layout

    def info(self) -> dict:
        """What ``embstore info --json`` prints."""
        self._check_open()
        stored, rows = self._versions.stored_bytes(self._v)
        return {"format": self._attrs.get("format"), "path": str(self.path),
                "vocab_size": self.vocab_size, "dim": self.dim, "dtype": self.dtype.name,
                "storage_dtype": self.storage_dtype,
                **{k: v for k, v in self.layout.items() if k != "fast_path"},
                "has_keys": self._has_keys, "nbytes": self.nbytes, "stored_bytes": stored,
                "version": self._version,
                "pending_rows": self._versions.pending_rows(self._v),
                "saved_bytes": max(0, self.nbytes - rows),  # vectors' chunks by compression
                **({"ngrams": self.subwords.info()} if self.subwords is not None else {}),
                "attributes": {k: v for k, v in self._attrs.items() if k not in (
                    "format", "dim", "dtype", "chunk_rows", "shard_rows", "compression",
                    "has_keys", "table_id")}, "table_id": self._attrs.get("table_id")}

    # -- reads ------------------------------------------------------------------------------
    def lookup(self, ids, out: Any = None) -> np.ndarray:  # out: an array, a CPU tensor
        self._check_open()
        ids = as_ids(ids, self.vocab_size, row_bytes=0 if out is not None else self._row_bytes)
        given, out = out, None if out is None else self._check_out(out, ids.shape)
        src = self._source  # once: a refresh() in another thread swaps it
        with memory_refused(ids.shape + (self.dim,), self.dtype):  # not NumPy's MemoryError
            rows = self._cache.gather(ids.reshape(-1), None if out is None else out.reshape(
                -1, self.dim), src.gather, src.take, src)  # (src's rows only: never mixed)
        return rows.reshape(ids.shape + (self.dim,)) if out is None else given

    def raw(self, ids) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Rows ``ids`` (any shape) as stored, for computing on the codes: ``(codes, scale,
        offset)`` with ``codes`` of shape ``ids.shape + (dim,)``.  int8: int8 codes and the
        float32 ``scale`` and ``offset`` of each row (shape ``ids.shape``; a row is
        ``codes * scale[..., None] + offset[..., None]``); bfloat16: the uint16 bit patterns
        (``ml_dtypes.bfloat16`` views them), None, None; float tables: the rows, None, None."""
        ids = as_ids(ids, self.vocab_size)
        self._check_open()
        codes, scale, offset = self._source.raw(ids.reshape(-1))
        shaped = (lambda a: None if a is None else a.reshape(ids.shape))  # noqa: E731
        return codes.reshape(ids.shape + (self.dim,)), shaped(scale), shaped(offset)

    def _gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        self._check_open()
        src = self._source
        self._cache.gather(ids, out, src.gather, None, src)

    @property
    def row_source(self):
        """The :class:`~embstore.store.source.RowSource` rows are read from (scans)."""
        self._check_open()
        src = self._source
        return plain(src.rows if isinstance(src, NormsSource) else src)

    @property
    def norms_source(self):
        """The source of the rows' stored norms (``(V, 1)``), None if the table has none."""
        self._check_open()
        src = self._source
        return plain(src.norms) if isinstance(src, NormsSource) else None

    def _read_rows(self, start: int, stop: int) -> np.ndarray:  # scans bypass the row cache
        self._check_open()
        return self._source.read(start, max(start, stop))

    def warm(self, ids) -> int:
        """Load rows ``ids`` into the row cache and hold them (:meth:`Table.warm`: ranked
        by count; traffic, cached LRU in the other slots, never evicts them; the next
        ``warm`` releases them, a write or ``cache_clear`` drops them).  Returns the rows
        held: 0 without a row cache (``cache_bytes=0``, or ``"auto"`` on an uncompressed
        local table)."""
        self._check_open()
        ids = as_ids(ids, self.vocab_size).reshape(-1)
        src = self._source
        return self._cache.warm(ids, src.gather, owner=src)

    @property
    def subwords(self) -> Subwords | None:
        """The n-gram matrix of a fastText model (``lookup_keys(..., oov="subword")``), or
        None (tables of other sources)."""
        self._check_open()
        v = self._v
        info = v.attrs.get("subwords")
        if info is None:
            return None
        with self._lock:
            if v.subwords is None:
                v.subwords = self._versions.open_ngrams(v, info, self.dim, self.mode)
                if v.pin is not None:
                    setattr(v.subwords, "_pin", v.pin)
            return v.subwords

    def _drop_subwords(self) -> None:
        sub, self._v.subwords = self._v.subwords, None
        if sub is not None:
            sub.close()

    # -- keys -------------------------------------------------------------------------------
    def _vocab(self) -> DiskVocab | MemoryKeyIndex | SegmentedVocab | None:
        v = self._v  # (one version's keys, whatever a refresh does meanwhile)
        if not v.has_keys or (self._closed and v.vocab is None):
            return None if not v.has_keys else v.vocab
        if v.vocab is None:
            with self._lock:
                if v.vocab is None:
                    rows = v.source.shape[0]
                    vocab = self._versions.open_vocab(v, self.writable)  # (its key deltas)
                    if vocab is None or len(vocab) != rows:
                        raise CorruptStoreError(
                            f"{self.path}: expected {rows} keys (has_keys), got "
                            f"{'no keys array' if vocab is None else len(vocab)}",
                            path=str(self.path))
                    if v.pin is not None:  # (read from the pinned version's files)
                        setattr(vocab, "_pin", v.pin)
                    v.vocab = vocab
        return v.vocab

    # -- writes: commits of the table's versions where it lives (self._versions) -------------
    def write(self, ids, vectors) -> None:
        """Overwrite rows ``ids`` (any shape) with ``vectors``; rows other writers appended
        since this handle loaded the table count as rows (it catches up first)."""
        try:
            super().write(ids, vectors)
        except InvalidIdError:
            if not self.writable or not self._versions.moved_on():
                raise
            with self._lock:
                self._reload()
            super().write(ids, vectors)

    def _write_rows(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._check_open()
        if ids.size > 1 and not (ids[1:] > ids[:-1]).all():  # (sorted, unique: as given;
            uniq, last = np.unique(ids[::-1], return_index=True)  # a trainer's write-backs)
            ids, vectors = uniq, vectors[::-1][last]  # the last write of an id wins
        self._versions.write(self._handle, ids, vectors)

    def write_blocks(self, ids: np.ndarray, rows_at) -> None:
        """Rows ``ids`` (1-D int64, sorted, unique, in range) set to ``rows_at(pos)`` (the
        vectors of ``ids[pos]``, ``pos`` ascending positions, a few MiB of rows at a
        time): one commit, as :meth:`write`, without ever holding all the vectors (a
        trainer's flush of its row cache)."""
        self._check_writable()
        self._check_open()
        ids = as_ids(ids, self.vocab_size).reshape(-1)
        if ids.size > 1 and not (ids[1:] > ids[:-1]).all():
            raise InvalidOptionError("write_blocks: ids must be sorted and unique")
        self._versions.write_blocks(self._handle, ids, lambda pos: self._check_vectors(
            rows_at(pos), (pos.size,), "write_blocks"))

    def _append_rows(self, vectors: np.ndarray, keys: list[str] | None) -> int:
        """Returns the id of the first new row (rows other writers appended come first)."""
        return self._versions.append(self._handle, vectors, keys)

    def compact_if_due(self, dense: bool = False) -> int | None:
        """Compact (:meth:`compact`) if the deltas are past COMPACT_FRACTION of the rows or
        COMPACT_BYTES, whatever ``compaction`` says (a trainer's checkpoint: its
        write-backs defer compaction); returns the new version, or None.  ``dense``: only
        the chunks dense in pending rows are rewritten, the scattered rows staying in one
        delta file of the same commit (a trainer's checkpoint)."""
        return self._versions.compact_if_due(self._handle, dense)

    def compact(self) -> int:
        """Fold the rows written since the last compaction into the table's chunks: one
        commit, a new version without deltas (earlier versions keep theirs; no row of any
        version changes).  Then every Zarr reader sees the newest rows (on object storage:
        a new base table in the commit area; Zarr readers of the URL keep the upload).
        Returns the version this handle reads afterwards."""
        if not self.writable:
            raise ReadOnlyError(f"{self.path}: compact needs the table opened with mode='r+'")
        return self._versions.compact(self._handle)

    def vacuum(self, keep: int | None = None, cutoff: float | None = None) -> list[int]:
        """Remove the versions past the retention setting (``keep`` newest; versions open
        readers hold are kept).  Returns the versions removed.  On object storage (no
        leases) ``cutoff``: only objects older than that many seconds go (default 3,600),
        so a commit in flight or a reader of a version just past ``keep`` keeps its own."""
        if not self.writable:
            raise ReadOnlyError(f"{self.path}: vacuum needs the table opened with mode='r+'")
        return self._versions.vacuum(self._handle, keep, cutoff)

    # -- versions: the one the handle reads, swapped in one assignment ----------------------
    def _reload(self) -> None:
        self._adopt(self._versions.open(self._v))

    def _adopt(self, v: Version) -> None:
        """Read version ``v`` from now on (the old one's files stay readable: threads still
        reading it finish, and it goes with them; a table without versions closes it)."""
        old = self._v
        self._drop_subwords()
        self._v, self.version = v, v.number
        if not old.versioned and old is not v:
            old.source.close()
            if old.objects is not None:
                old.objects.close()
            if old.vocab is not None:
                old.vocab.close()
        self._cache.resize_for(self.vocab_size)
        self._cache.bind(self._source)  # (the old version's rows dropped, in one step)
        if self._versions.needs_key_index(v):
            self._vocab()  # keys written by another tool: store their index now

    def refresh(self) -> None:
        """Move to the newest version (row count, rows, keys): until then a handle reads
        the version it opened, whatever other processes commit.  Safe while other threads
        look rows up on this handle (they see the old version or the new one)."""
        if self._want_version is not None:
            return  # pinned to the version asked for
        with self._lock:
            self._check_open()
            if not self._versions.is_current(self._v):  # (nothing new: the row cache
                self._reload()  # stays warm)

    # -- housekeeping -----------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:  # statistics stay readable after close()
        return self._cache.info()

    def cache_clear(self) -> None:
        self._cache.clear()

    def close(self) -> None:
        if self._closed:
            return
        with self._lock:
            self._closed = True
            v = self._v
            v.release()  # (threads still reading keep the pin, not the lease)
            v.source.close()
            if v.objects is not None:  # (a table on object storage: its client, its keys)
                v.objects.close()
            self._drop_subwords()
            self._cache.clear(keep_stats=True)
            if v.vocab is not None:
                v.vocab.close(final=True)

    def __reduce__(self):
        """Pickled as its path (rows never travel): the copy opens the table again,
        read-only, with the same cache budget and at the version this handle reads (worker
        processes of a job read what its driver reads, whatever commits meanwhile)."""
        pinned = self._want_version or (self._version or None)  # workers read this version
        return (open, (str(self.path), "r", self.cache_info().capacity_bytes, None, pinned))

    def __repr__(self) -> str:
        stored = "" if self.storage_dtype == self.dtype.name else \
            f", storage_dtype={self.storage_dtype}"
        return (f"ZarrTable({str(self.path)!r}, mode={self.mode!r}, vocab_size="
                f"{self.vocab_size}, dim={self.dim}, dtype={self.dtype}{stored})")


# -- module functions ---------------------------------------------------------------------
def open(path: PathLike, mode: OpenMode = "r",  # noqa: A001
         cache_bytes: Bytes = "auto", lock_timeout: float | None = None,
         version: int | None = None, **remote: Any) -> ZarrTable:
    """Open the table at ``path`` (``mode`` ``"r"`` or ``"r+"``) with a row cache of
    ``cache_bytes``: an int or a string like ``"256MiB"``, 0 for none; ``"auto"`` (default):
    none for uncompressed local tables (the page cache holds their rows), 256 MiB otherwise.

    Writes take the table's writer lock, one writer at a time across processes and
    handles; a write waits up to ``lock_timeout`` seconds (default 300) for another one,
    then raises :class:`~embstore.errors.LockTimeoutError`.  Readers never wait for it.

    ``path`` may be a URL (``s3://bucket/t.emb``, ``gs://``, ``az://``, ``http(s)://``), read
    only, with ``storage_options`` (endpoint, region, credentials; default: the AWS variables),
    ``cache_dir`` (a disk cache shared by processes), ``cache_dir_bytes`` (its budget, default
    ``"4GiB"``), ``request_latency``, ``request_bandwidth``, ``max_request_bytes`` (costs.py).

    ``version``: read that earlier version of a format-2 table (read only, while it is
    retained; ``embstore log`` lists them); default the newest.  A handle reads the version
    it opened until :meth:`~ZarrTable.refresh`."""
    return ZarrTable(path, mode=mode, cache_bytes=cache_bytes, lock_timeout=lock_timeout,
                     version=version, **remote)

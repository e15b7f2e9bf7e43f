"""The on-disk backend's table: :class:`ZarrTable` and ``open`` (``create``/``save`` are in
:mod:`embstore.store.build`, :class:`~embstore.store.writer.TableWriter` in
:mod:`embstore.store.writer`, ``verify`` in :mod:`embstore.store.verify`).

Rows are read through a row source (:mod:`embstore.store.source`: format-1 shards, format-2
rows, or zarr-python for layouts embstore does not know; docs/FORMAT.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from .._types import Bytes, OpenMode, PathLike
from ..cache.rows import CacheInfo, parse_bytes
from ..cache.null import make_cache
from ..errors import (CorruptStoreError, InvalidIdError, InvalidOptionError, InvalidTypeError,
                      ReadOnlyError)
from ..fs.beside import sweep_beside
from .commit import last_commit, recover, settle
from .lock import writer_lock
from ..fs.forksafe import renew_after_fork
from ..ids import as_ids, memory_refused
from ..keys.foreign import MemoryKeyIndex
from ..keys.index import DiskVocab, has_key_index
from ..keys.mapped import read_array_meta
from ..keys.segments import SegmentedVocab
from .subword.ngrams import Subwords
from .remote.objstore import is_url
from .remote.open import open_remote_ngrams, open_remote_source
from .norms.source import NormsSource
from ..table import Table
from .versions import handle as history
from .versions.delta import Overlays
from .versions.keydelta import key_entries, open_vocab
from .versions.retain import vacuum

__all__ = ["ZarrTable", "open"]


DEFAULT_CACHE = "256MiB"  # the row cache of tables whose reads are not cheap


class ZarrTable(Table):
    """A table stored as a sharded Zarr v3 group (format v1).  Use :func:`open`.

    Rows come from a :class:`~embstore.store.source.RowSource` (the shard fast path, or
    zarr-python for layouts it does not know) through a row cache (a
    :class:`~embstore.cache.null.NullCache` when ``cache_bytes=0``).
    """

    _appends_check_keys = True  # (versions.handle.append_rows, under the writer lock)

    def __init__(self, path: PathLike, *, mode: OpenMode = "r", cache_bytes: Bytes = "auto",
                 lock_timeout: float | None = None, version: int | None = None, **remote: Any):
        if mode not in ("r", "r+"):
            raise InvalidOptionError(f"mode must be 'r' or 'r+', got {mode!r}")
        self._want_version = history.check_version(version, mode, is_url(path))
        self._version = 0  # tables without versions (format 1) read as version 0
        self._root: Any = None  # the directory rows are read from (a version's snapshot)
        self._overlays: Overlays | None = None
        self._pin: Any = None  # the version's directory held open, and its lease
        self._remote = remote if is_url(path) else None  # (storage_options, cache_dir, ...)
        if remote and self._remote is None:
            raise InvalidTypeError(f"{', '.join(remote)}: options of tables on object storage "
                            f"(URLs), not of the local path {path!r}")
        self.path: Any = os.fspath(path).rstrip("/") if self._remote is not None else Path(
            os.fspath(path)).absolute()  # (a str for a URL, a Path on disk)
        self._vocab_obj: DiskVocab | MemoryKeyIndex | SegmentedVocab | None = None
        self._seen_commit: str | None = None
        self._subwords: Subwords | None = None  # opened on first use
        self.mode = mode
        self.lock_timeout = lock_timeout  # seconds a write waits for another writer
        self._lock = threading.RLock()  # writers, vocab opening, refresh
        renew_after_fork(self, "_lock")
        self._closed = False
        self._in_write = False  # this handle holds the writer lock (inside _writing)
        root = None if self._remote is not None else Path(self.path)
        if mode == "r+" and root is not None and root.is_dir():
            with writer_lock(root, lock_timeout):  # finish or clear interrupted writes
                recover(root, deep=True)
            sweep_beside(root)  # and temporary tables of killed saves/imports
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
            cheap = self._source.cheap_reads and self._remote is None
            return 0 if cheap else parse_bytes(DEFAULT_CACHE)
        return parse_bytes(cache_bytes)

    def _load_meta(self) -> None:
        if self._remote is not None:
            self._seen_commit = None
            self._attrs, self._source, self._objects = open_remote_source(
                self.path, self.mode, **self._remote)
            self._has_keys = bool(self._attrs.get("has_keys"))
            self._vocab_obj = None
            self._versioned = False
            return
        if self.path.is_dir():
            settle(self.path, self.lock_timeout)  # no commit half applied
        history.open_version(self)
        if self._has_keys:
            self._check_key_count()
            if self.mode == "r+" and not has_key_index(self._root):
                self._vocab()  # keys written by another tool: store their index now

    def _check_key_count(self) -> None:
        """Keys must cover every row (more keys: an append in flight, they are capped)."""
        shape = read_array_meta(self._root, "keys").get("shape")
        if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int
                and shape[0] >= self.vocab_size):
            raise CorruptStoreError(f"{self.path}/keys: expected {self.vocab_size} keys (one "
                                    f"per row), got shape {shape!r}", path=str(self.path))

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
        return self._remote is not None

    @property
    def layout(self) -> dict:
        """``chunk_rows``, ``shard_rows`` and ``compression`` of ``vectors`` (None if unknown)."""
        return self._source.layout

    def info(self) -> dict:
        """What ``embstore info --json`` prints."""
        self._check_open()
        if self._remote is not None:
            stored = sum(size for _, size in self._objects.client.list())
        else:  # every file once (versions share files: hard links)
            stored = history.stored_bytes(self.path)
        return {"format": self._attrs.get("format"), "path": str(self.path),
                "vocab_size": self.vocab_size, "dim": self.dim, "dtype": self.dtype.name,
                "storage_dtype": self.storage_dtype,
                **{k: v for k, v in self.layout.items() if k != "fast_path"},
                "has_keys": self._has_keys, "nbytes": self.nbytes, "stored_bytes": stored,
                "version": self._version,
                "pending_rows": 0 if self._overlays is None else self._overlays.pending_rows,
                "saved_bytes": max(0, self.nbytes - stored),  # by compression; never < 0
                **({"ngrams": self.subwords.info()} if self.subwords is not None else {}),
                "attributes": {k: v for k, v in self._attrs.items() if k not in (
                    "format", "dim", "dtype", "chunk_rows", "shard_rows", "compression",
                    "has_keys")}}

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
        return history.plain(src.rows if isinstance(src, NormsSource) else src)

    @property
    def norms_source(self):
        """The source of the rows' stored norms (``(V, 1)``), None if the table has none."""
        self._check_open()
        src = self._source
        return history.plain(src.norms) if isinstance(src, NormsSource) else None

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
        info = self._attrs.get("subwords")
        if info is None:
            return None
        with self._lock:
            if self._subwords is None:
                self._subwords = (Subwords(self._root, info, self.dim, self.mode)
                                  if self._remote is None else
                                  open_remote_ngrams(self._objects, info, self.dim))
                if self._pin is not None:
                    setattr(self._subwords, "_pin", self._pin)
            return self._subwords

    def _drop_subwords(self) -> None:
        sub, self._subwords = self._subwords, None
        if sub is not None:
            sub.close()

    # -- keys -------------------------------------------------------------------------------
    def _vocab(self) -> DiskVocab | MemoryKeyIndex | SegmentedVocab | None:
        if not self._has_keys or (self._closed and self._vocab_obj is None):
            return None if not self._has_keys else self._vocab_obj
        if self._vocab_obj is None:
            with self._lock:
                if self._vocab_obj is None:
                    # rows: keys past the committed row count belong to an append in flight;
                    # writable: keys another tool wrote get their index stored, a write to
                    # the table: under the writer lock (unless this call holds it)
                    if self._remote is not None:
                        vocab = self._objects.vocab(self.vocab_size)
                    else:
                        with (writer_lock(self.path, self.lock_timeout)
                              if self.writable and not self._in_write else nullcontext()):
                            vocab = open_vocab(  # (format 2: with the key deltas, V6)
                                self._root, self.vocab_size, key_entries(self._overlays),
                                writable=self.writable,
                                settle=lambda: settle(self.path, self.lock_timeout))
                    if vocab is None or len(vocab) != self.vocab_size:
                        raise CorruptStoreError(
                            f"{self.path}: expected {self.vocab_size} keys (has_keys), got "
                            f"{'no keys array' if vocab is None else len(vocab)}",
                            path=str(self.path))
                    if self._pin is not None:  # (read from the pinned version's files)
                        setattr(vocab, "_pin", self._pin)
                    self._vocab_obj = vocab
        return self._vocab_obj

    # -- writes -----------------------------------------------------------------------------
    @contextmanager
    def _writing(self) -> Iterator[None]:
        """The writer lock, interrupted writes finished or cleared, and this handle's view
        brought up to date if another handle or process committed since (never write over
        newer rows)."""
        with self._lock, writer_lock(self.path, self.lock_timeout):
            self._check_open()
            recover(self.path)
            if last_commit(self.path) != self._seen_commit:
                self._reload()
            self._in_write = True
            try:
                yield
            finally:
                self._in_write = False

    def write(self, ids, vectors) -> None:
        """Overwrite rows ``ids`` (any shape) with ``vectors``; rows other writers appended
        since this handle loaded the table count as rows (it catches up first)."""
        try:
            super().write(ids, vectors)
        except InvalidIdError:
            if not self.writable or last_commit(self.path) == self._seen_commit:
                raise
            with self._lock:
                self._reload()
            super().write(ids, vectors)

    def _write_rows(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._check_open()
        history.write_rows(self, ids, vectors)

    def _append_rows(self, vectors: np.ndarray, keys: list[str] | None) -> int:
        """Returns the id of the first new row (rows other writers appended come first)."""
        return history.append_rows(self, vectors, keys)

    def compact(self) -> int:
        """Fold the rows written since the last compaction into the table's chunks: one
        commit, a new version without deltas (earlier versions keep theirs; no row of any
        version changes).  Then every Zarr reader sees the newest rows.  Returns the version
        this handle reads afterwards."""
        if not self.writable:
            raise ReadOnlyError(f"{self.path}: compact needs the table opened with mode='r+'")
        with self._writing():
            v = history.compact_locked(self)
            vacuum(self.path)
            return v

    def vacuum(self, keep: int | None = None) -> list[int]:
        """Remove the versions past the retention setting (``keep`` newest; versions open
        readers hold are kept).  Returns the versions removed."""
        if not self.writable:
            raise ReadOnlyError(f"{self.path}: vacuum needs the table opened with mode='r+'")
        with self._writing():
            return vacuum(self.path, keep)

    def _reload(self) -> None:
        old_source, old_vocab = self._source, self._vocab_obj
        self._drop_subwords()
        self._load_meta()
        if not self._versioned:  # (a version's files stay readable: threads still reading
            old_source.close()   # the old one finish, and it goes with them)
            if old_vocab is not None:
                old_vocab.close()
        self._cache.resize_for(self.vocab_size)
        self._cache.bind(self._source)  # (the old version's rows dropped, in one step)

    def refresh(self) -> None:
        """Move to the newest version (row count, rows, keys): until then a handle reads
        the version it opened, whatever other processes commit.  Safe while other threads
        look rows up on this handle (they see the old version or the new one)."""
        if self._want_version is not None:
            return  # pinned to the version asked for
        with self._lock:
            self._check_open()
            if not history.is_current(self):  # (nothing new: the row cache stays warm)
                self._reload()

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
            if self._pin is not None:  # (threads still reading keep the pin, not the lease)
                self._pin.release()
            self._source.close()
            self._drop_subwords()
            self._cache.clear(keep_stats=True)
            if self._vocab_obj is not None:
                self._vocab_obj.close(final=True)

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
    only, with ``storage_options`` (endpoint, region, credentials; default: the standard
    AWS environment variables), ``cache_dir`` (an on-disk chunk cache shared by processes)
    and ``cache_dir_bytes`` (its budget, default ``"4GiB"``).

    ``version``: read that earlier version of a format-2 table (read only, while it is
    retained; ``embstore log`` lists them); default the newest.  A handle reads the version
    it opened until :meth:`~ZarrTable.refresh`."""
    return ZarrTable(path, mode=mode, cache_bytes=cache_bytes, lock_timeout=lock_timeout,
                     version=version, **remote)

"""The on-disk backend's table: :class:`ZarrTable` and ``open`` (``create``/``save`` are in
:mod:`embstore.store.build`, :class:`~embstore.store.writer.TableWriter` in
:mod:`embstore.store.writer`, ``verify`` in :mod:`embstore.store.verify`).

Rows are read through a row source (:mod:`embstore.store.source`: format-1 shards, format-2
rows, or zarr-python for layouts embstore does not know; docs/FORMAT.md).
"""

from __future__ import annotations

import logging
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
from ..fs.copytree import disk_usage
from .versions.commit import last_commit, recover, settle
from .place.lock import writer_lock
from ..fs.forksafe import renew_after_fork
from ..ids import as_ids, memory_refused
from ..keys.foreign import MemoryKeyIndex
from ..keys.index import DiskVocab, has_key_index
from ..keys.mapped import read_array_meta
from ..keys.segments import SegmentedVocab
from .subword.ngrams import Subwords
from .place.objstore import is_url
from .remote.open import open_remote_ngrams
from .objects.manifest import DeltaCache
from .objects.source import ObjectVersionSource
from .objects.compact import compact_objects
from .objects.version import commit_rows, object_vocab, open_version, vacuum_objects
from .norms.source import NormsSource
from ..table import Table
from ..ids import refuse_existing
from .versions.commit import Transaction
from .versions.keydelta import (KEYS, encoded_new_keys, fold_keys, key_entries, open_vocab,
                                stage_keys)
from .versions.retain import vacuum
from .versions.version import Version, check_version, plain

__all__ = ["ZarrTable", "open", "COMPACT_FRACTION", "COMPACT_BYTES"]

_log = logging.getLogger("embstore")

DEFAULT_CACHE = "256MiB"  # the row cache of tables whose reads are not cheap
#: a write leaving more rows than this share of the table in deltas compacts them (or
#: more bytes than COMPACT_BYTES), in its own commit: lookups overlay deltas; every reader
#: holds 16 bytes a pending row (the rows stay in the mapped delta files).  A handle whose
#: ``compaction`` is "deferred" (a trainer's) only merges delta files (MAX_DELTA_FILES):
#: it folds when told (``compact_if_due()``, ``compact()``).
COMPACT_FRACTION = 0.05
COMPACT_BYTES = 128 << 20
#: more delta files than this in a version (many small writes) are merged into one per array
MAX_DELTA_FILES = 32
#: key deltas (appends) are folded into the key index past this many files or this share
#: of the table's rows
MAX_KEY_DELTAS = 8
KEYS_FRACTION = 0.5


class ZarrTable(Table):
    """A table stored as a Zarr v3 group (docs/FORMAT.md).  Use :func:`open`.

    The handle reads one :class:`~embstore.store.versions.version.Version` (``_v``: its
    directory, row source, attributes, key index) and swaps it for another in one
    assignment.  Rows come from the version's :class:`~embstore.store.base.RowSource`
    through a row cache (a :class:`~embstore.cache.null.NullCache` when
    ``cache_bytes=0``).  Writes commit versions (:mod:`embstore.store.versions.commit`).
    One class: reads, writes and the versions they make share its lock and its state.
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
        self._want_version = check_version(version, mode, is_url(path))
        self._v: Version  # (set by _load_meta)
        self._remote = remote if is_url(path) else None  # (storage_options, cache_dir, ...)
        if remote and self._remote is None:
            raise InvalidTypeError(f"{', '.join(remote)}: options of tables on object storage "
                            f"(URLs), not of the local path {path!r}")
        self.path: Any = os.fspath(path).rstrip("/") if self._remote is not None else Path(
            os.fspath(path)).absolute()  # (a str for a URL, a Path on disk)
        self._seen_commit: str | None = None  # the last commit this handle knows of
        self._deltas = DeltaCache()  # (object storage: the deltas this handle has read)
        self.mode = mode
        self.lock_timeout = lock_timeout  # seconds a write waits for another writer
        self._lock = threading.RLock()  # writers, vocab opening, refresh
        renew_after_fork(self, "_lock")
        self._closed = False
        self._in_write = False  # this handle holds the writer lock (inside _writing)
        #: when a write folds the deltas into the chunks (in its own commit): "auto" past
        #: COMPACT_FRACTION or COMPACT_BYTES; "deferred" (a trainer's write-backs) never
        #: (delta files are merged past MAX_DELTA_FILES)
        self.compaction = "auto"
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
        if self._remote is not None:  # (one manifest, then immutable objects: §11a)
            self._v = open_version(self.path, self._want_version, self._remote, self._deltas,
                                   getattr(self, "_v", None))
            self._seen_commit = self._v.commit
            self.version = self._v.number
            return
        if self.path.is_dir():
            settle(self.path, self.lock_timeout)  # no commit half applied
        old = getattr(self, "_v", None)
        v = Version.open(self.path, self._want_version, self.mode,
                         0 if old is None else old.number)
        self._v = v  # one step: threads sharing the handle see the old state or the new
        self._seen_commit = v.commit
        self.version = v.number  # (Table.version: what the handle reads)
        if v.has_keys:
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
            objects = self._v.objects.client.list()
            stored = sum(size for _, size in objects)
            rows = sum(size for name, size in objects if name.startswith("vectors/c/"))
        else:  # as du counts: every file once (versions share files: hard links), holes free
            stored = disk_usage(self.path)
            rows = disk_usage(self.path / "vectors", skip=(".embstore",))  # vectors' chunks
        return {"format": self._attrs.get("format"), "path": str(self.path),
                "vocab_size": self.vocab_size, "dim": self.dim, "dtype": self.dtype.name,
                "storage_dtype": self.storage_dtype,
                **{k: v for k, v in self.layout.items() if k != "fast_path"},
                "has_keys": self._has_keys, "nbytes": self.nbytes, "stored_bytes": stored,
                "version": self._version,
                "pending_rows": (self._source.pending_rows if isinstance(
                    self._source, ObjectVersionSource) else 0 if self._overlays is None
                    else self._overlays.pending_rows),
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
                v.subwords = (Subwords(v.root, info, self.dim, self.mode)
                              if self._remote is None else
                              open_remote_ngrams(v.objects, info, self.dim))
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
                    # rows: keys past the committed row count belong to an append in flight;
                    # writable: keys another tool wrote get their index stored, a write to
                    # the table: under the writer lock (unless this call holds it)
                    rows = v.source.shape[0]
                    if self._remote is not None:  # (with its key deltas)
                        vocab = object_vocab(v, self._deltas)
                    else:
                        with (writer_lock(self.path, self.lock_timeout)
                              if self.writable and not self._in_write else nullcontext()):
                            vocab = open_vocab(  # (with the version's key deltas)
                                v.root, rows, key_entries(v.overlays), writable=self.writable,
                                settle=lambda: settle(self.path, self.lock_timeout))
                    if vocab is None or len(vocab) != rows:
                        raise CorruptStoreError(
                            f"{self.path}: expected {rows} keys (has_keys), got "
                            f"{'no keys array' if vocab is None else len(vocab)}",
                            path=str(self.path))
                    if v.pin is not None:  # (read from the pinned version's files)
                        setattr(vocab, "_pin", v.pin)
                    v.vocab = vocab
        return v.vocab

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
            if not self.writable or self._remote is not None or \
                    last_commit(self.path) == self._seen_commit:
                raise
            with self._lock:
                self._reload()
            super().write(ids, vectors)

    def _write_rows(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self._check_open()
        uniq, last = np.unique(ids[::-1], return_index=True)  # the last write of an id wins
        vals = vectors[::-1][last]
        if self._remote is not None:
            self._commit_objects("write", uniq, vals)
            return
        with self._writing():
            how = self._fold_plan(uniq.size, 0, 0)
            txn = self._transaction({"kind": "write", "rows": int(uniq.size),
                                     **({"folded": how} if how else {})},
                                    clear_deltas=how is not None)
            try:
                with self._folding(how, txn):
                    self._source.write(uniq, vals, txn)  # (a delta of each row array)
            except BaseException:
                txn.abort()
                raise
            self._commit(txn)
            self._cache.invalidate(uniq)
            self._after_version()

    def _append_rows(self, vectors: np.ndarray, keys: list[str] | None) -> int:
        """Returns the id of the first new row (rows other writers appended come first)."""
        if self._remote is not None:
            return self._commit_objects("append", None, vectors, keys)
        with self._writing():
            n0, n = self.vocab_size, vectors.shape[0]
            if n == 0:
                return n0
            vocab = self._vocab() if keys is not None else None
            if vocab is not None and not isinstance(vocab, (DiskVocab, SegmentedVocab)):
                raise ReadOnlyError(f"{self.path}: appending keys needs embstore's key index "
                                    "(this table's keys were written by another tool)")
            if vocab is not None:  # under the lock: another writer may have added them
                assert keys is not None
                enc, h = encoded_new_keys(vocab, keys, n0)
                refuse_existing(vocab.probe_hashed(enc, h), keys)
            how = self._fold_plan(0, 0 if keys is None else n, n)
            how = "delta" if how is not None else None  # (key deltas fold into the index;
            # row deltas are rewritten as one file each: the append writes the last chunk)
            txn = self._transaction({"kind": "append", "rows": int(n), "keys": keys is not None,
                                     **({"folded": how} if how else {})},
                                    clear_deltas=how is not None)
            try:
                self._source.append(vectors, txn)
                if vocab is not None and how is not None and isinstance(
                        vocab, (DiskVocab, SegmentedVocab)):
                    assert keys is not None  # the key index grown whole, the deltas' keys too
                    self._stage_keys_folded(vocab, keys, n0, txn)
                elif vocab is not None:
                    assert keys is not None
                    stage_keys(vocab, keys, n0, txn, enc, h)  # (a key delta)
                with self._folding(how, txn):
                    pass  # (the pending rows of every array: one delta file each)
                    if not self._versioned and isinstance(vocab, DiskVocab):  # (a version:
                        txn.after(lambda: vocab.committed(n0 + n))  # reopened)
                self._source.publish_rows(n0 + n, txn)  # vectors/zarr.json last
            except BaseException:
                txn.abort()
                raise
            self._commit(txn)
            self._cache.resize_for(n0 + n)
            self._after_version()
            return n0

    def _commit_objects(self, kind: str, ids, values: np.ndarray, keys=None) -> int:
        """A commit to the table on object storage (docs/FORMAT.md §11a): the handle moves
        to the version it made (on top of the commits it rebased onto)."""
        with self._lock:
            self._check_open()
            if values.shape[0] == 0:
                return self.vocab_size
            vocab = self._vocab() if keys is not None else None
            v, first = commit_rows(self._v, kind, ids, values, keys, self._deltas, vocab)
            self._v, self._seen_commit, self.version = v, v.commit, v.number
            self._cache.resize_for(self.vocab_size)
            self._cache.bind(self._source)  # (rows other writers committed: dropped too)
            return first

    def _transaction(self, change: dict, *, clear_deltas: bool = False) -> Transaction:
        """A commit of this handle's table, described by ``change`` in its version's
        manifest; ``clear_deltas``: the new version has none (a compaction, a merge)."""
        txn = Transaction(self.path, versioned=self._versioned or clear_deltas)
        txn.change, txn.clear_deltas = change, clear_deltas
        return txn

    def _commit(self, txn: Transaction) -> None:
        try:
            txn.commit()
        except BaseException:
            self._seen_commit = None  # this view may be half updated: reload on next write
            raise
        finally:
            txn.abort()  # removes what an uncommitted transaction staged; never raises
        self._seen_commit = txn.id

    def _after_version(self) -> None:
        """After a commit that made a version: the handle moves to it, versions past the
        retention setting removed (the writer lock is held).  The commit happened: a
        failure here (a full disk) is logged, not raised."""
        if not self._versioned:
            return
        self._reload()
        try:
            vacuum(self.path)
        except OSError as exc:
            _log.warning("%s: committed; the clean-up after it failed (%s): the next write "
                         "or `embstore vacuum` does it", self.path, exc)

    def _fold_plan(self, rows: int, keys: int, appended: int) -> str | None:
        """How a commit writing ``rows`` rows as deltas (and ``keys`` keys as a key delta,
        ``appended`` rows) treats the pending deltas, so that every commit is one version:
        ``"chunks"``, the commit is also the compaction (deltas past COMPACT_FRACTION of
        the rows or COMPACT_BYTES, key deltas past MAX_KEY_DELTAS files or KEYS_FRACTION
        of the rows); ``"delta"``, one delta file per array in place of more than
        MAX_DELTA_FILES; None, a delta file of its own (the lock is held)."""
        ov = self._overlays
        if not self._versioned or ov is None:
            return None
        n = max(1, self.vocab_size + appended)
        pending = ov.pending_rows + rows
        too_big = self.compaction != "deferred" and self._past_threshold(rows, n, True)
        entries = key_entries(ov)
        if keys and (len(entries) + 1 > MAX_KEY_DELTAS
                     or self._pending_keys() + keys > KEYS_FRACTION * n):
            too_big = True
        if too_big and (pending or entries or keys):
            return "chunks"
        return "delta" if len(ov.entries) + 1 > MAX_DELTA_FILES else None

    def _past_threshold(self, rows: int, n: int, fraction: bool) -> bool:
        """Whether ``rows`` more rows in deltas pass COMPACT_BYTES (or, ``fraction``,
        COMPACT_FRACTION of ``n`` rows)."""
        ov = self._overlays
        if ov is None:
            return False
        row_bytes = 8 + self.dim * self.dtype.itemsize
        return (ov.pending_bytes + rows * row_bytes > COMPACT_BYTES
                or (fraction and ov.pending_rows + rows > COMPACT_FRACTION * n))

    def compact_if_due(self) -> int | None:
        """Compact (:meth:`compact`) if the deltas are past COMPACT_FRACTION of the rows or
        COMPACT_BYTES, whatever ``compaction`` says (a trainer's checkpoint: its
        write-backs defer compaction); returns the new version, or None."""
        with self._writing():
            if not self._past_threshold(0, max(1, self.vocab_size), True):
                return None
            v = self._compact_locked()
            vacuum(self.path)
            return v

    def _pending_keys(self) -> int:
        vocab = self._vocab() if key_entries(self._overlays) else None
        return len(vocab) - len(vocab.base) if isinstance(vocab, SegmentedVocab) else 0

    @contextmanager
    def _folding(self, how: str | None, txn: Transaction) -> Iterator[None]:
        """Around a commit's writes: with ``how`` (:meth:`_fold_plan`), each row array's
        write merges its pending rows in; then the arrays it did not write fold theirs
        (into the chunks, or one delta file each), and key deltas are folded into the key
        index (unless an append did)."""
        ov = self._overlays
        if how is None or ov is None:
            yield
            return
        for o in ov.made:  # a loop per row array (vectors, row_scale, norms)
            o.combine = how
        try:
            yield
            for o in ov.made:
                o.fold(txn, how)
            if "keys_folded" not in txn.change:
                txn.change["keys"] = fold_keys(self._vocab() if key_entries(ov) else None,
                                               txn)
        finally:
            for o in ov.made:
                o.combine = None

    def _stage_keys_folded(self, vocab: DiskVocab | SegmentedVocab, keys: list[str],
                           n0: int, txn: Transaction) -> None:
        """An append's keys written into the key index with those of the key deltas (one
        commit that is also the keys' compaction: no key delta)."""
        base = vocab.base if isinstance(vocab, SegmentedVocab) else vocab
        pending = vocab.keys_between(len(base), n0) if len(base) < n0 else []
        tree = txn.tree(KEYS)
        for name, live in base.stage_append(pending + list(keys), tree):  # a loop per file
            txn.adopt(tree / name, live)
        txn.change["keys_folded"] = len(pending) + len(keys)

    def _compact_locked(self) -> int:
        """Fold every delta into the chunks: one commit (the writer lock is held)."""
        ov = self._overlays
        keyed = bool(key_entries(ov))
        if ov is None or not (keyed or any(o.ids.size for o in ov.made)):
            return self._version
        txn = self._transaction({"kind": "compact", "rows": ov.pending_rows},
                                clear_deltas=True)
        try:
            for o in ov.made:  # a loop per row array (vectors, row_scale, norms)
                o.fold(txn)
            txn.change["keys"] = fold_keys(self._vocab() if keyed else None, txn)
        except BaseException:
            txn.abort()
            raise
        self._commit(txn)
        self._reload()
        return self._version

    def compact(self) -> int:
        """Fold the rows written since the last compaction into the table's chunks: one
        commit, a new version without deltas (earlier versions keep theirs; no row of any
        version changes).  Then every Zarr reader sees the newest rows (on object storage:
        a new base table in the commit area; Zarr readers of the URL keep the upload).
        Returns the version this handle reads afterwards."""
        if not self.writable:
            raise ReadOnlyError(f"{self.path}: compact needs the table opened with mode='r+'")
        if self._remote is not None:
            with self._lock:
                for _ in range(3):  # (lost to a compaction or an append of keys: again)
                    self._reload()  # the newest version
                    vocab = self._vocab() if self._has_keys else None
                    if compact_objects(self._v, self._deltas, self.path,
                                       self._remote.get("storage_options"),
                                       None if vocab is None else vocab.keys_between):
                        break
                self._reload()
                return self._version
        with self._writing():
            v = self._compact_locked()
            vacuum(self.path)
            return v

    def vacuum(self, keep: int | None = None, cutoff: float | None = None) -> list[int]:
        """Remove the versions past the retention setting (``keep`` newest; versions open
        readers hold are kept).  Returns the versions removed.  On object storage (no
        leases) ``cutoff``: only objects older than that many seconds go (default 3,600),
        so a commit in flight or a reader of a version just past ``keep`` keeps its own."""
        if not self.writable:
            raise ReadOnlyError(f"{self.path}: vacuum needs the table opened with mode='r+'")
        if self._remote is not None:
            with self._lock:
                src = self._source
                assert isinstance(src, ObjectVersionSource)
                setting = self._attrs.get("retain_versions")  # (the table's, as locally)
                return vacuum_objects(src.client, keep if keep is not None or type(
                    setting) is not int else setting, cutoff)
        if cutoff is not None:
            raise InvalidOptionError(f"cutoff={cutoff!r}: an option of tables on object "
                                     "storage (local versions are held by readers' leases)")
        with self._writing():
            return vacuum(self.path, keep)

    def _reload(self) -> None:
        old = self._v
        self._drop_subwords()
        self._load_meta()
        if not self._versioned:  # (a version's files stay readable: threads still reading
            old.source.close()   # the old one finish, and it goes with them)
            if old.objects is not None:
                old.objects.close()
            if old.vocab is not None:
                old.vocab.close()
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
            if self._remote is not None or not self._v.is_current(self.path):  # (nothing
                self._reload()  # new: the row cache stays warm)

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

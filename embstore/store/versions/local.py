"""The versions of a table in a local folder (docs/FORMAT.md §6-9): :class:`LocalVersions`
opens them and commits a table handle's writes, appends, compactions and vacuums.

A commit: the writer lock (:mod:`embstore.store.place.lock`), interrupted commits finished
or cleared (:func:`~.commit.recover`), the handle caught up if another process committed
since it last looked, one :class:`~.commit.Transaction` (rows as deltas, the journal
rename its commit point), then the handle adopts the version it made and versions past
the retention setting go (:mod:`.retain`).  Deltas fold into the chunks in the commit
that passes COMPACT_FRACTION or COMPACT_BYTES, so every commit is one version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError, InvalidOptionError, ReadOnlyError
from ...fs.beside import sweep_beside
from ...fs.copytree import disk_usage
from ...ids import refuse_existing
from ...keys.index import DiskVocab, has_key_index
from ...keys.mapped import read_array_meta
from ...keys.segments import SegmentedVocab
from ..base import Handle
from ..place.lock import writer_lock
from ..source import ShardSource
from ..subword.ngrams import NGRAMS, Subwords
from .commit import Transaction, last_commit, recover, settle
from .keydelta import (KEYS, encoded_new_keys, fold_keys, key_entries, open_vocab,
                       stage_keys)
from .retain import vacuum
from .version import Version

__all__ = ["LocalVersions", "COMPACT_FRACTION", "COMPACT_BYTES", "MAX_DELTA_FILES",
           "MAX_KEY_DELTAS", "KEYS_FRACTION"]

_log = logging.getLogger("embstore")

#: a write leaving more rows than this share of the table in deltas compacts them (or
#: more bytes than COMPACT_BYTES), in its own commit: lookups overlay deltas; every reader
#: holds 16 bytes a pending row (the rows stay in the mapped delta files).  A handle whose
#: ``compaction`` is "deferred" (a trainer's) only merges delta files (MAX_DELTA_FILES):
#: it folds when told (``compact_if_due()``, ``compact()``); "dense" (a trainer's
#: checkpoint) folds only the units dense in pending rows.
COMPACT_FRACTION = 0.05
COMPACT_BYTES = 128 << 20
#: more delta files than this in a version (many small writes) are merged into one per array
MAX_DELTA_FILES = 32
#: key deltas (appends) are folded into the key index past this many files or this share
#: of the table's rows
MAX_KEY_DELTAS = 8
KEYS_FRACTION = 0.5


class LocalVersions:
    """The versions of the table in the folder ``path``, for one handle (``mode``,
    ``want``: the version asked for, None the newest; ``lock_timeout``: seconds a commit
    waits for another writer).  It knows the last commit the handle saw, so a commit never
    writes over rows it has not seen."""

    remote = False

    def __init__(self, path: Path, mode: str, want: int | None, lock_timeout: float | None):
        self.path, self.mode, self.want, self.lock_timeout = path, mode, want, lock_timeout
        self.seen_commit: str | None = None  # the last commit the handle knows of
        self.in_write = False  # the handle holds the writer lock (inside writing())
        if mode == "r+" and path.is_dir():
            with writer_lock(path, lock_timeout):  # finish or clear interrupted writes
                recover(path, deep=True)
            sweep_beside(path)  # and temporary tables of killed saves/imports

    # -- reading ----------------------------------------------------------------------------
    def open(self, old: Version | None) -> Version:
        if self.path.is_dir():
            settle(self.path, self.lock_timeout)  # no commit half applied
        v = Version.open(self.path, self.want, self.mode, 0 if old is None else old.number)
        self.seen_commit = v.commit
        if v.has_keys:
            _check_key_count(self.path, v)
        return v

    def is_current(self, v: Version) -> bool:
        return v.is_current(self.path)

    def moved_on(self) -> bool:
        return last_commit(self.path) != self.seen_commit

    def needs_key_index(self, v: Version) -> bool:
        return v.has_keys and self.mode == "r+" and not has_key_index(v.root)

    def open_vocab(self, v: Version, writable: bool):
        """Keys past the committed row count belong to an append in flight; writable: keys
        another tool wrote get their index stored, a write to the table, under the writer
        lock (unless the handle holds it)."""
        with (writer_lock(self.path, self.lock_timeout) if writable and not self.in_write
              else nullcontext()):
            return open_vocab(v.root, v.source.shape[0], key_entries(v.overlays),
                              writable=writable,
                              settle=lambda: settle(self.path, self.lock_timeout))

    def open_ngrams(self, v: Version, info: dict, dim: int, mode: str) -> Subwords:
        sub = Subwords(v.root, info, dim, mode)
        if isinstance(sub.source, ShardSource) and NGRAMS in v.shard_pins:
            sub.source.pin_shards(v.shard_pins[NGRAMS])  # (the version's, as its rows')
        return sub

    def stored_bytes(self, v: Version) -> tuple[int, int]:
        """As du counts: every file once (versions share files: hard links), holes free."""
        return (disk_usage(self.path),
                disk_usage(self.path / "vectors", skip=(".embstore",)))

    def pending_rows(self, v: Version) -> int:
        return 0 if v.overlays is None else v.overlays.pending_rows

    # -- commits ----------------------------------------------------------------------------
    @contextmanager
    def writing(self, h: Handle) -> Iterator[Version]:
        """The writer lock, interrupted writes finished or cleared, and the handle brought
        up to date if another handle or process committed since (never write over newer
        rows); yields the version the commit builds on."""
        with h.lock, writer_lock(self.path, self.lock_timeout):
            h.check_open()
            recover(self.path)
            if self.moved_on():
                h.reload()
            self.in_write = True
            try:
                yield h.current()
            finally:
                self.in_write = False

    def write(self, h: Handle, ids: np.ndarray, values: np.ndarray) -> None:
        """Rows ``ids`` (sorted, unique) of the table set to ``values``: one commit."""
        self._write(h, ids, lambda src, txn: src.write(ids, values, txn))

    def write_blocks(self, h: Handle, ids: np.ndarray, rows_at) -> None:
        """Rows ``ids`` (sorted, unique) set to ``rows_at(pos)`` (those of ``ids[pos]``,
        asked for a block at a time: a trainer's flush never holds them all): one
        commit."""
        self._write(h, ids, lambda src, txn: src.write_blocks(ids, rows_at, txn))

    def _write(self, h: Handle, ids: np.ndarray, stage) -> None:
        with self.writing(h) as v:
            how = self._fold_plan(h, v, ids.size, 0, 0)
            txn = self._transaction(v, {"kind": "write", "rows": int(ids.size),
                                        **({"folded": how} if how else {})},
                                    clear_deltas=how is not None)
            try:
                with self._folding(h, v, how, txn):
                    stage(v.source, txn)  # (a delta of each row array)
            except BaseException:
                txn.abort()
                raise
            self._commit(txn)
            h.cache().invalidate(ids)
            self._after_version(h, v)

    def append(self, h: Handle, values: np.ndarray, keys: list[str] | None) -> int:
        """Rows ``values`` (and their ``keys``) appended: one commit.  Returns the id of the
        first new row (rows other writers appended come first)."""
        with self.writing(h) as v:
            n0, n = v.source.shape[0], values.shape[0]
            if n == 0:
                return n0
            vocab = h.vocab() if keys is not None else None
            if vocab is not None and not isinstance(vocab, (DiskVocab, SegmentedVocab)):
                raise ReadOnlyError(f"{self.path}: appending keys needs embstore's key index "
                                    "(this table's keys were written by another tool)")
            coded = None
            if vocab is not None:  # under the lock: another writer may have added them
                assert keys is not None
                coded = encoded_new_keys(vocab, keys, n0)
                refuse_existing(vocab.probe_hashed(*coded), keys)
            how = self._fold_plan(h, v, 0, 0 if keys is None else n, n)
            how = "delta" if how is not None else None  # (key deltas fold into the index;
            # row deltas are rewritten as one file each: the append writes the last chunk)
            txn = self._transaction(v, {"kind": "append", "rows": int(n),
                                        "keys": keys is not None,
                                        **({"folded": how} if how else {})},
                                    clear_deltas=how is not None)
            try:
                self._stage_append(h, v, values, keys, vocab, coded, how, txn)
            except BaseException:
                txn.abort()
                raise
            self._commit(txn)
            h.cache().resize_for(n0 + n)
            self._after_version(h, v)
            return n0

    def _stage_append(self, h: Handle, v: Version, values: np.ndarray,
                      keys: list[str] | None, vocab, coded, how: str | None,
                      txn: Transaction) -> None:
        """An append's rows, keys (a key delta, or the key index grown whole with the
        deltas' keys) and row count staged in ``txn``."""
        n0, n = v.source.shape[0], values.shape[0]
        v.source.append(values, txn)
        if vocab is not None and how is not None:
            assert keys is not None  # the key index grown whole, the deltas' keys too
            self._stage_keys_folded(vocab, keys, n0, txn)
        elif vocab is not None:
            assert keys is not None and coded is not None
            stage_keys(vocab, keys, n0, txn, *coded)  # (a key delta)
        with self._folding(h, v, how, txn):
            pass  # (the pending rows of every array: one delta file each)
            if not v.versioned and isinstance(vocab, DiskVocab):  # (a version: reopened)
                txn.after(lambda: vocab.committed(n0 + n))
        v.source.publish_rows(n0 + n, txn)  # vectors/zarr.json last

    def compact(self, h: Handle) -> int:
        """Fold every delta into the chunks: one commit, a version without deltas."""
        with self.writing(h) as v:
            n = self._compact_locked(h, v)
            vacuum(self.path)
            return n

    def compact_if_due(self, h: Handle, dense: bool = False) -> int | None:
        """Compact if the deltas are past COMPACT_FRACTION of the rows or COMPACT_BYTES,
        whatever ``compaction`` says (a trainer's checkpoint); the new version, or None.
        ``dense`` (without key deltas): :meth:`_compact_dense`."""
        with self.writing(h) as v:
            if not _past_threshold(v, 0, max(1, v.source.shape[0]), True):
                return None
            dense = dense and not key_entries(v.overlays)
            n = self._compact_dense(h, v) if dense else self._compact_locked(h, v)
            vacuum(self.path)
            return n

    def _compact_dense(self, h: Handle, v: Version) -> int:
        """Only the chunks dense in pending rows rewritten
        (:meth:`~embstore.store.versions.delta.OverlaySource.fold_dense`: at least 1/8 of a
        chunk's bytes pending, then the densest others until at most half the threshold is
        left), the thinly scattered rows staying in one delta file of the same commit
        (``change``: ``{"kind": "compact", "folded": "dense"}``; the lock is held)."""
        ov = v.overlays
        assert ov is not None
        keep = _dense_keep(v)

        def fold(txn: Transaction) -> None:
            txn.change["rows_folded"] = max(o.fold_dense(txn, keep) for o in ov.made)
        return self._fold_commit(h, v, {"kind": "compact", "folded": "dense",
                                        "rows": ov.pending_rows}, fold)

    def _fold_commit(self, h: Handle, v: Version, change: dict, fold) -> int:
        """One commit without deltas, ``change`` in its manifest, staged by ``fold(txn)``;
        the handle moves to it (the lock is held)."""
        txn = self._transaction(v, change, clear_deltas=True)
        try:
            fold(txn)
        except BaseException:
            txn.abort()
            raise
        self._commit(txn)
        h.reload()
        return h.current().number

    def vacuum(self, h: Handle, keep: int | None, cutoff: float | None) -> list[int]:
        if cutoff is not None:
            raise InvalidOptionError(f"cutoff={cutoff!r}: an option of tables on object "
                                     "storage (local versions are held by readers' leases)")
        with self.writing(h):
            return vacuum(self.path, keep)

    def _transaction(self, v: Version, change: dict, *,
                     clear_deltas: bool = False) -> Transaction:
        """A commit of the table, described by ``change`` in its version's manifest;
        ``clear_deltas``: the new version has none (a compaction, a merge)."""
        txn = Transaction(self.path, versioned=v.versioned or clear_deltas)
        txn.change, txn.clear_deltas = change, clear_deltas
        return txn

    def _commit(self, txn: Transaction) -> None:
        try:
            txn.commit()
        except BaseException:
            self.seen_commit = None  # the handle's view may be half updated: reload next
            raise
        finally:
            txn.abort()  # removes what an uncommitted transaction staged; never raises
        self.seen_commit = txn.id

    def _after_version(self, h: Handle, v: Version) -> None:
        """After a commit that made a version: the handle moves to it, versions past the
        retention setting removed (the writer lock is held).  The commit happened: a
        failure here (a full disk) is logged, not raised."""
        if not v.versioned:
            return
        h.reload()
        try:
            vacuum(self.path)
        except OSError as exc:
            _log.warning("%s: committed; the clean-up after it failed (%s): the next write "
                         "or `embstore vacuum` does it", self.path, exc)

    def _fold_plan(self, h: Handle, v: Version, rows: int, keys: int,
                   appended: int) -> str | None:
        """How a commit writing ``rows`` rows as deltas (and ``keys`` keys as a key delta,
        ``appended`` rows) treats the pending deltas, so that every commit is one version:
        ``"chunks"``, the commit is also the compaction (deltas past COMPACT_FRACTION of
        the rows or COMPACT_BYTES, key deltas past MAX_KEY_DELTAS files or KEYS_FRACTION
        of the rows); ``"dense"``, the same for a handle whose ``compaction`` is "dense"
        (a trainer's checkpoint) but only the units dense in pending rows folded, the rest
        left in one delta file (:meth:`~.delta.OverlaySource.fold_dense`); ``"delta"``, one
        delta file per array in place of more than MAX_DELTA_FILES; None, a delta file of
        its own (the lock is held)."""
        ov = v.overlays
        if not v.versioned or ov is None:
            return None
        n = max(1, v.source.shape[0] + appended)
        pending = ov.pending_rows + rows
        too_big = h.compaction() != "deferred" and _past_threshold(v, rows, n, True)
        entries = key_entries(ov)
        if keys and (len(entries) + 1 > MAX_KEY_DELTAS
                     or _pending_keys(h, v) + keys > KEYS_FRACTION * n):
            too_big = True
        if too_big and (pending or entries or keys):
            dense = h.compaction() == "dense" and not entries and not keys
            return "dense" if dense else "chunks"
        return "delta" if len(ov.entries) + 1 > MAX_DELTA_FILES else None

    @contextmanager
    def _folding(self, h: Handle, v: Version, how: str | None,
                 txn: Transaction) -> Iterator[None]:
        """Around a commit's writes: with ``how`` (:meth:`_fold_plan`), each row array's
        write merges its pending rows in; then the arrays it did not write fold theirs
        (into the chunks, or one delta file each), and key deltas are folded into the key
        index (unless an append did)."""
        ov = v.overlays
        if how is None or ov is None:
            yield
            return
        keep = _dense_keep(v)
        for o in ov.made:  # a loop per row array (vectors, row_scale, norms)
            o.combine, o.keep_rows = how, keep
        try:
            yield
            for o in ov.made:
                o.fold(txn, how)
            if "keys_folded" not in txn.change:
                txn.change["keys"] = fold_keys(h.vocab() if key_entries(ov) else None, txn)
        finally:
            for o in ov.made:
                o.combine = None

    @staticmethod
    def _stage_keys_folded(vocab: DiskVocab | SegmentedVocab, keys: list[str], n0: int,
                           txn: Transaction) -> None:
        """An append's keys written into the key index with those of the key deltas (one
        commit that is also the keys' compaction: no key delta)."""
        base = vocab.base if isinstance(vocab, SegmentedVocab) else vocab
        pending = vocab.keys_between(len(base), n0) if len(base) < n0 else []
        tree = txn.tree(KEYS)
        for name, live in base.stage_append(pending + list(keys), tree):  # a loop per file
            txn.adopt(tree / name, live)
        txn.change["keys_folded"] = len(pending) + len(keys)

    def _compact_locked(self, h: Handle, v: Version) -> int:
        """Fold every delta into the chunks: one commit (the writer lock is held)."""
        ov = v.overlays
        keyed = bool(key_entries(ov))
        if ov is None or not (keyed or any(o.ids.size for o in ov.made)):
            return v.number

        def fold(txn: Transaction) -> None:
            for o in ov.made:  # a loop per row array (vectors, row_scale, norms)
                o.fold(txn)
            txn.change["keys"] = fold_keys(h.vocab() if keyed else None, txn)
        return self._fold_commit(h, v, {"kind": "compact", "rows": ov.pending_rows}, fold)


def _past_threshold(v: Version, rows: int, n: int, fraction: bool) -> bool:
    """Whether ``rows`` more rows in ``v``'s deltas pass COMPACT_BYTES (or, ``fraction``,
    COMPACT_FRACTION of ``n`` rows)."""
    ov = v.overlays
    if ov is None:
        return False
    row_bytes = 8 + v.source.shape[1] * v.source.dtype.itemsize
    return (ov.pending_bytes + rows * row_bytes > COMPACT_BYTES
            or (fraction and ov.pending_rows + rows > COMPACT_FRACTION * n))


def _dense_keep(v: Version) -> int:
    """The rows a dense fold leaves pending at most: half the threshold."""
    n = max(1, v.source.shape[0])
    row_bytes = 8 + v.source.shape[1] * v.source.dtype.itemsize
    return min(int(COMPACT_FRACTION * n) // 2, (COMPACT_BYTES // 2) // row_bytes)


def _pending_keys(h: Handle, v: Version) -> int:
    vocab = h.vocab() if key_entries(v.overlays) else None
    return len(vocab) - len(vocab.base) if isinstance(vocab, SegmentedVocab) else 0


def _check_key_count(path: Path, v: Version) -> None:
    """Keys must cover every row (more keys: an append in flight, they are capped)."""
    shape = read_array_meta(v.root, "keys").get("shape")
    if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int
            and shape[0] >= v.source.shape[0]):
        raise CorruptStoreError(f"{path}/keys: expected {v.source.shape[0]} keys (one "
                                f"per row), got shape {shape!r}", path=str(path))

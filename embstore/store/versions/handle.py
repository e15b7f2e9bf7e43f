"""What a table handle (:class:`~embstore.store.table.ZarrTable`) does with versions: open
one (its snapshot read as a table), commit writes and appends as new versions, follow them,
compact past a threshold, and clean up (docs/FORMAT.md §6-7).  Format-1 tables take the
same paths without versions (their commits replace live files, section 5)."""

from __future__ import annotations

import logging
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import pin_name
from ...errors import CorruptStoreError, InvalidOptionError, ReadOnlyError
from ...ids import refuse_existing
from ...keys.index import DiskVocab
from ...keys.segments import SegmentedVocab
from .commit import Transaction, last_commit
from ..meta import read_table_meta
from ..norms.source import attach_norms
from ..base import RowSource
from ..source import keeps_versions, open_source, same_array
from .delta import Overlays, OverlaySource, write_delta
from .keydelta import encoded_new_keys, fold_keys, key_entries, stage_keys
from .retain import Lease, vacuum
from .snapshot import VersionNotFoundError, list_versions, newest, read_manifest, snapshot_root

#: the handle these functions work for (:class:`~embstore.store.table.ZarrTable`: typed
#: loosely, that module imports this one)
ZarrTable = Any

__all__ = ["open_version", "write_rows", "append_rows", "after_version", "compact_locked",
           "commit", "plain", "stored_bytes", "COMPACT_FRACTION", "COMPACT_BYTES"]

_log = logging.getLogger("embstore")

#: a write leaving more rows than this share of the table in deltas compacts them (or
#: more bytes than COMPACT_BYTES): lookups overlay deltas; every reader holds them in memory
COMPACT_FRACTION = 0.05
COMPACT_BYTES = 128 << 20
#: more delta files than this in a version (many small writes) are merged into one per array
MAX_DELTA_FILES = 32
#: key deltas (appends) are folded into the key index past this many files or this share
#: of the table's rows
MAX_KEY_DELTAS = 8
KEYS_FRACTION = 0.5


def check_version(version, mode: str, remote: bool) -> int | None:
    """The ``version`` argument of ``open``, checked."""
    if version is None:
        return None
    if type(version) is not int or version < 1:
        raise InvalidOptionError(f"version must be a version number (an int >= 1, see "
                                 f"`embstore log`), got {version!r}")
    if mode != "r":
        raise InvalidOptionError(f"version={version}: an earlier version is read only "
                                 "(open it with mode='r')")
    if remote:
        raise InvalidOptionError(f"version={version}: versions of tables on object storage "
                                 "are not read yet (open a local copy)")
    return version


def open_version(t: ZarrTable) -> None:
    """Open the newest version (or the one asked for): its snapshot directory is read
    like a table, so nothing a later commit writes is ever seen."""
    for attempt in range(5):  # (the newest version vacuumed between listing and opening)
        try:
            return _open_version(t)
        except CorruptStoreError:
            if t._want_version is not None or attempt == 4 or \
                    newest(t.path) in (None, t._version):
                raise


def _open_version(t: ZarrTable) -> None:
    seen, sig = last_commit(t.path), _signature(t.path)  # before the metadata: never newer
    n = newest(t.path) if t._want_version is None else t._want_version
    overlays, pin = None, None
    if n is None:  # no version yet: a write still goes to a delta (never over live files
        root, version = t.path, 0  # a reader of them may read), its commit version 1
        if t.mode == "r+":
            overlays = Overlays(root, {"deltas": []}, writable=True)
    else:
        root, version = snapshot_root(t.path, n), n
        if not root.is_dir():
            raise VersionNotFoundError(
                f"{t.path}: no version {n} (the table holds versions "
                f"{list_versions(t.path) or 'none'}; `embstore log` lists them)")
        pin = _Pin(root, t.path, n)  # held open and leased before anything is read
        root = pin.path
        manifest = read_manifest(root)
        seen = manifest.get("txn")
        overlays = Overlays(root, manifest, writable=t.mode == "r+")
    attrs, meta = read_table_meta(root)
    wrap = overlays.wrap if overlays is not None else same_array
    checked = attrs.get("format") == 2  # (every row array checksummed, or damage)
    source = attach_norms(root, open_source(root, meta, t.mode, wrap, checked=checked), wrap)
    # every table's commits make versions (a format-1 table's first commit makes it
    # versioned in place), but not a layout zarr-python writes in place (another tool's)
    versioned = n is not None or keeps_versions(source)
    if not versioned and overlays is not None:  # (its writes: zarr-python's, no deltas)
        source.close()
        overlays, source = None, attach_norms(root, open_source(root, meta, t.mode))
    if pin is not None:
        hold(source, pin)
    has_keys = bool(attrs.get("has_keys", (root / "keys").is_dir()))
    # one step: threads sharing the handle see the old state or the new one (the old
    # one's files stay readable: a version's files never change)
    (t._root, t._version, t._overlays, t._seen_commit, t._attrs, t._source, t._has_keys,
     t._vocab_obj, t._pin) = (root, version, overlays, seen, attrs, source, has_keys, None,
                              pin)
    t.version = version  # (Table.version: what the handle reads)
    t._versioned = versioned
    t._signature = sig if n is None else None  # (no version yet: what refresh compares)


def _signature(path: Path):
    """What a format-1 table looks like from outside: its directory (a table saved over it
    is another directory) and its metadata files, as ``stat`` sees them; None if absent."""
    try:
        return tuple((st.st_ino, st.st_mtime_ns, st.st_size) for st in (
            os.stat(path), os.stat(path / "zarr.json"), os.stat(path / "vectors" / "zarr.json")))
    except OSError:
        return None


def is_current(t: ZarrTable) -> bool:
    """Whether the version a handle reads is still the newest (``refresh`` has nothing to
    do): the same number and the same commit (a table replaced at the same path starts
    its numbers again); format 1: the same last commit and the same directory and
    metadata files as at open (a shard cache and a row cache then stay warm)."""
    if t._remote is not None:
        return False
    if t._version == 0:  # no version yet (format 1, another tool's layout)
        sig = t._signature  # (set by every local open)
        return sig is not None and sig == _signature(t.path) and \
            last_commit(t.path) == t._seen_commit
    n = newest(t.path)
    if n is None or n != t._version:
        return False
    try:
        return read_manifest(snapshot_root(t.path, n)).get("txn") == t._seen_commit
    except (OSError, ValueError):
        return False


def hold(source: RowSource, pin: _Pin) -> None:
    """``source`` and every source it wraps (norms, overlays, int8 scales, the rows) hold
    ``pin``: whichever of them a reader keeps (a scan keeps the rows' source, a gather the
    whole), the version's directory stays open and leased while it reads (a source opens
    chunk files when first read)."""
    todo = [source]
    while todo:  # a loop per wrapped source (a few)
        obj = todo.pop()
        setattr(obj, "_pin", pin)
        todo.extend(v for v in getattr(obj, "__dict__", {}).values()
                    if isinstance(v, RowSource))


class _Pin:
    """A version's snapshot directory held open, read as ``/proc/self/fd/<n>``: files the
    handle opens later come from this directory even if the table is replaced or removed
    under it meanwhile (then: the old files, or a clear error; never the new table's).
    It holds the version's lease too: ``vacuum`` keeps the version while anything in this
    process still reads through the pin (a thread still reading what a ``refresh`` left)."""

    def __init__(self, root: Path, table: Path, n: int):
        self.fd, self.path = None, Path(root)
        self.lease = Lease(table, n)
        if os.path.isdir("/proc/self/fd"):
            try:
                fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) |
                             getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return
            self.fd, self.path = fd, Path(f"/proc/self/fd/{fd}")
            pin_name(str(self.path), str(root))
            weakref.finalize(self, _unpin, fd, str(self.path), os.getpid())

    def release(self) -> None:
        self.lease.release()


def _unpin(fd: int, path: str, pid: int) -> None:
    if pid == os.getpid():
        pin_name(path, None)
        try:
            os.close(fd)
        except OSError:
            pass


def commit(t: ZarrTable, txn: Transaction) -> None:
    try:
        txn.commit()
    except BaseException:
        t._seen_commit = None  # this view may be half updated: reload on next write
        raise
    finally:
        txn.abort()  # removes what an uncommitted transaction staged; never raises
    t._seen_commit = txn.id


def write_rows(t: ZarrTable, ids: np.ndarray, vectors: np.ndarray) -> None:
    uniq, last = np.unique(ids[::-1], return_index=True)  # the last write of an id wins
    vals = vectors[::-1][last]
    with t._writing():
        txn = Transaction(t.path, versioned=t._versioned)
        txn.change = {"kind": "write", "rows": int(uniq.size)}
        try:
            t._source.write(uniq, vals, txn)  # format 2: deltas (V6)
        except BaseException:
            txn.abort()
            raise
        commit(t, txn)
        t._cache.invalidate(uniq)
        after_version(t)


def append_rows(t: ZarrTable, vectors: np.ndarray, keys: list[str] | None) -> int:
    """Returns the id of the first new row (rows other writers appended come first)."""
    with t._writing():
        n0, n = t.vocab_size, vectors.shape[0]
        if n == 0:
            return n0
        vocab = t._vocab() if keys is not None else None
        if vocab is not None and not isinstance(vocab, (DiskVocab, SegmentedVocab)):
            raise ReadOnlyError(f"{t.path}: appending keys needs embstore's key index "
                                "(this table's keys were written by another tool)")
        if vocab is not None:  # under the lock: another writer may have added them
            assert keys is not None
            enc, h = encoded_new_keys(vocab, keys, n0)
            refuse_existing(vocab.probe_hashed(enc, h), keys)
        txn = Transaction(t.path, versioned=t._versioned)
        txn.change = {"kind": "append", "rows": int(n), "keys": keys is not None}
        try:
            t._source.append(vectors, txn)
            if vocab is not None:
                assert keys is not None
                stage_keys(vocab, keys, n0, txn, enc, h)  # format 2: a key delta (V6)
                if not t._versioned and isinstance(vocab, DiskVocab):  # (a version: reopened)
                    txn.after(lambda: vocab.committed(n0 + n))
            t._source.publish_rows(n0 + n, txn)  # vectors/zarr.json last
        except BaseException:
            txn.abort()
            raise
        commit(t, txn)
        t._cache.resize_for(n0 + n)
        after_version(t)
        return n0


def after_version(t: ZarrTable) -> None:
    """After a commit that made a version: the handle moves to it, deltas past the
    threshold are compacted, versions past the retention setting removed (the writer lock
    is held).  The commit happened: a failure here (a full disk) is logged, not raised."""
    if not t._versioned:
        return
    t._reload()
    ov = t._overlays
    try:
        if ov is not None and (ov.pending_rows > COMPACT_FRACTION * max(1, t.vocab_size)
                               or ov.pending_bytes > COMPACT_BYTES or _many_keys(t)):
            compact_locked(t)
        elif ov is not None and len(ov.entries) > MAX_DELTA_FILES:
            merge_deltas(t)
        vacuum(t.path)
    except OSError as exc:
        _log.warning("%s: committed; the compaction or clean-up after it failed (%s): the "
                     "next write or `embstore compact` does it", t.path, exc)


def _many_keys(t: ZarrTable) -> bool:
    """Key deltas past the point where they are folded: more than MAX_KEY_DELTAS files, or
    more keys than KEYS_FRACTION of the index (each lookup probes every segment; every
    reader holds them in memory)."""
    entries = key_entries(t._overlays)
    if not entries:
        return False
    vocab = t._vocab()
    pending = len(vocab) - len(vocab.base) if isinstance(vocab, SegmentedVocab) else 0
    return len(entries) > MAX_KEY_DELTAS or pending > KEYS_FRACTION * max(1, t.vocab_size)


def merge_deltas(t: ZarrTable) -> None:
    """One delta file per row array in place of many (a commit; the rows of every version
    unchanged, no chunk rewritten): what a version's readers load stays a few files."""
    ov = t._overlays
    txn = Transaction(t.path, versioned=True)
    txn.clear_deltas = True
    txn.change = {"kind": "merge deltas", "rows": ov.pending_rows}
    try:
        for o in ov.made:  # a loop per row array
            if o.ids.size:
                write_delta(txn.delta(o.name), o.name, o.ids, o.values)
        fold_keys(t._vocab() if key_entries(ov) else None, txn)  # (the deltas are dropped)
    except BaseException:
        txn.abort()
        raise
    commit(t, txn)
    t._reload()


def compact_locked(t: ZarrTable) -> int:
    """Fold every delta into the chunks: one commit (the writer lock is held)."""
    ov = t._overlays
    keyed = bool(key_entries(ov))
    if ov is None or not (keyed or any(o.ids.size for o in ov.made)):
        return t._version
    txn = Transaction(t.path, versioned=True)
    txn.clear_deltas = True
    txn.change = {"kind": "compact", "rows": ov.pending_rows}
    try:
        for o in ov.made:  # a loop per row array (vectors, row_scale, norms)
            o.fold(txn)
        txn.change["keys"] = fold_keys(t._vocab() if keyed else None, txn)
    except BaseException:
        txn.abort()
        raise
    commit(t, txn)
    t._reload()
    return t._version


def plain(src):
    """A row array's source without its overlay when the overlay holds no rows (scans
    then take the fast paths of the plain layouts)."""
    return src.inner if isinstance(src, OverlaySource) and not src.ids.size else src


def stored_bytes(path) -> int:
    """Bytes stored by the files under ``path``: each file once (versions share files), a
    sparse file by its allocated blocks (the padding of a format-2 chunk is a hole)."""
    seen: dict = {}
    for d, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            seen[(st.st_dev, st.st_ino)] = min(st.st_size, getattr(st, "st_blocks", 1 << 62)
                                               * 512)
    return sum(seen.values())

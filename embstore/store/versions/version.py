"""One version of a table as a handle reads it: :class:`Version` (docs/FORMAT.md §6-7).

A :class:`~embstore.store.table.ZarrTable` holds one ``Version`` and swaps it for another
in one assignment (``refresh``, and after its own commits): the directory its files are
read from (the version's snapshot, held open by a :class:`_Pin` that also holds its lease),
its number, the deltas overlaid on its row arrays, its group attributes, its row source,
and its key index and n-grams, opened on first use.  Threads sharing the handle see the
old value or the new one, never a mix; the old one's files stay readable while anything
still reads them (its pin goes with the last of its sources).
"""

from __future__ import annotations

import os
import weakref
from functools import partial
from pathlib import Path
from typing import Any

from ...errors import CorruptStoreError, InvalidOptionError, pin_name
from ..base import RowSource
from ..meta import read_table_meta
from ..norms.source import attach_norms
from ..source import ShardSource, keeps_versions, open_source, same_array
from .commit import last_commit, settle
from .delta import Overlays, OverlaySource
from .retain import Lease
from .snapshot import (VersionNotFoundError, list_versions, newest, read_manifest,
                       snapshot_root, version_files)
from .pinning import OBJECTS, check_pins, shard_pins

__all__ = ["Version", "check_version", "plain", "stored_bytes"]


def check_version(version, mode: str) -> int | None:
    """The ``version`` argument of ``open``, checked."""
    if version is None:
        return None
    if type(version) is not int or version < 1:
        raise InvalidOptionError(f"version must be a version number (an int >= 1, see "
                                 f"`embstore log`), got {version!r}")
    if mode != "r":
        raise InvalidOptionError(f"version={version}: an earlier version is read only "
                                 "(open it with mode='r')")
    return version


class Version:
    """One version of a table: what a handle reads (see the module doc).

    ``number`` 0: a table without versions yet (written as format 1, or another tool's
    layout: its live files are read); ``versioned``: whether its commits make versions;
    ``commit``: the id of the commit it shows; ``vocab`` and ``subwords`` are opened on
    first use by the handle (under its lock) and belong to this version."""

    def __init__(self, *, root: Any, number: int, source: RowSource, attrs: dict,
                 has_keys: bool, overlays: Overlays | None = None, commit: str | None = None,
                 pin: _Pin | None = None, versioned: bool = False, signature=None,
                 objects: Any = None):
        self.root, self.number, self.source, self.attrs = root, number, source, attrs
        self.has_keys, self.overlays, self.commit, self.pin = has_keys, overlays, commit, pin
        self.versioned, self.signature, self.objects = versioned, signature, objects
        self.vocab: Any = None
        self.subwords: Any = None
        #: ``{array: {shard: tag crc32c}}`` its manifest pins (docs/FORMAT.md §3b), for the
        #: sharded arrays opened later from ``root`` (the n-grams)
        self.shard_pins: dict[str, dict[int, int]] = {}

    @classmethod
    def open(cls, path: Path, want: int | None, mode: str, current: int = 0) -> Version:
        """The newest version of the local table at ``path`` (or version ``want``);
        ``current``: the one the handle reads now (0: none)."""
        for attempt in range(5):  # (the newest version vacuumed between listing and opening)
            try:
                return cls._open(path, want, mode)
            except CorruptStoreError:
                if want is not None or attempt == 4 or newest(path) in (None, current):
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _open(cls, path: Path, want: int | None, mode: str) -> Version:
        seen, sig = last_commit(path), _signature(path)  # before the metadata: never newer
        n = newest(path) if want is None else want
        overlays, pin = None, None
        if n is None:  # no version yet: a write still goes to a delta (never over live
            root = path  # files a reader of them may read), its commit version 1
            if mode == "r+":
                overlays = Overlays(root, {"deltas": []}, writable=True)
        else:
            root = snapshot_root(path, n)
            if not root.is_dir():
                raise VersionNotFoundError(
                    f"{path}: no version {n} (the table holds versions "
                    f"{list_versions(path) or 'none'}; `embstore log` lists them)")
            pin = _Pin(root, path, n)  # held open and leased before anything is read
            root = pin.path
            manifest = read_manifest(root)
            seen = manifest.get("txn")
            _check_named(path, n, manifest, want is None)
            check_pins(path, n, root, manifest, read_manifest, version_files(root))
            overlays = Overlays(root, manifest, writable=mode == "r+")
        attrs, meta = read_table_meta(root)
        if n is not None and manifest.get("rows") != meta["shape"][0]:
            raise CorruptStoreError(f"{path}: version {n}'s manifest says {manifest.get('rows')}"
                                    f" rows, its vectors/zarr.json {meta['shape'][0]}: the "
                                    "version's files are not its own", path=str(path))
        wrap = overlays.wrap if overlays is not None else same_array
        pins = shard_pins(manifest.get(OBJECTS)) if n is not None else {}
        wrap = _pinning(wrap, pins)  # (root: version n's snapshot, whose manifest pins them)
        checked = attrs.get("format") == 2  # (every row array checksummed, or damage)
        ready = partial(settle, root)  # (a reader finding a page changed waits for the commit)
        source = attach_norms(root, open_source(root, meta, mode, wrap, checked=checked,
                                                settle=ready), wrap)
        # every table's commits make versions (a format-1 table's first commit makes it
        # versioned in place), but not a layout zarr-python writes in place (another tool's)
        versioned = n is not None or keeps_versions(source)
        if not versioned and overlays is not None:  # (its writes: zarr-python's, no deltas)
            source.close()
            overlays, source = None, attach_norms(root, open_source(root, meta, mode,
                                                                   settle=ready))
        if pin is not None:
            hold(source, pin)
        v = cls(root=root, number=n or 0, source=source, attrs=attrs,
                has_keys=bool(attrs.get("has_keys", (root / "keys").is_dir())),
                overlays=overlays, commit=seen, pin=pin, versioned=versioned,
                signature=sig if n is None else None)
        v.shard_pins = pins
        return v

    def is_current(self, path: Path) -> bool:
        """Whether this is still the newest version of the local table at ``path``
        (``refresh`` has nothing to do): the same number and the same commit (a table
        replaced at the same path starts its numbers again); without versions: the same
        last commit and the same directory and metadata files as at open."""
        if self.number == 0:
            return self.signature is not None and self.signature == _signature(path) and \
                last_commit(path) == self.commit
        n = newest(path)
        if n is None or n != self.number:
            return False
        try:
            return read_manifest(snapshot_root(path, n)).get("txn") == self.commit
        except (OSError, ValueError):
            return False

    def release(self) -> None:
        """The lease goes (threads still reading keep the pinned directory, not the lease)."""
        if self.pin is not None:
            self.pin.release()


def _pinning(wrap, pins: dict[str, dict[int, int]]):
    """``wrap`` that first gives each sharded row array the tag pins of its shards in the
    manifest of the version it reads (docs/FORMAT.md §3b: a shard of another version or
    table in its place is damage before its rows are read)."""
    if not pins:
        return wrap

    def pinned(name: str, src: RowSource) -> RowSource:
        if name in pins and isinstance(src, ShardSource):
            src.pin_shards(pins[name])
        return wrap(name, src)
    return pinned


def _check_named(path: Path, n: int, manifest: dict, newest_one: bool) -> None:
    """A version directory is what its name says: its manifest states the same number, and
    the newest one is the table's last commit (a removed newest version, or an older one
    copied in its place, is damage; a commit rolling forward meanwhile is waited for)."""
    if manifest.get("embstore_version") != n:
        raise CorruptStoreError(
            f"{path}: versions/{n}/manifest.json says version "
            f"{manifest.get('embstore_version')!r}: the version directory is not what its "
            "name says", path=str(path))
    last = last_commit(path)
    if not newest_one or last is None or last == manifest.get("txn"):
        return
    settle(path)  # (a commit between the listing and now: rolled forward first)
    if newest(path) == n and last_commit(path) not in (None, manifest.get("txn")):
        raise CorruptStoreError(
            f"{path}: the last commit ({last_commit(path)}) is not version {n}'s, the newest "
            "version there (a version directory was removed or replaced)", path=str(path))
    if newest(path) != n:  # (a newer version now: opened again by Version.open)
        raise CorruptStoreError(f"{path}: version {n} is no longer the newest", path=str(path))


def _signature(path: Path):
    """What a table without versions looks like from outside: its directory (a table saved
    over it is another directory) and its metadata files, as ``stat`` sees them; None if
    absent."""
    try:
        return tuple((st.st_ino, st.st_mtime_ns, st.st_size) for st in (
            os.stat(path), os.stat(path / "zarr.json"), os.stat(path / "vectors" / "zarr.json")))
    except OSError:
        return None


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


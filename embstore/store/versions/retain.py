"""Which versions a format-2 table keeps: reader leases, ``vacuum`` and ``log``
(docs/FORMAT.md §7c).

- A reader of a version holds a lease: the empty file
  ``vectors/.embstore/readers/<host>-<pid>-<id>.<N>``, made when a handle opens version N,
  removed when nothing of the process reads it through that handle any more, or by
  ``close()`` (a killed reader's lease is recognised by its process being gone).
- :func:`vacuum` (under the writer lock) removes every version but the newest
  ``retain_versions`` (default :data:`RETAIN_VERSIONS`, or the group attribute
  ``embstore.retain_versions``) and those a lease holds: a lease of a live process of this
  host, or one of another host younger than :data:`LEASE_SECONDS`.  Removing a version
  removes its snapshot directory (hard links only): the bytes of a file go with its last
  link.  Every commit ends with one.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
import weakref
from pathlib import Path

from ...fs.files import create_new, real_dir
from .commit import retire_version
from .snapshot import list_versions, read_manifest, snapshot_root, versions_dir

__all__ = ["Lease", "vacuum", "version_log", "RETAIN_VERSIONS", "LEASE_SECONDS",
           "retained"]

RETAIN_VERSIONS = 8  # versions kept by default (the newest among them)
LEASE_SECONDS = 3600.0  # a lease of another host counts this long after it was taken
READERS = "readers"
_HOST = socket.gethostname().replace("-", "_").replace(".", "_")[:64] or "host"


def _readers(root: Path) -> Path:
    return versions_dir(root).parent / READERS


def _drop(path: str | None, pid: int | None = None) -> None:
    """Remove a lease (in the process that took it: a forked child's exit must not drop its
    parent's lease)."""
    if path is not None and (pid is None or pid == os.getpid()):
        try:
            os.remove(path)
        except OSError:
            pass


class Lease:
    """The lease of one version, held by the pinned directory of every handle's source of
    it (nothing at all where the table's directory is not writable: such readers are not
    seen by ``vacuum``, which the docs say); dropped by ``release`` or when collected."""

    def __init__(self, root: Path, version: int):
        self.root = Path(root)
        self.id = uuid.uuid4().hex[:12]
        self.pid = os.getpid()
        self.path: str | None = str(_readers(self.root) /
                                    f"{_HOST}-{self.pid}-{self.id}.{int(version)}")
        try:
            real_dir(self.root, ("vectors", ".embstore", READERS), create=True)  # (no link)
            os.close(create_new(self.path))
        except OSError:  # (CorruptStoreError too: a link in its place: no lease)
            self.path = None  # a read-only table (or a full disk): no lease
        # (only the process that took it drops it: a forked child's exit must not)
        self._finalizer: weakref.finalize | None = (
            weakref.finalize(self, _drop, self.path, self.pid) if self.path else None)

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.path = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leased(root: Path, *, now: float | None = None, sweep: bool = False) -> set[int]:
    """Versions held by a reader's lease (``sweep``: leases of dead processes removed)."""
    now = time.time() if now is None else now
    out: set[int] = set()
    try:
        entries = list(os.scandir(_readers(root)))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for e in entries:  # a loop per open reader
        try:
            who, _, n = e.name.rpartition(".")
            host, pid, _ = who.rsplit("-", 2)
            version, pid_n = int(n), int(pid)
        except ValueError:
            continue
        if host == _HOST:
            live = _alive(pid_n)
        else:
            try:
                live = now - e.stat(follow_symlinks=False).st_mtime < LEASE_SECONDS
            except OSError:
                live = False
        if live:
            out.add(version)
        elif sweep:
            _drop(e.path)
    return out


def _retain_setting(root: Path) -> int:
    try:
        doc = json.loads((Path(root) / "zarr.json").read_text("utf-8"))
        v = doc["attributes"]["embstore"].get("retain_versions", RETAIN_VERSIONS)
        return max(1, int(v))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return RETAIN_VERSIONS


def retained(root: Path, keep: int | None = None) -> tuple[list[int], list[int]]:
    """``(kept, removable)`` versions of the table at ``root`` under ``keep`` (default: its
    retention setting) and the readers' leases."""
    versions = list_versions(root)
    keep = _retain_setting(root) if keep is None else max(1, int(keep))
    held = leased(root, sweep=True)
    kept = [v for i, v in enumerate(versions) if i >= len(versions) - keep or v in held]
    return kept, [v for v in versions if v not in set(kept)]


def vacuum(root: Path, keep: int | None = None) -> list[int]:
    """Remove the versions :func:`retained` does not keep (call it with the writer lock
    held); returns the versions removed."""
    _, removable = retained(root, keep)
    for v in removable:  # a loop per version removed
        retire_version(root, v)
    return removable


def version_log(root: Path) -> list[dict]:
    """One entry per retained version, oldest first: ``version``, ``time``, ``rows``,
    ``change``, ``deltas`` (rows pending compaction, per array)."""
    out = []
    for v in list_versions(root):
        try:
            m = read_manifest(snapshot_root(root, v))
        except OSError:
            continue  # removed meanwhile
        out.append({"version": v, "time": m.get("time"), "rows": m.get("rows"),
                    "change": m.get("change", {}), "deltas": len(m["deltas"])})
    return out

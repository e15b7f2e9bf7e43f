"""An on-disk cache of a remote table's stored chunks and shard indexes.

``cache_dir=`` of :func:`embstore.open` on a URL.  Entries are files holding the stored
bytes exactly as fetched (chunk bytes with their crc32c; a shard's index tail with its
crc32c and the object's size), so a damaged cache file is caught by the same checks as a
damaged object, and is then dropped and fetched again.

Keys: ``<table>/<version>/<shard object>/<offset>-<nbytes>`` (format 1: a stored chunk;
format 2: ``<chunk object>/<start>-<stop>``, a byte range of a chunk file as one request
fetched it, its pages checked against their crc32c on every read) where ``table`` is a hash of
the table's URL and ``version`` a hash of its two ``zarr.json`` documents (fetched at every
open).  A remote table is written whole and its group ``zarr.json`` last, with a fresh
``write_id``: a rewritten table has a new version, so nothing stale is served.

Several processes may share one directory: entries are written to a temporary file and
renamed into place (a reader sees a whole entry or none), a vanished entry is a miss, and
eviction (oldest first, by modification time, which a hit refreshes) runs when the bytes
this process added since its last scan pass a tenth of the budget.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
import time
import uuid

import numpy as np

from ...fs.atomic import replace

__all__ = ["ChunkCache"]


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class ChunkCache:
    """Files under ``root`` for one table version; ``budget`` bytes in all (every table)."""

    def __init__(self, root, url: str, version: str, budget: int):
        self.root = os.path.abspath(os.fspath(root))
        self.dir = os.path.join(self.root, _h(url), version)
        self.budget = int(budget)
        self._added = 0
        self._lock = threading.Lock()
        os.makedirs(self.dir, exist_ok=True)

    def _path(self, obj: str, name: str) -> str:
        return os.path.join(self.dir, obj.replace("/", "_"), name)

    def get(self, obj: str, name: str) -> bytes | None:
        path = self._path(obj, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:  # absent, or evicted by another process meanwhile
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return data

    def ranges(self, obj: str) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, stops)`` of the cached byte ranges of ``obj`` (entries named
        ``<start>-<stop>``), sorted by start."""
        try:
            names = os.listdir(os.path.dirname(self._path(obj, "x")))
        except OSError:
            names = []
        got = []
        for n in names:  # a loop per entry of one object
            a, sep, b = n.partition("-")
            if sep and a.isdigit() and b.isdigit():
                got.append((int(a), int(b)))
        arr = np.array(sorted(got), dtype=np.int64).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def map(self, obj: str, name: str) -> mmap.mmap | None:
        """The entry mapped read-only (None if absent or empty); a hit, as :meth:`get`."""
        path = self._path(obj, name)
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return None
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # absent, or evicted by another process meanwhile
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        return mm

    def put(self, obj: str, name: str, data) -> None:
        path = self._path(obj, name)
        if os.path.exists(path):
            return
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            replace(tmp, path)
        except OSError:  # a full or read-only disk makes the cache a no-op, never an error
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        with self._lock:
            self._added += len(data)
            scan = self._added > self.budget // 10
            if scan:
                self._added = 0
        if scan:
            self.evict()

    def drop(self, obj: str, name: str) -> None:
        try:
            os.unlink(self._path(obj, name))
        except OSError:
            pass

    def evict(self) -> None:
        """Remove the least recently used entries until the cache is under 90% of its budget."""
        entries, total = [], 0
        now = time.time()
        for d, _, files in os.walk(self.root):
            for name in files:
                p = os.path.join(d, name)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                if name.endswith(".tmp"):  # a writer killed mid-entry, an hour ago
                    if now - st.st_mtime > 3600:
                        self._unlink(p)
                    continue
                entries.append((st.st_mtime, st.st_size, p))
                total += st.st_size
        if total <= self.budget:
            return
        entries.sort()
        target = self.budget * 9 // 10
        for _, size, p in entries:
            if total <= target:
                break
            self._unlink(p)
            total -= size

    @staticmethod
    def _unlink(p: str) -> None:
        try:
            os.unlink(p)
        except OSError:
            pass

"""A table in a local directory: :class:`LocalDir`.

Objects are the files under the table's folder, read with ``pread`` and, for the layouts'
fast paths, memory-mapped (:attr:`~embstore.store.place.base.Place.maps_files`: the row
arrays' chunk files side by side in one reserved range, :mod:`embstore.store.shard.arena`;
shard files one mapping each).  A request here costs a system call, not a round trip: the
cost model reads a gap through when it is shorter than what the disk moves in the time of
one more call.  Commits (the journal, the writer lock, recovery, version leases) are local
to this place too: :mod:`embstore.store.versions`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import CorruptStoreError
from ...fs.files import open_regular
from ..meta import read_json
from .base import Place
from .costs import CostModel

__all__ = ["LocalDir", "LOCAL_COSTS"]

#: a system call (about 20 us with its page-cache lookups) against 2 GB/s of copying
LOCAL_COSTS = CostModel(latency_s=20e-6, bandwidth_Bps=2e9, max_request_bytes=64 << 20)


def _pread_all(fd: int, n: int, at: int) -> bytes:
    parts, done = [], 0
    while done < n:  # a loop per system call (one, but for signals)
        b = os.pread(fd, n - done, at + done)
        if not b:
            break
        parts.append(b)
        done += len(b)
    return b"".join(parts)


class LocalDir(Place):
    """The files of the table at ``root`` (a folder, or a version's snapshot in it)."""

    maps_files = True
    costs = LOCAL_COSTS

    def __init__(self, root, settle: Callable[[], None] | None = None):
        self.root = Path(root)
        self.url = str(self.root)
        self._settle = settle

    def settle(self) -> None:
        """Wait until no commit of the table is half applied (the commit protocol's hook,
        :func:`embstore.store.versions.commit.settle`, given by who opened the place): a
        reader that finds a page changed under it looks again once the commit is whole."""
        if self._settle is not None:
            self._settle()

    def where(self, rel: str = "") -> str:
        return str(self.root / rel) if rel else str(self.root)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def _open(self, rel: str) -> int | None:
        try:
            return open_regular(self.path(rel), shown=self.where(rel))
        except FileNotFoundError:
            return None

    def get(self, rel: str, limit: int | None = None) -> bytes | None:
        fd = self._open(rel)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            if limit is not None and size > limit:
                raise CorruptStoreError(f"{self.where(rel)}: {size} bytes, more than the "
                                        f"{limit} expected", path=self.where(rel))
            return _pread_all(fd, size, 0)
        finally:
            os.close(fd)

    def exists(self, rel: str) -> bool:
        return os.path.isfile(self.path(rel))

    present = exists

    list_past = 0  # (a folder is one directory walk, whatever it holds)

    def names(self, rel: str) -> list[str]:
        top = self.path(rel)
        out: list[str] = []
        for folder, _, files in os.walk(top):  # a loop per directory
            base = os.path.relpath(folder, top)
            out += files if base == "." else [f"{base}/{f}".replace(os.sep, "/") for f in files]
        return out

    def get_json(self, rel: str, what: str) -> dict:
        return read_json(Path(self.path(rel)), what)

    def size(self, rel: str) -> int | None:
        fd = self._open(rel)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def read_into(self, rel: str, at: int, buf) -> int:
        fd = self._open(rel)
        if fd is None:
            return 0
        try:
            done = 0
            while done < buf.size:  # a loop per system call (one, but for signals)
                n = os.preadv(fd, [buf[done:].data], at + done)
                if n <= 0:
                    break
                done += n
            return done
        finally:
            os.close(fd)

    def will_read(self, rel: str, start: int, stop: int) -> None:
        # cold: the reads all in flight at once (0.2 ms warm; A/B, 1M x 256, pages evicted:
        # verify 0.58-0.83 s against 0.74-1.28 s without, a dd of the files 0.67-0.90 s)
        fd = self._open(rel)
        if fd is not None and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, start, stop - start, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
        elif fd is not None:
            os.close(fd)

    def get_range(self, rel: str, start: int, stop: int) -> Any:
        fd = self._open(rel)
        if fd is None:
            raise CorruptStoreError(f"{self.where(rel)}: missing", path=self.where(rel))
        try:
            return _pread_all(fd, max(0, stop - start), start)
        finally:
            os.close(fd)

    def get_tail(self, rel: str, n: int) -> tuple[Any, int] | None:
        fd = self._open(rel)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            return _pread_all(fd, min(n, size), max(0, size - n)), size
        finally:
            os.close(fd)

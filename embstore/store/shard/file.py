"""One shard file as the fast path reads it: its index (one pread of the tail), a read-only
memory map that keeps no descriptor, and which chunks passed their crc32c (see docs/FORMAT.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from ...fs.checksum import as_bytes_array, crc32c, value as crc_value

from . import prefetch
from ...errors import CorruptStoreError, ResourceLimitError
from ...fs.files import map_file, open_regular
from ..codecs import ABSENT, Layout, check_chunk
from .tag import find_tag, tag_len, tagged

__all__ = ["ShardFile", "crcs", "parse_index"]


def parse_index(tail, size: int, layout: Layout, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, nbytes)`` of a shard's chunks (offset -1: absent) from the ``tail`` of
    the shard (its index, and the index's crc32c), ``size`` bytes long, checked: the
    crc32c, every chunk inside the data bytes and, uncompressed, of the one size they all
    have (docs/FORMAT.md)."""
    n = layout.n_inner
    index_len = 16 * n + (4 if layout.index_crc else 0)
    buf = memoryview(tail).cast("B")
    if size < index_len or len(buf) != index_len:
        raise CorruptStoreError(f"shard {where}: {size} bytes, shorter than its "
                                f"{index_len}-byte index (truncated?)", path=where)
    body = buf[: 16 * n]
    if layout.index_crc and crc32c(body) != int.from_bytes(buf[16 * n:], "little"):
        raise CorruptStoreError(f"shard {where}: the shard index fails its crc32c "
                                "(damaged or truncated)", path=where)
    index = np.frombuffer(body, dtype="<u8").reshape(n, 2)
    present = index[:, 0] != ABSENT
    data_len = size - index_len
    bad = present & ((index[:, 0] > data_len) | (index[:, 1] > data_len - np.minimum(
        index[:, 0], data_len)))
    want = layout.chunk_bytes + (4 if layout.has_crc else 0)
    if layout.compression == "none":
        bad |= present & (index[:, 1].astype(np.int64) != want)
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptStoreError(
            f"shard {where}, chunk {i}: index says offset {int(index[i, 0])}, "
            f"{int(index[i, 1])} bytes, outside the {data_len} data bytes or not the {want} "
            "expected", path=where)
    return (np.where(present, index[:, 0].astype(np.int64), -1),
            np.where(present, index[:, 1].astype(np.int64), 0))


class ShardFile:
    """One shard as read: its index, memory map, and which chunks passed their crc32c."""

    def __init__(self, path: str, layout: Layout, root: str | None = None,
                 pin: int | None = None):
        self.path = path  # root: the table's directory, which the file must not leave
        n = layout.n_inner
        #: the crc32c each chunk must end in, as the shard's tag records (:mod:`.tag`:
        #: checked against ``pin``, the tag crc32c the version's manifest records), or None
        self.expect: np.ndarray | None = None
        #: ``decode_check(payload, where)`` raises CorruptStoreError if a stored chunk does
        #: not decode (set by a reader of a compressed layout): a re-checksummed chunk
        #: that does not decode keeps that message, more precise than its tag's mismatch
        self.decode_check: Callable[[Any, str], None] | None = None
        self.mm: np.ndarray | None = None
        self.rowview: np.ndarray | None = None
        self.scan_rows: np.ndarray | None = None  # every row, one-row chunks back to back (embstore.store.scan)
        self.offsets = np.broadcast_to(np.int64(-1), (n,))  # until the index is read
        self.nbytes = np.broadcast_to(np.int64(0), (n,))
        self.verified = np.zeros(n, dtype=bool)
        self.all_verified = False
        self.ident: tuple[int, int] | None = None
        self._whole: tuple[int, bool] | None = None  # back_to_back of the whole shard
        # size, index and map all from one open file: a writer may rename a new shard into
        # place at any moment, and the size of one file with the bytes of another is garbage.
        # The mapping keeps no descriptor (a table of 10,000 shards under ulimit -n 1024).
        fd = self._open(root)
        if fd is None:
            self.all_verified = True  # an absent shard: every chunk is the fill value
            return
        try:
            size, tail, mm = self._read_tail(fd, layout)
        finally:
            os.close(fd)
        index_len = 16 * n + (4 if layout.index_crc else 0)
        data_len = size - index_len
        # the index first (its damage keeps its own message), then the tag it must match
        present, self.offsets, self.nbytes = self._parse_index(tail[len(tail) - index_len:],
                                                               data_len, layout)
        self.expect = find_tag(tail, index_len, self.offsets, self.nbytes, data_len, layout,
                               pin, path)
        self._map(mm, size, data_len, present, layout)

    def _open(self, root: str | None) -> int | None:
        """A descriptor of the shard file (never through a FIFO or a symbolic link out of
        ``root``); None for a shard never written (a table removed meanwhile is an error)."""
        path = self.path
        try:
            return open_regular(path, root=root)
        except FileNotFoundError:
            if root is not None and not os.path.lexists(os.path.join(root, "vectors",
                                                                     "zarr.json")):
                raise CorruptStoreError(  # never the fill value for a table that is gone
                    f"shard {path}: the table was removed under this reader (reopen it)",
                    path=path) from None
            return None
        except (CorruptStoreError, ResourceLimitError):  # a FIFO, a symlink out, no fds
            raise
        except OSError as exc:  # unreadable, ...
            raise CorruptStoreError(f"shard {path}: cannot open ({exc.strerror or exc})",
                                    path=path) from None

    def _read_tail(self, fd: int, layout: Layout) -> tuple[int, bytes, np.ndarray]:
        """``(size, tail bytes, map)`` of the open file ``fd``: its index (and crc), and the
        bytes of a shard tag before it, read from its tail with one pread, the whole file
        mapped read-only."""
        path = self.path
        st = os.fstat(fd)
        size, self.ident = st.st_size, (st.st_dev, st.st_ino)
        index_len = 16 * layout.n_inner + (4 if layout.index_crc else 0)
        if size < index_len:
            raise CorruptStoreError(
                f"shard {path}: {size} bytes, shorter than its {index_len}-byte index "
                "(truncated?)", path=path)
        # the index with one read (a fault on the map would read ahead megabytes around
        # it, or with MADV_RANDOM fault its pages in one at a time)
        want = min(size, index_len + (tag_len(layout.n_inner) if tagged(layout) else 0))
        tail = os.pread(fd, want, size - want)
        if len(tail) != want:
            raise CorruptStoreError(f"shard {path}: index truncated while reading",
                                    path=path)
        return size, tail, map_file(fd, size, f"shard {path}")

    def _parse_index(self, tail: bytes, data_len: int, layout: Layout
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(present, offsets, nbytes)`` of every inner chunk (:func:`parse_index`;
        uncompressed chunks all of one size, 8 bytes a chunk less)."""
        off, nb = parse_index(tail, data_len + len(tail), layout, self.path)
        present = off >= 0
        if layout.compression == "none":
            want = layout.chunk_bytes + (4 if layout.has_crc else 0)
            nb = np.broadcast_to(np.int64(want), (layout.n_inner,))
        return present, off, nb

    def _map(self, mm: np.ndarray, size: int, data_len: int, present: np.ndarray,
             layout: Layout) -> None:
        """Keep the map ``mm`` of the file (advised random access; a strided view of its
        rows if uncompressed); absent chunks need no check, and none do without crcs."""
        self.mm = mm
        self.buf = memoryview(mm).cast("B")  # type: ignore[arg-type]  # slicing a memoryview is cheap, a memmap's is not
        self.addr = mm.ctypes.data if size else 0
        prefetch.advise_random(self.addr, size)  # see embstore/store/shard/prefetch.py
        self.all_verified = not layout.has_crc
        self.verified[~present] = True
        rb = layout.row_bytes
        if layout.compression == "none" and data_len >= rb:
            self.rowview = np.ndarray(shape=(data_len - rb + 1,), dtype=np.dtype((np.void, rb)),
                                      buffer=mm, offset=0, strides=(1,))

    def back_to_back(self, c0: int, c1: int, step: int) -> bool:
        """Whether inner chunks ``c0..c1-1`` are all present and stored back to back,
        ``step`` bytes apart (the whole shard is checked once, then remembered)."""
        whole = self._whole
        if whole is None or whole[0] != step:
            off = self.offsets
            whole = (step, bool(self.mm is not None and (off >= 0).all()
                                and (np.diff(off) == step).all()))
            self._whole = whole
        if whole[1]:
            return True
        off = self.offsets[c0:c1]
        return self.mm is not None and bool((off >= 0).all()) and \
            bool((np.diff(off) == step).all())

    def willneed(self, lo: int, hi: int) -> None:
        """Start reading bytes ``lo:hi`` of the file (before a sequential copy of them)."""
        if self.mm is not None and hi > lo:
            prefetch.willneed(np.array([self.addr + lo]), np.array([self.addr + hi]))

    def chunk(self, i: int, layout: Layout):
        """The stored bytes of inner chunk ``i`` after their crc32c check (None if absent)."""
        off = int(self.offsets[i])
        if off < 0:
            return None
        buf = self.buf[off: off + int(self.nbytes[i])]
        if layout.has_crc:
            payload = buf[:-4]
            if len(buf) < 4 or crc32c(payload) != int.from_bytes(buf[-4:], "little"):
                check_chunk(buf, f"shard {self.path}, chunk {i}")  # raises, with the reason
            if self.expect is not None:
                self.check_pinned(np.array([i]), np.array([int.from_bytes(buf[-4:], "little")]))
            return payload
        return buf

    def check_pinned(self, inner: np.ndarray, stored: np.ndarray) -> None:
        """Raise CorruptStoreError unless inner chunks ``inner`` end in the crc32c values
        ``stored`` their shard tag records (a no-op for a shard without a tag)."""
        if self.expect is None:
            return
        bad = np.flatnonzero(self.expect[inner] != stored)
        if bad.size:
            i = int(inner[bad[0]])
            if self.decode_check is not None and self.offsets[i] >= 0:
                off, nb = int(self.offsets[i]), int(self.nbytes[i])
                self.decode_check(self.buf[off: off + nb - 4], f"shard {self.path}, chunk {i}")
            raise CorruptStoreError(
                f"shard {self.path}, chunk {i}: ends in crc32c {int(stored[bad[0]]):#010x}, "
                f"its shard tag records {int(self.expect[i]):#010x} (a chunk of another "
                "shard, or re-checksummed, in its place)", path=self.path)

    def verify(self, inner: np.ndarray, layout: Layout) -> None:
        for i in inner.tolist():  # a loop per chunk, each checked once per process
            self.chunk(i, layout)
            self.verified[i] = True
        if self.verified.all():
            self.all_verified = True


def crcs(mv: memoryview, offsets: list, n: int, mode: int) -> np.ndarray:
    """crc32c of ``mv[o:o+n]`` for each ``o`` (a loop per chunk)."""
    v = as_bytes_array(mv)  # (google-crc32c lets the GIL go in every call: ``mode`` is moot)
    return np.fromiter((crc_value(v[o: o + n]) for o in offsets), dtype=np.int64,
                       count=len(offsets))

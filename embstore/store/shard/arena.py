"""All shard files of an uncompressed table mapped side by side in one address range (Linux).

One reserved range of ``n_shards * stride`` bytes (``PROT_NONE``, no memory behind it);
shard ``k`` is mapped read-only at ``base + k * stride`` with ``MAP_FIXED``.  A row of any
shard is then one byte offset in one NumPy view, so a lookup is a single vectorised gather
straight from the page cache, like ``np.load(mmap_mode="r")[ids]``, with no per-shard
grouping or scatter.  ``goff`` holds, for every global inner chunk, its byte offset in the
range (-1 absent chunk, -2 shard not mapped yet) and ``gver`` whether its crc32c passed.

The range lives until the last user releases it after :meth:`retire` (a shard was rewritten
or the table closed); readers in flight keep the mapping they started with.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from typing import Any

import numpy as np

from ...fs.files import open_regular
from ...fs.forksafe import renew_after_fork
from . import prefetch
from .tag import tag_len, tagged

__all__ = ["JoinedMap", "available", "reserve", "map_fixed", "release"]

_PROT_NONE, _PROT_READ = 0, 1
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANON, _MAP_NORESERVE = 1, 2, 0x10, 0x20, 0x4000
_libc: Any = None  # the C library (ctypes.CDLL) once available() found mmap


def available() -> bool:
    global _libc
    if sys.platform != "linux" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.mmap.restype = ctypes.c_void_p
            _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_int, ctypes.c_long]
            _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        except (OSError, AttributeError):
            return False
    return True


def _check(addr) -> int:
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap failed: {os.strerror(err)}")
    return int(addr)


class JoinedMap:
    """Shard files side by side in one reserved address range; see the module doc."""

    def __init__(self, n_shards: int, stride: int, n_inner: int, row_bytes: int):
        self.closed = True  # until the range is mapped (__del__ runs after a failed __init__)
        self.stride, self.n_inner = stride, n_inner
        self.total = n_shards * stride
        self.base = _check(_libc.mmap(None, self.total, _PROT_NONE,
                                      _MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE, -1, 0))
        self.closed = False
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * self.total).from_address(self.base))
        self.raw = raw  # the whole range as bytes (chunk checksums are read through it)
        self.view = np.ndarray(shape=(self.total - row_bytes + 1,),
                               dtype=np.dtype((np.void, row_bytes)), buffer=raw, strides=(1,))
        self.goff = np.full(n_shards * n_inner, -2, dtype=np.int64)
        self.gver = np.zeros(n_shards * n_inner, dtype=bool)
        self.all_verified = False
        self.users = 0
        self.retired = False
        self.lock = threading.Lock()
        renew_after_fork(self, "lock")

    def add(self, k: int, shard) -> None:
        """Map shard file ``k`` (a loaded :class:`~embstore.store.shard.file.ShardFile`) into its slot."""
        sl = slice(k * self.n_inner, (k + 1) * self.n_inner)
        if shard.mm is not None:
            fd = open_regular(shard.path)  # never blocks (a FIFO swapped in is refused)
            try:
                st = os.fstat(fd)
                size = st.st_size
                if getattr(shard, "ident", None) not in (None, (st.st_dev, st.st_ino)):
                    # a writer renamed a new shard into place since its index was read
                    raise ValueError(f"{shard.path}: replaced since its index was read")
                if size > self.stride:
                    raise ValueError(f"{shard.path}: {size} bytes, more than the {self.stride} "
                                     "slot")
                _check(_libc.mmap(self.base + k * self.stride, size, _PROT_READ,
                                  _MAP_SHARED | _MAP_FIXED, fd, 0))
                # no read-ahead around faults: cold batches are prefetched instead
                prefetch.advise_random(self.base + k * self.stride, size)
            finally:
                os.close(fd)
        self.goff[sl] = np.where(shard.offsets >= 0, shard.offsets + k * self.stride, -1)
        self.gver[sl] = shard.verified

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _libc.munmap(self.base, self.total)

    def __del__(self) -> None:  # no reader holds it any more (they hold a reference)
        self.close()


def stride_for(layout) -> int:
    """Bytes reserved per shard: the largest shard this layout writes, in whole pages."""
    n = layout.n_inner
    size = n * (layout.chunk_bytes + (4 if layout.has_crc else 0)) + 16 * n + 4 + (
        tag_len(n) if tagged(layout) else 0)
    page = mmap.PAGESIZE
    return -(-size // page) * page


def reserve(total: int) -> int:
    """An address range of ``total`` bytes with nothing behind it (``PROT_NONE``)."""
    return _check(_libc.mmap(None, total, _PROT_NONE, _MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE,
                             -1, 0))


def map_fixed(addr: int, fd: int, size: int) -> None:
    """Map ``size`` bytes of the open file ``fd`` read-only at ``addr`` (inside a reserved
    range), with no read-ahead around its faults (``MADV_RANDOM``)."""
    _check(_libc.mmap(addr, size, _PROT_READ, _MAP_SHARED | _MAP_FIXED, fd, 0))
    prefetch.advise_random(addr, size)


def release(base: int, total: int) -> None:
    _libc.munmap(base, total)

"""Framed files: delta files (docs/FORMAT.md §6c) and the frame they share with key delta
files.  A delta file holds the rows a ``write`` on a format-2 table changes:
``deltas/<N>.<array>`` of the version N it makes, the sorted unique ids and their
rows as stored (codes).  A delta file is::

    b"EMBDELTA" | uint32 header length | header (JSON: array, rows, cols, dtype) |
    zero padding to 8 bytes | int64 ids[rows] | values[rows, cols] | uint32 crc32c

all little-endian, the crc32c over every byte before it.  Bytes written: the rows, their
ids, 8 per id, and a few dozen more.  The frame (:func:`write_framed`,
:func:`read_framed`) is shared with key delta files; :mod:`.delta` reads a version's
delta files as an overlay of its row arrays.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptStoreError
from ...fs.checksum import crc32c
from ...fs.files import create_new, open_regular

__all__ = ["write_delta", "read_delta", "check_delta", "MAGIC", "write_framed", "read_framed",
           "sorted_union"]

MAGIC = b"EMBDELTA"
MAX_HEADER = 1 << 16


def write_framed(path: Path, magic: bytes, header: dict, parts: Iterable[Any], *,
                 fsync: bool = True) -> int:
    """Write (and fsync, unless the caller does) the new file ``path``: ``magic`` (8
    bytes), the JSON ``header`` with its length, zero padding to 8, ``parts`` (buffers,
    possibly made one at a time), then the crc32c of all of it; returns its size (the
    frame of delta files and key delta files)."""
    head = json.dumps(header).encode()
    head = magic + struct.pack("<I", len(head)) + head
    crc, size = 0, 0
    fd = create_new(path)
    with os.fdopen(fd, "wb") as f:
        for p in itertools.chain([head + b"\0" * (-len(head) % 8)], parts):  # per part
            crc = crc32c(p, crc)
            size += f.write(p)
        f.write(struct.pack("<I", crc))
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return size + 4


def read_framed(path: Path, magic: bytes, what: str, body_size, *,
                mapped: bool = False) -> tuple[dict, Any, int]:
    """``(header, data, start)`` of a file written by :func:`write_framed`: the magic, the
    header (``body_size(header)``: the bytes after it it announces, checked against the
    file's size before the rest is read) and the crc32c checked; :class:`CorruptStoreError`
    naming the file (``what``: "delta", "key delta").  ``mapped``: ``data`` is a read-only
    memory map of the file (its pages are the page cache's, not the process's: a trainer's
    deltas do not count against its memory), else bytes."""
    def bad(why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{path}: {why}: the {what} is damaged", path=str(path))
    try:
        fd = open_regular(path, nofollow=True)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: missing (a {what} of this version; the table was "
                                "removed or vacuumed under this reader: reopen it)",
                                path=str(path)) from None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 12 + MAX_HEADER, 0)
        if size < 16 or head[:8] != magic:
            raise bad(f"not a {what} file (magic)")
        (hlen,) = struct.unpack_from("<I", head, 8)
        if hlen > MAX_HEADER or 12 + hlen > size:
            raise bad(f"header length {hlen}")
        try:  # the header, checked before the rest is read (its size the file's)
            h = json.loads(head[12: 12 + hlen].decode("utf-8"))
            body = int(body_size(h))
        except (ValueError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as exc:
            raise bad(f"header ({exc})") from None
        start = 12 + hlen + (-(12 + hlen) % 8)
        if start + body + 4 != size:
            raise bad(f"{size} bytes, the header says {start + body + 4}")
        if mapped:
            data: Any = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        else:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
    finally:
        os.close(fd)
    if len(data) != size:
        raise bad("changed while read")
    (stored,) = struct.unpack_from("<I", data, size - 4)
    if crc32c(memoryview(data)[: size - 4]) != stored:
        raise bad("crc32c mismatch")
    return h, data, start


def sorted_union(*parts: np.ndarray) -> np.ndarray:
    """The sorted union of sorted unique int64 id arrays.  Two: the smaller one's new ids
    placed among the larger one's (its size in the result, a mask, and a few arrays of the
    smaller one's size: about 9 bytes a row of the result past the result itself, where
    ``np.union1d`` takes 24 or more); more: one sort of their concatenation."""
    parts = tuple(p for p in parts if p.size)
    if len(parts) <= 1:
        return parts[0] if parts else np.empty(0, np.int64)
    if len(parts) == 2:
        small, big = sorted(parts, key=len)
        at = np.searchsorted(big, small)
        new = np.flatnonzero(big[np.minimum(at, big.size - 1)] != small)
        out = np.empty(big.size + new.size, np.int64)
        mine = at[new] + np.arange(new.size)  # (where the small one's new ids land)
        rest = np.ones(out.size, bool)
        rest[mine] = False
        out[mine] = small[new]
        out[rest] = big
        return out
    c = np.concatenate(parts)
    c.sort()
    keep = np.empty(c.size, bool)
    keep[0] = True
    np.not_equal(c[1:], c[:-1], out=keep[1:])
    return c[keep]


def write_delta(path: Path, array: str, ids: np.ndarray, values: np.ndarray | None, *,
                blocks: Iterable[np.ndarray] = (), cols: int = 0, dtype=None) -> int:
    """Write (and fsync) the delta file ``path`` of rows ``ids`` (sorted, unique) of
    ``array``: ``values``, or (None) the row blocks ``blocks`` in order (``cols`` values
    of ``dtype`` each: a delta larger than memory); returns its size."""
    if values is not None:
        values = np.ascontiguousarray(values)
        if values.ndim == 1:
            values = values[:, None]
        blocks, cols, dtype = [values], values.shape[1], values.dtype
    dt = np.dtype(dtype).newbyteorder("<")
    return write_framed(path, MAGIC, {"array": array, "rows": int(ids.size),
                                      "cols": int(cols), "dtype": dt.str},
                        itertools.chain([np.ascontiguousarray(ids, dtype="<i8").view(np.uint8)],
                                        (np.ascontiguousarray(b, dtype=dt).reshape(-1)
                                         .view(np.uint8) for b in blocks)))


def _parse(path: Path, limit_rows: int | None = None) -> tuple[dict, np.ndarray, np.ndarray]:
    """``(header, ids, values)`` of the delta file ``path``: its checksum, sizes and order
    checked (:class:`CorruptStoreError` naming the file)."""
    def body(h: dict) -> int:
        n, c, dt = int(h["rows"]), int(h["cols"]), np.dtype(h["dtype"])
        if dt.hasobject or c < 1 or n < 0 or (limit_rows is not None and n > limit_rows):
            raise ValueError(f"{n} rows of {c} x {dt}")
        return n * 8 + n * c * dt.itemsize
    h, data, start = read_framed(path, MAGIC, "delta", body, mapped=True)
    n, c, dt = int(h["rows"]), int(h["cols"]), np.dtype(h["dtype"])
    # (views of the mapped file: its pages are the page cache's, not the process's)
    ids = np.frombuffer(data, dtype="<i8", count=n, offset=start).astype(np.int64, copy=False)
    values = np.frombuffer(data, dtype=dt, count=n * c, offset=start + n * 8).reshape(n, c)
    if n and (ids[0] < 0 or (ids[1:] <= ids[:-1]).any()):
        raise CorruptStoreError(f"{path}: ids not sorted and unique: the delta is damaged",
                                path=str(path))
    return h, ids, values


def check_delta(path: Path) -> None:
    """``verify``'s check of one delta file (raises :class:`CorruptStoreError`)."""
    _parse(path)


def read_delta(path: Path, array: str, cols: int, dtype: np.dtype,
               limit_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, values)`` of the delta file ``path`` of rows of ``array`` (``cols`` values
    of ``dtype`` each, ids below ``limit_rows``), everything checked."""
    h, ids, values = _parse(path, limit_rows)
    want = np.dtype(dtype).newbyteorder("<")
    if h.get("array") != array or values.shape[1] != cols or values.dtype != want:
        raise CorruptStoreError(f"{path}: expected rows of {array} ({cols} x "
                                f"{np.dtype(dtype).name}), got {h.get('array')!r} "
                                f"({values.shape[1]} x {values.dtype}): the delta is damaged",
                                path=str(path))
    if ids.size and ids[-1] >= limit_rows:
        raise CorruptStoreError(f"{path}: row {int(ids[-1])} past the {limit_rows} rows of "
                                "the version: the delta is damaged", path=str(path))
    return ids, values.astype(np.dtype(dtype), copy=False)

"""crc32c, the checksum of every stored chunk and index (Zarr's ``crc32c`` codec), through
``google-crc32c``: the library zarr-python itself requires (Apache-2.0), so embstore adds no
second one (it used ``crc32c``, LGPL, until 2026-12).

Measured on this machine (2 cores, shared), one call over 100 MB of a memory map: google-crc32c
6.6-10.0 ms, crc32c 5.7-10.1 ms; 102,400 calls over 1 KiB pieces of it: google-crc32c 0.41-0.51
us a call, crc32c 0.58-0.86 us (its ``gil_release_mode=1``); 1 KiB ``bytes``: 0.10-0.12 us
both.  google-crc32c lets the GIL go during each call (two threads over 200 MB each: the time
of one), as the cold chunk checks need.

``google_crc32c.value`` takes ``bytes`` and NumPy arrays but refuses ``memoryview``,
``bytearray`` and ``mmap`` (its ``y#`` argument): :func:`crc32c` views those as a uint8 array
first (no copy); hot loops slice one such view (:func:`as_bytes_array`) instead.

:func:`mismatched` checks many buffers against their expected checksums with a call per
group of buffers instead of a call per buffer.  The crc32c of ``A`` followed by ``B`` is
``Z(|B|)(crc(A)) ^ crc(B)``, ``Z(n)`` the linear map over GF(2) of feeding ``n`` zero bytes
to the register (zlib's ``crc32_combine``): the expected checksums of a group of
equal-length buffers combine, vectorised over all groups at once, into the checksum of the
buffers laid back to back; the buffers are gathered so (one ``np.take`` into a buffer that
stays in the CPU's cache) and one library call checks the group.  A group that fails is
checked buffer by buffer, so what is reported is exactly the buffers that differ.
Measured (2 cores shared, load 6-12): 15,855 scattered 4 KiB pages of a warm 1 GB array, one
thread, CPU time: a call a page 18.6-19.4 ms (1.2 us a page, of which 0.45 us is the call and
0.3 us the hash), :func:`mismatched` 12.7-13.0 ms (the gathering copy 6-7 ms of it).  What is
left is the copy: a loop over pages in compiled code would save it.
"""

from __future__ import annotations

from functools import lru_cache

import google_crc32c
import numpy as np

__all__ = ["crc32c", "as_bytes_array", "value", "mismatched", "zeros_tables", "shift",
           "combine"]

value = google_crc32c.value  # crc32c of bytes or a C-contiguous ndarray


def as_bytes_array(data) -> np.ndarray:
    """``data`` (bytes, memoryview, bytearray, mmap, ndarray) as a flat uint8 array, no copy."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def crc32c(data, value: int = 0) -> int:
    """The crc32c of ``data`` (any contiguous buffer), continuing from ``value``."""
    if type(data) is not bytes and type(data) is not np.ndarray:
        data = as_bytes_array(data)
    elif type(data) is np.ndarray and (data.dtype != np.uint8 or data.ndim != 1):
        data = as_bytes_array(data)
    return google_crc32c.extend(value, data) if value else google_crc32c.value(data)


_POLY = 0x82F63B78  # crc32c (Castagnoli), reflected
_GROUPS = (64, 8)  # buffers a call: 256 KiB of 4 KiB pages (in cache), then what is left


def _apply(mat: np.ndarray, vecs: np.ndarray) -> np.ndarray:
    """The GF(2) matrix ``mat`` (32 uint32 columns) applied to each uint32 of ``vecs``."""
    bits = (vecs[:, None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
    return np.bitwise_xor.reduce(bits * mat[None, :], axis=1)


@lru_cache(maxsize=None)
def _zeros_matrix(nbytes: int) -> np.ndarray:
    """The columns of ``Z(nbytes)``: ``Z(2n) = Z(n) Z(n)``, ``Z(n + 1) = Z(1) Z(n)``, so the
    lengths a tree of combinations asks for (``n``, ``2n``, ``4n``...) cost a product each."""
    if nbytes == 0:
        return np.left_shift(np.uint32(1), np.arange(32, dtype=np.uint32))
    if nbytes == 1:  # eight zero bits: the shift register's step, applied eight times
        bit = np.array([_POLY] + [1 << (i - 1) for i in range(1, 32)], dtype=np.uint32)
        op = bit
        for _ in range(7):  # a loop per bit of one byte
            op = _apply(bit, op)
        return op
    half = _zeros_matrix(nbytes // 2)
    even = _apply(half, half)
    return even if nbytes % 2 == 0 else _apply(_zeros_matrix(1), even)


@lru_cache(maxsize=None)
def zeros_tables(nbytes: int) -> np.ndarray:
    """``(4, 256)`` uint32 tables of ``Z(nbytes)``: ``Z(c)`` is the xor of
    ``t[j][(c >> 8 j) & 255]`` over the four bytes ``j`` of ``c``."""
    cols = _zeros_matrix(nbytes).astype(np.uint64).reshape(4, 8)
    v = np.arange(256, dtype=np.uint64)
    bits = (v[None, :, None] >> np.arange(8, dtype=np.uint64)[None, None, :]) & np.uint64(1)
    tables = np.bitwise_xor.reduce(bits * cols[:, None, :], axis=2)
    return tables.astype(np.uint32)


def shift(tables: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``Z(n)(c)`` for every uint32 in ``c``, ``tables`` those of ``Z(n)``."""
    return (tables[0][c & 0xFF] ^ tables[1][(c >> 8) & 0xFF] ^ tables[2][(c >> 16) & 0xFF]
            ^ tables[3][c >> 24])


def combine(crcs: np.ndarray, size: int) -> np.ndarray:
    """The crc32c of each row of ``crcs`` (``(groups, 2**j)``: the checksums of buffers of
    ``size`` bytes each) laid back to back: a tree of ``j`` vectorised steps."""
    c = np.ascontiguousarray(crcs, dtype=np.uint32)
    span = size
    while c.shape[1] > 1:  # a loop per level of the tree
        c = shift(zeros_tables(span), c[:, 0::2]) ^ c[:, 1::2]
        span *= 2
    return c[:, 0]


def _each(raw: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """crc32c of each ``raw[start:stop]``: a library call each."""
    return np.array([google_crc32c.value(raw[a:b]) for a, b in zip(starts.tolist(),
                                                                   stops.tolist())],
                    dtype=np.uint32).reshape(-1)


def _group_bad(raw: np.ndarray, starts: np.ndarray, expected: np.ndarray, size: int,
               g: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bad, rest)``: positions among the first ``g * (len // g)`` equal-length buffers
    whose groups of ``g`` failed (their buffers to check one by one), and where the ones
    left over start."""
    n = starts.size // g * g
    if not n:
        return starts[:0], np.arange(starts.size)
    first = int(starts[0]) % size  # all start at ``first`` plus a multiple of ``size``
    blocks = raw[first: first + (raw.size - first) // size * size].reshape(-1, size)
    at = (starts - first) // size
    want = combine(expected[:n].reshape(-1, g), size)
    buf = np.empty((g, size), dtype=np.uint8)  # gathered here, in cache, for the call
    got = np.empty(n // g, dtype=np.uint32)
    for i in range(n // g):  # a loop per group of buffers (not per buffer)
        np.take(blocks, at[i * g:(i + 1) * g], axis=0, out=buf, mode="clip")
        got[i] = google_crc32c.value(buf)
    failed = np.flatnonzero(got != want)
    bad = (failed[:, None] * g + np.arange(g)).reshape(-1)
    return bad, np.arange(n, starts.size)


def mismatched(raw: np.ndarray, starts: np.ndarray, stops: np.ndarray,
               expected: np.ndarray) -> np.ndarray:
    """The positions ``i`` (ascending) where the crc32c of ``raw[starts[i]:stops[i]]`` is not
    ``expected[i]``; ``raw`` a flat uint8 array (a range past its end ends with it, as a
    slice does).  Buffers of the most
    common (full) length are checked a group at a time (see the module's note), the others
    one call each (and all of them when the full ones do not start on a common grid of
    their length); the result is the same as one call a buffer."""
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    stops = np.asarray(stops, dtype=np.int64).reshape(-1)
    expected = np.asarray(expected, dtype=np.uint32).reshape(-1)
    if not (starts.size == stops.size == expected.size):
        raise ValueError(f"mismatched: {starts.size} starts, {stops.size} stops and "
                         f"{expected.size} checksums (expected as many of each)")
    if not starts.size:
        return np.zeros(0, dtype=np.int64)
    if int(starts.min()) < 0 or (stops < starts).any():
        raise ValueError("mismatched: a range that starts before the bytes given or ends "
                         "before it starts")
    stops = np.minimum(stops, raw.size)  # (as a slice would end)
    lengths = stops - starts
    size = int(lengths.max())
    full = np.flatnonzero(lengths == size)
    suspects, rest = [], [np.flatnonzero(lengths != size)]
    if size and full.size >= _GROUPS[-1] and not ((starts[full] - starts[full[0]]) % size).any():
        left = np.arange(full.size)
        for g in _GROUPS:  # a loop per group size
            bad, more = _group_bad(raw, starts[full[left]], expected[full[left]], size, g)
            suspects.append(full[left[bad]])
            left = left[more]
        rest.append(full[left])
    else:
        rest.append(full)
    check = np.sort(np.concatenate(suspects + rest))
    got = _each(raw, starts[check], stops[check])
    return check[got != expected[check]]

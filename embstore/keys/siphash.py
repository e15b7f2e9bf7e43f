"""SipHash-1-3, vectorised over a batch of keys (the key hash of tables written now).

The reference algorithm (Aumasson and Bernstein; 1 compression and 3 finalisation rounds,
64-bit output, as Python's and Rust's hash tables use it) over each key's UTF-8 bytes,
keyed with a table's own random 128-bit key: see :mod:`embstore.keys.hashing`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["siphash13", "word_view", "TAIL"]

# TAIL[r] keeps the first r bytes of a little-endian word (r = 0..8)
TAIL = np.array([(1 << (8 * r)) - 1 for r in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def word_view(buf: np.ndarray) -> np.ndarray:
    """Every byte offset of the contiguous uint8 array ``buf`` as the start of a little-endian
    uint64 (an unaligned strided view; offsets up to ``len(buf) - 8``)."""
    return np.ndarray((max(len(buf) - 7, 0),), dtype="<u8", buffer=buf, strides=(1,))



_SIP_INIT = tuple(np.uint64(c) for c in (0x736F6D6570736575, 0x646F72616E646F6D,
                                          0x6C7967656E657261, 0x7465646279746573))
_R = {r: (np.uint64(r), np.uint64(64 - r)) for r in (13, 16, 17, 21, 32)}


def _rotl(x: np.ndarray, r: int, t: np.ndarray) -> None:
    """``x = rotl64(x, r)`` in place (``t``: scratch of x's size)."""
    a, b = _R[r]
    np.right_shift(x, b, out=t)
    x <<= a
    x |= t


def _sipround(v0, v1, v2, v3, t) -> None:
    """One SipRound on the state arrays, in place (no temporaries: 26 NumPy calls)."""
    v0 += v1
    _rotl(v1, 13, t)
    v1 ^= v0
    _rotl(v0, 32, t)
    v2 += v3
    _rotl(v3, 16, t)
    v3 ^= v2
    v0 += v3
    _rotl(v3, 21, t)
    v3 ^= v0
    v2 += v1
    _rotl(v1, 17, t)
    v1 ^= v2
    _rotl(v2, 32, t)


_SIP_BLOCK = 1 << 15  # keys hashed together: the state arrays stay in the CPU cache
#: keys of more 8-byte words are hashed one by one with Python ints: a NumPy pass per word
#: over one long key cost ~0.2 ms a word (8 s for a MiB), the loop below ~3 us
_LONG_WORDS = 64
_M64 = (1 << 64) - 1


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    """One SipRound on Python ints (64-bit words)."""
    v0 = (v0 + v1) & _M64
    v1 = ((v1 << 13) | (v1 >> 51)) & _M64 ^ v0
    v0 = ((v0 << 32) | (v0 >> 32)) & _M64
    v2 = (v2 + v3) & _M64
    v3 = ((v3 << 16) | (v3 >> 48)) & _M64 ^ v2
    v0 = (v0 + v3) & _M64
    v3 = ((v3 << 21) | (v3 >> 43)) & _M64 ^ v0
    v2 = (v2 + v1) & _M64
    v1 = ((v1 << 17) | (v1 >> 47)) & _M64 ^ v2
    v2 = ((v2 << 32) | (v2 >> 32)) & _M64
    return v0, v1, v2, v3


def _one(data: bytes, k0: int, k1: int) -> int:
    """SipHash-1-3 of one (long) key with Python ints, linear in its length."""
    v0, v1 = k0 ^ int(_SIP_INIT[0]), k1 ^ int(_SIP_INIT[1])
    v2, v3 = k0 ^ int(_SIP_INIT[2]), k1 ^ int(_SIP_INIT[3])
    end = len(data) - len(data) % 8
    tail = ((len(data) & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    words = np.frombuffer(data, dtype="<u8", count=end // 8).tolist() + [tail]
    for m in words:  # a loop per 8-byte word of one long key
        v3 ^= m
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 ^= m
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def siphash13(enc, key: tuple[int, int]) -> np.ndarray:
    """SipHash-1-3 (the reference algorithm; 64-bit output) of every key of ``enc`` (an
    :class:`~embstore.keys.hashing.EncodedKeys`: UTF-8 bytes, starts and lengths).

    Blocks of keys, longest first: one NumPy pass per 8-byte word position over the keys
    that still have such a word, then the last block and the finalisation together.  A key
    of more than ``_LONG_WORDS`` words is hashed alone (:func:`_one`), so no key costs a
    NumPy pass per word.
    """
    n = len(enc)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    init = (k0 ^ _SIP_INIT[0], k1 ^ _SIP_INIT[1], k0 ^ _SIP_INIT[2], k1 ^ _SIP_INIT[3])
    words = word_view(enc.buf)
    full = enc.lengths >> 3  # complete 8-byte words; the rest goes into the last block
    long_ = np.flatnonzero(full > _LONG_WORDS)
    for i in long_.tolist():  # a loop per long key (each over _LONG_WORDS words)
        a = int(enc.starts[i])
        out[i] = _one(enc.buf[a:a + int(enc.lengths[i])].tobytes(), int(k0), int(k1))
    order = np.argsort(-full, kind="stable")[long_.size:]  # (the long ones sort first)
    n = order.size
    for a in range(0, n, _SIP_BLOCK):
        sel = order[a:a + _SIP_BLOCK]
        st, ln, nfull = enc.starts[sel], enc.lengths[sel], full[sel]
        m = len(sel)
        v0, v1, v2, v3 = (np.full(m, c) for c in init)
        t = np.empty(m, dtype=np.uint64)
        maxw = int(nfull[0])
        still = m - np.cumsum(np.bincount(nfull, minlength=maxw + 1))
        for j in range(maxw):
            c = int(still[j])
            w = words[st[:c] + 8 * j]
            v3[:c] ^= w
            _sipround(v0[:c], v1[:c], v2[:c], v3[:c], t[:c])
            v0[:c] ^= w
        last = words[st + 8 * nfull]
        last &= TAIL[ln & 7]
        last |= (ln.astype(np.uint64) & np.uint64(0xFF)) << np.uint64(56)
        v3 ^= last
        _sipround(v0, v1, v2, v3, t)
        v0 ^= last
        v2 ^= np.uint64(0xFF)
        for _ in range(3):
            _sipround(v0, v1, v2, v3, t)
        v0 ^= v1
        v0 ^= v2
        v0 ^= v3
        out[sel] = v0
    return out



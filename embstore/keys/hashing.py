"""Vectorised key encoding, hashing and comparison (the arithmetic behind :mod:`embstore.keys.index`).

Keys are exact Python ``str`` (no normalisation).  A batch of keys is turned
into one UTF-8 byte buffer plus per-key ``starts`` and ``lengths`` (so any
character works, including ``"\\x00"``, which NumPy's ``S``/``U`` dtypes would
drop).  Nothing here loops over keys in Python: loops run over 8-byte word
positions (hashing) or over bytes as whole arrays (comparison).

The key hash ``emb64-v1`` (frozen: it is part of the on-disk format)::

    h = SEED ^ (len(utf8) * P3)
    for each 8-byte little-endian word w of the UTF-8 bytes (the last one zero-padded):
        h = rotl64(h ^ (w * P2), 31) * P1
    h = fmix64(h)                                   # MurmurHash3's finaliser

The byte length in the seed separates keys that differ only by trailing NULs.

``emb64-v1`` is unseeded and invertible: thousands of keys sharing one hash are made in
seconds, and a run of equal hashes is walked linearly (a collision flood cost n^1.5).
Tables written now use ``siphash-1-3`` (SipHash with 1 compression and 3 finalisation
rounds, as Python's and Rust's hash tables use it) over the key's UTF-8 bytes, with a
random 128-bit key per table stored in the key index attributes: without the table's
key nobody can make colliding keys, so runs of equal hashes stay of length 1 and an
import or a lookup costs O(n log n) whatever the keys.  Any language with a SipHash
reads the index.  Tables written with ``emb64-v1`` stay readable; appending keys to
one re-keys its whole index with ``siphash-1-3`` (one pass over the old keys).

Keys are at most ``MAX_KEY_BYTES`` bytes of UTF-8: longer ones are refused when written
and simply miss when looked up (hashing and comparing a 2 MiB key took seconds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import secrets

import numpy as np

from ..errors import CorruptStoreError, FormatError
from .siphash import TAIL as _TAIL
from .siphash import siphash13, word_view

__all__ = ["EncodedKeys", "encode_keys", "hash_encoded", "hash_keys", "keys_equal", "word_view",
           "words_from_bytes", "decode_keys", "segment_index", "probe", "first_occurrences",
           "merge_runs", "sorted_first_occurrences", "find_keys", "HASH_NAME", "SIP_NAME",
           "KEY_PAD", "MAX_KEY_BYTES", "new_hash_key",
           "hash_key_attrs", "hash_key_from_attrs", "siphash13"]

HASH_NAME = "emb64-v1"  # the legacy hash (tables written before siphash-1-3)
SIP_NAME = "siphash-1-3"
MAX_KEY_BYTES = 1 << 16  # 64 KiB of UTF-8 per key
KEY_PAD = 8  # zero bytes after the last key in ``key_utf8``: a word can be read at any key start
_SEED = np.uint64(0x2545F4914F6CDD1D)
_P1 = np.uint64(0x9E3779B97F4A7C15)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_F1 = np.uint64(0xFF51AFD7ED558CCD)
_F2 = np.uint64(0xC4CEB9FE1A85EC53)
_S31, _S33 = np.uint64(31), np.uint64(33)


@dataclass
class EncodedKeys:
    """A batch of keys as UTF-8: key ``i`` is ``buf[starts[i]:starts[i] + lengths[i]]``.

    ``buf`` ends with 8 zero bytes past the last key, so 8-byte words can be
    read at any key start.
    """

    buf: np.ndarray       # uint8
    starts: np.ndarray    # int64
    lengths: np.ndarray   # int64

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def nbytes(self) -> int:
        return len(self.buf) - 8

    def subset(self, idx: np.ndarray) -> EncodedKeys:
        """The keys ``idx`` (sharing ``buf``)."""
        return EncodedKeys(self.buf, self.starts[idx], self.lengths[idx])


def encode_keys(keys, *, strict: bool = True, first_row: int = 0) -> EncodedKeys:
    """UTF-8 encode a sequence of ``str`` in one pass.

    ``strict=True`` (writing) refuses a key that is not a ``str`` or cannot be
    stored as UTF-8 (a lone surrogate) with :class:`FormatError` naming its row
    (``first_row`` + position).  ``strict=False`` (lookups) encodes lone
    surrogates with ``surrogatepass``: such bytes are not valid UTF-8, so they
    never equal a stored key and the lookup simply misses.
    """
    keys = keys if isinstance(keys, list) else list(keys)
    n = len(keys)
    try:
        text = "".join(keys)
    except TypeError:
        bad = next(i for i, k in enumerate(keys) if not isinstance(k, str))
        raise FormatError(f"keys must be str, got {type(keys[bad]).__name__} "
                          f"{keys[bad]!r} at row {first_row + bad}") from None
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        if strict:
            for i, k in enumerate(keys):  # error path only
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise FormatError(
                        f"key {k!r} at row {first_row + i} cannot be stored as UTF-8 "
                        f"({exc.reason} at character {exc.start})") from None
        raw = text.encode("utf-8", "surrogatepass")
    char_len = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    buf = np.frombuffer(raw + b"\0" * 8, dtype=np.uint8)
    if len(raw) == len(text):  # all ASCII: one byte per character
        lengths = char_len
        starts = np.cumsum(char_len) - char_len
    else:
        # the first byte of each character is the one that is not 10xxxxxx
        lead = np.flatnonzero((buf[: len(raw)] & 0xC0) != 0x80)
        lead = np.append(lead, len(raw))
        char_end = np.cumsum(char_len)
        bounds = lead[np.concatenate([[0], char_end])]
        starts = bounds[:-1]
        lengths = np.diff(bounds)
    if strict and n and int(lengths.max()) > MAX_KEY_BYTES:
        i = int(np.argmax(lengths > MAX_KEY_BYTES))
        raise FormatError(f"key at row {first_row + i} is {int(lengths[i])} bytes of UTF-8, "
                          f"more than the {MAX_KEY_BYTES} a key may have ({keys[i][:40]!r}...)")
    return EncodedKeys(buf, starts.astype(np.int64, copy=False),
                       lengths.astype(np.int64, copy=False))


def words_from_bytes(take: Callable, nbytes: int) -> Callable:
    """``words(positions)`` built from a byte reader ``take`` (bytes past ``nbytes`` are
    repeated, the callers mask them)."""
    lane = np.arange(8)
    last = max(nbytes - 1, 0)

    def words(pos: np.ndarray) -> np.ndarray:
        idx = np.minimum(pos[:, None] + lane, last).reshape(-1)
        return np.ascontiguousarray(take(idx), dtype=np.uint8).view("<u8").reshape(-1)

    return words


def _by_words(lengths: np.ndarray):
    """Order keys by word count (most first): ``(order, still, maxw)``, where the first
    ``still[j]`` keys in that order have more than ``j`` words."""
    nwords = (lengths + 7) >> 3
    maxw = int(nwords.max()) if len(nwords) else 0
    key_dtype = np.uint16 if maxw < 65535 else np.int64  # small ints: a radix sort
    order = np.argsort((maxw - nwords).astype(key_dtype), kind="stable")
    still = len(lengths) - np.cumsum(np.bincount(nwords, minlength=maxw + 1))
    return order, still, maxw


def _fmix(h: np.ndarray) -> np.ndarray:
    h ^= h >> _S33
    h *= _F1
    h ^= h >> _S33
    h *= _F2
    h ^= h >> _S33
    return h


def hash_encoded(enc: EncodedKeys, key: tuple[int, int] | None = None) -> np.ndarray:
    """The hash (uint64) of every key of ``enc``: ``siphash-1-3`` with the 128-bit ``key``
    ``(k0, k1)``, or the legacy ``emb64-v1`` when ``key`` is None."""
    if key is not None:
        return siphash13(enc, key)
    n = len(enc)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    words = word_view(enc.buf)
    h = enc.lengths.astype(np.uint64) * _P3
    h ^= _SEED
    order, still, maxw = _by_words(enc.lengths)
    if maxw:
        # keys with the most words first: the keys still hashing at word j are a prefix
        st, ln, hs = enc.starts[order], enc.lengths[order], h[order]
        for j in range(maxw):
            c = int(still[j])
            w = words[st[:c] + 8 * j]
            w &= _TAIL[np.minimum(ln[:c] - 8 * j, 8)]
            w *= _P2
            x = hs[:c] ^ w
            hs[:c] = ((x << _S31) | (x >> _S33)) * _P1
        h[order] = hs
    return _fmix(h)


def hash_keys(keys, *, strict: bool = False, key: tuple[int, int] | None = None) -> np.ndarray:
    """Hashes of a sequence of ``str`` (``siphash-1-3`` with ``key``, else ``emb64-v1``)."""
    return hash_encoded(encode_keys(keys, strict=strict), key)


def new_hash_key() -> tuple[int, int]:
    """A random 128-bit SipHash key for a new table."""
    return secrets.randbits(64), secrets.randbits(64)


def hash_key_attrs(key: tuple[int, int] | None) -> dict:
    """The key index attributes naming the hash (and its key) of ``key`` (None: legacy)."""
    if key is None:
        return {"version": 1, "hash": HASH_NAME}
    return {"version": 2, "hash": SIP_NAME, "key": f"{key[0]:016x}{key[1]:016x}"}


def hash_key_from_attrs(info, where) -> tuple[int, int] | None:
    """The hash key recorded in key index attributes ``info`` (None for ``emb64-v1``)."""
    name = info.get("hash") if isinstance(info, dict) else None
    if name == HASH_NAME:
        return None
    hexkey = info.get("key") if name == SIP_NAME else None
    if isinstance(hexkey, str) and len(hexkey) == 32:
        try:
            return int(hexkey[:16], 16), int(hexkey[16:], 16)
        except ValueError:
            pass
    raise CorruptStoreError(f"{where}: key_hash holds hash {name!r} with key {hexkey!r}; this "
                            f"embstore reads {SIP_NAME!r} with a 32-digit hex key, or "
                            f"{HASH_NAME!r}", path=str(where))


def segment_index(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat byte indices of the segments ``[starts[i], starts[i] + lengths[i])`` and the
    segment number of each one."""
    total = int(lengths.sum())
    seg = np.repeat(np.arange(len(lengths)), lengths)
    first = np.cumsum(lengths) - lengths
    idx = np.arange(total, dtype=np.int64)
    idx += np.repeat(starts - first, lengths)
    return idx, seg


def keys_equal(a: EncodedKeys, b_words: Callable, b_starts: np.ndarray,
               b_lengths: np.ndarray) -> np.ndarray:
    """Elementwise ``key a[i] == stored key i`` (bool array), compared 8 bytes at a time.

    The stored keys start at ``b_starts`` and have ``b_lengths`` bytes;
    ``b_words(positions)`` reads little-endian uint64 words at byte positions
    (a :func:`word_view` or :func:`words_from_bytes`).
    """
    out = a.lengths == b_lengths
    cand = np.flatnonzero(out & (a.lengths > 0))
    if cand.size == 0:
        return out
    order, still, maxw = _by_words(a.lengths[cand])
    cand = cand[order]
    qs, bs, ln = a.starts[cand], b_starts[cand], a.lengths[cand]
    qwords = word_view(a.buf)
    bad = np.zeros(len(cand), dtype=bool)
    for j in range(maxw):
        c = int(still[j])
        d = qwords[qs[:c] + 8 * j] ^ b_words(bs[:c] + 8 * j)
        d &= _TAIL[np.minimum(ln[:c] - 8 * j, 8)]
        bad[:c] |= d != 0
    out[cand[bad]] = False
    return out


def decode_keys(flat: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Python ``str`` keys from ``flat``, the UTF-8 bytes of consecutive keys of ``lengths``.

    One decode for the whole batch; a ``UnicodeDecodeError`` means corrupt bytes.
    """
    if len(lengths) == 0:
        return []
    text = bytes(flat).decode("utf-8")
    ends = np.cumsum(lengths)
    if len(text) != len(flat):  # byte ends -> character ends
        chars = np.concatenate([[0], np.cumsum((flat & 0xC0) != 0x80)])
        ends = chars[ends]
    bounds = np.concatenate([[0], ends]).tolist()
    return list(map(text.__getitem__, map(slice, bounds[:-1], bounds[1:])))


def probe(q: EncodedKeys, qh: np.ndarray, *, size: int, search: Callable, hash_at: Callable,
          row_at: Callable, offset_at: Callable, word_at: Callable, row_limit: int,
          visible: int, nbytes: int) -> np.ndarray:
    """Rows (int64, -1 where absent) of the keys ``q`` (hashes ``qh``) in a sorted index.

    The index has ``size`` sorted hashes: ``search(hashes)`` gives leftmost
    insertion points, ``hash_at``/``row_at`` read the sorted hashes and their
    rows, ``offset_at`` the key offsets, ``word_at`` 8-byte words of the key
    bytes.  A row ``>= row_limit`` is damage; rows ``>= visible`` (added after
    this snapshot) are skipped; the visible keys' bytes end by ``nbytes``.  One pass per position in a run of equal hashes
    (usually one or two passes in all).
    """
    n = len(q)
    result = np.full(n, -1, dtype=np.int64)
    if n == 0 or size == 0:
        return result
    # probes in hash order: the binary search and the reads of the sorted arrays go forward
    sort = np.argsort(qh)
    pos = np.empty(n, dtype=np.int64)
    pos[sort] = search(qh[sort])
    active = sort
    step = 0
    while active.size:
        p = pos[active] + step
        ok = p < size
        active, p = active[ok], p[ok]
        if not active.size:
            break
        same = hash_at(p) == qh[active]
        active, p = active[same], p[same]
        if not active.size:
            break
        rows = row_at(p)
        if rows.min() < 0 or rows.max() >= row_limit:
            raise CorruptStoreError(f"key index: row {int(rows.max())} out of range "
                                    f"0..{row_limit - 1} in key_order")
        eq = rows < visible
        mine = np.flatnonzero(eq)
        if mine.size:
            r = rows[mine]
            starts = offset_at(r)
            ends = offset_at(r + 1)
            if (ends < starts).any() or starts.min() < 0 or ends.max() > nbytes:
                raise CorruptStoreError(
                    "key index: key_offsets are not increasing within key_utf8")
            eq[mine] = keys_equal(q.subset(active[mine]), word_at, starts, ends - starts)
        result[active[eq]] = rows[eq]
        active = active[~eq]
        step += 1
    return result


def find_keys(keys, probe_hashed: Callable, hash_of: Callable) -> np.ndarray:
    """Rows (int64, -1 where absent) of a 1-D sequence of ``str`` keys through
    ``probe_hashed(encoded, hash_of(encoded))`` (an index's probe and hash): encoded and
    hashed once; keys longer than ``MAX_KEY_BYTES`` (never stored) miss without hashing
    megabytes."""
    key_list = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
    out = np.full(len(key_list), -1, dtype=np.int64)
    if not key_list:
        return out
    enc = encode_keys(key_list, strict=False)
    short = np.flatnonzero(enc.lengths <= MAX_KEY_BYTES)
    if not short.size:
        return out
    if short.size != len(enc):
        enc = enc.subset(short)
    out[short] = probe_hashed(enc, hash_of(enc))
    return out


def first_occurrences(enc: EncodedKeys, h: np.ndarray) -> np.ndarray:
    """Bool mask: True for the first occurrence of each distinct key of ``enc`` (exact bytes)."""
    return sorted_first_occurrences(enc, h)[0]


def sorted_first_occurrences(enc: EncodedKeys, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`first_occurrences` and the stable order of ``h`` it sorted by."""
    n = len(enc)
    keep = np.ones(n, dtype=bool)
    if n < 2:
        return keep, np.arange(n)
    perm = np.argsort(h, kind="stable")  # equal hashes: ascending positions
    hs = h[perm]
    dup = hs[1:] == hs[:-1]
    if not dup.any():
        return keep, perm
    multi = np.zeros(n, dtype=bool)
    multi[1:] |= dup
    multi[:-1] |= dup
    active = perm[multi]  # keys sharing their hash, grouped by hash, ascending positions
    ha = h[active]
    while active.size:
        head_flag = np.ones(active.size, dtype=bool)
        head_flag[1:] = ha[1:] != ha[:-1]
        head = np.maximum.accumulate(np.where(head_flag, np.arange(active.size), 0))
        heads = active[head]
        eq = keys_equal(enc.subset(active), word_view(enc.buf).__getitem__, enc.starts[heads],
                        enc.lengths[heads])
        keep[active[eq & ~head_flag]] = False
        active, ha = active[~eq], ha[~eq]
    return keep, perm


def merge_runs(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    """Merge sorted ``(hashes, rows)`` runs; on equal hashes ``a`` (earlier rows) comes first."""
    (ha, ra), (hb, rb) = a, b
    pos = np.searchsorted(ha, hb, side="right") + np.arange(len(hb))
    other = np.ones(len(ha) + len(hb), dtype=bool)
    other[pos] = False
    h = np.empty(len(other), dtype=np.uint64)
    r = np.empty(len(other), dtype=np.int64)
    h[pos], r[pos] = hb, rb
    h[other], r[other] = ha, ra
    return h, r

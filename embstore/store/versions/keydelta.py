"""Key deltas (docs/FORMAT.md §6d): the keys an append adds to a format-2 table, one file per
append (``deltas/<N>.keys``), searched beside the key index (:mod:`embstore.keys.segments`)
until a compaction folds them into it.  So an append writes its own keys, not the index of
every key.  A key delta file is::

    b"EMBKEYS1" | uint32 header length | header (JSON: array "keys", first_row, rows,
    bytes) | zero padding to 8 | uint64 hashes[rows] (sorted) | int64 rows[rows] (the row of
    each hash) | int64 offsets[rows + 1] (from 0) | the keys' UTF-8 bytes, 8 zero bytes, zero
    padding to 8 | uint32 crc32c

little-endian, the crc32c over every byte before it; the hashes are the table's key-index
hash (``siphash-1-3`` under its key).  The ``keys`` array itself (for other Zarr readers)
is grown by every append as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError
from ...keys.hashing import EncodedKeys, encode_keys, hash_encoded
from ...keys.index import DiskVocab, MemoryKeyIndex
from ...keys.mapped import stage_keys_array
from ...keys.segments import KeySegment, SegmentedVocab
from .commit import Transaction
from .framed import read_framed, write_framed
from .snapshot import DELTAS

__all__ = ["write_key_delta", "read_key_delta", "check_key_delta", "open_vocab", "KEYS",
           "key_entries", "stage_keys", "fold_keys", "encoded_new_keys"]

MAGIC = b"EMBKEYS1"
KEYS = "keys"  # the ``array`` of a key delta's manifest entry


def write_key_delta(path: Path, first_row: int, enc: EncodedKeys, hashes: np.ndarray, *,
                    fsync: bool = True) -> int:
    """Write (and fsync, unless the caller does) the key delta ``path`` of the keys ``enc``
    (rows ``first_row``.., contiguous in ``enc.buf``) with their hashes ``hashes``; returns
    its size."""
    m = len(enc)
    order = np.argsort(hashes, kind="stable")
    offsets = np.zeros(m + 1, dtype="<i8")
    np.cumsum(enc.lengths, out=offsets[1:])
    nb = int(offsets[-1])
    utf8 = enc.buf[:nb].tobytes() + bytes(8)
    return write_framed(path, MAGIC, {"array": KEYS, "first_row": int(first_row), "rows": m,
                                      "bytes": nb},
                        [hashes[order].astype("<u8").tobytes(),
                         (order + first_row).astype("<i8").tobytes(), offsets.tobytes(),
                         utf8 + bytes(-len(utf8) % 8)], fsync=fsync)


def _utf8_len(nb: int) -> int:
    return nb + 8 + (-(nb + 8) % 8)  # the keys' bytes, 8 zero bytes, padding to 8


def _body(h: dict) -> int:
    first, m, nb = int(h["first_row"]), int(h["rows"]), int(h["bytes"])
    if h.get("array") != KEYS or first < 0 or m < 0 or nb < 0:
        raise ValueError(f"array {h.get('array')!r}, {m} rows from {first}")
    return 24 * m + 8 + _utf8_len(nb)


def read_key_delta(path: Path) -> KeySegment:
    """The segment of the key delta file ``path``, everything checked
    (:class:`CorruptStoreError` naming the file)."""
    h, data, start = read_framed(path, MAGIC, "key delta", _body)
    first, m, nb = int(h["first_row"]), int(h["rows"]), int(h["bytes"])
    hashes = np.frombuffer(data, "<u8", m, start).astype(np.uint64)
    rows = np.frombuffer(data, "<i8", m, start + 8 * m).astype(np.int64)
    offsets = np.frombuffer(data, "<i8", m + 1, start + 16 * m).astype(np.int64)
    utf8 = np.frombuffer(data, np.uint8, _utf8_len(nb), start + 24 * m + 8).copy()
    return KeySegment(first, hashes, rows, offsets, utf8, str(path))


def check_key_delta(path: Path) -> None:
    """``verify``'s check of one key delta file (raises :class:`CorruptStoreError`)."""
    read_key_delta(path)


def key_entries(overlays) -> list[dict]:
    """The key deltas of a version (its :class:`~.delta.Overlays`, or None), oldest first."""
    return [] if overlays is None else [e for e in overlays.entries if e["array"] == KEYS]


def open_vocab(root: Path, rows: int, entries: list[dict], *, writable: bool = False,
               settle=None) -> DiskVocab | MemoryKeyIndex | SegmentedVocab | None:
    """The keys of the table (or version) at ``root`` with ``rows`` rows: its key index,
    with the segments of the key deltas ``entries`` (files under ``root/deltas``) on top."""
    segs = [read_key_delta(root / DELTAS / e["name"]) for e in entries]
    for a, b in zip(segs, segs[1:]):  # a loop per segment
        if a.stop != b.first:
            raise CorruptStoreError(f"{b.where}: rows from {b.first}, expected {a.stop}: "
                                    "the key deltas do not follow each other", path=b.where)
    if segs and segs[-1].stop != rows:
        raise CorruptStoreError(f"{segs[-1].where}: keys up to row {segs[-1].stop}, the "
                                f"version has {rows} rows", path=segs[-1].where)
    base_rows = segs[0].first if segs else rows
    vocab = DiskVocab.open(None, root, rows=base_rows, writable=writable, settle=settle)
    if not segs:
        return vocab
    if not isinstance(vocab, DiskVocab) or len(vocab) != base_rows:
        raise CorruptStoreError(f"{root}: the key index holds "
                                f"{'no keys' if vocab is None else len(vocab)} keys, its key "
                                f"deltas start at row {base_rows}", path=str(root))
    return SegmentedVocab(vocab, segs)


def encoded_new_keys(vocab, keys: list[str], n0: int) -> tuple[EncodedKeys, np.ndarray]:
    """The keys an append adds (rows ``n0``..) encoded (refused: not valid Unicode, too
    long) and hashed with the hash of the table's key index: done once for the check that
    they are new and for their key delta."""
    base = vocab.base if isinstance(vocab, SegmentedVocab) else vocab
    enc = encode_keys(keys, strict=True, first_row=n0)
    return enc, hash_encoded(enc, base.hash_key)


def stage_keys(vocab: DiskVocab | SegmentedVocab, keys: list[str], n0: int,
               txn: Transaction, enc: EncodedKeys, h: np.ndarray) -> None:
    """Stage the keys of an append of rows ``n0..`` (``enc``, ``h``: from
    :func:`encoded_new_keys`; new and unique: checked): on a format-2 table a key delta and
    the grown ``keys`` array; else (format 1, or an index of the legacy hash, re-keyed)
    the whole key index rewritten (section 2b)."""
    base = vocab.base if isinstance(vocab, SegmentedVocab) else vocab
    tree = txn.tree(KEYS)
    if txn.versioned and base.hash_key is not None:
        path = txn.delta(KEYS)
        write_key_delta(path, n0, enc, h, fsync=False)
        txn.sync_later(path)
        moves = stage_keys_array(vocab.path, tree, n0, vocab.keys_between, keys)
    else:
        assert isinstance(vocab, DiskVocab)  # (segments are made on format 2 only)
        moves = vocab.stage_append(keys, tree)
    for name, live in moves:  # a loop per file
        txn.adopt(tree / name, live)


def fold_keys(vocab, txn: Transaction) -> int:
    """Compaction: the key deltas folded into the key index (staged in ``txn``, which
    drops the deltas); returns the keys folded."""
    if not isinstance(vocab, SegmentedVocab):
        return 0
    keys = vocab.keys_between(len(vocab.base), len(vocab))
    tree = txn.tree(KEYS)
    for name, live in vocab.base.stage_append(keys, tree):  # a loop per file
        txn.adopt(tree / name, live)
    return len(keys)

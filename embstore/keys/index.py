"""Keys <-> ids on disk without loading every key.

Layout (in the table's Zarr group; ``V`` keys; see also docs/FORMAT.md):

- ``keys``: 1-D Zarr string array (``vlen-utf8`` + zstd + crc32c, 65,536 keys a
  chunk): the contract's array, for any Zarr reader.
- ``key_utf8`` (uint8): the UTF-8 bytes of all keys, back to back, in row order,
  then 8 zero bytes (so keys are compared 8 bytes at a time straight from the map).
- ``key_offsets`` (int64, ``V + 1``): key ``i`` is ``key_utf8[key_offsets[i]:key_offsets[i+1]]``.
- ``key_hash`` (uint64, ``V``): the ``emb64-v1`` hashes (:mod:`embstore.keyhash`)
  of all keys, sorted ascending.  Attribute ``embstore_key_index`` names the hash.
- ``key_order`` (int64, ``V``): ``key_order[j]`` is the row whose hash is
  ``key_hash[j]`` (equal hashes: ascending rows).

The four index arrays are uncompressed with a crc32c checksum and are read
through memory maps of their chunk files (:mod:`embstore.keyarrays`).  Opening
reads five small JSON files.  ``find`` hashes the queries (vectorised),
binary-searches ``key_hash`` and compares the stored bytes of each candidate row
with the query, walking runs of equal hashes, so a collision never gives a
wrong id.  Keys are exact ``str``: any Unicode (``"\\x00"`` included), the empty
string allowed; keys that are not valid Unicode (lone surrogates) are refused at
write time with :class:`FormatError`, and simply miss at lookup.

``append`` rewrites the four index arrays (O(V): append in batches) under
temporary names, renames each into place, and grows ``keys`` last.  A reader
takes its size from ``keys`` and maps the arrays through directory descriptors,
so it sees one consistent snapshot (rows past it are skipped) even while
another process appends; an interrupted append stays invisible and the next
append overwrites its leftovers.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CorruptStoreError
from .mapped import Head, MappedArray, concat_reader, read_array_meta, write_mapped
from .hashing import (HASH_NAME, KEY_PAD, EncodedKeys, decode_keys, encode_keys,
                      hash_encoded, merge_runs, probe, segment_index, word_view,
                      words_from_bytes)
from .writer import INDEX_ARRAYS, INDEX_ATTR, KEYS_CHUNK, KeyIndexWriter, index_attrs
from ..table import Vocab

if TYPE_CHECKING:
    import zarr

__all__ = ["KeyIndexWriter", "DiskVocab", "MemoryKeyIndex", "INDEX_ARRAYS", "has_key_index",
           "build_key_index", "read_key_array"]

_RETRIES = 10  # attempts to map a consistent snapshot (20 ms apart)
_log = logging.getLogger("embstore")


def has_key_index(path) -> bool:
    """Whether the group at ``path`` holds a key index (``key_hash`` is written last)."""
    return (Path(path) / "key_hash" / "zarr.json").is_file()


def read_key_array(path, n: int) -> np.ndarray:
    """The first ``n`` keys of the plain Zarr string array ``keys`` (an object array of str),
    read through zarr-python in blocks; damage raises :class:`CorruptStoreError`."""
    import zarr

    where = Path(path) / "keys"
    try:
        arr = zarr.open_array(str(where), mode="r")
        if arr.ndim != 1 or arr.shape[0] < n:
            raise ValueError(f"expected a 1-D array of at least {n} keys, got shape {arr.shape}")
        out = np.empty(n, dtype=object)
        for a in range(0, n, KEYS_CHUNK * 4):
            b = min(n, a + KEYS_CHUNK * 4)
            block = np.asarray(arr[a:b])
            if block.dtype.kind not in "UTO":
                raise ValueError(f"expected strings, got an array of {block.dtype}")
            out[a:b] = block.astype(object)
    except CorruptStoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - zarr raises many types on foreign or bad bytes
        raise CorruptStoreError(f"{where}: cannot read the keys ({type(exc).__name__}: {exc})",
                                path=str(where)) from None
    if n and not all(type(k) is str for k in out):  # noqa: E721 - exact str only
        raise CorruptStoreError(f"{where}: the keys must be strings", path=str(where))
    return out


def _index_arrays(keys: np.ndarray, *, strict: bool):
    """``(encoded keys, offsets, sorted hashes, their rows)`` of all ``keys``, vectorised."""
    enc = encode_keys(keys.tolist(), strict=strict)
    hashes = hash_encoded(enc)
    order = np.argsort(hashes, kind="stable")  # equal hashes: ascending rows
    offsets = np.empty(len(enc) + 1, dtype=np.int64)
    offsets[:-1] = enc.starts
    offsets[-1] = enc.nbytes
    return enc, offsets, hashes[order], order.astype(np.int64)


class MemoryKeyIndex(Vocab):
    """The key index of a group that has a plain ``keys`` array but no stored index (written
    by another Zarr tool), built in memory with the same hash and probe as the stored one.

    About 17 bytes per key plus the keys themselves; duplicate keys: the first row wins.
    """

    def __init__(self, keys: np.ndarray):
        self._keys = keys
        enc, self._offsets, self._hash, self._order = _index_arrays(keys, strict=False)
        self._buf, self._nbytes = enc.buf, enc.nbytes
        self._words = word_view(enc.buf).__getitem__

    @classmethod
    def from_store(cls, path, n: int) -> MemoryKeyIndex:
        t0 = time.perf_counter()
        index = cls(read_key_array(path, n))
        _log.warning("%s: keys without a key index: indexed %d keys in memory (%.1f s); open "
                     "the table once with mode='r+' to store the index", path, n,
                     time.perf_counter() - t0)
        return index

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, keys: np.ndarray) -> np.ndarray:
        key_list = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        n = len(self._keys)
        if not key_list or not n:
            return np.full(len(key_list), -1, dtype=np.int64)
        enc = encode_keys(key_list, strict=False)
        return probe(enc, hash_encoded(enc), size=n, search=self._hash.searchsorted,
                     hash_at=self._hash.take, row_at=self._order.take,
                     offset_at=self._offsets.take, word_at=self._words, row_limit=n,
                     visible=n, nbytes=self._nbytes)

    def key_at(self, ids: np.ndarray) -> list[str]:
        return self._keys[np.asarray(ids, dtype=np.int64).reshape(-1)].tolist()

    def keys_between(self, start: int, stop: int) -> list[str]:
        return self._keys[start:max(start, stop)].tolist()

    def close(self) -> None:
        pass


def build_key_index(path, n: int, group: zarr.Group | None = None) -> None:
    """Write the key index of the first ``n`` entries of the group's plain ``keys`` array
    (replacing any index there).  ``key_hash`` is written last: until it is in place,
    readers index the keys in memory."""
    import zarr

    path = Path(path)
    keys = read_key_array(path, n)
    enc, offsets, hashes, order = _index_arrays(keys, strict=True)
    g = group if group is not None else zarr.open_group(str(path), mode="r+")
    if has_key_index(path):  # rebuilding: readers fall back to memory, never a mixed index
        shutil.rmtree(path / "key_hash")  # (open memory maps keep the old files alive)
    buf = enc.buf[: enc.nbytes + KEY_PAD]  # encode_keys ends the buffer with KEY_PAD zeros
    write_mapped(g, "key_utf8", len(buf), np.uint8, lambda a, b: buf[a:b], path=path)
    write_mapped(g, "key_offsets", n + 1, np.int64, lambda a, b: offsets[a:b], path=path)
    write_mapped(g, "key_order", n, np.int64, lambda a, b: order[a:b], path=path)
    write_mapped(g, "key_hash", n, np.uint64, lambda a, b: hashes[a:b], attrs=index_attrs(),
                 path=path)


class DiskVocab(Vocab):
    """The key index of an on-disk table, read through memory maps (see the module doc)."""

    def __init__(self, group: zarr.Group | None, path: Path, n: int):
        self._group = group
        self.path = Path(path)
        self._n = n
        self._map()

    def _zarr_group(self, mode: str) -> zarr.Group:
        """The Zarr group (opened on first need: lookups never import zarr)."""
        if self._group is not None:
            return self._group
        import zarr

        group = zarr.open_group(str(self.path), mode=mode)
        if mode != "r":
            self._group = group
        return group

    def _map(self) -> None:
        """Map the index arrays, retrying while an appender in another process swaps them."""
        for attempt in range(_RETRIES):
            try:
                return self._map_once()
            except CorruptStoreError:
                if attempt == _RETRIES - 1:
                    raise
                time.sleep(0.02)

    def _map_once(self) -> None:
        # Read in the reverse of the order ``append`` writes (key_utf8, key_offsets,
        # key_hash, key_order, then ``keys``): each array is then of the snapshot's
        # version or newer, and newer versions only add rows (skipped: >= n).
        n = self._n
        offsets = MappedArray(self.path, "key_offsets")
        utf8 = MappedArray(self.path, "key_utf8")
        hashes = MappedArray(self.path, "key_hash")
        order = MappedArray(self.path, "key_order")
        info = hashes.attrs.get(INDEX_ATTR, {})
        if info.get("hash") != HASH_NAME:
            raise CorruptStoreError(
                f"{self.path}: key_hash holds hash {info.get('hash')!r}, this embstore reads "
                f"{HASH_NAME!r}", path=self.path)
        if len(offsets) < n + 1 or len(hashes) < n or len(order) != len(hashes):
            raise CorruptStoreError(
                f"{self.path}: key index sizes do not fit {n} keys: key_offsets "
                f"{len(offsets)}, key_hash {len(hashes)}, key_order {len(order)} elements "
                f"(expected {n + 1}, {n}, {n})", path=self.path)
        last = int(offsets.read(len(offsets) - 1, len(offsets))[0])
        if last + KEY_PAD > len(utf8):
            raise CorruptStoreError(
                f"{self.path}: key_utf8 has {len(utf8)} bytes, expected key_offsets[-1] + "
                f"{KEY_PAD} = {last + KEY_PAD}", path=self.path)
        self._utf8, self._offsets, self._hash, self._order = utf8, offsets, hashes, order
        self._nbytes = int(offsets.read(n, n + 1)[0])
        if utf8.nchunks == 1:  # the common case: words straight from the map
            self._words = word_view(utf8.chunk_data(0)).__getitem__
        else:
            self._words = words_from_bytes(utf8.take, len(utf8))

    @classmethod
    def open(cls, group: zarr.Group | None, path, *, rows: int | None = None,
             writable: bool = False) -> DiskVocab | MemoryKeyIndex | None:
        """The vocabulary of the group at ``path``, or None when it has no ``keys``.

        Reads five small JSON files and maps the index files; nothing else.  ``group``
        may be None: it is then opened (importing zarr) only for ``append``/``verify``.
        ``rows`` (the table's committed row count) caps the keys seen, for readers
        that open while another process appends.

        A group with a plain ``keys`` array and no key index (written by another Zarr
        tool) is indexed: on disk when ``writable``, else in memory
        (:class:`MemoryKeyIndex`, with a one-line notice on the ``embstore`` logger).
        """
        path = Path(path)
        if not (path / "keys" / "zarr.json").is_file():
            return None
        meta = read_array_meta(path, "keys")
        try:
            (n,) = meta["shape"]
            n = int(n)
        except (KeyError, TypeError, ValueError):
            raise CorruptStoreError(f"{path / 'keys'}: 'keys' must be a 1-D array, got "
                                    f"shape {meta.get('shape')!r}", path=path) from None
        n = n if rows is None else min(n, int(rows))
        if not has_key_index(path):
            if not writable:
                return MemoryKeyIndex.from_store(path, n)
            build_key_index(path, n, group)
        return cls(group, path, n)

    def __len__(self) -> int:
        return self._n

    def close(self) -> None:
        """Release the memory maps (a later lookup maps the files again)."""
        for arr in (self._utf8, self._offsets, self._hash, self._order):
            arr.close()

    def _corrupt(self, exc: Exception) -> CorruptStoreError:
        return CorruptStoreError(f"{self.path}: the key index is damaged ({exc})", path=self.path)

    def find(self, keys: np.ndarray) -> np.ndarray:
        key_list = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        if not key_list or not self._n:
            return np.full(len(key_list), -1, dtype=np.int64)
        enc = encode_keys(key_list, strict=False)
        try:
            return probe(enc, hash_encoded(enc), size=len(self._hash),
                         search=self._hash.searchsorted, hash_at=self._hash.take,
                         row_at=self._order.take, offset_at=self._offsets.take,
                         word_at=self._words, row_limit=len(self._order), visible=self._n,
                         nbytes=self._nbytes)
        except IndexError as exc:
            raise self._corrupt(exc) from None

    def key_at(self, ids: np.ndarray) -> list[str]:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not ids.size:
            return []
        starts = self._offsets.take(ids)
        lengths = self._offsets.take(ids + 1) - starts
        try:
            if (lengths < 0).any() or (starts + lengths).max() > self._nbytes:
                raise IndexError("key_offsets out of order")
            flat = self._utf8.take(segment_index(starts, lengths)[0])
            return decode_keys(flat, lengths)
        except (IndexError, UnicodeDecodeError) as exc:
            raise self._corrupt(exc) from None

    def keys_between(self, start: int, stop: int) -> list[str]:
        if stop <= start:
            return []
        offsets = self._offsets.read(start, stop + 1)
        lengths = np.diff(offsets)
        try:
            if (lengths < 0).any() or offsets[-1] > self._nbytes:
                raise IndexError("key_offsets out of order")
            return decode_keys(self._utf8.read(int(offsets[0]), int(offsets[-1])), lengths)
        except (IndexError, UnicodeDecodeError) as exc:
            raise self._corrupt(exc) from None

    def append(self, keys: list[str]) -> None:
        """Add keys for new rows (the caller checked they are new and unique)."""
        enc = encode_keys(keys, strict=True, first_row=self._n)
        m = len(enc)
        if not m:
            return
        n, g, path = self._n, self._zarr_group("r+"), self.path
        h = hash_encoded(enc)
        flat = enc.buf[: enc.nbytes]
        new_offsets = self._nbytes + np.cumsum(enc.lengths)
        # the index first, ``keys`` last (readers take their size from ``keys``); data past
        # this snapshot (left by an interrupted append) is dropped
        write_mapped(g, "key_utf8", self._nbytes + len(flat) + KEY_PAD, np.uint8,
                     concat_reader(Head(self._utf8, self._nbytes), flat,
                                   np.zeros(KEY_PAD, np.uint8)), path=path)
        write_mapped(g, "key_offsets", n + m + 1, np.int64,
                     concat_reader(Head(self._offsets, n + 1), new_offsets), path=path)
        old_h, old_rows = self._hash.read(0, len(self._hash)), self._order.read(0, len(self._order))
        if len(old_h) != n:
            old_h, old_rows = old_h[old_rows < n], old_rows[old_rows < n]
        order = np.argsort(h, kind="stable")
        merged_h, merged_rows = merge_runs((old_h, old_rows),
                                           (h[order], np.arange(n, n + m, dtype=np.int64)[order]))
        write_mapped(g, "key_hash", n + m, np.uint64, lambda a, b: merged_h[a:b],
                     attrs=index_attrs(), path=path)
        write_mapped(g, "key_order", n + m, np.int64, lambda a, b: merged_rows[a:b], path=path)
        arr = g["keys"]
        arr.resize((n + m,))
        arr[n:n + m] = np.array(keys, dtype=object)
        self._n = n + m
        self._map()

    def verify(self) -> None:
        """Check every stored byte of the keys and their index (O(V)); CorruptStoreError if bad.

        Checksums (through zarr-python), offsets, sortedness, the permutation, every
        hash recomputed from the key bytes and ``keys`` equal to ``key_utf8``.
        """
        group = self._zarr_group("r")
        for name, arr in zip(INDEX_ARRAYS, (self._utf8, self._offsets, self._hash,
                                            self._order)):
            arr.verify(group, name)
        n = self._n
        bad = None
        sizes = (len(self._offsets), len(self._hash), len(self._order), len(self._utf8))
        if sizes != (n + 1, n, n, self._nbytes + KEY_PAD):
            raise CorruptStoreError(
                f"{self.path}: key index sizes (key_offsets, key_hash, key_order, key_utf8) "
                f"are {sizes}, expected {(n + 1, n, n, self._nbytes + KEY_PAD)} for {n} keys "
                "(an interrupted append? a later append repairs it)", path=self.path)
        offsets = self._offsets.read(0, n + 1)
        hashes, order = self._hash.read(0, n), self._order.read(0, n)
        if offsets[0] != 0 or (np.diff(offsets) < 0).any():
            bad = "key_offsets are not increasing from 0"
        elif self._utf8.read(self._nbytes, self._nbytes + KEY_PAD).any():
            bad = f"the {KEY_PAD} bytes after the last key in key_utf8 are not zero"
        if bad is None and n and (hashes[1:] < hashes[:-1]).any():
            bad = "key_hash is not sorted"
        if bad is None and n and ((order < 0).any() or (order >= n).any()
                                  or np.bincount(order, minlength=n).max() != 1):
            bad = "key_order is not a permutation of the rows"
        if bad is not None:
            raise CorruptStoreError(f"{self.path}: {bad}", path=self.path)
        by_row = np.empty(n, dtype=np.uint64)
        by_row[order] = hashes
        keys_arr = group["keys"]
        for a in range(0, n, KEYS_CHUNK):
            b = min(n, a + KEYS_CHUNK)
            flat = self._utf8.read(int(offsets[a]), int(offsets[b]))
            lengths = np.diff(offsets[a:b + 1])
            enc = EncodedKeys(np.concatenate([flat, np.zeros(8, np.uint8)]),
                              offsets[a:b] - offsets[a], lengths)
            if not np.array_equal(hash_encoded(enc), by_row[a:b]):
                raise CorruptStoreError(f"{self.path}: key_hash disagrees with the keys of "
                                        f"rows {a}..{b - 1}", path=self.path)
            try:
                stored = keys_arr[a:b]
            except ValueError as exc:
                raise CorruptStoreError(f"{self.path}/keys: {exc}", path=self.path) from None
            if stored.tolist() != self.keys_between(a, b):
                raise CorruptStoreError(f"{self.path}: 'keys' disagrees with key_utf8 in rows "
                                        f"{a}..{b - 1}", path=self.path)

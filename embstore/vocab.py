"""Keys <-> ids on disk without loading every key.

Layout (in the table's Zarr group; ``V`` keys; see also docs/FORMAT.md):

- ``keys``: 1-D Zarr string array (``vlen-utf8`` + zstd + crc32c, 65,536 keys a
  chunk): the contract's array, for any Zarr reader.
- ``key_utf8`` (uint8): the UTF-8 bytes of all keys, back to back, in row order.
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
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import CorruptStoreError
from .keyarrays import Head, MappedArray, concat_reader, read_array_meta, write_mapped
from .keyhash import (HASH_NAME, KEY_PAD, EncodedKeys, decode_keys, encode_keys,
                      hash_encoded, merge_runs, probe, segment_index, word_view,
                      words_from_bytes)
from .keywriter import INDEX_ARRAYS, INDEX_ATTR, KEYS_CHUNK, KeyIndexWriter, index_attrs
from .table import Vocab

if TYPE_CHECKING:
    import zarr

__all__ = ["KeyIndexWriter", "DiskVocab", "INDEX_ARRAYS"]


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
        arrays = {name: MappedArray(self.path, name) for name in INDEX_ARRAYS}
        for arr in arrays.values():  # a consistent snapshot even if an appender renames files
            arr.map_all()
        self._utf8, self._offsets = arrays["key_utf8"], arrays["key_offsets"]
        self._hash, self._order = arrays["key_hash"], arrays["key_order"]
        n = self._n
        info = self._hash.attrs.get(INDEX_ATTR, {})
        if info.get("hash") != HASH_NAME:
            raise CorruptStoreError(
                f"{self.path}: key_hash holds hash {info.get('hash')!r}, this embstore reads "
                f"{HASH_NAME!r}", path=self.path)
        sizes = {"key_offsets": (len(self._offsets), n + 1), "key_hash": (len(self._hash), n),
                 "key_order": (len(self._order), n)}
        for name, (got, want) in sizes.items():
            if got != want:
                raise CorruptStoreError(
                    f"{self.path}: {name} has {got} elements, expected {want} for {n} keys",
                    path=self.path)
        self._nbytes = int(self._offsets.read(n, n + 1)[0])
        if self._nbytes + KEY_PAD != len(self._utf8):
            raise CorruptStoreError(
                f"{self.path}: key_utf8 has {len(self._utf8)} bytes, expected "
                f"key_offsets[-1] + {KEY_PAD} = {self._nbytes + KEY_PAD}", path=self.path)
        if self._utf8.nchunks == 1:  # the common case: words straight from the map
            self._words = word_view(self._utf8.chunk_data(0)).__getitem__
        else:
            self._words = words_from_bytes(self._utf8.take, len(self._utf8))

    @classmethod
    def open(cls, group: zarr.Group | None, path) -> DiskVocab | None:
        """The vocabulary of the group at ``path``, or None when it has no ``keys``.

        Reads five small JSON files and maps the index files; nothing else.  ``group``
        may be None: it is then opened (importing zarr) only for ``append``/``verify``.
        """
        path = Path(path)
        if not (path / "keys" / "zarr.json").is_file():
            return None
        meta = read_array_meta(path, "keys")
        try:
            (n,) = meta["shape"]
        except (KeyError, TypeError, ValueError):
            raise CorruptStoreError(f"{path / 'keys'}: 'keys' must be a 1-D array, got "
                                    f"shape {meta.get('shape')!r}", path=path) from None
        return cls(group, path, int(n))

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
            return probe(enc, hash_encoded(enc), size=self._n, search=self._hash.searchsorted,
                         hash_at=self._hash.take, row_at=self._order.take,
                         offset_at=self._offsets.take, word_at=self._words,
                         nrows=self._n, nbytes=self._nbytes)
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
        arr = g["keys"]
        arr.resize((n + m,))
        arr[n:n + m] = np.array(keys, dtype=object)
        flat = enc.buf[: enc.nbytes]
        new_offsets = self._nbytes + np.cumsum(enc.lengths)
        write_mapped(g, "key_utf8", self._nbytes + len(flat) + KEY_PAD, np.uint8,
                     concat_reader(Head(self._utf8, self._nbytes), flat,
                                   np.zeros(KEY_PAD, np.uint8)), path=path)
        write_mapped(g, "key_offsets", n + m + 1, np.int64,
                     concat_reader(self._offsets, new_offsets), path=path)
        order = np.argsort(h, kind="stable")
        merged_h, merged_rows = merge_runs((self._hash.read(0, n), self._order.read(0, n)),
                                       (h[order], np.arange(n, n + m, dtype=np.int64)[order]))
        write_mapped(g, "key_hash", n + m, np.uint64, lambda a, b: merged_h[a:b],
                     attrs=index_attrs(), path=path)
        write_mapped(g, "key_order", n + m, np.int64, lambda a, b: merged_rows[a:b], path=path)
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

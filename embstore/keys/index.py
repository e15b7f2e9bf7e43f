"""Keys <-> ids on disk without loading every key.

Layout (in the table's Zarr group; ``V`` keys; see also docs/FORMAT.md):

- ``keys``: 1-D Zarr string array (``vlen-utf8`` + zstd + crc32c, 65,536 keys a
  chunk): the contract's array, for any Zarr reader.
- ``key_utf8`` (uint8): the UTF-8 bytes of all keys, back to back, in row order,
  then 8 zero bytes (so keys are compared 8 bytes at a time straight from the map).
- ``key_offsets`` (int64, ``V + 1``): key ``i`` is ``key_utf8[key_offsets[i]:key_offsets[i+1]]``.
- ``key_hash`` (uint64, ``V``): the hashes (:mod:`embstore.keys.hashing`: ``siphash-1-3``
  with the table's own key, or the legacy ``emb64-v1``) of all keys, sorted ascending.
  Attribute ``embstore_key_index`` names the hash (and holds its key).
- ``key_order`` (int64, ``V``): ``key_order[j]`` is the row whose hash is
  ``key_hash[j]`` (equal hashes: ascending rows).

The four index arrays are uncompressed with a crc32c checksum and are read
through memory maps of their chunk files (:mod:`embstore.keys.mapped`).  Opening
reads five small JSON files.  ``find`` hashes the queries (vectorised),
binary-searches ``key_hash`` and compares the stored bytes of each candidate row
with the query, walking runs of equal hashes, so a collision never gives a
wrong id.  Keys are exact ``str``: any Unicode (``"\\x00"`` included), the empty
string allowed; keys that are not valid Unicode (lone surrogates) are refused at
write time with :class:`FormatError`, and simply miss at lookup.

An append writes the four index arrays (O(V): append in batches) and the grown
``keys`` into a transaction's staging directory; the store's commit protocol
(:mod:`embstore.store.versions.commit`) replaces the live files in that order, all or
nothing.  A reader takes its size from ``keys`` (capped by the row count) and
maps the arrays through directory descriptors, so it sees one consistent
snapshot (rows past it are skipped); while a commit replaces the files it
retries.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..errors import CorruptStoreError
from ..fs.atomic import replace
from .foreign import MemoryKeyIndex, build_key_index, has_key_index
from .mapped import (Head, MappedArray, concat_reader, read_array_meta, stage_keys_array,
                     write_mapped)
from .hashing import (KEY_PAD, EncodedKeys, decode_keys, encode_keys, find_keys,
                      hash_encoded, hash_key_from_attrs, merge_runs, probe, segment_index,
                      new_hash_key, word_view, words_from_bytes)
from .writer import INDEX_ARRAYS, INDEX_ATTR, KEYS_CHUNK, KeyIndexWriter, index_attrs
from ..table import Vocab

if TYPE_CHECKING:
    import zarr

__all__ = ["KeyIndexWriter", "DiskVocab", "MemoryKeyIndex", "INDEX_ARRAYS", "has_key_index",
           "build_key_index"]

_RETRIES = 10  # attempts to map a consistent snapshot (20 ms apart)


class DiskVocab(Vocab):
    """The key index of an on-disk table, read through memory maps (see the module doc)."""

    def __init__(self, group: zarr.Group | None, path: Path, n: int,
                 settle: Callable[[], None] | None = None):
        self._group = group
        self.path = Path(path)
        self._n = n
        self._settle = settle  # waits while a commit replaces the index files
        self._map()

    def _zarr_group(self, mode: Literal["r", "r+"]) -> zarr.Group:
        """The Zarr group (opened on first need: lookups never import zarr)."""
        if self._group is not None:
            return self._group
        import zarr

        try:
            group = zarr.open_group(str(self.path), mode=mode, use_consolidated=False)
        except (zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError,
                ValueError, OSError) as exc:  # (a group zarr.json removed or damaged)
            raise CorruptStoreError(f"{self.path}/zarr.json: zarr cannot open the table's "
                                    f"group ({type(exc).__name__}: {exc})",
                                    path=str(self.path)) from None
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
                if self._settle is not None:
                    self._settle()

    def _map_once(self) -> None:
        # Read in the reverse of the order ``append`` writes (key_utf8, key_offsets,
        # key_hash, key_order, then ``keys``): each array is then of the snapshot's
        # version or newer, and newer versions only add rows (skipped: >= n).
        n = self._n
        offsets = self._array("key_offsets")
        utf8 = self._array("key_utf8")
        hashes = self._array("key_hash")
        order = self._array("key_order")
        hash_key = hash_key_from_attrs(hashes.attrs.get(INDEX_ATTR, {}), self.path)
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
        self._hash_key = hash_key
        self._nbytes = int(offsets.read(n, n + 1)[0])
        self._words = self._word_reader(utf8)

    def _array(self, name: str) -> MappedArray:
        """One index array (the seam: a remote table reads them by ranges instead)."""
        return MappedArray(self.path, name)

    def _word_reader(self, utf8) -> Callable:
        if utf8.nchunks == 1:  # the common case: words straight from the map
            return word_view(utf8.chunk_data(0)).__getitem__
        return words_from_bytes(utf8.take, len(utf8))

    @classmethod
    def open(cls, group: zarr.Group | None, path, *, rows: int | None = None,
             writable: bool = False, settle: Callable[[], None] | None = None
             ) -> DiskVocab | MemoryKeyIndex | None:
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
        return cls(group, path, n, settle)

    def __len__(self) -> int:
        return self._n

    def close(self, *, final: bool = False) -> None:
        """Release the memory maps (a later lookup maps the files again, unless ``final``:
        the table was closed, and later lookups raise ClosedTableError)."""
        for arr in (self._utf8, self._offsets, self._hash, self._order):
            arr.close(final=final)

    def _corrupt(self, exc: Exception) -> CorruptStoreError:
        return CorruptStoreError(f"{self.path}: the key index is damaged ({exc})", path=self.path)

    def find(self, keys: np.ndarray) -> np.ndarray:
        if not self._n:
            return np.full(len(keys), -1, dtype=np.int64)
        return find_keys(keys, self.probe_hashed,
                         lambda enc: hash_encoded(enc, self._hash_key))

    @property
    def hash_key(self) -> tuple[int, int] | None:
        return self._hash_key

    def probe_hashed(self, enc: EncodedKeys, h: np.ndarray) -> np.ndarray:
        """Rows of the keys ``enc`` (hashes ``h`` under :attr:`hash_key`), -1 where absent."""
        if not self._n:
            return np.full(len(enc), -1, dtype=np.int64)
        try:
            return probe(enc, h, size=len(self._hash),
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
        flat, lengths = self.utf8_between(start, stop)
        try:
            return decode_keys(flat, lengths)
        except UnicodeDecodeError as exc:
            raise self._corrupt(exc) from None

    def utf8_between(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        if stop <= start:
            return np.zeros(0, np.uint8), np.zeros(0, np.int64)
        offsets = self._offsets.read(start, stop + 1)
        lengths = np.diff(offsets)
        try:
            if (lengths < 0).any() or offsets[-1] > self._nbytes:
                raise IndexError("key_offsets out of order")
            return self._utf8.read(int(offsets[0]), int(offsets[-1])), lengths
        except IndexError as exc:
            raise self._corrupt(exc) from None

    def stage_append(self, keys: list[str], stage: Path) -> list[tuple[str, str]]:
        """Write the key index and ``keys`` grown by ``keys`` (new and unique: the caller
        checked) into the empty directory ``stage``; nothing live changes.

        Returns ``(file under stage, live file in the table)`` pairs in the order they must
        replace the live files (the four index arrays, then ``keys``, each array's
        ``zarr.json`` after its chunks).  The caller's transaction moves them; then
        :meth:`committed` shows the new keys.  Arrays only grow, so the new chunk files
        cover every old one.
        """
        import zarr

        enc = encode_keys(keys, strict=True, first_row=self._n)
        m = len(enc)
        if not m:
            return []
        n, stage = self._n, Path(stage)
        g = zarr.open_group(str(stage), mode="a", use_consolidated=False)
        key = self._hash_key
        if key is None:  # a legacy emb64-v1 index (floodable): re-keyed with a salted hash
            key = new_hash_key()
        h = hash_encoded(enc, key)
        flat = enc.buf[: enc.nbytes]
        new_offsets = self._nbytes + np.cumsum(enc.lengths)
        # data past this snapshot (left by an older embstore's interrupted append) is dropped
        write_mapped(g, "key_utf8", self._nbytes + len(flat) + KEY_PAD, np.uint8,
                     concat_reader(Head(self._utf8, self._nbytes), flat,
                                   np.zeros(KEY_PAD, np.uint8)))
        write_mapped(g, "key_offsets", n + m + 1, np.int64,
                     concat_reader(Head(self._offsets, n + 1), new_offsets))
        if key != self._hash_key:
            old_h = self._row_hashes(key)
            old_rows = np.argsort(old_h, kind="stable")
            old_h = old_h[old_rows]
        else:
            old_h, old_rows = (self._hash.read(0, len(self._hash)),
                               self._order.read(0, len(self._order)))
        if len(old_h) != n:
            old_h, old_rows = old_h[old_rows < n], old_rows[old_rows < n]
        order = np.argsort(h, kind="stable")
        merged_h, merged_rows = merge_runs((old_h, old_rows),
                                           (h[order], np.arange(n, n + m, dtype=np.int64)[order]))
        write_mapped(g, "key_hash", n + m, np.uint64, lambda a, b: merged_h[a:b],
                     attrs=index_attrs(key))
        write_mapped(g, "key_order", n + m, np.int64, lambda a, b: merged_rows[a:b])
        moves = []
        for name in INDEX_ARRAYS:  # a loop per array
            chunks = sorted(os.listdir(stage / name / "c"), key=int) if (
                stage / name / "c").is_dir() else []
            moves += [(f"{name}/c/{c}", f"{name}/c/{c}") for c in chunks]
            moves.append((f"{name}/zarr.json", f"{name}/zarr.json"))
        return moves + stage_keys_array(self.path, stage, n, self.keys_between, keys)

    def _row_hashes(self, key: tuple[int, int], block: int = KEYS_CHUNK) -> np.ndarray:
        """The hashes under ``key`` of the keys of rows ``0..n-1``, in row order (by blocks)."""
        out = np.empty(self._n, dtype=np.uint64)
        for a in range(0, self._n, block):  # a loop per block of keys
            b = min(self._n, a + block)
            offs = self._offsets.read(a, b + 1)
            flat = self._utf8.read(int(offs[0]), int(offs[-1]))
            out[a:b] = hash_encoded(EncodedKeys(np.concatenate(
                [flat, np.zeros(KEY_PAD, np.uint8)]), offs[:-1] - offs[0], np.diff(offs)), key)
        return out

    def append(self, keys: list[str]) -> None:
        """Add keys for new rows, outside any table transaction (a bare key group): the
        files are staged, then moved into place one by one, which a crash can interrupt.
        Tables append through :meth:`stage_append` and their commit protocol."""
        import tempfile

        stage = Path(tempfile.mkdtemp(prefix=".embstore-stage-", dir=self.path))
        try:
            for staged, live in self.stage_append(keys, stage):
                (self.path / live).parent.mkdir(parents=True, exist_ok=True)
                replace(stage / staged, self.path / live)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        self.committed(self._n + len(keys))

    def committed(self, n: int) -> None:
        """Show the first ``n`` keys after a commit that grew the index (see above)."""
        self._n = int(n)
        self._map()

    def verify(self, block: int = KEYS_CHUNK) -> None:
        """Check every stored byte of the keys and their index (O(V)); CorruptStoreError if bad.

        Checksums (through zarr-python), offsets, sortedness, the permutation, every
        hash recomputed from the key bytes and ``keys`` equal to ``key_utf8``.  Streamed
        by blocks of ``block`` keys: memory is a few blocks plus one bit per key.
        """
        group = self._zarr_group("r")
        for name, arr in zip(INDEX_ARRAYS, (self._utf8, self._offsets, self._hash,
                                            self._order)):
            arr.verify(group, name)
        n = self._n
        sizes = (len(self._offsets), len(self._hash), len(self._order), len(self._utf8))
        if sizes != (n + 1, n, n, self._nbytes + KEY_PAD):
            raise CorruptStoreError(
                f"{self.path}: key index sizes (key_offsets, key_hash, key_order, key_utf8) "
                f"are {sizes}, expected {(n + 1, n, n, self._nbytes + KEY_PAD)} for {n} keys "
                "(an interrupted append? a later append repairs it)", path=self.path)
        bad = self._check_offsets(block)
        if bad is None and self._utf8.read(self._nbytes, self._nbytes + KEY_PAD).any():
            bad = f"the {KEY_PAD} bytes after the last key in key_utf8 are not zero"
        if bad is None:
            bad = self._check_sorted_permutation(block)
        if bad is not None:
            raise CorruptStoreError(f"{self.path}: {bad}", path=self.path)
        self._check_hashes(block)
        self._check_keys_array(group, block)

    def _check_offsets(self, block: int) -> str | None:
        prev = 0
        for a in range(0, self._n + 1, block):
            offsets = self._offsets.read(a, min(self._n + 1, a + block))
            if (a == 0 and offsets[0] != 0) or offsets[0] < prev or \
                    (offsets[1:] < offsets[:-1]).any():  # (an unsigned diff would wrap)
                return "key_offsets are not increasing from 0"
            prev = int(offsets[-1])
        return None

    def _check_sorted_permutation(self, block: int) -> str | None:
        n = self._n
        seen = np.zeros((n + 7) // 8, dtype=np.uint8)  # one bit per row
        prev = None
        for a in range(0, n, block):
            b = min(n, a + block)
            hashes, order = self._hash.read(a, b), self._order.read(a, b)
            if (hashes[1:] < hashes[:-1]).any() or (prev is not None and hashes[0] < prev):
                return f"key_hash is not sorted (in elements {a}..{b - 1})"
            prev = hashes[-1]
            if (order < 0).any() or (order >= n).any() or len(np.unique(order)) != len(order):
                return "key_order is not a permutation of the rows"
            byte, bit = order >> 3, (np.uint8(1) << (order & 7).astype(np.uint8))
            if (seen[byte] & bit).any():
                return "key_order is not a permutation of the rows"
            np.bitwise_or.at(seen, byte, bit)
        return None

    def _check_hashes(self, block: int) -> None:
        """Each stored hash equals the hash of its row's key bytes (rows gathered by block)."""
        for a in range(0, self._n, block):
            b = min(self._n, a + block)
            rows = self._order.read(a, b)
            starts = self._offsets.take(rows)
            lengths = self._offsets.take(rows + 1) - starts
            flat = self._utf8.take(segment_index(starts, lengths)[0])
            enc = EncodedKeys(np.concatenate([flat, np.zeros(KEY_PAD, np.uint8)]),
                              np.cumsum(lengths) - lengths, lengths)
            if not np.array_equal(hash_encoded(enc, self._hash_key), self._hash.read(a, b)):
                raise CorruptStoreError(f"{self.path}: key_hash disagrees with the keys (in "
                                        f"elements {a}..{b - 1})", path=self.path)

    def _check_keys_array(self, group, block: int) -> None:
        keys_arr = group["keys"]
        for a in range(0, self._n, block):
            b = min(self._n, a + block)
            try:
                stored = np.asarray(keys_arr[a:b]).astype(object)
            except ValueError as exc:
                raise CorruptStoreError(f"{self.path}/keys: {exc}", path=self.path) from None
            if stored.tolist() != self.keys_between(a, b):
                raise CorruptStoreError(f"{self.path}: 'keys' disagrees with key_utf8 in rows "
                                        f"{a}..{b - 1}", path=self.path)


"""KeyIndexWriter: writes ``keys`` and the key index of a new table (see :mod:`embstore.keys.index`).

Duplicates are found without a dict of all keys: hashes of the kept keys live
in sorted runs (merged geometrically, about 16 bytes a key), a hash match is
confirmed by comparing the key bytes, which wait in a temporary file beside the
group until ``finish`` writes them as Zarr arrays.
"""

from __future__ import annotations

import tempfile
from itertools import chain
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .vlen import plain_keys_codecs, write_keys_chunks
from .mapped import concat_reader, write_mapped
from .hashing import (KEY_PAD, encode_keys, hash_encoded, hash_key_attrs, merge_runs,
                      new_hash_key, probe, segment_index, sorted_first_occurrences,
                      words_from_bytes)

if TYPE_CHECKING:
    import zarr

__all__ = ["KeyIndexWriter", "KEYS_CHUNK", "INDEX_ARRAYS", "INDEX_ATTR", "index_attrs"]

KEYS_CHUNK = 65536
INDEX_ARRAYS = ("key_utf8", "key_offsets", "key_hash", "key_order")
INDEX_ATTR = "embstore_key_index"


def index_attrs(hash_key: tuple[int, int] | None) -> dict:
    """Attributes of ``key_hash``: the hash and its key (None: the legacy ``emb64-v1``)."""
    return {INDEX_ATTR: hash_key_attrs(hash_key)}


def _local_dir(group: zarr.Group) -> Path | None:
    root = getattr(group.store, "root", None)
    if root is None:
        return None
    return Path(root) / group.path if group.path else Path(root)


def _create_keys_array(group: zarr.Group, chunk: int) -> zarr.Array:
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return group.create_array("keys", shape=(0,), chunks=(chunk,), dtype=str,
                              compressors=[ZstdCodec(level=3), Crc32cCodec()],
                              overwrite=True, dimension_names=("key",))


class _Spill:
    """An append-only temporary file of one dtype, readable as a memory map."""

    def __init__(self, directory, dtype):
        self.dtype = np.dtype(dtype)
        self.file = tempfile.TemporaryFile(dir=directory, prefix=".embstore-keys-")
        self.n = 0
        self._map: np.ndarray | None = None

    def append(self, arr: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(arr, dtype=self.dtype).tobytes())
        self.n += len(arr)
        self._map = None

    def view(self) -> np.ndarray:
        if self._map is None or len(self._map) != self.n:
            self.file.flush()
            self._map = (np.memmap(self.file, dtype=self.dtype, mode="r", shape=(self.n,))
                         if self.n else np.empty(0, dtype=self.dtype))
        return self._map

    def close(self) -> None:
        self._map = None
        self.file.close()


DUPLICATE_EXAMPLES = 5  # dropped keys a writer remembers, to name them


class KeyIndexWriter:
    """Writes ``keys`` and the key index of a new table, block by block, dropping duplicates.

    Memory: about 16 bytes per kept key (hashes and rows, as sorted runs) plus one
    block; the keys' bytes and offsets go to temporary files beside the group.
    """

    def __init__(self, group: zarr.Group, *, expected: int | None = None):
        self.group = group
        self.duplicates = 0
        self.duplicate_keys: list[str] = []  # the first few dropped (DUPLICATE_EXAMPLES)
        self._n = 0          # kept keys
        self._offered = 0    # keys given to add()
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        directory = _local_dir(group)
        self._dir = directory if directory is not None and directory.is_dir() else None
        self._utf8 = _Spill(self._dir, np.uint8)
        self._offsets = _Spill(self._dir, np.int64)
        self._offsets.append(np.zeros(1, dtype=np.int64))
        chunk = KEYS_CHUNK if expected is None else int(min(KEYS_CHUNK, max(1024, expected)))
        self._keys = _create_keys_array(group, chunk)
        self._keys_chunk = chunk
        # local and embstore's codecs: the chunks written directly (zarr's bytes, 10x faster)
        self._keys_dir = None if self._dir is None or not plain_keys_codecs(
            self._keys.metadata.to_dict()) else self._dir / "keys"
        self._keys_written = 0
        self._pending: list[list[str]] = []
        self._pending_n = 0
        self._done = False
        self.hash_key = new_hash_key()  # siphash-1-3 with a key of this table's own

    def add(self, keys: Sequence[str]) -> np.ndarray:
        """Take the next block of keys (row order); returns the keep mask (False: duplicate)."""
        if self._done:
            raise RuntimeError("KeyIndexWriter.add after finish()")
        key_list = keys if isinstance(keys, list) else list(keys)
        enc = encode_keys(key_list, strict=True, first_row=self._offered)
        self._offered += len(enc)
        h = hash_encoded(enc, self.hash_key)
        keep, perm = sorted_first_occurrences(enc, h)
        cand = np.flatnonzero(keep)
        if self._runs and cand.size:
            utf8, offsets = self._utf8.view(), self._offsets.view()
            for run_h, run_rows in self._runs:
                rows = probe(enc.subset(cand), h[cand], size=len(run_h),
                             search=lambda v, a=run_h: np.searchsorted(a, v),
                             hash_at=run_h.__getitem__, row_at=run_rows.__getitem__,
                             offset_at=offsets.__getitem__,
                             word_at=words_from_bytes(utf8.__getitem__, len(utf8)),
                             row_limit=len(offsets) - 1, visible=len(offsets) - 1,
                             nbytes=len(utf8))
                found = rows >= 0
                if found.any():
                    keep[cand[found]] = False
                    cand = cand[~found]
                    if not cand.size:
                        break
        kept = np.flatnonzero(keep)
        self.duplicates += len(enc) - len(kept)
        room = DUPLICATE_EXAMPLES - len(self.duplicate_keys)
        if room > 0 and kept.size < len(enc):  # a few dropped keys, to name in messages
            self.duplicate_keys += [key_list[i] for i in np.flatnonzero(~keep)[:room]]
        if not kept.size:
            return keep
        lengths = enc.lengths[kept]
        if kept.size == len(enc):
            flat = enc.buf[: enc.nbytes]
        else:
            flat = enc.buf[segment_index(enc.starts[kept], lengths)[0]]
        self._utf8.append(flat)
        self._offsets.append(self._utf8.n - len(flat) + np.cumsum(lengths))
        rows = np.arange(self._n, self._n + kept.size, dtype=np.int64)
        order = perm if kept.size == len(enc) else np.argsort(h[kept], kind="stable")
        self._runs.append((h[kept][order], rows[order]))
        while len(self._runs) >= 2 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            b = self._runs.pop()
            self._runs[-1] = merge_runs(self._runs[-1], b)
        self._n += kept.size
        self._queue_keys(key_list if kept.size == len(enc) else
                         [key_list[i] for i in kept.tolist()])
        return keep

    def _queue_keys(self, keys: list[str]) -> None:
        self._pending.append(keys)
        self._pending_n += len(keys)
        if self._pending_n >= self._keys_chunk:
            self._flush_keys(final=False)

    def _flush_keys(self, *, final: bool) -> None:
        if not self._pending_n:
            return
        pending = list(chain.from_iterable(self._pending)) if len(self._pending) > 1 \
            else self._pending[0]
        take = len(pending) if final else len(pending) // self._keys_chunk * self._keys_chunk
        start = self._keys_written
        if self._keys_dir is not None and self._keys_dir.is_dir():  # (its shape: at finish)
            write_keys_chunks(self._keys_dir, self._keys_chunk, start // self._keys_chunk,
                              pending[:take])
        else:
            self._keys.resize((start + take,))
            self._keys[start:start + take] = np.array(pending[:take], dtype=object)
        self._keys_written += take
        rest = pending[take:]
        self._pending = [rest] if len(rest) else []
        self._pending_n = len(rest)

    def __len__(self) -> int:
        return self._n

    def finish(self) -> None:
        """Write the rest of ``keys`` and the key index arrays into the group."""
        if self._done:
            return
        try:
            self._flush_keys(final=True)
            if self._keys.shape[0] != self._keys_written:
                self._keys.resize((self._keys_written,))
            h, rows = np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
            for run in self._runs:  # oldest (largest) first
                h, rows = merge_runs((h, rows), run)
            self._runs = []
            g, n = self.group, self._n
            utf8, offsets = self._utf8.view(), self._offsets.view()
            write_mapped(g, "key_utf8", len(utf8) + KEY_PAD, np.uint8,
                         concat_reader(utf8, np.zeros(KEY_PAD, np.uint8)))
            write_mapped(g, "key_offsets", n + 1, np.int64, lambda a, b: offsets[a:b])
            write_mapped(g, "key_hash", n, np.uint64, lambda a, b: h[a:b],
                         attrs=index_attrs(self.hash_key))
            write_mapped(g, "key_order", n, np.int64, lambda a, b: rows[a:b])
        finally:
            self.close()

    def close(self) -> None:
        """Drop the temporary files (``finish`` calls it; call it to abandon an import)."""
        self._done = True
        self._runs = []
        self._pending = []
        self._utf8.close()
        self._offsets.close()

"""Keys written by another Zarr tool: a plain ``keys`` string array and no key index.

The contract allows such a group (``vectors`` plus a 1-D Zarr string array ``keys``).
:func:`build_key_index` writes the key index of :mod:`embstore.keys.index` from it (a
table opened ``r+``, or ``embstore reindex``); a read-only open indexes the keys in
memory instead (:class:`MemoryKeyIndex`), with the same hash and probe.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CorruptStoreError
from ..table import Vocab
from .hashing import KEY_PAD, encode_keys, hash_encoded, new_hash_key, probe, word_view
from .mapped import write_mapped
from .writer import KEYS_CHUNK, index_attrs

if TYPE_CHECKING:
    import zarr

__all__ = ["MemoryKeyIndex", "build_key_index", "has_key_index", "read_key_array"]

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


def _index_arrays(keys: np.ndarray, *, strict: bool, hash_key: tuple[int, int]):
    """``(encoded keys, offsets, sorted hashes, their rows)`` of all ``keys``, vectorised."""
    enc = encode_keys(keys.tolist(), strict=strict)
    hashes = hash_encoded(enc, hash_key)
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
        self._hash_key = new_hash_key()  # siphash-1-3, as a stored index: no flood
        enc, self._offsets, self._hash, self._order = _index_arrays(
            keys, strict=False, hash_key=self._hash_key)
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
        return probe(enc, hash_encoded(enc, self._hash_key), size=n,
                     search=self._hash.searchsorted,
                     hash_at=self._hash.take, row_at=self._order.take,
                     offset_at=self._offsets.take, word_at=self._words, row_limit=n,
                     visible=n, nbytes=self._nbytes)

    def key_at(self, ids: np.ndarray) -> list[str]:
        return self._keys[np.asarray(ids, dtype=np.int64).reshape(-1)].tolist()

    def keys_between(self, start: int, stop: int) -> list[str]:
        return self._keys[start:max(start, stop)].tolist()

    def close(self, *, final: bool = False) -> None:
        pass


def build_key_index(path, n: int, group: zarr.Group | None = None) -> None:
    """Write the key index of the first ``n`` entries of the group's plain ``keys`` array
    (replacing any index there).  ``key_hash`` is written last: until it is in place,
    readers index the keys in memory."""
    import zarr

    path = Path(path)
    keys = read_key_array(path, n)
    hash_key = new_hash_key()
    enc, offsets, hashes, order = _index_arrays(keys, strict=True, hash_key=hash_key)
    g = group if group is not None else zarr.open_group(str(path), mode="r+",
                                                        use_consolidated=False)
    if has_key_index(path):  # rebuilding: readers fall back to memory, never a mixed index
        shutil.rmtree(path / "key_hash")  # (open memory maps keep the old files alive)
    buf = enc.buf[: enc.nbytes + KEY_PAD]  # encode_keys ends the buffer with KEY_PAD zeros
    write_mapped(g, "key_utf8", len(buf), np.uint8, lambda a, b: buf[a:b], path=path)
    write_mapped(g, "key_offsets", n + 1, np.int64, lambda a, b: offsets[a:b], path=path)
    write_mapped(g, "key_order", n, np.int64, lambda a, b: order[a:b], path=path)
    write_mapped(g, "key_hash", n, np.uint64, lambda a, b: hashes[a:b],
                 attrs=index_attrs(hash_key),
                 path=path)

"""The key index of a table on object storage, read by ranges (:mod:`embstore.store.remote.ranged`).

:class:`ObjectRanges` is the :class:`~embstore.store.remote.ranged.RangeReader` over the table's
object-store client: ranged GETs issued concurrently (the blocks of one batch of keys are
coalesced by the array), small objects fetched at once, and the on-disk chunk cache
(``cache_dir=``) in front, so a second process looks keys up without a request.

Tables uploaded before the block sidecars existed (embstore 0.2.0) have none: their key
arrays are then downloaded once (:func:`download_key_arrays`), as that release did.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from ...errors import CorruptStoreError, FormatError
from ...fs.atomic import replace
from ...keys.index import DiskVocab, MemoryKeyIndex
from .ranged import RangedVocab, sidecar_name
from ...keys.writer import INDEX_ARRAYS
from ..place.chunkcache import ChunkCache
from ..place.objstore import ObjectClient
from ...dtypes import SIDE_ARRAYS

__all__ = ["RemoteKeys", "ObjectRanges", "open_remote_vocab", "download_key_arrays"]


class ObjectRanges:
    """Ranged reads of one table's objects through ``client`` (and ``cache``, if any)."""

    def __init__(self, client: ObjectClient, cache: ChunkCache | None):
        self.client, self.cache = client, cache
        self._fetched: dict[str, bytes] = {}  # small objects fetched ahead, used once

    def where(self, rel: str) -> str:
        return self.client.where(rel)

    def get_objects(self, rels: list[str]) -> list[bytes | None]:
        def one(rel: str) -> bytes | None:
            hit = self._fetched.pop(rel, None)
            if hit is None and self.cache is not None:
                hit = self.cache.get(rel, "whole")
            if hit is not None:
                return hit
            data = self.client.get(rel)
            if data is not None and self.cache is not None:
                self.cache.put(rel, "whole", data)
            return data

        return self.client.map(one, rels)

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list:
        return self.client.map(lambda r: self.client.get_range(*r), requests)

    def cached(self, rel: str, name: str) -> bytes | None:
        return None if self.cache is None else self.cache.get(rel, name)

    def keep(self, rel: str, name: str, data) -> None:
        if self.cache is not None:
            self.cache.put(rel, name, data)

    def ahead(self, rel: str, data: bytes | None) -> None:
        """``data`` of ``rel`` fetched already: the next :meth:`get_objects` uses it."""
        if data is not None:
            self._fetched[rel] = data

    def metas(self, names, raws: list[bytes | None]) -> dict[str, dict]:
        """The ``zarr.json`` documents ``raws`` of the arrays ``names``, parsed."""
        out = {}
        for name, raw in zip(names, raws):
            rel = f"{name}/zarr.json"
            where = self.where(rel)
            if raw is None:
                raise CorruptStoreError(f"{self.client.url}: the key index array {name!r} is "
                                        "missing", path=self.client.url)
            try:
                doc = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                raise CorruptStoreError(f"{where}: broken JSON ({exc})", path=where) from None
            if not isinstance(doc, dict):
                raise CorruptStoreError(f"{where}: expected a JSON object", path=where)
            out[name] = doc
        return out


def _rows_of(meta: dict, where: str) -> int:
    shape = meta.get("shape")
    if not (isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int)):
        raise CorruptStoreError(f"{where}: 'keys' must be a 1-D array, got shape {shape!r}",
                                path=where)
    return int(shape[0])


def open_remote_vocab(client: ObjectClient, cache: ChunkCache | None, rows: int,
                      fallback) -> DiskVocab | MemoryKeyIndex | None:
    """The key index of the remote table: read by ranges when it has block sidecars, else
    (an older upload) through ``fallback()``, a local folder holding the key arrays."""
    reader = ObjectRanges(client, cache)
    # one round: the five array documents and the first sidecar of each index array (does
    # the table have them? a lookup needs all four)
    names = ["keys", *INDEX_ARRAYS]
    sides = [sidecar_name(name, 0) for name in INDEX_ARRAYS]
    got = reader.get_objects([f"{n}/zarr.json" for n in names] + sides)
    if got[0] is None:
        return None
    if all(raw is None for raw in got[len(names):]):
        return DiskVocab.open(None, fallback(), rows=rows, writable=False)
    metas = reader.metas(names, got[:len(names)])
    for rel, raw in zip(sides, got[len(names):]):
        reader.ahead(rel, raw)
    n = min(_rows_of(metas["keys"], client.where("keys/zarr.json")), int(rows))
    return RangedVocab(reader, metas, n, group=_LazyGroup(client))


class _LazyGroup:
    """The table's Zarr group over the object store, opened when first indexed (verify
    reads ``keys`` through zarr-python)."""

    def __init__(self, client: ObjectClient):
        self.client = client
        self._group: Any = None

    def __getitem__(self, name: str):
        if self._group is None:
            import zarr
            from zarr.storage import ObjectStore

            store = ObjectStore(self.client.prefixed_store(), read_only=True)
            self._group = zarr.open_group(store=store, mode="r", use_consolidated=False)
        return self._group[name]


def download_key_arrays(client: ObjectClient, cache: ChunkCache | None) -> Path:
    """Every object but the row arrays, downloaded once into a local folder (the chunk
    cache's when there is one, shared by processes: downloaded beside, renamed into place;
    else a temporary folder, the caller's to remove)."""
    final = None if cache is None else Path(cache.dir) / "key-index"
    if final is not None and (final / "zarr.json").is_file():
        return final
    parent = Path(cache.dir) if cache is not None else None
    tmp = Path(tempfile.mkdtemp(prefix=".keys-", dir=parent))
    try:
        rels = [r for r, _ in client.list() if not r.startswith(
            ("vectors/", *(f"{name}/" for name in SIDE_ARRAYS)))]

        def get(rel: str) -> None:
            data = client.get(rel)
            if data is None:
                raise FormatError(f"{rel} vanished while being read (is the table "
                                  "being replaced?)", path=client.url)
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)

        client.map(get, rels)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final is None:
        return tmp
    try:
        replace(tmp, final, keep_existing=True)
    except OSError:  # another process was first: its copy is the same
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class RemoteKeys:
    """The key index of a table on object storage (``place``): read by ranges, or from its
    arrays downloaded once when the upload has no block sidecars (a temporary folder, removed
    on :meth:`close`, unless the place has an on-disk cache)."""

    def __init__(self, place: Any):
        self.place = place
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._tmp: Path | None = None

    def vocab(self, rows: int):
        """The key index (None when the table has no keys)."""
        return open_remote_vocab(self.place.client, self.place.cache, rows, self._folder)

    def _folder(self) -> Path:
        with self._lock:
            if self._dir is None:
                self._dir = download_key_arrays(self.place.client, self.place.cache)
                if self.place.cache is None:
                    self._tmp = self._dir
            return self._dir

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = self._dir = None

"""A table on object storage: :class:`ObjectStore`.

Objects are read by ranged GETs (:class:`~embstore.store.place.objstore.ObjectClient`:
S3 and compatible through obstore, a helper process after ``fork``), many in flight at once;
the layouts coalesce their ranges by the place's cost model (:mod:`.costs`: a gap shorter
than what a connection moves in one request's latency is read through) and keep what they
fetch in the on-disk chunk cache (``cache_dir=``, :mod:`.chunkcache`), shared by processes.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from ...errors import CorruptStoreError, FormatError
from .objstore import ObjectClient
from .base import Place
from .chunkcache import ChunkCache
from .costs import DEFAULT, CostModel

__all__ = ["ObjectStore", "parse_json"]


class ObjectStore(Place):
    """The objects of the table at ``client.url``."""

    def __init__(self, client: ObjectClient, *, cache: ChunkCache | None = None,
                 costs: CostModel = DEFAULT):
        self.client = client
        self.url = client.url
        self.cache = cache
        self.costs = costs

    def where(self, rel: str = "") -> str:
        return self.client.where(rel)

    def get(self, rel: str, limit: int | None = None) -> bytes | None:
        data = self.client.get(rel)
        if data is not None and limit is not None and len(data) > limit:
            raise CorruptStoreError(f"{self.where(rel)}: {len(data)} bytes, more than the "
                                    f"{limit} expected", path=self.where(rel))
        return data

    readers = 8  # (a whole-table pass: requests in flight, 8 MiB each at most)

    def exists(self, rel: str) -> bool:
        return self.client.head(rel) is not None

    def names(self, rel: str) -> list[str]:
        cut = len(rel.rstrip("/")) + 1
        return [name[cut:] for name, _ in self.client.list(rel.rstrip("/"))]

    def size(self, rel: str) -> int | None:
        meta = self.client.head(rel)
        return None if meta is None else int(meta["size"])

    def get_json(self, rel: str, what: str) -> dict:
        return parse_json(self.client.get(rel), self.where(rel), what, self.url)

    def get_range(self, rel: str, start: int, stop: int) -> Any:
        return self.client.get_range(rel, start, stop)

    def get_tail(self, rel: str, n: int) -> tuple[Any, int] | None:
        got = self.client.get_tail(rel, n)
        if got is None:
            return None
        return got[0], got[1]

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        return self.client.map(fn, items)

    def peek(self, obj: str, name: str, check: Callable[[Any], Any]) -> Any:
        if self.cache is None:
            return None
        hit = self.cache.get(obj, name)
        if hit is None:
            return None
        try:
            return check(hit)
        except CorruptStoreError:
            self.cache.drop(obj, name)  # damaged in the cache: fetched again
            return None

    def cached(self, obj: str, name: str, load: Callable[[], bytes],
               check: Callable[[Any], Any]) -> Any:
        """``check(bytes)`` of cache entry ``name`` of object ``obj``, else of ``load()``
        (then kept in the cache): an entry that fails its check is dropped and loaded again."""
        got = self.peek(obj, name, check)
        if got is not None:
            return got
        data = load()
        got = check(data)
        if self.cache is not None:
            self.cache.put(obj, name, data)
        return got

    def close(self) -> None:
        self.client.close()


def parse_json(raw: bytes | None, where: str, what: str, url: str) -> dict:
    """Metadata fetched as a JSON object (``raw`` None: missing)."""
    if raw is None:
        raise FormatError(f"not an embstore table: {what} is missing", path=url)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorruptStoreError(f"{where}: broken JSON ({exc})", path=where) from None
    if not isinstance(doc, dict):
        raise CorruptStoreError(f"{where}: expected a JSON object", path=where)
    return doc

"""Row caches: the vectorised LRU with a byte budget (``rows``) and the cache of a table opened
with ``cache_bytes=0`` (``null``)."""

from __future__ import annotations

from .null import NullCache, make_cache
from .rows import CacheInfo, RowCache, parse_bytes

__all__ = ["CacheInfo", "RowCache", "NullCache", "make_cache", "parse_bytes"]

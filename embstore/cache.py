"""Row cache statistics (the LRU row cache itself lives here too)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CacheInfo"]


class CacheInfo(NamedTuple):
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0

"""The row cache a table gets: :func:`make_cache` picks a :class:`~embstore.cache.rows.RowCache`,
or a :class:`NullCache` when the budget holds no row (``cache_bytes=0``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .rows import CacheInfo, RowCache

__all__ = ["NullCache", "make_cache"]


class NullCache:
    """The row cache of a table opened with ``cache_bytes=0``: every row is read."""

    slots = 0
    cheap_reads = False
    reads_cold: Callable[[], bool] | None = None  # set by the table; unused here

    def gather(self, ids: np.ndarray, out: np.ndarray | None,
               fetch: Callable[[np.ndarray, np.ndarray], None],
               take: Callable[[np.ndarray], np.ndarray] | None = None,
               owner: object = None) -> np.ndarray:
        """As :meth:`RowCache.gather` with nothing cached: ``take(ids)`` or ``fetch``."""
        if out is None and take is not None:
            return take(ids)
        if out is None:
            raise ValueError("NullCache.gather needs out= or take=")
        if ids.size:
            fetch(ids, out)
        return out

    def warm(self, ids: np.ndarray, fetch, *, block: int = 65536, owner: object = None) -> int:
        return 0

    def bind(self, owner: object) -> None:
        pass

    def invalidate(self, ids: np.ndarray) -> None:
        pass

    def resize_for(self, rows: int | None) -> None:
        pass

    def clear(self, *, keep_stats: bool = False) -> None:
        pass

    def info(self) -> CacheInfo:
        return CacheInfo()


def make_cache(capacity_bytes: int, dim: int, dtype,
               rows: int | None = None) -> RowCache | NullCache:
    """A :class:`RowCache` of ``capacity_bytes`` for a table of ``rows`` rows, or a
    :class:`NullCache` when it holds no row."""
    if not capacity_bytes or RowCache(capacity_bytes, dim, dtype).slots == 0:
        return NullCache()  # the budget holds no row
    return RowCache(capacity_bytes, dim, dtype, rows)

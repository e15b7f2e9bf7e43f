"""Where a table's bytes live, one file a medium: ``base`` (the :class:`Place` seam the
layouts read through), ``local`` (a directory: files read and mapped), ``objects`` (object
storage: ranged requests, concurrent), ``costs`` (what a request and a byte cost: how
ranges coalesce), ``chunkcache`` (object storage's on-disk cache, shared by processes)."""

from .base import Place

__all__ = ["Place"]

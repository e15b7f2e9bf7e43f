"""One module per scenario: ``NAME``, ``TITLE`` and ``run(ctx, res)``."""

from __future__ import annotations

from . import (batch, changes, compact, format2, import_compressed, import_w2v, keys, limits, lookup, ooc,
               ooc_zipf, open_time, parquet, remote, save, scale, scans, search, train, waits)

SCENARIOS = {m.NAME: m for m in (lookup, scale, ooc, ooc_zipf, open_time, keys, import_w2v,
                                 import_compressed, batch, limits, compact, remote, search,
                                 parquet, format2, changes, save, scans, train, waits)}

__all__ = ["SCENARIOS"]

"""The on-disk backend (docs/FORMAT.md): sharded Zarr v3 ``vectors`` and what lives beside them.

- ``table``: :class:`ZarrTable` and ``open``; ``build``: ``create``/``save``
- ``source``: where rows are read (row sources); ``writer``: :class:`TableWriter`
- ``meta``: read and check ``zarr.json``; ``codecs``: the layout, chunk codecs and checksums
- ``verify``: every stored byte checked; ``scan``, ``prefetch``: whole-table scans, cold reads
- ``lock``, ``commit``: one writer at a time; all-or-nothing writes, recovery (``repair``)
- ``shard/``: local shard files (index, mapped gathers, compressed chunks, streaming, rewrites)
- ``remote/``: tables on object storage; ``norms/``: stored row norms; ``subword/``: fastText n-grams
"""

from __future__ import annotations

from .commit import repair
from .build import create, save
from .table import ZarrTable, open  # noqa: A004
from .verify import Damage, VerifyReport
from .remote.verify import verify
from .writer import TableWriter

__all__ = ["ZarrTable", "TableWriter", "create", "save", "open", "verify", "VerifyReport",
           "Damage", "repair"]

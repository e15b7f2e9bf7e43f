"""The on-disk backend (docs/FORMAT.md): sharded Zarr v3 ``vectors`` and what lives beside them.

- ``table``: :class:`ZarrTable` and ``open``; ``build``: ``create``/``save``/``upgrade``
- ``source``: where rows are read (row sources); ``writer``: :class:`TableWriter`
- ``meta``: read and check ``zarr.json``; ``codecs``: the layout, chunk codecs and checksums
- ``verify``: every stored byte checked; ``scan``: whole-table scans
- ``lock``, ``commit``: one writer at a time; all-or-nothing writes, recovery (``repair``)
- ``rows/``: format-2 row arrays (fixed stride, page checksums); ``base``: the row-source
  interface
- ``shard/``: local shard files (index, mapped gathers, compressed chunks, streaming, rewrites,
  cold reads asked for at once: ``prefetch``)
- ``remote/``: tables on object storage; ``norms/``: stored row norms; ``subword/``: fastText n-grams
"""

from __future__ import annotations

from .versions.commit import repair
from .build import create, save, upgrade
from .table import ZarrTable, open  # noqa: A004
from .verify import Damage, VerifyReport
from .remote.verify import verify
from .writer import TableWriter

__all__ = ["ZarrTable", "TableWriter", "create", "save", "open", "verify", "VerifyReport",
           "Damage", "repair", "upgrade"]

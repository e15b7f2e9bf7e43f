"""The on-disk backend (docs/FORMAT.md): one versioned table format over Zarr v3, its row
arrays in one of two layouts, its bytes in one of two places.

- ``table``: :class:`ZarrTable` and ``open``; ``build``: ``create``/``save``/``upgrade``
- ``source``: where rows are read (one row source per layout, plus zarr-python's for
  layouts of other tools); ``base``: the row-source interface; ``writer``: :class:`TableWriter`
- ``rows/``: the row-array layout (fixed stride, a crc32c per page); ``shard/``: the sharded
  layout (index, mapped gathers, compressed chunks, streaming, copy-on-write rewrites, cold
  reads asked for at once: ``prefetch``)
- ``versions/``: every table's commits (``commit``: the journal, ``repair``), snapshots,
  deltas over either layout, key deltas, retention, and what a handle does with them
- ``meta``: read, check and write ``zarr.json``; ``codecs``: the sharded layout, codecs, checksums
- ``place/``: where the bytes live (a local directory, object storage) behind one seam,
  the writer lock of a local table (``place.lock``)
- ``verify``: every stored byte checked, through the place; ``scan``: whole-table scans
- ``remote/``: what only object storage needs (opening, the key index by ranges, upload);
  ``norms/`` and ``stored_norms``: stored row norms; ``subword/``: fastText n-grams;
  ``annfiles``: the approximate index's files and their checks
"""

from __future__ import annotations

from .versions.commit import repair
from .build import create, save, upgrade
from .table import ZarrTable, open  # noqa: A004
from .verify import Damage, VerifyReport, verify
from .writer import TableWriter

__all__ = ["ZarrTable", "TableWriter", "create", "save", "open", "verify", "VerifyReport",
           "Damage", "repair", "upgrade"]

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

import sys
import types
from typing import TYPE_CHECKING, Any

from ..optional import lazy_attributes

if TYPE_CHECKING:
    from .build import create, save, upgrade
    from .table import ZarrTable, open  # noqa: A004
    from .verify import Damage, VerifyReport, verify
    from .versions.commit import repair
    from .writer import TableWriter

__all__ = ["ZarrTable", "TableWriter", "create", "save", "open", "verify", "VerifyReport",
           "Damage", "repair", "upgrade"]

# the module that defines each public name, imported on first use (as embstore/__init__):
# importing one module of the store (``store.place.objstore``, ``store.table``) loads what
# that module needs, not every layout, version and verify module
_LAZY = {"repair": ".versions.commit", "create": ".build", "save": ".build",
         "upgrade": ".build", "ZarrTable": ".table", "open": ".table", "Damage": ".verify",
         "VerifyReport": ".verify", "verify": ".verify", "TableWriter": ".writer"}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)


class _Store(types.ModuleType):
    """The package's module object: ``verify`` names both the function and its subpackage,
    and the import system binds a subpackage on its parent once loaded (``store.verify =
    <module>``); the function keeps the name, as when this package imported it eagerly
    (and loading ``verify.report`` alone does not load the function's module)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == f".{name}":
            if name not in vars(value):  # a lazy subpackage (``verify``) that has not loaded
                return  # its function yet: it comes on first use (``__getattr__``)
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Store

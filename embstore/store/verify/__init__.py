"""``embstore.verify(path)``: check every stored byte of a table.

- ``run``: :func:`verify` itself, the walk over a table's arrays, versions and indexes
- ``report``: :class:`VerifyReport`, :class:`Damage`, and :func:`checksum_status` (which
  arrays carry checksums: what ``embstore info`` shows without verifying anything)
- ``media``: what differs by where the table lives, one class a medium
- ``tree``: the checks of the key index, the stored norms, the versions and the
  approximate index

Each name is imported on first use (PEP 562): ``embstore info`` loads ``report`` alone,
not the walk and every layout's checks with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...optional import lazy_attributes

if TYPE_CHECKING:
    from .report import Damage, VerifyReport, checksum_status, checksummed
    from .run import verify

__all__ = ["Damage", "VerifyReport", "verify", "checksummed", "checksum_status"]

_LAZY = {"verify": ".run", "Damage": ".report", "VerifyReport": ".report",
         "checksummed": ".report", "checksum_status": ".report"}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)

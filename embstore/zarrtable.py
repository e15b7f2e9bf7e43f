"""Moved: the on-disk backend lives in :mod:`embstore.store` (kept for old imports)."""

from __future__ import annotations

from .store.build import create, save
from .store.table import ZarrTable, open  # noqa: A004
from .store.verify import Damage, VerifyReport, verify
from .store.writer import TableWriter

__all__ = ["ZarrTable", "TableWriter", "create", "save", "open", "verify", "VerifyReport",
           "Damage"]

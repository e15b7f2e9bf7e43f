"""``float16``, ``float32``, ``float64``: rows stored as they are, looked up as they are."""

from __future__ import annotations

from .base import StorageDtype

__all__ = ["FLOAT16", "FLOAT32", "FLOAT64"]

FLOAT16 = StorageDtype("float16")
FLOAT32 = StorageDtype("float32", golden="golden-v1-none")
FLOAT64 = StorageDtype("float64")

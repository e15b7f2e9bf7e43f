"""Moved: the on-disk key index lives in :mod:`embstore.keys` (kept for old imports)."""

from __future__ import annotations

from .keys.index import INDEX_ARRAYS, DiskVocab
from .keys.writer import KeyIndexWriter

__all__ = ["KeyIndexWriter", "DiskVocab", "INDEX_ARRAYS"]

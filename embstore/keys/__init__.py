"""Keys <-> row ids on disk: ``hashing`` (key hashes, probes), ``mapped`` (memory-mapped
index arrays), ``index`` (:class:`DiskVocab`, the reader), ``writer`` (:class:`KeyIndexWriter`)."""

from __future__ import annotations

from .index import DiskVocab
from .writer import KeyIndexWriter

__all__ = ["DiskVocab", "KeyIndexWriter"]

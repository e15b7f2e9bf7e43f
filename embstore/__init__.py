"""embstore: embedding tables larger than RAM.

Sharded Zarr v3 storage, fast row lookup by id or key with a bounded LRU row
cache, an in-memory NumPy backend with the same contract, the operations of a
model's embedding layer, import/export of the common formats and offline batch
lookup jobs.
"""

from __future__ import annotations

from .cache import CacheInfo
from .errors import (CorruptStoreError, DestinationExistsError, EmbstoreError, FormatError,
                     InvalidIdError, KeyNotFoundError, ReadOnlyError, ShapeMismatchError)
from .memory import MemoryTable
from .table import Table

__version__ = "0.1.0"


def embedding_lookup(table_or_array, ids, out=None):
    """Rows of ``table_or_array`` (a :class:`Table` or a 2-D array) for ``ids`` of any shape."""
    table = table_or_array if isinstance(table_or_array, Table) else MemoryTable(table_or_array)
    return table.lookup(ids, out=out)


__all__ = [
    "Table", "MemoryTable", "CacheInfo", "embedding_lookup",
    "EmbstoreError", "InvalidIdError", "KeyNotFoundError", "CorruptStoreError",
    "ReadOnlyError", "FormatError", "ShapeMismatchError", "DestinationExistsError",
]

try:  # the on-disk backend (embstore/zarrtable.py)
    from .zarrtable import ZarrTable, create, open, save, verify  # noqa: A004
    __all__ += ["ZarrTable", "create", "open", "save", "verify"]
except ImportError as _exc:  # pragma: no cover - only while the backend is being built
    if "zarrtable" not in str(_exc):
        raise

try:  # the embedding layer (embstore/layer.py)
    from .layer import Embedding
    __all__ += ["Embedding"]
except ImportError as _exc:  # pragma: no cover
    if "layer" not in str(_exc):
        raise

"""embstore: embedding tables larger than RAM.

Sharded Zarr v3 storage, fast row lookup by id or key with a bounded LRU row
cache, an in-memory NumPy backend with the same contract, the operations of a
model's embedding layer, import/export of the common formats and offline batch
lookup jobs.
"""

from __future__ import annotations

from ._version import __version__
from .batch import lookup_file
from .cache.rows import CacheInfo
from .convert import ExportResult, ImportResult, export_table, import_file
from .search.analogy import normalized
from .search.ann import StaleIndexWarning, build_index
from .errors import (ClosedTableError, ConflictError, CorruptStoreError, DestinationExistsError, EmbstoreError,
                     FormatError, IndexNotFoundError, InvalidIdError, InvalidOptionError, KeyNotFoundError,
                     LockTimeoutError, MissingDependencyError, NotATableError, ReadOnlyError,
                     ResourceLimitError, ResultTooLargeError, ShapeMismatchError,
                     TableChangedError, InvalidTypeError)
from .gensim import from_gensim, to_gensim
from .layer import Embedding
from .memory import MemoryTable
from .store import (TableWriter, VerifyReport, ZarrTable, create, open, repair,  # noqa: A004
                    save, upgrade, verify)
from .table import Table

__all__ = [
    "__version__",
    "Table", "MemoryTable", "ZarrTable", "CacheInfo",
    "open", "create", "save", "upgrade", "verify", "repair", "VerifyReport", "TableWriter",
    "embedding_lookup", "Embedding",
    "import_file", "export_table", "ImportResult", "ExportResult", "lookup_file",
    "from_gensim", "to_gensim",
    "EmbstoreError", "InvalidIdError", "KeyNotFoundError", "CorruptStoreError",
    "ReadOnlyError", "FormatError", "NotATableError", "ShapeMismatchError", "DestinationExistsError",
    "LockTimeoutError", "MissingDependencyError", "ClosedTableError", "InvalidOptionError",
    "ResultTooLargeError", "ResourceLimitError", "TableChangedError", "InvalidTypeError", "ConflictError",
    "build_index", "StaleIndexWarning", "IndexNotFoundError", "normalized",
]


def embedding_lookup(table_or_array, ids, out=None):
    """Rows of ``table_or_array`` (a :class:`Table` or a 2-D array) for ``ids`` of any shape."""
    table = table_or_array if isinstance(table_or_array, Table) else MemoryTable(table_or_array)
    return table.lookup(ids, out=out)

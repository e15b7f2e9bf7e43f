"""embstore: embedding tables larger than RAM.

Sharded Zarr v3 storage, fast row lookup by id or key with a bounded LRU row
cache, an in-memory NumPy backend with the same contract, the operations of a
model's embedding layer, import/export of the common formats and offline batch
lookup jobs.

Every public name is an attribute of the package, and a subpackage is imported the
first time one of its names is asked for. ``import embstore`` in a program loads the
read path of a local table (``embstore.store.table``: NumPy, the row sources, the
local place) so that ``embstore.open(path)`` and its first lookup take milliseconds,
not the imports. The ``embstore`` command line loads only what its command runs (its
help never loads NumPy); ``EMBSTORE_IMPORT=lazy`` gives a program the same (and
``EMBSTORE_IMPORT=eager`` gives the command line the library's).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

from ._version import __version__
from .errors import (ClosedTableError, ConflictError, CorruptStoreError, DestinationExistsError, EmbstoreError,
                     FormatError, IndexNotFoundError, InvalidIdError, InvalidOptionError, KeyNotFoundError,
                     LockTimeoutError, MissingDependencyError, NotATableError, ReadOnlyError,
                     ResourceLimitError, ResultTooLargeError, ShapeMismatchError,
                     TableChangedError, InvalidTypeError)
from .optional import lazy_attributes

if TYPE_CHECKING:
    from .batch import lookup_file
    from .cache.rows import CacheInfo
    from .convert import ExportResult, ImportResult, export_table, import_file
    from .search.analogy import normalized
    from .search.ann import StaleIndexWarning, build_index
    from .gensim import from_gensim, to_gensim
    from .layer import Embedding
    from .memory import MemoryTable, embedding_lookup
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

# the module that defines each public name loaded on first use (the TYPE_CHECKING block
# above lists the same names for type checkers)
_LAZY = {
    "lookup_file": ".batch", "CacheInfo": ".cache.rows",
    "ExportResult": ".convert", "ImportResult": ".convert", "export_table": ".convert",
    "import_file": ".convert", "normalized": ".search.analogy",
    "StaleIndexWarning": ".search.ann", "build_index": ".search.ann",
    "from_gensim": ".gensim", "to_gensim": ".gensim", "Embedding": ".layer",
    "MemoryTable": ".memory", "embedding_lookup": ".memory", "Table": ".table",
    **dict.fromkeys(("TableWriter", "VerifyReport", "ZarrTable", "create", "open", "repair",
                     "save", "upgrade", "verify"), ".store"),
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)


def _loads_read_path() -> bool:
    """Whether ``import embstore`` loads the read path now: yes in a program, no in the
    ``embstore`` command (the console script: ``sys.argv[0]`` is its path; ``python -m
    embstore``: ``sys.argv[0]`` is ``-m`` while Python locates the module it runs), unless
    ``EMBSTORE_IMPORT`` says ``eager`` or ``lazy``."""
    how = os.environ.get("EMBSTORE_IMPORT", "").strip().lower()
    if how in ("eager", "lazy"):
        return how == "eager"
    argv = getattr(sys, "argv", None) or [""]
    return str(argv[0]) != "-m" and \
        os.path.basename(str(argv[0])) not in ("embstore", "embstore.exe")


if _loads_read_path():
    importlib.import_module(".store.table", __name__)

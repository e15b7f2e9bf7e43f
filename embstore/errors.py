"""Errors raised by embstore.

Every error derives from :class:`EmbstoreError` and also from the builtin that
describes it best, so callers can catch either (``except IndexError`` keeps
working for bad ids).  Messages say what was expected, what came and where;
the raw values are kept as attributes.
"""

from __future__ import annotations

import errno

import re

__all__ = [
    "EmbstoreError",
    "IndexNotFoundError",
    "InvalidIdError",
    "KeyNotFoundError",
    "CorruptStoreError",
    "ReadOnlyError",
    "FormatError",
    "NotATableError",
    "ShapeMismatchError",
    "DestinationExistsError",
    "MissingDependencyError",
    "ClosedTableError",
    "InvalidOptionError",
    "InvalidTypeError",
    "ResultTooLargeError",
    "ResourceLimitError",
    "LockTimeoutError",
    "TableChangedError",
]


def table_label(table) -> str:
    """A table as messages name it: its path, never its repr (``the in-memory table``)."""
    path = table.path  # every Table declares it (None in memory)
    return str(path) if path is not None else "the in-memory table"


#: a file of a version's snapshot (docs/FORMAT.md §6a), named in messages by its live name
_SNAPSHOT = re.compile(r"/vectors/\.embstore/versions/[0-9]+(?=/(?!manifest\.json|deltas/)|:|\s|$)")


#: directories a reader holds open, named ``/proc/self/fd/<n>``: their real paths
_PINNED: dict[str, str] = {}
_FD_PATH = re.compile(r"/proc/self/fd/[0-9]+")


def pin_name(pinned: str, real: str | None) -> None:
    """Messages name paths under ``pinned`` by ``real`` (None: forget ``pinned``)."""
    if real is None:
        _PINNED.pop(pinned, None)
    else:
        _PINNED[pinned] = real


def unpinned(text: str) -> str:
    """``text`` with the held-open directories of readers written as their real paths."""
    if "/proc/self/fd/" not in text:
        return text
    return _FD_PATH.sub(lambda m: _PINNED.get(m.group(0), m.group(0)), text)


def live_name(text):
    """``text`` with paths into a version's snapshot written as the table's own paths (the
    same file: the snapshot links it); other values as they are."""
    return _SNAPSHOT.sub("", unpinned(text)) if isinstance(text, str) else text


class EmbstoreError(Exception):
    """Base class of every error embstore raises on purpose."""

    def __init__(self, *args):
        super().__init__(*(live_name(a) for a in args))


class InvalidIdError(EmbstoreError, IndexError):
    """An id that is negative, too large or not an integer.

    ``id`` is the first bad id (as given), ``position`` its index tuple in the
    id array, ``vocab_size`` the table's row count.
    """

    def __init__(self, message: str, *, id=None, position=None, vocab_size=None):
        super().__init__(message)
        self.id = id
        self.position = position
        self.vocab_size = vocab_size


class KeyNotFoundError(EmbstoreError, KeyError):
    """A key that is not in the table's vocabulary."""

    def __init__(self, message: str, *, key=None, position=None):
        super().__init__(message)
        self.key = key
        self.position = position

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CorruptStoreError(EmbstoreError, OSError):
    """Stored bytes fail their checksum, or the store's metadata is broken."""

    def __init__(self, message: str, *, path=None):
        super().__init__(message)
        self.path = live_name(path)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ReadOnlyError(EmbstoreError, PermissionError):
    """A write to a table opened read-only (or wrapping a read-only array)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FormatError(EmbstoreError, ValueError):
    """A malformed input file.  ``path`` and ``line`` (1-based) say where."""

    def __init__(self, message: str, *, path=None, line=None):
        where = ""
        if path is not None:
            where = f"{path}, line {line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.path = live_name(path)
        self.line = line
        self.reason = message


class NotATableError(FormatError):
    """A path that is not an embstore table: missing, a plain file, or a folder without a
    Zarr group.  ``is_file`` tells a file (which may be importable) from the rest."""

    def __init__(self, message: str, *, path=None, is_file: bool = False):
        super().__init__(message, path=path)
        self.is_file = is_file


class TableNotFoundError(NotATableError, FileNotFoundError):
    """Nothing at a table's path.  A ``FileNotFoundError`` as a missing file is, and still a
    :class:`NotATableError` (and ``ValueError``) for the ``except`` clauses written before;
    ``errno`` is ``ENOENT`` and ``filename`` the path, as ``open`` sets them."""

    def __init__(self, message: str, *, path=None):
        super().__init__(message, path=path)
        self.errno, self.strerror, self.filename = errno.ENOENT, message, self.path

    def __str__(self) -> str:  # the message, not OSError's "[Errno 2] ...: 'path'"
        return Exception.__str__(self)


class ShapeMismatchError(EmbstoreError, ValueError):
    """Vectors or an output buffer whose shape or dtype does not fit.  ``row``: the input
    row at fault, when there is one."""

    row: int | None = None


class DestinationExistsError(EmbstoreError, FileExistsError):
    """A destination that exists, written without ``overwrite=True``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MissingDependencyError(EmbstoreError, ImportError):
    """An optional package that a feature needs is not installed.  ``extra`` names the
    embstore extra that installs it (``pip install 'embstore[extra]'``)."""

    def __init__(self, message: str, *, module: str, extra: str):
        super().__init__(message)
        self.module = module
        self.extra = extra


class ClosedTableError(EmbstoreError, ValueError):
    """A method called on a table after ``close()`` (as ``ValueError`` for a closed file)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidOptionError(EmbstoreError, ValueError):
    """An option value that cannot be used (a byte size such as ``"1XB"`` or ``-5``, an
    unknown mode, a negative ``max_norm``): every argument error of the API is one."""


class InvalidTypeError(EmbstoreError, TypeError):
    """An argument of the wrong type (``padding_idx=1.5``, a list where a table goes)."""


class ResultTooLargeError(EmbstoreError, MemoryError):
    """A result that cannot fit in this machine's memory (checked before any work)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ResourceLimitError(EmbstoreError, OSError):
    """The system refused a resource (file descriptors, memory maps): not damage.

    ``errno`` is the system's (``EMFILE``, ``ENFILE``, ``ENOMEM``); the message names the
    limit to raise (``ulimit -n``, ``vm.max_map_count``).
    """

    def __init__(self, message: str, *, errno: int | None = None, path=None):
        super().__init__(message)
        self.errno = errno
        self.filename = path
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LockTimeoutError(EmbstoreError, TimeoutError):
    """Another writer held a table's writer lock for longer than the timeout.

    ``path`` is the table, ``timeout`` the seconds waited.
    """

    def __init__(self, message: str, *, path=None, timeout=None):
        super().__init__(message)
        self.path = path
        self.timeout = timeout

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class IndexNotFoundError(EmbstoreError, FileNotFoundError):
    """An approximate search on a table without an approximate index (or with unreadable
    index metadata); ``path`` is where the index was looked for."""

    def __init__(self, message: str, *, path=None):
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TableChangedError(EmbstoreError, RuntimeError):
    """The table was written while something derived from all its rows was being built (its
    approximate index): build it again.  ``path`` is the table."""

    def __init__(self, message: str, *, path=None):
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConflictError(EmbstoreError, RuntimeError):
    """A commit to a table on object storage lost the race to another writer's commit that
    changed some of the same rows (or appended some of the same keys): nothing of it was
    committed.  ``path`` is the table, ``rows`` the overlapping row ids (a sorted int64
    array; empty for a key conflict), ``keys`` the overlapping keys, ``version`` the
    winner's version."""

    def __init__(self, message: str, *, path=None, rows=None, keys=(), version=None):
        super().__init__(message)
        self.path, self.rows, self.keys, self.version = path, rows, list(keys), version

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

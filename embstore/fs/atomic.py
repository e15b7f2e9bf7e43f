"""Write beside, then rename into place: the one way embstore creates or replaces an output.

Every output (a new table, an exported file, a batch job's output and its lengths file)
is written under a temporary name in the destination's directory that says which process
owns it, ``.<name>.tmp-<host>-<pid>.<start time>-<random>`` (:mod:`embstore.fs.beside`; a
resumable job uses a fixed name of its own, see :mod:`embstore.batch.job`), and renamed
to the destination only when complete.  A crash leaves at most that temporary entry
behind, never a half-written destination, and the next writer to the same destination
removes the entries of writers that are gone.  Replacing a directory is one atomic
exchange where the system has one (Linux ``renameat2``), else two renames (see
:func:`embstore.fs.beside.swap_in`).  Cleanup after a failure never raises.

An existing destination is only replaced when the caller says ``overwrite=True``
(:func:`check_dest`, checked before the work starts and again just before the rename).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._types import PathLike
from .beside import owned_prefix, remove_quietly, swap_in, sweep_beside
from ..errors import DestinationExistsError

__all__ = ["PathLike", "check_dest", "temp_path", "temp_dir", "replace", "remove",
           "write_beside"]

def _beside(dest: PathLike, tag: str) -> str:
    target = Path(os.path.abspath(os.fspath(dest).rstrip("/\\")))
    sweep_beside(target)  # the leftovers of killed writers to the same destination
    return str(target.parent / (owned_prefix(target, tag, hidden=True) + uuid.uuid4().hex[:8]))


def check_dest(dest: PathLike, overwrite: bool) -> None:
    """:class:`DestinationExistsError` if ``dest`` exists and ``overwrite`` is false."""
    if os.path.lexists(dest) and not overwrite:
        raise DestinationExistsError(
            f"{os.fspath(dest)} already exists (pass overwrite=True to replace it)")


def temp_path(dest: PathLike) -> str:
    """A fresh name beside ``dest``: ``.<name>.tmp-<pid>-<random>`` (nothing is created)."""
    return _beside(dest, "tmp")


def temp_dir(dest: PathLike) -> str:
    """A new empty directory beside ``dest`` (its parent is created if missing)."""
    path = temp_path(dest)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkdir(path)
    return path


def remove(path: PathLike) -> None:
    """Remove a file, a link or a directory tree if it exists; never raises (a cleanup
    after a failure, a full disk included, must not hide that failure)."""
    if os.path.lexists(path):
        remove_quietly(path)


def replace(tmp: PathLike, dest: PathLike, *, keep_existing: bool = False,
            aside: PathLike | None = None) -> None:
    """Rename ``tmp`` to ``dest``, replacing what is there (the caller checked overwrite).

    A file over a file is one atomic rename; when either is a directory, one atomic
    exchange where the system has one, else two renames through ``aside`` (default: a name
    owned by this process that :func:`~embstore.fs.beside.sweep_beside` puts back;
    :func:`embstore.fs.beside.swap_in`).  ``keep_existing=True`` (a directory ``tmp`` that
    others may make too, such as a shared cache's copy) never replaces: one rename, which
    raises ``OSError`` when another process put a non-empty directory at ``dest`` first.
    """
    if keep_existing:
        os.rename(tmp, dest)
        return
    if not os.path.lexists(dest) or not (os.path.isdir(dest) or os.path.isdir(tmp)):
        os.replace(tmp, dest)
        return
    swap_in(Path(tmp), Path(dest), aside=None if aside is None else Path(aside))


@contextmanager
def write_beside(dest: PathLike, *, overwrite: bool = False,
                 directory: bool = False) -> Iterator[str]:
    """Yield a temporary path beside ``dest`` to write; on success rename it to ``dest``.

    ``directory=True`` creates the temporary directory first.  On an exception the
    temporary entry is removed and ``dest`` is left as it was.
    """
    check_dest(dest, overwrite)
    tmp = temp_dir(dest) if directory else temp_path(dest)
    try:
        yield tmp
        check_dest(dest, overwrite)
        replace(tmp, dest)
    except BaseException:
        remove(tmp)
        raise

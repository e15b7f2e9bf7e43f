"""Write beside, then rename into place: the one way embstore creates or replaces an output.

Every output (a new table, an exported file, a batch job's output and its lengths file)
is written under a temporary name in the destination's directory,
``.<name>.tmp-<pid>-<random>`` (a resumable job uses a fixed name of its own, see
:mod:`embstore.batch.job`), and renamed to the destination only when complete.  A
crash leaves at most that temporary entry behind, never a half-written destination.
Replacing a directory (or replacing with one) takes two renames: the old entry is first
set aside as ``.<name>.old-<pid>-<random>`` and removed after the new one is in place;
a crash between the two renames leaves the old entry whole under that name.

An existing destination is only replaced when the caller says ``overwrite=True``
(:func:`check_dest`, checked before the work starts and again just before the rename).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from ._types import PathLike
from .errors import DestinationExistsError

__all__ = ["PathLike", "check_dest", "temp_path", "temp_dir", "replace", "remove",
           "write_beside"]

def _beside(dest: PathLike, tag: str) -> str:
    parent, name = os.path.split(os.path.abspath(os.fspath(dest).rstrip("/\\")))
    return os.path.join(parent, f".{name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


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
    """Remove a file, a link or a directory tree; nothing if ``path`` does not exist."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def replace(tmp: PathLike, dest: PathLike) -> None:
    """Rename ``tmp`` to ``dest``, replacing what is there (the caller checked overwrite).

    A file over a file is one atomic rename.  When either is a directory, ``dest`` is set
    aside first and removed once ``tmp`` is in place (put back if that rename fails).
    """
    if not os.path.lexists(dest) or not (os.path.isdir(dest) or os.path.isdir(tmp)):
        os.replace(tmp, dest)
        return
    aside = _beside(dest, "old")
    os.rename(dest, aside)
    try:
        os.rename(tmp, dest)
    except BaseException:
        os.rename(aside, dest)
        raise
    remove(aside)


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

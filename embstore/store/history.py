"""Where a table's versions live, decided once: :func:`versions_at` gives a table handle
the :class:`~embstore.store.base.Versions` of its place (a local folder, or object storage
at a URL); :func:`whole_table_at` says where a whole table (its first version) is written,
:func:`refuse_in_place` what object storage does not do.  The one place in the table's code
that tells the two apart (below it, :func:`embstore.store.place.where.place_at` chooses
a place); a new medium with versions is one more class beside them.

Object storage's versions (``objects.history``: its commits, compactions, the remote
opening and key index, ~40 modules) and its transfers are imported only when a URL is
opened or written, so that opening a local table (``embstore info``, every DataLoader
worker) does not load them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidTypeError, ReadOnlyError
from .base import Versions
from .place.objstore import is_url
from .versions.local import LocalVersions

if TYPE_CHECKING:
    from .objects.history import ObjectVersions

#: the modules of object storage's versions and transfers, imported on the first URL
OBJECT_VERSIONS = "embstore.store.objects.history"
OBJECT_TRANSFERS = "embstore.store.remote.transfer"

__all__ = ["refuse_in_place", "versions_at", "whole_table_at"]


def versions_at(path: Any, mode: str, want: int | None, lock_timeout: float | None,
                remote: dict[str, Any]) -> Versions:
    """The versions of the table at ``path`` (a folder, or a URL with ``remote``: the
    options of :func:`embstore.open` for object storage) for a handle opened with
    ``mode``, reading version ``want`` (None: the newest)."""
    if is_url(path):
        cls: type[ObjectVersions] = importlib.import_module(OBJECT_VERSIONS).ObjectVersions
        return cls(os.fspath(path).rstrip("/"), want, remote)
    if remote:
        raise InvalidTypeError(f"{', '.join(remote)}: options of tables on object storage "
                               f"(URLs), not of the local path {path!r}")
    return LocalVersions(Path(os.fspath(path)).absolute(), mode, want, lock_timeout)


@contextmanager
def whole_table_at(path: Any, overwrite: bool, storage_options: dict | None
                   ) -> Iterator[tuple[Any, bool]]:
    """``(folder, overwrite)``: where :func:`~embstore.store.build.save` writes a whole
    table for ``path``, and whether over what is there.  A local path: the folder itself.
    A URL: a new local folder, uploaded (the group's zarr.json last) when the block ends
    without an error; the destination is checked first, so a refusal comes early."""
    if is_url(path):
        staged = importlib.import_module(OBJECT_TRANSFERS).staged
        with staged(os.fspath(path), overwrite=overwrite,
                    storage_options=storage_options) as local:
            yield local, False
        return
    if storage_options:
        raise InvalidTypeError(f"storage_options: an option of tables on object storage "
                               f"(URLs), not of the local path {path!r}")
    yield path, overwrite


def refuse_in_place(path: Any, why: str) -> None:
    """Refuse, with ``why``, what object storage does not do in place (a table created
    empty to be written into, an upgrade): a local table passes."""
    if is_url(path):
        raise ReadOnlyError(f"{path}: {why}")

"""Where a table's versions live, decided once: :func:`versions_at` gives a table handle
the :class:`~embstore.store.base.Versions` of its place (a local folder, or object storage
at a URL).  The one place in the table's code that tells the two apart; a new medium with
versions is one more class beside them.

Object storage's versions (``objects.history``: its commits, compactions, the remote
opening and key index, ~40 modules) are imported only when a URL is opened, so that
opening a local table (``embstore info``, every DataLoader worker) does not load them.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidTypeError
from .base import Versions
from .place.objstore import is_url
from .versions.local import LocalVersions

if TYPE_CHECKING:
    from .objects.history import ObjectVersions

#: the module of object storage's versions, imported on the first URL opened
OBJECT_VERSIONS = "embstore.store.objects.history"

__all__ = ["versions_at"]


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

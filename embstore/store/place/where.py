"""The place of a table from its path, chosen once below the table: object storage for a
URL, a local folder otherwise (:func:`embstore.store.history.versions_at` makes the same
choice for a handle's versions)."""

from __future__ import annotations

import os
from pathlib import Path

from .base import Place
from .local import LocalDir
from .objects import ObjectStore
from .objstore import ObjectClient, is_url

__all__ = ["place_at"]


def place_at(path, storage_options: dict | None = None) -> Place:
    """The place of the table at ``path``: object storage for a URL (``s3://``, ``gs://``,
    ``az://``, ``http(s)://``; ``storage_options`` for its client), else a local folder."""
    if is_url(path):
        return ObjectStore(ObjectClient(str(path).rstrip("/"), storage_options))
    if storage_options:
        raise TypeError("storage_options: an option of tables on object storage, got the "
                        f"local path {os.fspath(path)!r}")
    return LocalDir(Path(os.fspath(path)).absolute())

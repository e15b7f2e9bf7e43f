"""The approximate index's metadata (docs/FORMAT.md §10): where a table keeps its index
(:func:`index_path`) and what ``meta.json`` says of it (:func:`index_info`), in a module of
its own so that ``embstore info`` reads it without loading FAISS's pipeline (ann, ivf)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .._types import PathLike
from ..errors import CorruptStoreError, IndexNotFoundError
from ..fs.files import open_regular, read_small, real_dir
from ..store import annfiles as check
from ..store.meta import read_table_meta, table_id
from ..store.table import ZarrTable
from ..store.versions.commit import AREA, area_of, last_commit
from ..store.versions.snapshot import newest

__all__ = ["METRICS", "META_FILE", "index_path", "index_info"]

METRICS = ("cos", "ip", "l2")
META_FILE = "meta.json"


def index_path(table: PathLike | ZarrTable) -> Path:
    """The directory of the approximate index of the table at ``table``."""
    root = table.path if isinstance(table, ZarrTable) else Path(os.fspath(table)).absolute()
    area_of(root)  # (refused when a symbolic link)
    return real_dir(root, ("vectors", AREA[0], "ann"))



def index_info(table: PathLike | ZarrTable) -> dict | None:
    """The metadata of the table's approximate index (None if it has none), with ``stale``:
    whether the table changed since the index was built."""
    path = index_path(table) / META_FILE
    try:
        fd = open_regular(path, nofollow=True)
        try:
            meta = json.loads(read_small(fd, path, 1 << 20))
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except CorruptStoreError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise IndexNotFoundError(f"{path}: unreadable index metadata ({exc})",
                                 path=str(path)) from None
    if not (isinstance(meta, dict) and meta.get("embstore_ann") == 1 and
            meta.get("metric") in METRICS and isinstance(meta.get("dim"), int) and
            meta.get("library", "usearch") in ("faiss", "usearch") and
            type(meta.get("expansion_search")) is int and meta["expansion_search"] >= 1):
        raise IndexNotFoundError(f"{path}: expected embstore index metadata, got "
                                 f"{str(meta)[:200]}", path=str(path))
    root = path.parent.parent.parent.parent
    rows = meta.get("table_rows")
    if isinstance(table, ZarrTable):
        now, attrs = table.vocab_size, table._attrs
    else:
        attrs, vmeta = read_table_meta(root)
        now = vmeta["shape"][0]
    meta["foreign"] = check.foreign(meta, table_id(attrs))
    meta["stale"] = (bool(meta["foreign"]) or meta.get("table_commit") != last_commit(root)
                     or rows != now or meta.get("table_version") != (newest(root) or None))
    return meta

"""What ``verify`` does only for a table on object storage: the objects that are not row
arrays (``keys``, the key index, its block sidecars) downloaded to a temporary folder, so
that the checks of :mod:`embstore.store.verify` run on them as on a local table's, and each
block sidecar recomputed from its chunk file."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...keys.writer import INDEX_ARRAYS
from ..place.objects import ObjectStore
from .keys import download_key_arrays
from .ranged import block_sidecar, sidecar_name

__all__ = ["downloaded", "check_sidecars"]


@contextmanager
def downloaded(place: ObjectStore, report: Any) -> Iterator[Path]:
    """A temporary folder holding every object of the table but its row arrays (removed
    after); the damage reported meanwhile names the objects, not the folder."""
    root = download_key_arrays(place.client, None)
    start = len(report.damaged)
    try:
        yield root
        check_sidecars(place, root, report)
    finally:
        for j in range(start, len(report.damaged)):
            d = report.damaged[j]
            report.damaged[j] = type(d)(d.file.replace(str(root), place.url), d.chunk,
                                        d.message.replace(str(root), place.url))
        shutil.rmtree(root, ignore_errors=True)


def check_sidecars(place: ObjectStore, root: Path, report: Any) -> None:
    """Each block sidecar equals the one made from its chunk file (none: an older upload)."""
    if not any((root / name / "blocks").is_dir() for name in INDEX_ARRAYS):
        return  # (an upload from before the sidecars)
    for name in INDEX_ARRAYS:
        for f in sorted((root / name / "c").iterdir()) if (root / name / "c").is_dir() else []:
            rel = sidecar_name(name, int(f.name))
            side = root / rel
            if not side.is_file() or side.read_bytes() != block_sidecar(
                    f.read_bytes(), fences=name == "key_hash"):
                report.add(place.where(rel), None, f"{place.where(rel)}: block sidecar "
                           f"{'missing' if not side.is_file() else 'damaged'} (it must "
                           f"match {name}/c/{f.name}; copy the table again to rewrite it)")

"""``verify``'s checks of a table's versions on object storage (docs/FORMAT.md §11a): every
retained manifest and every delta it names, in depth (sizes, crc32c, ids)."""

from __future__ import annotations

from collections.abc import Callable

from ...errors import CorruptStoreError, FormatError
from ..place.objstore import ObjectClient
from .manifest import DeltaCache, list_versions, manifest_name, need_manifest

__all__ = ["check_versions"]


def check_versions(client: ObjectClient, add: Callable[[str, int | None, str], None]
                   ) -> tuple[list[int], set[str]]:
    """Check every manifest and its deltas (damage goes to ``add(where, row, message)``);
    returns the versions and the base prefixes they read (the caller checks those as
    tables)."""
    cache, versions, bases = DeltaCache(), [], set()
    for n, _, _ in list_versions(client):  # a loop per version: each a manifest and deltas
        try:
            doc = need_manifest(client, n)
            cache.load(client, doc["deltas"], doc["dim"], doc["dtype"])
            cache.merged(doc, doc["dim"], doc["dtype"])
        except (CorruptStoreError, FormatError, TypeError, ValueError) as exc:
            add(client.where(manifest_name(n)), None, str(exc))
            continue
        versions.append(n)
        if doc["base"]["prefix"]:
            bases.add(doc["base"]["prefix"])
    return versions, bases

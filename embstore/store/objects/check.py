"""``verify``'s checks of a table's versions on object storage (docs/FORMAT.md §11a): every
retained manifest and every delta it names, in depth (sizes, crc32c, ids; a key delta's
hashes against its keys, under the hash key of its base's index)."""

from __future__ import annotations

import json
from collections.abc import Callable

from ...errors import CorruptStoreError, FormatError
from ...keys.hashing import hash_key_from_attrs
from ...keys.writer import INDEX_ATTR
from ..place.objstore import ObjectClient
from .manifest import DeltaCache, key_entries, list_versions, manifest_name, need_manifest

__all__ = ["check_versions"]


def _hash_key(client: ObjectClient, prefix: str, known: dict):
    """The hash key of the key index of the base at ``prefix`` (one GET per base)."""
    if prefix not in known:
        rel = f"{prefix}/key_hash/zarr.json" if prefix else "key_hash/zarr.json"
        raw = client.get(rel)
        if raw is None:
            raise CorruptStoreError(f"{client.where(rel)}: missing: key deltas on a base "
                                    "without a key index", path=client.where(rel))
        try:
            info = json.loads(raw.decode("utf-8"))["attributes"].get(INDEX_ATTR, {})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptStoreError(f"{client.where(rel)}: unreadable ({exc})",
                                    path=client.where(rel)) from None
        known[prefix] = hash_key_from_attrs(info, client.where(rel))
    return known[prefix]


def check_versions(client: ObjectClient, add: Callable[[str, int | None, str], None]
                   ) -> tuple[list[int], set[str]]:
    """Check every manifest and its deltas (damage goes to ``add(where, row, message)``);
    returns the versions and the base prefixes they read (the caller checks those as
    tables)."""
    cache, versions, bases = DeltaCache(), [], set()
    keys_of: dict[str, tuple[int, int] | None] = {}
    checked: set[str] = set()
    for n, _, _ in list_versions(client):  # a loop per version: each a manifest and deltas
        try:
            doc = need_manifest(client, n)
            cache.load(client, doc["deltas"], doc["dim"], doc["dtype"])
            cache.merged(doc, doc["dim"], doc["dtype"])
            for e in key_entries(doc):  # a loop per key delta (each checked once)
                if e["object"] not in checked:
                    key = _hash_key(client, doc["base"]["prefix"], keys_of)
                    cache.segment(client, e).check_hashes(key)
                    checked.add(e["object"])
        except (CorruptStoreError, FormatError, TypeError, ValueError) as exc:
            add(client.where(manifest_name(n)), None, str(exc))
            continue
        versions.append(n)
        if doc["base"]["prefix"]:
            bases.add(doc["base"]["prefix"])
    return versions, bases

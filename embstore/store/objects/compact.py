"""Compaction of a table on object storage (docs/FORMAT.md §11a): the version's rows (and
keys) written as a new base table under ``commits/base-<write id>/``, committed as a
version without deltas.

The base is written locally in blocks of rows (a :class:`~embstore.store.writer.TableWriter`
beside a temporary folder) and uploaded as any table is (its group ``zarr.json`` last), so it
costs the table's bytes once; readers of earlier versions keep their base and deltas.  The
published view (the table's own names, version 0) is not rewritten: Zarr readers keep
reading the table as uploaded.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError
from ..remote.transfer import upload_table
from ..versions.version import Version
from ..writer import TableWriter
from .commit import Change, commit
from .manifest import AREA, DeltaCache, new_write_id
from .source import ObjectVersionSource

__all__ = ["compact_objects", "BLOCK_BYTES"]

BLOCK_BYTES = 64 << 20  # rows read and written per step


def _write_base(src: ObjectVersionSource, local: Path, keys_of, attrs: dict) -> None:
    rows, dim = src.shape
    lay = src.layout
    packed = lay.get("compression") not in (None, "none")  # (keeps its codec and shards;
    step = max(1, BLOCK_BYTES // max(1, dim * src.dtype.itemsize))  # raw rows: row arrays)
    with TableWriter(local, dim=dim, dtype=src.storage_dtype, has_keys=keys_of is not None,
                     chunk_rows=lay.get("chunk_rows") if packed else None,
                     shard_rows=lay.get("shard_rows") if packed else None,
                     compression=lay.get("compression") if packed else "none",
                     expected_rows=rows, format_version=attrs.get("format")) as w:
        for start in range(0, rows, step):  # a loop per block of rows
            stop = min(rows, start + step)
            keys = None if keys_of is None else keys_of(start, stop)
            if not src.record.compact:
                w.add(src.read(start, stop), keys)
                continue
            codes, scale, offset = src.raw(np.arange(start, stop, dtype=np.int64))
            w.add_stored(codes, None if scale is None else np.stack([scale, offset], axis=1),
                         keys)  # (as stored: decoding and encoding int8 again is not exact)


def compact_objects(v: Version, deltas: DeltaCache, url: str, storage_options: dict | None,
                    keys_of: Callable[[int, int], list[str]] | None) -> dict | None:
    """Fold version ``v``'s deltas into a new base; returns the committed manifest (``v``'s
    own when there is nothing to fold; None: another writer's commit made it moot, see
    :func:`~.commit.commit`)."""
    src = v.source
    assert isinstance(src, ObjectVersionSource)
    if not src.ids.size:
        return src.doc  # (nothing to fold)
    w = new_write_id()
    prefix = f"{AREA}base-{w}"
    with tempfile.TemporaryDirectory(prefix="embstore-compact-") as d:
        local = Path(d) / "base.emb"
        _write_base(src, local, keys_of, v.attrs)
        upload_table(local, f"{url}/{prefix}", storage_options=storage_options)
    raw = src.client.get(f"{prefix}/zarr.json")
    try:
        base_id = json.loads(raw or b"")["attributes"]["embstore"]["write_id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptStoreError(f"{src.client.where(prefix)}: the compacted base's zarr.json "
                                f"does not read back ({exc})", path=url) from None
    change = Change("compact", w, base={"prefix": prefix, "write_id": base_id,
                                        "rows": src.rows},
                    folded=frozenset(e["object"] for e in src.doc["deltas"]),
                    summary={"kind": "compact", "rows": src.pending_rows})
    return commit(src.client, src.doc, change,
                  lambda e: deltas.ids_of(src.client, e, src.shape[1], src.doc["dtype"]))

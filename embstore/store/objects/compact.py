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
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError, EmbstoreError
from ..remote.transfer import upload_table
from ..versions.version import Version
from ..writer import TableWriter
from .commit import Change, commit
from .manifest import AREA, DeltaCache, new_write_id
from .source import ObjectVersionSource
from .version import object_vocab

_log = logging.getLogger("embstore")

__all__ = ["compact_objects", "compaction_due", "compact_if_due", "BLOCK_BYTES", "COMPACT_FRACTION",
           "COMPACT_BYTES"]

BLOCK_BYTES = 64 << 20  # rows read and written per step
#: a version with more rows than this share of the table in deltas, or more bytes of them
#: than COMPACT_BYTES, is due for compaction (the thresholds of local tables, §6e)
COMPACT_FRACTION = 0.05
COMPACT_BYTES = 128 << 20


def compaction_due(v: Version) -> bool:
    """Whether version ``v``'s deltas are past COMPACT_FRACTION of its rows or
    COMPACT_BYTES (then its writer compacts it, in a commit of its own)."""
    src = v.source
    assert isinstance(src, ObjectVersionSource)
    side = 0 if src.side is None else src.side.shape[1] * src.side.dtype.itemsize
    row_bytes = 8 + src.shape[1] * src.record.code.itemsize + side
    pending = src.pending_rows
    return pending > COMPACT_FRACTION * max(1, src.rows) or pending * row_bytes > COMPACT_BYTES


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


def compact_if_due(v: Version, deltas: DeltaCache, url: str,
                   storage_options: dict | None) -> dict | None:
    """After a commit that made version ``v``: compact it when :func:`compaction_due`, in a
    commit of its own (object stores have no rename to fold it into the same one).  Returns
    the compaction's manifest (the handle then reloads), or None: not due, or made moot by
    another writer's compaction or append of keys (the next commit tries again).  The
    commit happened: a failure here is logged, not raised."""
    if not compaction_due(v):
        return None
    try:
        vocab = object_vocab(v, deltas) if v.has_keys else None
        doc = compact_objects(v, deltas, url, storage_options,
                              None if vocab is None else vocab.keys_between)
    except (OSError, EmbstoreError) as exc:
        _log.warning("%s: version %d committed; compacting its deltas after it failed (%s): "
                     "the next commit or `embstore compact` does it", url, v.number, exc)
        return None
    return None if doc is None or doc["version"] == v.number else doc

"""Opening a table on object storage: its metadata (two GETs) and its row source.

See :mod:`embstore.store.remote.source` for the reads and docs/FORMAT.md section 11 for the rules.
"""

from __future__ import annotations

import hashlib
import json

from ...cache.rows import parse_bytes
from ...errors import CorruptStoreError, FormatError, ReadOnlyError
from .chunkcache import ChunkCache
from .costs import CostModel
from ..codecs import Layout
from ..meta import check_group_meta, check_vectors_meta
from ..subword.ngrams import NGRAMS, Subwords
from .objstore import ObjectClient
from ...dtypes import DTYPES
from .rows import RemotePagedSource
from .source import RemoteShardSource
from ..rows.layout import RowLayout
from ..base import RowSource
from ..source import CodedSource, check_side_meta

__all__ = ["open_remote_source", "read_remote_meta", "open_remote_ngrams"]


def _parse_json(raw: bytes | None, where: str, what: str, url: str) -> dict:
    if raw is None:
        raise FormatError(f"not an embstore table: {what} is missing", path=url)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorruptStoreError(f"{where}: broken JSON ({exc})", path=where) from None
    if not isinstance(doc, dict):
        raise CorruptStoreError(f"{where}: expected a JSON object", path=where)
    return doc


def read_remote_meta(client: ObjectClient) -> tuple[dict, dict, str]:
    """``(embstore attributes, vectors zarr.json, version)`` of the table: two GETs.

    ``version`` hashes both documents (it keys the on-disk chunk cache)."""
    graw = client.get("zarr.json")
    attrs = check_group_meta(_parse_json(graw, client.where("zarr.json"),
                                         "the group's zarr.json", client.url), client.url)
    vraw = client.get("vectors/zarr.json")
    meta = _parse_json(vraw, client.where("vectors/zarr.json"), "vectors/zarr.json",
                       client.url)
    check_vectors_meta(meta, client.where("vectors/zarr.json"), attrs)
    assert graw is not None and vraw is not None  # _parse_json refused missing documents
    version = hashlib.sha256(graw + b"\0" + vraw).hexdigest()[:20]
    return attrs, meta, version


def open_remote_source(url: str, mode: str = "r", *, storage_options: dict | None = None,
                       cache_dir=None, cache_dir_bytes="4GiB", request_latency=None,
                       request_bandwidth=None, max_request_bytes=None,
                       ) -> tuple[dict, RowSource, RemoteShardSource]:
    """``(embstore attributes, row source, vectors source)`` of the table at ``url`` (the
    row source decodes bfloat16 and int8 rows over the vectors source): two requests
    (three for int8 rows, whose row scales are an array of their own).

    ``request_latency`` (seconds), ``request_bandwidth`` (bytes per second on one
    connection) and ``max_request_bytes`` set the cost model reads coalesce by
    (:mod:`.costs`; default 25 ms, 100 MB/s, 8 MiB: S3)."""
    if mode != "r":
        raise ReadOnlyError(f"{url}: tables on object storage open read-only (mode 'r'), got "
                            f"mode {mode!r}; write a local table and copy it there")
    costs = CostModel.from_options(request_latency, request_bandwidth, max_request_bytes)
    client = ObjectClient(url, storage_options)
    try:
        attrs, meta, version = read_remote_meta(client)
        cache = None if cache_dir is None else ChunkCache(cache_dir, client.url, version,
                                                          parse_bytes(cache_dir_bytes))
        rows = RowLayout.from_metadata(meta) if attrs.get("format") == 2 else None
        codes = (RemotePagedSource(client, rows, cache=cache, costs=costs) if rows is not None
                 else RemoteShardSource(client, _layout(meta, url), cache=cache, costs=costs))
        record = DTYPES.get(meta.get("data_type"))  # type: ignore[arg-type]
        if record is None or not record.compact:
            return attrs, codes, codes
        if record.side is None:
            return attrs, CodedSource(codes, record), codes
        name = record.side.name
        where = client.where(f"{name}/zarr.json")
        smeta = _parse_json(client.get(f"{name}/zarr.json"), where,
                            f"{name}/zarr.json ({record.name} vectors need their "
                            f"{record.side.called})", url)
        check_side_meta(record, smeta, meta, where, url)
        srows = RowLayout.from_metadata(smeta) if rows is not None else None
        side = (RemotePagedSource(client, srows, cache=cache, costs=costs, name=name)
                if srows is not None else RemoteShardSource(
                    client, _layout(smeta, url), cache=cache, costs=costs, name=name))
        return attrs, CodedSource(codes, record, side), codes
    except BaseException:
        client.close()
        raise


def _layout(meta: dict, url: str) -> Layout:
    layout = Layout.from_metadata(meta)
    if layout is None:
        raise FormatError("vectors is not stored in the sharded layout of format v1 "
                          "(crc32c-checked chunks in shards), which remote reads need; "
                          "copy the table to a local folder to read it", path=url)
    return layout


def open_remote_ngrams(vectors: RemoteShardSource, attrs: dict, dim: int) -> Subwords:
    """The n-gram matrix of a fastText table on object storage (one GET; rows read by range,
    through the table's chunk cache, like ``vectors``)."""
    client, rel = vectors.client, f"{NGRAMS}/zarr.json"
    where = client.where(rel)
    meta = _parse_json(client.get(rel), where, f"{rel} (the table's subword n-grams)",
                       client.url)

    def source(layout: Layout | None) -> RemoteShardSource:
        if layout is None:
            raise FormatError(f"{where}: the n-grams are not in the sharded layout of format "
                              "v1, which remote reads need", path=client.url)
        return RemoteShardSource(client, layout, cache=vectors.cache, costs=vectors.costs,
                                 name=NGRAMS)
    return Subwords.over(attrs, dim, meta, where, source)

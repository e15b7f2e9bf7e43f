"""Opening a table on object storage: its place, its metadata (two GETs) and its row source.

The row sources are those of every table (:func:`embstore.store.source.open_source`) over an
:class:`~embstore.store.place.objects.ObjectStore`; see docs/FORMAT.md section 11 for the
rules.
"""

from __future__ import annotations

import hashlib

from ...cache.rows import parse_bytes
from ...errors import FormatError, ReadOnlyError
from ..base import RowSource
from ..meta import check_group_meta, check_vectors_meta
from ..place.chunkcache import ChunkCache
from ..place.costs import CostModel
from ..place.objects import ObjectStore, parse_json
from ..source import ShardSource, open_source
from ..subword.ngrams import NGRAMS, Subwords
from .keys import RemoteKeys
from ..place.objstore import ObjectClient

__all__ = ["open_remote_source", "read_remote_meta", "parse_remote_meta", "META",
           "open_remote_ngrams", "RemoteTable"]


class RemoteTable:
    """What a handle on a table on object storage holds beside its row source: its place
    (the client and the chunk cache) and its key index."""

    def __init__(self, place: ObjectStore):
        self.place, self.client, self.cache = place, place.client, place.cache
        self.keys = RemoteKeys(place)

    def vocab(self, rows: int):
        return self.keys.vocab(rows)

    def close(self) -> None:
        self.keys.close()
        self.place.close()


META = ("zarr.json", "vectors/zarr.json")  # what a table's opening reads first


def read_remote_meta(client: ObjectClient) -> tuple[dict, dict, str]:
    """``(embstore attributes, vectors zarr.json, version)`` of the table: two GETs, in
    flight together."""
    graw, vraw = client.map(client.get, META)
    return parse_remote_meta(client, graw, vraw)


def parse_remote_meta(client: ObjectClient, graw: bytes | None,
                      vraw: bytes | None) -> tuple[dict, dict, str]:
    """:func:`read_remote_meta` of the two documents fetched (None: missing).

    ``version`` hashes both documents (it keys the on-disk chunk cache)."""
    attrs = check_group_meta(parse_json(graw, client.where("zarr.json"),
                                        "the group's zarr.json", client.url), client.url)
    meta = parse_json(vraw, client.where("vectors/zarr.json"), "vectors/zarr.json",
                      client.url)
    check_vectors_meta(meta, client.where("vectors/zarr.json"), attrs)
    assert graw is not None and vraw is not None  # parse_json refused missing documents
    version = hashlib.sha256(graw + b"\0" + vraw).hexdigest()[:20]
    return attrs, meta, version


def open_remote_source(url: str, mode: str = "r", *, storage_options: dict | None = None,
                       cache_dir=None, cache_dir_bytes="4GiB", request_latency=None,
                       request_bandwidth=None, max_request_bytes=None,
                       client: ObjectClient | None = None,
                       meta: tuple[dict, dict, str] | None = None,
                       ) -> tuple[dict, RowSource, RemoteTable]:
    """``(embstore attributes, row source, table)`` of the table at ``url`` (the row source
    decodes bfloat16 and int8 rows): two requests, and one to find the layout (two more for
    int8 rows, whose row scales are an array of their own).

    ``request_latency`` (seconds), ``request_bandwidth`` (bytes per second on one
    connection) and ``max_request_bytes`` set the cost model reads coalesce by
    (:mod:`embstore.store.place.costs`; default 25 ms, 100 MB/s, 8 MiB: S3).  ``client``:
    a client of ``url`` to use (the caller's, shared: a failure here leaves it open);
    ``meta``: what :func:`read_remote_meta` returned for it."""
    if mode != "r":
        raise ReadOnlyError(f"{url}: tables on object storage open read-only (mode 'r'), got "
                            f"mode {mode!r}; write a local table and copy it there")
    costs = CostModel.from_options(request_latency, request_bandwidth, max_request_bytes)
    own = client is None
    client = ObjectClient(url, storage_options) if client is None else client
    try:
        attrs, vmeta, version = read_remote_meta(client) if meta is None else meta
        cache = None if cache_dir is None else ChunkCache(cache_dir, client.url, version,
                                                          parse_bytes(cache_dir_bytes))
        place = ObjectStore(client, cache=cache, costs=costs)
        source = open_source(place, vmeta, mode, checked=attrs.get("format") == 2)
        return attrs, source, RemoteTable(place)
    except BaseException:
        if own:
            client.close()
        raise


def open_remote_ngrams(table: RemoteTable, attrs: dict, dim: int) -> Subwords:
    """The n-gram matrix of a fastText table on object storage (one GET; rows read by range,
    through the table's chunk cache, like ``vectors``)."""
    place, rel = table.place, f"{NGRAMS}/zarr.json"
    meta = place.get_json(rel, f"{rel} (the table's subword n-grams)")
    where = place.where(rel)

    def source(layout) -> ShardSource:
        if layout is None:
            raise FormatError(f"{where}: the n-grams are not in the sharded layout of format "
                              "v1, which remote reads need", path=place.url)
        return ShardSource(place, layout, NGRAMS)
    return Subwords.over(attrs, dim, meta, where, source)

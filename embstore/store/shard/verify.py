"""``verify`` of a sharded array, on any place: every shard's index (its crc32c, every chunk
inside the data bytes) and every stored chunk (its crc32c, and a decode for compressed
chunks), fetched by ranges of at most 8 MiB, a few at a time, so that memory stays bounded
whatever the table's size.

The walk visits the shards that exist, not every shard the metadata declares: an absent shard
is all fill value (nothing to check), and a header declaring 10^15 rows must not cost 10^15
requests or stats (a local folder is listed; object storage when the declared shards pass its
``Place.list_past``, one listing page)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from ...errors import CorruptStoreError
from ..codecs import Layout, check_chunk, make_codec
from ..place.base import Place
from .file import parse_index
from .ranged import regions
from .tag import find_tag, tag_len, tagged

__all__ = ["verify_shards"]

Problem = tuple[str, int | None, str]

_REQUEST = 8 << 20  # bytes per request
_GAP = 1 << 16  # a gap between stored chunks read through


def _check(raw, nb: int, L: Layout, codec, at: str, where: str, tag: int | None) -> None:
    if len(raw) != nb:
        raise CorruptStoreError(f"{at}: truncated ({len(raw)} of {nb} bytes)", path=where)
    payload = check_chunk(raw, at) if L.has_crc else raw
    if tag is not None and int.from_bytes(raw[-4:], "little") != tag:
        raise CorruptStoreError(f"{at}: ends in crc32c "
                                f"{int.from_bytes(raw[-4:], 'little'):#010x}, its shard tag "
                                f"records {tag:#010x} (a chunk of another shard in its place)",
                                path=where)
    if codec is not None:
        size = memoryview(codec.decode(payload)).nbytes
        if size != L.chunk_bytes:
            raise ValueError(f"{size} bytes, expected {L.chunk_bytes}")


def _shard(place: Place, name: str, L: Layout, k: int, codec) -> tuple[int, list[Problem]]:
    """``(chunks checked, problems)`` of shard ``k``."""
    rel = f"{name}/{L.shard_key(k)}"
    where = place.where(rel)
    index_len = 16 * L.n_inner + (4 if L.index_crc else 0)
    try:  # the index, and the shard tag before it (its own crc32c: no byte unchecked)
        got = place.get_tail(rel, index_len + (tag_len(L.n_inner) if tagged(L) else 0))
        if got is None:
            return 0, []  # an absent shard: every chunk the fill value
        tail, size = memoryview(got[0]).cast("B"), got[1]
        off, nb = parse_index(tail[max(0, len(tail) - index_len):], size, L, where)
        expect = find_tag(tail, index_len, off, nb, size - index_len, L, None, where)
    except CorruptStoreError as exc:
        return 0, [(where, None, str(exc))]
    present = np.flatnonzero(off >= 0)
    order = present[np.argsort(off[present], kind="stable")]
    cuts = regions(np.zeros(order.size, np.int64), off[order], nb[order], _GAP,
                   max(_REQUEST, L.chunk_bytes + 4))

    def fetch(region: tuple[int, int]) -> list[Problem]:
        lo, hi = region
        js = order[lo:hi]
        start, stop = int(off[js[0]]), int(off[js[-1]] + nb[js[-1]])
        buf = memoryview(place.get_range(rel, start, stop)).cast("B")
        bad: list[Problem] = []
        for i in js.tolist():  # a loop per chunk
            at = f"shard {where}, chunk {i}"
            a = int(off[i]) - start
            try:
                _check(buf[a: a + int(nb[i])], int(nb[i]), L, codec, at, where,
                       None if expect is None else int(expect[i]))
            except CorruptStoreError as exc:
                bad.append((where, i, str(exc)))
            except Exception as exc:  # noqa: BLE001 - a codec's own error type
                bad.append((where, i, f"{at}: cannot decode ({exc})"))
        return bad
    problems: list[Problem] = []
    window = max(1, place.readers)
    for w in range(0, len(cuts), window):  # a window of requests at a time
        for bad in place.map(fetch, cuts[w: w + window]):
            problems.extend(bad)
    return int(present.size), problems


def _listed(place: Place, name: str, L: Layout) -> list[int] | None:
    """The numbers ``k < n_shards`` of the shards of ``name`` that are there (sorted), or None
    where walking every declared shard costs no more than listing them."""
    sep = L.separator
    pattern = re.compile(rf"c{re.escape(sep)}(0|[1-9][0-9]*){re.escape(sep)}0")
    if L.n_shards <= place.list_past:  # (asking for each costs no more than a listing)
        return None
    names = place.names(name)
    found = (pattern.fullmatch(n) for n in names)
    return sorted(k for k in {int(m.group(1)) for m in found if m} if k < L.n_shards)


def verify_shards(place: Place, layout: Layout, name: str = "vectors",
                  counted: list[int] | None = None) -> Iterator[Problem]:
    """``(file, chunk or None, message)`` for every damage found in the sharded array
    ``name``; ``counted`` (if given) gets the number of stored chunks checked appended."""
    codec = make_codec(layout.compression, layout.dtype.itemsize) if (
        layout.compression != "none") else None
    total = 0
    stored = _listed(place, name, layout)
    for k in range(layout.n_shards) if stored is None else stored:  # a loop per shard
        n, problems = _shard(place, name, layout, k, codec)
        total += n
        yield from problems
    if counted is not None:
        counted.append(total)

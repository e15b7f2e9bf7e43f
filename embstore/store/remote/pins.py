"""The key arrays' chunk pins checked on object storage (docs/FORMAT.md §4, §11).

Each key-index array's ``zarr.json`` lists, in ``embstore_chunk_crc32c``, the crc32c each of
its chunk files ends in.  On a local disk :class:`~embstore.keys.mapped.MappedArray`
compares a chunk's last 4 bytes with its entry when it maps the chunk.  A table on object
storage reads its key chunks by checked blocks (:mod:`.ranged`), each block against the
chunk's block sidecar; a chunk file swapped, with its sidecar, for another table's of the
same size (every block matching that sidecar) would pass those checks.  So before a chunk's
sidecar is used, the chunk file's last 4 bytes are compared with its pin: one ranged read of
4 bytes per chunk file on first use, kept in the disk cache (a key array holds one chunk
file per 64 MiB: a few requests per table).
"""

from __future__ import annotations

from typing import Any

from ...errors import CorruptStoreError

__all__ = ["check_chunk_pins"]

_TAIL = "tail"  # the disk-cache entry of a chunk file's last 4 bytes


def check_chunk_pins(reader: Any, name: str, pins: list[int] | None, file_bytes: int,
                     chunks: list[int], where: str) -> None:
    """Raise :class:`CorruptStoreError` unless each chunk file ``<name>/c/<c>`` of
    ``chunks`` (``file_bytes`` long) ends in ``pins[c]``; ``reader`` is the table's
    :class:`~embstore.store.remote.ranged.RangeReader`, ``where`` the array (for
    messages).  No-op for an array written before the pins (``pins`` None)."""
    if pins is None or not chunks:
        return
    rels = [f"{name}/c/{c}" for c in chunks]
    tails: list = [reader.cached(rel, _TAIL) for rel in rels]
    todo = [j for j, t in enumerate(tails) if t is None or len(t) != 4]
    got = reader.get_ranges([(rels[j], file_bytes - 4, file_bytes) for j in todo]) \
        if todo else []
    for j, data in zip(todo, got):
        tails[j] = b"" if data is None else bytes(data)
    for c, rel, tail in zip(chunks, rels, tails):  # a loop per chunk file (a few)
        stored = int.from_bytes(tail, "little") if len(tail) == 4 else None
        if stored != pins[c]:
            shown = "missing" if stored is None else f"{stored:#010x}"
            raise CorruptStoreError(
                f"{reader.where(rel)}: ends in crc32c {shown}, its array's zarr.json "
                f"records {pins[c]:#010x} (a chunk file of another array, version or "
                "table in its place; run embstore verify)", path=where)
    for j in todo:  # (only tails that matched: a damaged one is fetched again next time)
        reader.keep(rels[j], _TAIL, tails[j])

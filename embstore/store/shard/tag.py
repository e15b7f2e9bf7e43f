"""The shard tag (docs/FORMAT.md §3b): what ties a shard file's chunks to the version that
names it.

Every inner chunk of a checksummed shard ends in its own crc32c and the index in its own,
so a shard of the same layout from another version or table (another valid file) passes
every check a reader makes on first use.  A shard embstore writes therefore carries, just
before its index, a tag listing the crc32c each of its chunks ends in and the crc32c of its
index; the version's manifest pins the tag by its own crc32c (the 4th element of the shard's
``objects`` entry, :mod:`embstore.store.versions.pinning`).  A reader checks the tag once per
shard (read with the index, one ``pread``) and then each chunk's crc32c against the tag's
entry when it checks the chunk: another shard, a re-checksummed chunk or index, or a chunk
marked absent is damage before any of its rows is returned.  Other Zarr readers never see
the tag (no index entry points into it).

Layout, ``n`` the shard's inner chunks::

    "EMBSHTG1" | uint32 n | uint32 crc32c(index body) | n x uint32 chunk crc32c (0: absent)
    | uint32 crc32c of the preceding 16 + 4 n bytes
"""

from __future__ import annotations

import numpy as np

from ...errors import CorruptStoreError
from ...fs.checksum import crc32c
from ..codecs import Layout

__all__ = ["MAGIC", "tag_len", "tagged", "make_tag", "parse_tag", "chunk_crcs"]

MAGIC = b"EMBSHTG1"


def tag_len(n: int) -> int:
    """Bytes of the tag of a shard of ``n`` inner chunks."""
    return 4 * n + 20


def tagged(layout: Layout) -> bool:
    """Whether shards of ``layout`` carry a tag: checksummed chunks and index (a tag pins
    crc32c values; without them there is nothing to pin)."""
    return layout.has_crc and layout.index_crc


def make_tag(index_body: bytes, crcs: np.ndarray) -> bytes:
    """The tag of a shard whose index body is ``index_body`` and whose chunks end in
    ``crcs`` (uint32, 0 for an absent chunk)."""
    head = MAGIC + len(crcs).to_bytes(4, "little") + crc32c(index_body).to_bytes(4, "little")
    body = head + np.ascontiguousarray(crcs, dtype="<u4").tobytes()
    return body + crc32c(body).to_bytes(4, "little")


def chunk_crcs(parts: list) -> np.ndarray:
    """The crc32c each stored chunk of ``parts`` (bytes, each ending in its crc32c) ends in."""
    return np.array([int.from_bytes(bytes(p[-4:]), "little") for p in parts], dtype="<u4")


def parse_tag(buf, n: int, index_body, pin: int, where: str) -> np.ndarray:
    """The chunk crc32c values of the tag ``buf`` (``tag_len(n)`` bytes) of a shard whose
    index body is ``index_body`` and whose version pins the tag as ``pin``; anything else
    (no tag, a damaged one, another shard's, an index that is not the tag's) raises
    :class:`CorruptStoreError` naming ``where``."""
    mv = memoryview(buf).cast("B")
    if len(mv) != tag_len(n) or bytes(mv[:8]) != MAGIC or \
            int.from_bytes(mv[8:12], "little") != n:
        raise CorruptStoreError(
            f"shard {where}: no shard tag before its index, though the version's manifest "
            "pins one (a shard this version did not write in its place)", path=where)
    stored = int.from_bytes(mv[-4:], "little")
    if crc32c(mv[:-4]) != stored:
        raise CorruptStoreError(f"shard {where}: its shard tag fails its crc32c (damaged)",
                                path=where)
    if stored != pin:
        raise CorruptStoreError(
            f"shard {where}: its shard tag has crc32c {stored:#010x}, the version's manifest "
            f"records {pin:#010x} (another shard, of another version or table, in its place)",
            path=where)
    if int.from_bytes(mv[12:16], "little") != crc32c(index_body):
        raise CorruptStoreError(
            f"shard {where}: its index is not the one its shard tag records (re-indexed or "
            "re-checksummed)", path=where)
    return np.frombuffer(mv[16:-4], dtype="<u4")

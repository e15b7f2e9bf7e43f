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

The tag is found by the shard's geometry: its stored chunks end exactly ``tag_len(n)`` bytes
before the index.  A shard laid out so is checked (its magic, its crc32c, the index crc32c
it records) whether or not a manifest pins it, so no byte of a shard embstore wrote goes
unchecked (a format-1 table has no manifest); a pinned shard without one is damage.

Layout, ``n`` the shard's inner chunks::

    "EMBSHTG1" | uint32 n | uint32 crc32c(index body) | n x uint32 chunk crc32c (0: absent)
    | uint32 crc32c of the preceding 16 + 4 n bytes
"""

from __future__ import annotations

import os

import numpy as np

from ...errors import CorruptStoreError
from ...fs.checksum import crc32c
from ...fs.files import open_regular
from ..codecs import ABSENT, Layout

__all__ = ["MAGIC", "tag_len", "tagged", "make_tag", "chunk_crcs", "find_tag", "tag_pin"]

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


def _stored_end(off: np.ndarray, nb: np.ndarray) -> int:
    """The end of the last stored chunk (0: none stored)."""
    return int(np.max(np.where(off >= 0, off + nb, 0), initial=0))


def find_tag(tail, index_len: int, off: np.ndarray, nb: np.ndarray, data_len: int,
             layout: Layout, pin: int | None, where: str) -> np.ndarray | None:
    """The chunk crc32c values the tag of a shard records, or None for a shard without one
    that nothing pins (written before tags, or by another tool).

    ``tail``: the shard's last bytes, its index (``index_len`` bytes, already checked and
    parsed into ``off``, ``nb``) and as many bytes before it as a tag takes (fewer if the
    file is shorter); ``data_len``: the bytes before the index; ``pin``: the tag crc32c the
    version's manifest records, or None.  A tag where the geometry puts one that is not a
    valid tag of this index, a tag another than the pin, or no tag where a pin says one is,
    raise :class:`CorruptStoreError` naming ``where``."""
    if not tagged(layout):
        return None
    n = layout.n_inner
    t = tag_len(n)
    mv = memoryview(tail).cast("B")
    if data_len - _stored_end(off, nb) != t or len(mv) < index_len + t:
        if pin is None:
            return None
        raise CorruptStoreError(
            f"shard {where}: no shard tag before its index, though the version's manifest "
            "pins one (a shard this version did not write in its place)", path=where)
    at = len(mv) - index_len
    tag, index_crc = mv[at - t: at], bytes(mv[len(mv) - 4:])
    stored = int.from_bytes(tag[-4:], "little")
    if bytes(tag[:8]) != MAGIC or int.from_bytes(tag[8:12], "little") != n or \
            crc32c(tag[:-4]) != stored:
        raise CorruptStoreError(f"shard {where}: its shard tag (the {t} bytes before its "
                                "index) fails its crc32c (damaged)", path=where)
    if pin is not None and stored != pin:
        raise CorruptStoreError(
            f"shard {where}: its shard tag has crc32c {stored:#010x}, the version's manifest "
            f"records {pin:#010x} (another shard, of another version or table, in its place)",
            path=where)
    if bytes(tag[12:16]) != index_crc:
        raise CorruptStoreError(
            f"shard {where}: its index is not the one its shard tag records (re-indexed or "
            "re-checksummed)", path=where)
    return np.frombuffer(tag[16:-4], dtype="<u4")  # (a view of ``tail``: kept with it)


def tag_pin(path, layout: Layout) -> int | None:
    """The crc32c of the tag of the shard file at ``path`` (what a manifest pins), or None:
    a layout without tags, a shard without one (written before tags), or one whose tag is
    not valid (nothing to pin: its reader reports the damage)."""
    if not tagged(layout):
        return None
    n = layout.n_inner
    index_len, t = 16 * n + 4, tag_len(n)
    fd = open_regular(path, nofollow=True)
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, index_len + t, max(0, size - index_len - t))
    finally:
        os.close(fd)
    if len(tail) < index_len + t:
        return None
    index = np.frombuffer(tail[-index_len:-4], dtype="<u8").reshape(n, 2)
    present = index[:, 0] != ABSENT
    off = np.where(present, index[:, 0].astype(np.int64), -1)
    nb = np.where(present, index[:, 1].astype(np.int64), 0)
    try:
        if find_tag(tail, index_len, off, nb, size - index_len, layout, None, str(path)) is None:
            return None
    except CorruptStoreError:
        return None
    return int.from_bytes(tail[-index_len - 4: -index_len], "little")

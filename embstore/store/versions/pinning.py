"""Versions pinned by content (docs/FORMAT.md §6f): what a version's manifest records of
its objects, and the checks that find an object or a version directory that is not what
the version's commit made.

A manifest (:mod:`.snapshot`) records ``objects``: for every delta of the version, by its
relative name ``deltas/<N>.<array>``, ``[size, crc32c, tail]`` (:func:`file_sum`).  The
layout's files are not in it: they carry their own checksums (page checksums, shard index
and chunk crc32c, the key index's block sums), an append writes rows into a row chunk's
padding in place, and another Zarr tool may write a layout in place (measured: a whole-file
pin of every file failed 15 existing cases of both); the deltas are embstore's alone and
never change once written, and so are the metadata files (``zarr.json``: a commit stages a
new one and renames it over the old), which are pinned too (small: verify checks them; a
reader checks what they say against the version: its rows, the key index's chunk sums).
``files`` lists every table file of the version by name: a removed, renamed or added file
is damage (an absent shard would otherwise read as zeros).  A delta kept from the parent (the same link) keeps the
parent's entry: a commit checksums only what it wrote.
The manifest also records ``parent_sha256``, the SHA-256 of the parent's manifest, and the
commit's journal (``last``) the SHA-256 of the new manifest (``manifest_sha256``): a chain
from the table's pointer to its newest commit down every retained version, as Git pins a
commit's tree and parents.  A version directory whose manifest was edited and re-checksummed
(a delta left out, a delta swapped, a key renamed in a key delta) no longer matches the hash
its child or ``last`` holds.

- **open** (cheap: manifests, and the deltas, which are read anyway): the newest version's
  manifest against ``last``'s ``manifest_sha256``; an older version's against its child's
  ``parent_sha256``; each delta file's size and last 4 bytes (its own crc32c, checked when
  it is read) against ``objects``.
- **verify**: all of that for every retained version, every delta's size and crc32c, and
  no delta file of a version outside ``objects``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path


from ...errors import CorruptStoreError
from ...fs.checksum import crc32c
from ...fs.files import open_regular, read_small
from ..codecs import Layout
from ..shard.tag import tag_pin

__all__ = ["OBJECTS", "FILES", "SEED", "CRC", "check_names", "in_place", "journal_crc",
           "last_problems", "manifest_sha256", "file_sum", "size_and_tail",
           "object_sums", "shard_tag", "shard_pins",
           "last_doc", "check_pins", "verify_objects"]

OBJECTS = "objects"
#: the manifest's list of the version's table files (its deltas and manifest aside)
FILES = "files"
_BLOCK = 1 << 20  # bytes read (and hashed) at a time
#: what an object's crc32c starts from (docs/FORMAT.md section 6f)
SEED = b"embstore-object\n"
_SEED_CRC = crc32c(SEED)


def manifest_sha256(doc: dict) -> str:
    """The SHA-256 (hex) of a manifest: the canonical JSON of its fields but ``crc32c``."""
    body = {k: v for k, v in doc.items() if k != "crc32c"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()


def file_sum(path: Path, *, legacy: bool = False) -> list:
    """``[size, digest, tail]`` of the regular file at ``path`` (read in pieces of 1 MiB):
    ``digest`` is ``"sha256:"`` and the first 16 hex digits of the file's SHA-256, ``tail``
    its last 4 bytes as a little-endian uint32 (0 when shorter): the open-time check reads
    only the size and those.  A crc32c cannot pin a file: over units that each end in
    their own crc32c (a delta, a shard's chunks and index) it is the same for any content
    of those lengths, seeded or not (measured: an older version's shard and the newest's
    summed alike).  ``legacy``: the seeded crc32c of entries written before (an int).
    A group's ``zarr.json`` is summed without its ``consolidated_metadata`` (a copy of the
    arrays' metadata, derived: a tool may leave it stale, docs/FORMAT.md §4)."""
    if path.name == "zarr.json" and not legacy:
        group = _group_body(path)
        if group is not None:
            return [len(group), f"sha256:{hashlib.sha256(group).hexdigest()[:16]}",
                    _tail(group[-4:])]
    fd = open_regular(path, nofollow=True)
    buf = bytearray(_BLOCK)  # (one buffer read into: a commit's checksum of a large
    view = memoryview(buf)  # delta takes a block of memory, not two copies of 16 MiB)
    try:
        h, crc, size, last = hashlib.sha256(), _SEED_CRC, 0, b""
        while True:  # a loop per block
            n = os.readv(fd, [buf])
            if not n:
                digest = crc if legacy else f"sha256:{h.hexdigest()[:16]}"
                return [size, digest, _tail(last)]
            block = view[:n]
            if legacy:
                crc = crc32c(block, crc)
            else:
                h.update(block)
            size += n
            last = (last + block[-4:].tobytes())[-4:]
    finally:
        os.close(fd)


def _group_body(path: Path) -> bytes | None:
    """The canonical JSON of a group's ``zarr.json`` without ``consolidated_metadata``, or
    None (an array's metadata, or not JSON: summed as bytes)."""
    fd = open_regular(path, nofollow=True)
    try:
        data = os.read(fd, 1 << 24)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("node_type") != "group":
        return None
    body = {k: v for k, v in doc.items() if k != "consolidated_metadata"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _tail(last: bytes) -> int:
    return int.from_bytes(last, "little") if len(last) == 4 else 0


def size_and_tail(path: Path) -> list[int]:
    """``[size, tail]`` of a file: one ``fstat`` and one 4-byte read."""
    fd = open_regular(path, nofollow=True)
    try:
        size = os.fstat(fd).st_size
        return [size, _tail(os.pread(fd, 4, size - 4)) if size >= 4 else 0]
    finally:
        os.close(fd)


def in_place(snap: Path, rel: str) -> bool:
    """Whether ``rel`` is a chunk file of a row array (an append writes its padding in
    place: pinned by its page checksums, never by its bytes)."""
    parts = rel.split("/")
    if len(parts) < 3 or parts[1] != "c":
        return False
    if parts[0].endswith("page_crc"):
        return True  # (a chunk's page checksums: checked against the chunk they cover)
    crc = "page_crc" if parts[0] == "vectors" else f"{parts[0]}_page_crc"
    return (Path(snap) / crc / "zarr.json").is_file()


def object_sums(snap: Path, rels: list[str], old: dict, fresh: set[str], *,
                first: bool = False) -> dict:
    """``objects`` of the version in ``snap``: ``rels`` (its files and ``deltas/...``),
    entries of ``old`` (the parent's) kept for the files not in ``fresh`` (written now).
    Every file never changed in place is pinned: the deltas and metadata files always
    (small), the others when written now (``first``: every file, version 1) or pinned by
    the parent, so a commit checksums only what it wrote.  A shard with a shard tag gets
    the tag's crc32c as a 4th element (:func:`shard_tag`)."""
    out: dict = {}
    layouts: dict = {}
    for rel in sorted(rels):  # a loop per file of the version (a checksum per new one)
        if in_place(snap, rel):
            continue  # (pinned by their page checksums: see the module doc)
        kept = old.get(rel) if rel not in fresh else None
        if isinstance(kept, list):
            out[rel] = list(kept)
        elif first or rel in fresh or rel.startswith("deltas/") or rel.endswith("zarr.json"):
            out[rel] = file_sum(snap / rel)
            tag = shard_tag(snap, rel, layouts)
            if tag is not None:
                out[rel].append(tag)
    return out


def _shard_number(rel: str) -> tuple[str, int] | None:
    """``(array, k)`` of a shard file's relative name ``<array>/c/<k>/0``, else None."""
    parts = rel.split("/")
    if len(parts) == 4 and parts[1] == "c" and parts[3] == "0" and parts[2].isdigit() and \
            parts[0] != "deltas":
        return parts[0], int(parts[2])
    return None


def shard_tag(snap: Path, rel: str, layouts: dict) -> int | None:
    """The crc32c of the shard tag of file ``rel`` of the snapshot ``snap`` (docs/FORMAT.md
    §3b), or None: not a shard of a checksummed sharded array, or a shard without a tag
    (written before tags).  ``layouts`` caches each array's layout."""
    got = _shard_number(rel)
    if got is None:
        return None
    name = got[0]
    if name not in layouts:
        try:
            layouts[name] = Layout.from_metadata(json.loads((snap / name / "zarr.json")
                                                            .read_text("utf-8")))
        except (OSError, ValueError, CorruptStoreError):
            layouts[name] = None
    L = layouts[name]
    return None if L is None else tag_pin(snap / rel, L)


def shard_pins(objects) -> dict[str, dict[int, int]]:
    """``{array: {k: tag crc32c}}`` of the shards a version's ``objects`` pins by tag."""
    out: dict[str, dict[int, int]] = {}
    if not isinstance(objects, dict):
        return out
    for rel, entry in objects.items():  # a loop per pinned file
        got = _shard_number(rel) if isinstance(rel, str) else None
        if got is not None and isinstance(entry, list) and len(entry) == 4 and \
                type(entry[3]) is int and 0 <= entry[3] < 1 << 32:
            out.setdefault(got[0], {})[got[1]] = entry[3]
    return out


CRC = "crc32c"


def journal_crc(doc: dict) -> int:
    """The crc32c of a commit journal (``last`` once applied): over its canonical JSON
    without ``crc32c``, as a manifest's."""
    body = {k: v for k, v in doc.items() if k != CRC}
    return crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def last_problems(root: Path, n: int, manifest: dict) -> list[tuple[str, str]]:
    """``(file, message)`` of what is wrong with ``last`` for the newest version ``n``: a
    version a commit made with content pins (``files``) has a ``last`` whose crc32c holds
    and which names that version, its manifest's SHA-256 and its commit."""
    path = Path(root) / "vectors" / ".embstore" / "last"
    if FILES not in manifest or manifest.get("parent") is None:
        return []  # (version 1 of a save has no last; versions made before the pins)
    doc = last_doc(root)
    if doc is None:
        return [(str(path), f"{path}: missing or unreadable (version {n} was made by a commit, "
                            "which leaves it)")]
    if CRC in doc and doc[CRC] != journal_crc(doc) or CRC not in doc:
        return [(str(path), f"{path}: its crc32c does not hold (the last commit's record is "
                            "damaged)")]
    snap = doc.get("snapshot")
    if not (isinstance(snap, list) and snap[1:] == [n] and doc.get("txn") == manifest.get("txn")
            and doc.get("manifest_sha256") == manifest_sha256(manifest)):
        return [(str(path), f"{path}: does not name version {n}, the newest (its commit, "
                            "version or manifest hash is another's)")]
    return []


def last_doc(root: Path) -> dict | None:
    """The table's pointer to its newest commit (``vectors/.embstore/last``), or None."""
    path = Path(root) / "vectors" / ".embstore" / "last"
    try:
        fd = open_regular(path, nofollow=True)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(read_small(fd, path))
    except (OSError, ValueError, RecursionError):
        return None  # (unreadable: the commit checks report it)
    finally:
        os.close(fd)
    return doc if isinstance(doc, dict) else None


_PART = re.compile(r"^[A-Za-z0-9_.-]+$")


def _relative(rel) -> bool:
    return isinstance(rel, str) and all(_PART.match(p) and p not in (".", "..")
                                        for p in rel.split("/"))


def _damage(snap: Path, what: str) -> CorruptStoreError:
    return CorruptStoreError(f"{snap}: {what} (the version's files are not the ones its commit "
                             "made)", path=str(snap))


def check_names(snap: Path, manifest: dict, files: list[str]) -> list[tuple[str, str]]:
    """``(file, message)`` of every file the manifest's ``files`` names that ``files`` (the
    version's table files as listed, deltas aside) lacks, and every file it does not name:
    a removed shard would otherwise read as zeros, a renamed or copied-in one as rows.  A
    version made before this list has none: nothing to compare."""
    named = manifest.get(FILES)
    if named is None:
        return []
    if not (isinstance(named, list) and all(isinstance(x, str) for x in named)):
        return [(str(snap / "manifest.json"), f"{snap}/manifest.json: files must be a list "
                 "of relative names")]
    have = {f for f in files if not f.startswith("deltas/")}
    want = set(named)
    out = [(str(snap / rel), f"{snap / rel}: missing (version's manifest names it)")
           for rel in sorted(want - have)]
    out += [(str(snap / rel), f"{snap / rel}: a file the version's manifest does not name "
             "(not a file of this version)") for rel in sorted(have - want)]
    return out


def check_pins(root: Path, n: int, snap: Path, manifest: dict, read_manifest,
               files: list[str] | None = None) -> None:
    """The open-time checks of version ``n`` (the module doc): its manifest against the
    hash ``last`` or its child holds, its files (``files``: the version's, as listed)
    against the manifest's ``files``, its deltas against ``objects``."""
    wrong = check_names(snap, manifest, files) if files is not None else []
    if wrong:
        raise CorruptStoreError(f"{wrong[0][1]} (the version's files are not the ones its "
                                f"commit made; {len(wrong)} such files)", path=wrong[0][0])
    from_last = last_doc(root)
    pin, by = None, ""
    if from_last is not None and isinstance(from_last.get("snapshot"), list) and \
            from_last["snapshot"][1:] == [n]:
        pin, by = from_last.get("manifest_sha256"), "the table's last commit"
    else:
        child = Path(root) / "vectors" / ".embstore" / "versions" / str(n + 1)
        if child.is_dir():
            try:
                pin, by = read_manifest(child).get("parent_sha256"), f"version {n + 1}"
            except CorruptStoreError:
                pin = None  # (its own damage is reported when it is opened or verified)
    if isinstance(pin, str) and pin != manifest_sha256(manifest):
        raise _damage(snap, f"its manifest's SHA-256 is not the one {by} records")
    objects = manifest.get(OBJECTS)
    if objects is None:
        return  # a version made before content pins: its manifest's crc32c only
    if not isinstance(objects, dict):
        raise _damage(snap, "manifest.json: objects must be an object")
    bad = [rel for rel in objects if not _relative(rel)]
    if bad:
        raise _damage(snap, f"manifest.json: objects names {bad[0][:80]!r}, not a relative "
                            "name inside the version")
    for rel in [f"deltas/{e['name']}" for e in manifest["deltas"]]:  # a loop per delta
        want = objects.get(rel)
        try:
            got = size_and_tail(snap / rel)
        except FileNotFoundError:
            raise _damage(snap, f"{rel}: missing") from None
        if not (isinstance(want, list) and len(want) == 3 and [want[0], want[2]] == got):
            raise _damage(snap, f"{rel}: {got[0]} bytes ending in {got[1]:#010x}; the manifest "
                                f"records {want} (size, crc32c, last 4 bytes)")


def verify_objects(snap: Path, manifest: dict, files: list[str]) -> list[tuple[str, str]]:
    """``(file, message)`` of every object of the version in ``snap`` whose size or crc32c
    is not the manifest's, missing, or not named by it (``files``: the version's files and
    ``deltas/...``)."""
    objects = manifest.get(OBJECTS)
    if not isinstance(objects, dict):
        return [] if objects is None else [(str(snap / "manifest.json"), "objects: not an object")]
    out = []
    layouts: dict = {}
    named = {rel for rel in objects if _relative(rel)}  # (others: reported by check_pins)
    for rel in sorted({f for f in files if f.startswith("deltas/")} | named):  # per object
        if rel not in named:
            out.append((str(snap / rel), f"{snap / rel}: a file the version's manifest does "
                                         "not name (not a file of this version)"))
            continue
        try:
            want = objects[rel]
            got = file_sum(snap / rel, legacy=isinstance(want, list) and len(want) >= 3
                           and type(want[1]) is int)
            if isinstance(want, list) and len(want) == 4:  # a shard pinned by its tag too
                got.append(shard_tag(snap, rel, layouts))
        except FileNotFoundError:
            out.append((str(snap / rel), f"{snap / rel}: missing (the version's manifest "
                                         f"names it: {objects[rel]})"))
            continue
        except (OSError, CorruptStoreError) as exc:
            out.append((str(snap / rel), f"{snap / rel}: unreadable ({exc})"))
            continue
        if got != objects[rel]:
            out.append((str(snap / rel), f"{snap / rel}: {got[0]} bytes, digest "
                                         f"{got[1]}; the version's manifest records "
                                         f"{objects[rel]} (another file in its place)"))
    return out

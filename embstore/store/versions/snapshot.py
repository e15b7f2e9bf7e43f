"""A version of a format-2 table is a snapshot: a directory of hard links (docs/FORMAT.md §6a).

``vectors/.embstore/versions/<N>/`` holds, under the table's own relative names, a hard link
to every file of version N (every file of the table but its private area), plus
``manifest.json`` (what the version is) and ``deltas/`` (rows written since the last
compaction, :mod:`.delta`).  Files are never changed in place once a version names them:
a commit writes new files and links them into a new snapshot, so a reader that opened
version N reads exactly version N, whatever commits follow, through the same code that
reads a table (the snapshot directory *is* a table directory).  Unchanged files are shared
by every version (one inode, many names); removing a version removes its names, and a
file's bytes go when no version (and no live name) links it any more.

A snapshot is built as ``versions/<N>.tmp-<txn>`` and renamed to ``versions/<N>`` when
its commit is rolled forward (:mod:`embstore.store.versions.commit`): a directory named by a bare
number is complete.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import time
from pathlib import Path

from ...errors import CorruptStoreError, InvalidOptionError
from ...fs.beside import fsync_all, fsync_path, remove_quietly
from ...fs.checksum import crc32c
from ...fs.files import create_new, open_regular, read_small, real_dir
from .pinning import (FILES, OBJECTS, check_names, check_pins, last_doc, last_problems,
                      manifest_sha256,
                      object_sums, verify_objects)

__all__ = ["VERSIONS", "MANIFEST", "DELTAS", "versions_dir", "list_versions", "newest",
           "snapshot_root", "read_manifest", "build_snapshot", "VersionNotFoundError",
           "version_files", "version_pins", "live_pins", "differs"]

VERSIONS = "versions"
MANIFEST = "manifest.json"
DELTAS = "deltas"
_NUMBER = re.compile(r"^[1-9][0-9]{0,17}$")
_PRIVATE = ("vectors", ".embstore")


class VersionNotFoundError(InvalidOptionError):
    """``open(path, version=N)`` for a version the table does not hold (never committed, or
    removed by ``vacuum``)."""


def versions_dir(root: Path) -> Path:
    return Path(root) / _PRIVATE[0] / _PRIVATE[1] / VERSIONS


def list_versions(root: Path) -> list[int]:
    """The complete versions of the table at ``root``, oldest first ([] if it has none)."""
    try:
        names = os.listdir(versions_dir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names if _NUMBER.match(n))


def newest(root: Path) -> int | None:
    found = list_versions(root)
    return found[-1] if found else None


def snapshot_root(root: Path, n: int) -> Path:
    """The snapshot directory of version ``n``: every part of the path a directory itself,
    never a symbolic link (:class:`CorruptStoreError`): a version never reads outside its
    table."""
    return real_dir(root, (*_PRIVATE, VERSIONS, str(int(n))))


def manifest_crc(doc: dict) -> int:
    body = {k: v for k, v in doc.items() if k != "crc32c"}
    return crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def read_manifest(snap: Path) -> dict:
    """The manifest of the snapshot directory ``snap``, its checksum checked."""
    path = Path(snap) / MANIFEST
    try:
        fd = open_regular(path, nofollow=True)
        try:
            doc = json.loads(read_small(fd, path).decode("utf-8"))
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: missing (the manifest of a version)",
                                path=str(path)) from None
    except CorruptStoreError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptStoreError(f"{path}: unreadable manifest ({exc})", path=str(path)) from None
    if not (isinstance(doc, dict) and isinstance(doc.get("embstore_version"), int)
            and isinstance(doc.get("deltas"), list) and doc.get("crc32c") == manifest_crc(doc)):
        raise CorruptStoreError(f"{path}: not a valid manifest (fields or crc32c do not hold)",
                                path=str(path))
    for d in doc["deltas"]:
        if not (isinstance(d, dict) and isinstance(d.get("name"), str)
                and re.match(r"^[0-9]+\.[A-Za-z0-9_]+$", d["name"])
                and isinstance(d.get("array"), str)):
            raise CorruptStoreError(f"{path}: a delta entry must name a delta file, got "
                                    f"{str(d)[:120]}", path=str(path))
    return doc


def _files(src: Path, *, live: bool) -> list[str]:
    """Relative names of every file of the table tree ``src`` (the private area of a live
    table, a snapshot's manifest and deltas left out); a link or a special file refused.
    (One ``scandir`` a folder: the entries' types come with the listing, no stat a file.)"""
    out: list[str] = []
    stack: list[tuple[str, list[str]]] = [(str(src), [])]
    while stack:  # a loop per folder of the tree
        d, parts = stack.pop()
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:  # a loop per entry of one folder
            if e.is_symlink():
                what = "a symbolic link inside a table" if e.is_dir() else \
                    "not a regular file"
                raise CorruptStoreError(f"{e.path}: {what} (refused)", path=e.path)
            if e.is_dir(follow_symlinks=False):
                if (live and parts == ["vectors"] and e.name == _PRIVATE[1]) or \
                        (not live and not parts and e.name == DELTAS):
                    continue
                stack.append((e.path, parts + [e.name]))
                continue
            if not e.is_file(follow_symlinks=False):
                raise CorruptStoreError(f"{e.path}: not a regular file (refused)", path=e.path)
            if (not live and not parts and e.name == MANIFEST) or ".tmp-" in e.name:
                continue  # (".tmp-": a write in flight of another tool, never in a version)
            out.append("/".join(parts + [e.name]))
    return out


def version_files(snap: Path) -> list[str]:
    """Every file of the snapshot ``snap`` by relative name, its deltas as
    ``deltas/<name>`` (the manifest left out)."""
    rels = _files(snap, live=False)
    try:
        rels += [f"{DELTAS}/{x}" for x in os.listdir(snap / DELTAS)]
    except (FileNotFoundError, NotADirectoryError):
        pass
    return rels


def _link(src: str, dst: Path, made: set) -> None:
    parent = str(dst.parent)
    if parent not in made:
        os.makedirs(parent, exist_ok=True)
        made.add(parent)
    os.link(src, dst)


def build_snapshot(root: Path, txn: str, staged: dict[str, Path], deltas: dict[str, Path],
                   change: dict, *, clear_deltas: bool = False) -> tuple[str, int]:
    """Build the snapshot of the version a commit makes: the newest version's files (the
    live tree if the table has no version yet) with ``staged`` (live name -> new file)
    linked in their place, the newest version's deltas (unless ``clear_deltas``) and
    ``deltas`` (array name -> its new delta file) after them, and the manifest.  Returns the
    snapshot's temporary name (in ``versions/``) and its version number; nothing is
    visible until the commit renames it."""
    root = Path(root)
    parent = newest(root)
    n = (parent or 0) + 1
    src = root if parent is None else snapshot_root(root, parent)
    vdir = versions_dir(root)
    vdir.mkdir(parents=True, exist_ok=True)
    tmp_name = f"{n}.tmp-{txn}"
    tmp = vdir / tmp_name
    made: set = set()
    tmp.mkdir()
    try:
        return _fill(root, src, tmp, tmp_name, n, parent, staged, deltas, change,
                     clear_deltas, made)
    except BaseException:
        remove_quietly(tmp)  # (a full disk: nothing of the version is left)
        raise


def _fill(root, src, tmp, tmp_name, n, parent, staged, deltas, change, clear_deltas,
          made) -> tuple[str, int]:
    vdir = versions_dir(root)
    old = read_manifest(src) if parent is not None else {"deltas": []}
    rels = [rel for rel in _files(src, live=parent is None) if rel not in staged]
    for rel in rels:  # a loop per file of the table (links)
        _link(str(src / rel), tmp / rel, made)
    for rel, path in staged.items():
        _link(str(path), tmp / rel, made)
    entries = [] if clear_deltas else list(old["deltas"])
    for e in entries:
        _link(str(src / DELTAS / e["name"]), tmp / DELTAS / e["name"], made)
    for array, path in deltas.items():  # named <version>.<array>
        _link(str(path), tmp / DELTAS / f"{n}.{array}", made)
        entries.append({"name": f"{n}.{array}", "array": array})
    try:
        vmeta = json.loads((tmp / "vectors" / "zarr.json").read_text("utf-8"))
        rows = int(vmeta["shape"][0])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise CorruptStoreError(f"{tmp}: the new version has no readable vectors/zarr.json",
                                path=str(tmp)) from None
    fresh = set(staged) | {f"{DELTAS}/{n}.{array}" for array in deltas}
    named = rels + list(staged) + [f"{DELTAS}/{e['name']}" for e in entries]
    objects = object_sums(tmp, named, old.get(OBJECTS) or {}, fresh,
                          first=parent is None and change.get("kind") == "save")
    doc = {"embstore_version": n, "parent": parent, "time": round(time.time(), 3),
           "txn": tmp_name.split(".tmp-", 1)[1], "rows": rows, "change": change, "deltas": entries,
           OBJECTS: objects, FILES: sorted(rels + list(staged)),
           "parent_sha256": manifest_sha256(old) if parent is not None else None}
    doc["crc32c"] = manifest_crc(doc)
    fd = create_new(tmp / MANIFEST)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    # the new names are durable before the commit point (the directories at once)
    fsync_all([d for d, _, _ in os.walk(tmp)], directory=True)
    fsync_path(vdir, directory=True)
    return tmp_name, n


def version_pins(root: Path, n: int, snap: Path, manifest: dict) -> list[tuple[str, str]]:
    """``(file, message)`` of everything wrong with version ``n``'s pins: its manifest
    against the hash its child or the last commit records, every object's size and crc32c,
    files its manifest does not name, and (the newest version) the last commit naming it."""
    out = []
    try:
        check_pins(root, n, snap, manifest, read_manifest)
    except CorruptStoreError as exc:
        out.append((str(exc.path), str(exc)))
    files = version_files(snap)
    out += check_names(snap, manifest, files)
    out += verify_objects(snap, manifest, files)
    try:  # the version's vectors are its own (an older vectors/zarr.json copied in: damage)
        shape = json.loads((snap / "vectors" / "zarr.json").read_text("utf-8"))["shape"]
        rows = shape[0]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        rows = None
    if rows != manifest.get("rows"):
        out.append((str(snap / "vectors" / "zarr.json"), f"{snap}/vectors/zarr.json: {rows} "
                    f"rows, version {n}'s manifest says {manifest.get('rows')} (the version's "
                    "files are not its own)"))
    if snap.parent.is_dir() and newest(root) == n:
        out += last_problems(root, n, manifest)
    last = last_doc(root)
    if last is not None and isinstance(last.get("snapshot"), list) and \
            isinstance(last["snapshot"][-1], int) and last["snapshot"][-1] > n and \
            not (snap.parent / str(last["snapshot"][-1])).is_dir():
        out.append((str(snap.parent), f"{snap.parent}: the last commit made version "
                                      f"{last['snapshot'][-1]}, which is missing (a version "
                                      "directory was removed)"))
    return out


def live_pins(root: Path, n: int, snap: Path) -> list[tuple[str, str]]:
    """``(file, message)`` of every live file of the table at ``root`` that is not version
    ``n``'s (the newest) under the same name: missing, extra, or other bytes (the live
    names are what other Zarr readers read; a copy of the table that broke the hard links
    is compared byte for byte)."""
    try:
        live = set(_files(root, live=True))
    except CorruptStoreError as exc:
        return [(str(exc.path), str(exc))]
    mine = {f for f in version_files(snap) if not f.startswith(f"{DELTAS}/")}
    out = [(str(root / rel), f"{root / rel}: missing (a file of the newest version, "
            f"{n}, which the live table shows)") for rel in sorted(mine - live)]
    out += [(str(root / rel), f"{root / rel}: not a file of the newest version ({n})")
            for rel in sorted(live - mine)]
    for rel in sorted(live & mine):  # a loop per file of the table
        a, b = root / rel, snap / rel
        try:
            same = os.path.samefile(a, b) or filecmp.cmp(a, b, shallow=False)
        except OSError as exc:
            out.append((str(a), f"{a}: unreadable ({exc})"))
            continue
        if not same:
            out.append((str(a), f"{a}: other bytes than version {n}'s file of that name "
                                "(the live table is not its newest version)"))
    return out


def differs(snap: Path, other: Path) -> bool:
    """Whether a table file of the snapshot ``snap`` is not ``other``'s of that name (the
    same inode, or the same bytes): ``snap`` then needs checks of its own."""
    for rel in version_files(snap):  # a loop per file of the version
        if rel.startswith(f"{DELTAS}/"):
            continue
        try:
            if not (os.path.samefile(snap / rel, other / rel) or
                    filecmp.cmp(snap / rel, other / rel, shallow=False)):
                return True
        except OSError:
            return True
    return False

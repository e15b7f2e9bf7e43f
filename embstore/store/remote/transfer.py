"""Tables to and from object storage: upload, download, copy.

Object stores have no rename, so a remote table is made visible the only way they allow:
every other object first, the group ``zarr.json`` last (with a fresh ``write_id`` in its
``embstore`` attributes, which versions the on-disk chunk cache).  Replacing a table
deletes its group ``zarr.json`` first, then its other objects (an old shard must not
survive into a new table whose shard is absent), so at no moment does a mix of old and new
objects open as a table, and a killed upload leaves objects without a group ``zarr.json``:
nothing that opens.  Each chunk file of the key index gets a block sidecar
(:mod:`embstore.store.remote.ranged`) so lookups read it by checked ranges.  Downloads are written beside the destination and renamed into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import DestinationExistsError, FormatError
from ...fs.atomic import replace
from ...fs.copytree import copy_folder
from ..place.lock import writer_lock
from .ranged import block_sidecar, is_sidecar, sidecar_name
from ...keys.writer import INDEX_ARRAYS
from ..place.objstore import ObjectClient, is_url
from ..versions.snapshot import DELTAS, MANIFEST, newest, read_manifest, snapshot_root

__all__ = ["upload_table", "download_table", "copy_table", "staged"]

_KEY_CHUNK = re.compile("^(" + "|".join(INDEX_ARRAYS) + r")/c/(\d+)$")
Progress = Callable[[int, int | None], None] | None


def _local_files(root: Path) -> list[tuple[str, Path, int]]:
    """The files of the local table at ``root`` to upload: those of its newest version
    (docs/FORMAT.md §6a: a commit made meanwhile is not mixed in), and of its private area
    the approximate index; never other versions or readers' leases.  A table with rows
    in deltas (written since its last compaction) is refused: remote readers read chunks."""
    n = newest(root)
    snap = root if n is None else snapshot_root(root, n)
    if n is not None:
        pending = read_manifest(snap)["deltas"]
        if pending:
            raise FormatError(f"{root}: rows written (or keys appended) since its last "
                              f"compaction are in {len(pending)} delta file(s), which tables on "
                              "object storage do not read: run `embstore compact` on it first",
                              path=str(root))
    out = []
    for base, skip in ((snap, n is not None), (root / "vectors" / ".embstore" / "ann", False)):
        for d, dirs, files in os.walk(base):
            rel_d = Path(d).relative_to(base).as_posix()
            if rel_d == "vectors" and base == root:
                dirs[:] = [x for x in dirs if x != ".embstore"]  # (the ann index: below)
            if skip and rel_d == ".":
                dirs[:] = [x for x in dirs if x != DELTAS]
                files = [f for f in files if f != MANIFEST]
            for name in files:
                p = Path(d) / name
                rel = p.relative_to(base).as_posix()
                if base.name == "ann":
                    rel = f"vectors/.embstore/ann/{rel}"
                out.append((rel, p, p.stat().st_size))
    return sorted(out)


def _check_dest(client: ObjectClient, overwrite: bool) -> list[str]:
    """The objects to delete before writing (refuses an existing table without overwrite)."""
    existing = [rel for rel, _ in client.list()]
    if existing and not overwrite:
        what = "already exists" if "zarr.json" in existing else (
            f"holds {len(existing)} objects but no table (a killed upload?)")
        raise DestinationExistsError(f"{client.url} {what} (pass overwrite=True to replace it)")
    return existing


def _clear(client: ObjectClient, existing: list[str]) -> None:
    if "zarr.json" in existing:  # first: from now on nothing here opens as a table
        client.delete(["zarr.json"])
    client.delete([r for r in existing if r != "zarr.json"])


class _Counter:
    def __init__(self, total: int, on_progress: Progress):
        self.done, self.total, self.cb = 0, total, on_progress
        self.lock = threading.Lock()
        if self.cb is not None:
            self.cb(0, total)

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            if self.cb is not None:
                self.cb(self.done, self.total)


def upload_table(src, url: str, *, overwrite: bool = False, storage_options: dict | None = None,
                 on_progress: Progress = None) -> None:
    """Upload the local table folder ``src`` to ``url`` (group ``zarr.json`` last)."""
    root = Path(os.fspath(src))
    files = _local_files(root)
    group = [f for f in files if f[0] == "zarr.json"]
    if not group or not (root / "vectors" / "zarr.json").is_file():
        raise FormatError("not an embstore table: zarr.json is missing", path=str(root))
    doc = json.loads(group[0][1].read_text(encoding="utf-8"))
    attrs = doc.setdefault("attributes", {})
    emb = attrs.get("embstore") if isinstance(attrs.get("embstore"), dict) else None
    if emb is not None:
        emb["write_id"] = uuid.uuid4().hex
    client = ObjectClient(url, storage_options)
    try:
        _clear(client, _check_dest(client, overwrite))
        rest = [f for f in files if f[0] != "zarr.json" and not is_sidecar(
            f[0])]  # (sidecars of an earlier download: made afresh below)
        progress = _Counter(sum(f[2] for f in files), on_progress)

        def put(item):
            rel, path, size = item
            client.put(rel, path if size > 0 else b"")
            m = _KEY_CHUNK.match(rel)
            if m is not None:  # the key index: its block sidecar, for ranged lookups
                client.put(sidecar_name(m.group(1), int(m.group(2))), block_sidecar(
                    path.read_bytes(), fences=m.group(1) == "key_hash"))
            progress.add(size)

        client.map(put, rest)
        client.put("zarr.json", json.dumps(doc, indent=2).encode())  # last: now it opens
        progress.add(group[0][2])
    finally:
        client.close()


def download_table(url: str, dest, *, overwrite: bool = False,
                   storage_options: dict | None = None, on_progress: Progress = None) -> None:
    """Download the table at ``url`` to the local folder ``dest`` (renamed into place)."""
    dest = Path(os.fspath(dest)).absolute()
    if dest.exists() and not overwrite:
        raise DestinationExistsError(f"{dest} already exists (pass overwrite=True to replace it)")
    client = ObjectClient(url, storage_options)
    try:
        objects = dict(client.list())
        if "zarr.json" not in objects:
            raise FormatError("not an embstore table: zarr.json is missing", path=url)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent))
        try:
            progress = _Counter(sum(objects.values()), on_progress)

            def get(rel):
                data = client.get(rel)
                if data is None:  # deleted meanwhile: the table is being replaced
                    raise FormatError("an object vanished during the download (is the table "
                                      f"being replaced?): {rel}", path=url)
                p = tmp / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
                progress.add(len(data))

            client.map(get, [r for r in objects if r != "zarr.json" and not is_sidecar(
                r)])  # block sidecars: for remote reads only
            get("zarr.json")
            replace(tmp, dest)  # one exchange where the system has one
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        client.close()


def copy_table(src, dest, *, overwrite: bool = False, storage_options: dict | None = None,
               on_progress: Progress = None) -> None:
    """Copy a table between a local folder and object storage (either way, or remote to
    remote through a local temporary folder), or from a local folder to another (as
    ``cp -a``: hard links and sparse files kept, the same space on disk).  ``storage_options`` apply to both URLs."""
    opts: dict[str, Any] = {"storage_options": storage_options, "on_progress": on_progress,
                            "overwrite": overwrite}
    if is_url(src) and is_url(dest):
        with tempfile.TemporaryDirectory(prefix="embstore-copy-") as tmp:
            download_table(src, Path(tmp) / "t.emb", storage_options=storage_options)
            upload_table(Path(tmp) / "t.emb", dest, **opts)
    elif is_url(dest):
        upload_table(src, dest, **opts)
    elif is_url(src):
        download_table(src, dest, **opts)
    else:  # local to local: hard links and holes kept (fs/copytree.py), no writer meanwhile
        if not os.path.isfile(os.path.join(src, "zarr.json")):
            raise FormatError("not a table (no zarr.json)", path=os.fspath(src))
        with writer_lock(Path(src)):
            copy_folder(src, dest, overwrite=overwrite, on_progress=on_progress)


@contextmanager
def staged(url: str, *, overwrite: bool = False, storage_options: dict | None = None,
           on_progress: Progress = None) -> Iterator[Path]:
    """A local folder path to write a table at; uploaded to ``url`` when the block ends
    without an error (the destination is checked first, so a refusal comes early)."""
    client = ObjectClient(url, storage_options)
    try:
        _check_dest(client, overwrite)
    finally:
        client.close()
    with tempfile.TemporaryDirectory(prefix="embstore-upload-") as tmp:
        local = Path(tmp) / "t.emb"
        yield local
        upload_table(local, url, overwrite=overwrite, storage_options=storage_options,
                     on_progress=on_progress)

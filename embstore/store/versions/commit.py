"""The commit protocol of ``write`` and ``append``: all or nothing, one commit point.

A Zarr v3 reader finds shard ``k`` at ``vectors/c/<k>/0`` and the row count in
``vectors/zarr.json``, so changed files cannot take new names; they are replaced.  A
:class:`Transaction` (under the writer lock, :mod:`embstore.store.place.lock`):

1. writes every new file (shards, key-index chunks, ``keys`` chunks, the ``zarr.json`` of
   each changed array), fsynced, as ``vectors/.embstore/txn-<id>.<n>`` (arrays that
   zarr-python writes go to the scratch directory ``txn-<id>/`` first, then each file
   is moved there); nothing live is touched;
2. writes the journal (the list of staged file -> live file moves) to
   ``vectors/.embstore/journal.tmp-<id>``, fsyncs it and renames it to
   ``vectors/.embstore/journal``: **the commit point**;
3. rolls forward: renames each staged file over its live file, in the journal's order
   (shards, key index, ``keys``, ``vectors/zarr.json`` last), fsyncs their directories,
   then renames the journal to ``vectors/.embstore/last`` (the id of the last commit,
   which tells a stale handle that the table changed) and removes the staging directory.

Staged names in the journal are ``txn-<id>.<n>`` (in ``vectors/.embstore/``); live
names are relative to the table.

A journal that exists is committed: whoever finds it first with the writer lock (the next
writer, a reader that opens, ``verify``, ``repair``) finishes it; a move whose staged file
is gone was done already, so rolling forward twice is harmless.  Staged files
without a journal are an operation that never committed: removed under the lock.  The
private area lives inside the ``vectors`` array's directory, where Zarr readers (which
list a group's members, not an array's files) never look.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from ...errors import CorruptStoreError, LockTimeoutError
from ...fs.beside import fsync_all
from ...fs.beside import fsync_path as _fsync
from ...fs.beside import remove_quietly, sweep_beside
from ...fs.files import create_new, open_regular, read_small, real_dir
from ..place.lock import LOCK_TIMEOUT, try_writer_lock, writer_lock
from ..meta import read_json, refresh_consolidated
from ..codecs import Layout
from .snapshot import VERSIONS, build_snapshot, newest, read_manifest, versions_dir
from .pinning import CRC, journal_crc, manifest_sha256

__all__ = ["Transaction", "recover", "repair", "settle", "last_commit", "is_versioned", "AREA"]

AREA = (".embstore",)  # under vectors/
JOURNAL, LAST = "journal", "last"
_PART = re.compile(r"^[A-Za-z0-9_.-]+$")


def area_of(root: Path, *, create: bool = False) -> Path:
    """``vectors/.embstore`` of the table at ``root``; :class:`CorruptStoreError` when it
    or ``vectors`` is a symbolic link (or no directory): nothing inside a table follows a
    link, and a writer never writes or deletes outside the table's directory."""
    return real_dir(root, ("vectors", AREA[0]), create=create)


def _read_private(path: Path, limit: int = 16 << 20) -> bytes:
    """The content of a regular file of the commit area (never a link or a FIFO)."""
    fd = open_regular(path, nofollow=True)
    try:
        return read_small(fd, path, limit)
    finally:
        os.close(fd)


class Transaction:
    """One ``write`` or ``append``: stage files, then :meth:`commit` (see the module doc)."""

    def __init__(self, root: Path, *, versioned: bool | None = None):
        self.root = Path(root)
        self.id = uuid.uuid4().hex[:16]
        self.area = area_of(self.root, create=True)
        self.stage = self.area / f"txn-{self.id}"
        self.moves: list[tuple[str, str]] = []  # (staged name in the area, live path)
        self.committed = False
        self._after: list[Callable[[], None]] = []
        # format 2: the commit also makes a version (a snapshot, :mod:`.snapshot`)
        self.versioned = is_versioned(self.root) if versioned is None else bool(versioned)
        self.deltas: dict[str, Path] = {}  # array -> staged delta file (format 2)
        self.clear_deltas = False  # a compaction: the new version has no deltas
        self._unsynced: list[str] = []  # files written, fsynced together before the commit
        self.change: dict = {}  # what the version's manifest says changed
        self._snapshot: str | None = None

    def delta(self, array: str) -> Path:
        """A path to write the delta file of ``array`` (:mod:`.delta`) to; it
        becomes part of the version this commit makes."""
        if not self.versioned:
            raise CorruptStoreError(f"{self.root}: deltas belong to format-2 tables",
                                    path=str(self.root))
        if array in self.deltas:
            raise ValueError(f"{array}: one delta per array and commit")
        path = self.area / f"txn-{self.id}.d-{array}"
        self.deltas[array] = path
        return path

    def file(self, live: str) -> Path:
        """A path to write the new version of the live file ``live`` (relative to the
        table) to, and fsync; it replaces the live file at commit, in the order of these
        calls.  Staged files lie in the private directory itself, so the fsync of that
        directory that commits the journal also makes their names durable."""
        staged = f"txn-{self.id}.{len(self.moves)}"
        self.moves.append((staged, live))
        return self.area / staged

    def tree(self, name: str) -> Path:
        """A scratch directory for arrays a library writes (zarr-python): hand their files
        over with :meth:`adopt`."""
        d = self.stage / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def adopt(self, path: Path, live: str) -> None:
        """Stage the file ``path`` (written in a :meth:`tree`) as the new ``live`` file:
        moved beside the other staged files (no directory fsyncs in trees), fsynced before
        the commit point."""
        staged = self.file(live)
        os.rename(path, staged)
        self.sync_later(staged)

    def sync_later(self, path) -> None:
        """The file ``path`` (staged, or written in place) is fsynced with the others before
        the commit point (concurrent fsyncs: :func:`~embstore.fs.beside.fsync_all`)."""
        self._unsynced.append(os.fspath(path))

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the commit is applied (update in-memory views)."""
        self._after.append(fn)

    def commit(self) -> None:
        """Make the staged files live, all or nothing."""
        if self.stage.exists():
            remove_quietly(self.stage)  # scratch only: every staged file was adopted
        fsync_all(self._unsynced)  # (the data on disk before anything names it)
        self._stage_group()
        for parent in dict.fromkeys(live.rpartition("/")[0] for _, live in self.moves):
            real_dir(self.root, parent.split("/") if parent else [], create=True)  # before
            # the commit point: a committed journal that cannot be applied would stop the table
        doc = {"embstore_journal": 1, "txn": self.id, "pid": os.getpid(),
               "moves": [list(m) for m in self.moves]}
        if self.versioned:  # the version's snapshot, renamed into place first by _apply
            self._snapshot, n = build_snapshot(
                self.root, self.id, {live: self.area / staged for staged, live in self.moves},
                self.deltas, self.change, clear_deltas=self.clear_deltas)
            doc["snapshot"] = [self._snapshot, n]
            doc["manifest_sha256"] = manifest_sha256(read_manifest(  # (pinning.py)
                versions_dir(self.root) / self._snapshot))
            doc["links"] = [p.name for p in self.deltas.values()]
        doc[CRC] = journal_crc(doc)  # (verify finds a damaged ``last``: pinning.py)
        tmp = self.area / f"{JOURNAL}.tmp-{self.id}"
        try:
            with os.fdopen(create_new(tmp), "w", encoding="utf-8") as f:
                json.dump(doc, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.area / JOURNAL)
        except BaseException:
            remove_quietly(tmp)
            raise
        self.committed = True  # from here on the operation happened, crash or not
        _fsync(self.area, directory=True)
        _apply(self.root, doc)
        for fn in self._after:
            fn()

    def _stage_group(self) -> None:
        """Stage the group ``zarr.json`` when it changes, moved last (after
        ``vectors/zarr.json``): its consolidated metadata (if it has any) rebuilt from the
        arrays' new documents (:func:`~.meta.refresh_consolidated`), and in the commit that
        makes a format-1 table's first version, its ``format`` raised to 2 (a versioned
        table: no reader may take its live files, which lack the deltas, for the table)."""
        staged = {live: self.area / name for name, live in self.moves}
        doc = refresh_consolidated(self.root, staged)
        if self.versioned and newest(self.root) is None:
            doc = raise_format(self.root, staged, doc)
        if doc is None:
            return
        with open(self.file("zarr.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.flush()
            os.fsync(f.fileno())

    def abort(self) -> None:
        """Remove the staged files of an operation that did not commit (no-op after a
        commit: the journal, if still there, is rolled forward by the next opener)."""
        if not self.committed:
            if self.stage.exists():
                remove_quietly(self.stage)
            for staged, _ in self.moves:
                remove_quietly(self.area / staged)
            for path in self.deltas.values():
                remove_quietly(path)
            if self._snapshot is not None:
                remove_quietly(versions_dir(self.root) / self._snapshot)


def raise_format(root: Path, staged: dict[str, Path], doc: dict | None) -> dict | None:
    """The group document ``doc`` (read from ``root`` if None) with ``format`` 2 when it says
    format 1 and its rows carry their checksums (format 2 requires them); else ``doc``."""
    group = doc if doc is not None else read_json(root / "zarr.json", "the group's zarr.json",
                                                  root=root)
    attrs = group.get("attributes", {}).get("embstore") if isinstance(
        group.get("attributes"), dict) else None
    if not isinstance(attrs, dict) or attrs.get("format") != 1:
        return doc
    meta = read_json(staged.get("vectors/zarr.json", root / "vectors" / "zarr.json"),
                     "vectors/zarr.json", root=root)
    layout = Layout.from_metadata(meta)
    if layout is None or not (layout.has_crc and layout.index_crc):
        return doc  # (rows without checksums stay format 1, versioned all the same)
    attrs["format"] = 2
    return group


def _check_rel(rel, where) -> str:
    parts = rel.split("/") if isinstance(rel, str) else None
    if not parts or not all(_PART.match(p) and p not in (".", "..") for p in parts) or \
            parts[:2] == ["vectors", AREA[0]]:
        raise CorruptStoreError(f"{where}: a journal entry must be a relative path inside "
                                f"the table, got {rel!r}", path=str(where))
    return rel


def _read_journal(root: Path) -> dict | None:
    path = area_of(root) / JOURNAL
    try:
        doc = json.loads(_read_private(path).decode("utf-8"))
    except FileNotFoundError:
        return None
    except CorruptStoreError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptStoreError(f"{path}: unreadable commit journal ({exc})",
                                path=str(path)) from None
    moves = doc.get("moves") if isinstance(doc, dict) else None
    txn = doc.get("txn") if isinstance(doc, dict) else None
    if not (isinstance(txn, str) and _PART.match(txn) and isinstance(moves, list)
            and all(isinstance(m, list) and len(m) == 2 for m in moves)):
        raise CorruptStoreError(f"{path}: expected a commit journal with 'txn' and 'moves', "
                                f"got {str(doc)[:200]}", path=str(path))
    for staged, live in moves:
        _check_rel(staged, path)
        _check_rel(live, path)
        if not staged.startswith(f"txn-{txn}.") or "/" in staged:
            raise CorruptStoreError(f"{path}: a staged file must be named txn-{txn}.<n>, "
                                    f"got {staged!r}", path=str(path))
    snap, links = doc.get("snapshot"), doc.get("links", [])
    if snap is not None and not (
            isinstance(snap, list) and len(snap) == 2 and type(snap[1]) is int
            and snap[0] == f"{snap[1]}.tmp-{txn}" and isinstance(links, list)
            and all(isinstance(x, str) and x.startswith(f"txn-{txn}.d-") and _PART.match(x)
                    for x in links)):
        raise CorruptStoreError(f"{path}: a bad snapshot entry {str(snap)[:100]}",
                                path=str(path))
    return doc


def _apply(root: Path, doc: dict) -> None:
    """Roll a committed journal forward (idempotent: see the module doc)."""
    area = area_of(root)
    stage = area / f"txn-{doc['txn']}"
    if doc.get("snapshot"):  # the new version, complete: readers open it from here on
        tmp, n = doc["snapshot"]
        vdir = versions_dir(root)
        if os.path.lexists(vdir / tmp):
            os.rename(vdir / tmp, vdir / str(n))
            _fsync(vdir, directory=True)
    dirs: dict[str, None] = {}
    checked: set[str] = set()
    for staged, live in doc["moves"]:  # a loop per changed file
        src, dst = area / staged, root / live
        if not os.path.lexists(src):
            continue  # moved by an earlier roll-forward
        if str(dst.parent) not in checked:  # never a move through a link out of the table
            if not os.path.lexists(dst.parent):
                dirs[str(dst.parent.parent)] = None  # a shard never written before
            real_dir(root, live.split("/")[:-1], create=True)
            checked.add(str(dst.parent))
        os.replace(src, dst)
        dirs[str(dst.parent)] = None
    fsync_all(dirs, directory=True)
    os.replace(area / JOURNAL, area / LAST)
    if stage.exists():
        remove_quietly(stage)
    for name in doc.get("links", ()):  # staged deltas: the snapshot holds them now
        remove_quietly(area / name)


def recover(root: Path, *, deep: bool = False) -> list[str]:
    """Finish a committed operation and remove what interrupted ones left (call it with
    the writer lock held).  ``deep`` also removes the temporary files of older embstore
    versions.  Returns the paths removed (relative to the table)."""
    root = Path(root)
    doc = _read_journal(root)
    if doc is not None:
        _apply(root, doc)
    removed = []
    area = area_of(root)
    try:
        entries = list(os.scandir(area))
    except (FileNotFoundError, NotADirectoryError):
        entries = []
    for e in entries:
        if e.name.startswith("txn-") or e.name.startswith(f"{JOURNAL}.tmp-"):
            remove_quietly(Path(e.path))
            removed.append(f"vectors/{AREA[0]}/{e.name}")
    try:  # snapshots of commits that never reached their commit point
        temps = [e for e in os.scandir(area / VERSIONS) if ".tmp-" in e.name or
                 ".gone-" in e.name]
    except (FileNotFoundError, NotADirectoryError):
        temps = []
    for e in temps:
        remove_quietly(Path(e.path))
        removed.append(f"vectors/{AREA[0]}/{VERSIONS}/{e.name}")
    if deep and (root / "zarr.json").is_file() and (root / "vectors" / "zarr.json").is_file():
        removed += _sweep_old_temps(root)  # only in what looks like a table
    return removed


def _sweep_old_temps(root: Path) -> list[str]:
    """Temporary files of embstore versions before the journal: ``<shard>.tmp-*`` beside
    shards, ``<array>.__tmp__``/``__old__`` arrays, ``zarr.json.tmp-*``."""
    removed = []
    candidates = [root, root / "vectors"]
    grid = root / "vectors" / "c"
    try:
        candidates += [Path(e.path) for e in os.scandir(grid) if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        pass
    for d in candidates:  # a loop per directory
        try:
            names = os.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if ".tmp-" in name or name.endswith((".__tmp__", ".__old__")):
                remove_quietly(d / name)
                removed.append(os.path.relpath(d / name, root))
    return removed


def repair(path, *, lock_timeout: float | None = None) -> list[str]:
    """Finish an interrupted commit of the table at ``path`` and remove every leftover of
    interrupted writes: staging directories, older embstore versions' temporary files, and
    beside ``path`` the temporary tables of ``save``/import runs whose process is gone.
    Returns what was removed (paths relative to the table, or names beside it)."""
    root = Path(os.fspath(path)).absolute()
    removed = [f"../{name}" for name in sweep_beside(root)]
    if root.is_dir():
        with writer_lock(root, lock_timeout):
            removed += recover(root, deep=True)
    return removed


def first_version(root: Path, change: dict) -> int:
    """Make version 1 of the new format-2 table at ``root`` (not yet in place: ``save``
    renames the whole table into place after this)."""
    tmp, n = build_snapshot(Path(root), uuid.uuid4().hex[:16], {}, {}, change)
    vdir = versions_dir(root)
    os.rename(vdir / tmp, vdir / str(n))
    _fsync(vdir, directory=True)
    return n


def retire_version(root: Path, n: int) -> None:
    """Remove the snapshot of version ``n`` (``vacuum``): renamed aside first, in one step,
    so a half-removed snapshot never looks complete."""
    vdir = versions_dir(root)
    gone = vdir / f"{n}.gone-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(vdir / str(int(n)), gone)
    except OSError:
        return
    remove_quietly(gone)


def is_versioned(root: Path) -> bool:
    """Whether commits to the table at ``root`` make versions: a format-2 table (its group
    says ``format: 2``) or one that has versions already."""
    if versions_dir(root).is_dir():
        return True
    try:
        doc = json.loads(_read_private(Path(root) / "zarr.json", 1 << 20))
        return doc.get("attributes", {}).get("embstore", {}).get("format") == 2
    except (OSError, ValueError, AttributeError, RecursionError, CorruptStoreError):
        return False


def last_commit(root: Path) -> str | None:
    """The id of the last commit applied (None before the first one): a handle that saw
    another id has stale metadata, shard indexes or key index."""
    try:
        doc = json.loads(_read_private(area_of(root) / LAST))
    except CorruptStoreError:
        raise  # a link or a FIFO in its place: refused, never followed
    except (OSError, ValueError, RecursionError):
        return None
    return doc.get("txn") if isinstance(doc, dict) else None


def settle(root: Path, timeout: float | None = None) -> None:
    """Wait until no commit is half applied: a reader's way in.

    A live writer holds the lock while it rolls forward (milliseconds): wait for it.  A
    journal whose writer died is rolled forward here, if the lock is free right now.
    """
    root = Path(root)
    journal = area_of(root) / JOURNAL
    if not os.path.lexists(journal):
        return
    timeout = LOCK_TIMEOUT if timeout is None else float(timeout)
    deadline = time.monotonic() + timeout
    while os.path.lexists(journal):
        with try_writer_lock(root) as mine:
            if mine:
                try:
                    doc = _read_journal(root)
                    if doc is not None:
                        _apply(root, doc)
                except CorruptStoreError:
                    raise
                except OSError as exc:  # a read-only file system, another user's table
                    raise CorruptStoreError(
                        f"{root}: a write was committed but not finished, and this process "
                        f"cannot finish it ({exc.strerror or exc}); open the table for "
                        "writing, or repair it, where that is allowed", path=str(root)) from None
                return
        if time.monotonic() >= deadline:
            raise LockTimeoutError(f"{root}: a writer has been committing for more than "
                                   f"{timeout:g} s", path=str(root), timeout=timeout)
        time.sleep(0.002)

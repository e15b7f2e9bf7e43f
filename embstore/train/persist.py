"""Where a trained on-disk table keeps its optimizer state and checkpoints (issue 40;
docs/training.md, "Checkpoints").

Everything lives in the table's private area, ``<table>/vectors/.embstore/train/``
(never part of the rows' versions, never seen by Zarr readers):

- ``state-<optimizer>/``: the optimizer state, an embstore table of ``vocab_size`` rows
  and ``state_cols`` float32 columns (row-wise Adagrad: one), versioned and checksummed
  as any table;
- ``checkpoints.json``: the checkpoints, each ``{"id", "rows": N, "state": {optimizer:
  S}, "step"}`` (rows version N of the table goes with version S of the state), with a
  crc32c of the list; replaced atomically (written beside, fsynced, renamed);
- ``pending-<id>.log``: the ids written to the table since checkpoint ``<id>``, one
  checksummed record per write-back, appended and fsynced *before* the write-back's
  commits (state first, then rows);
- ``lock``: an exclusive ``flock`` held by the one trainer of the table.

A checkpoint is its record: ``checkpoint()`` writes every dirty row back (state, then
rows), then appends the record naming both versions.  A crash anywhere leaves the newest
record intact; rows and state written after it (evictions, or a checkpoint whose record
was not written) are listed in its pending log, so resuming puts those rows back to the
checkpoint's versions (read from the retained snapshots, which the trainer holds leased)
before training goes on: resuming from a checkpoint equals never having gone past it.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import CorruptStoreError, EmbstoreError, FormatError, ReadOnlyError
from ..fs.atomic import write_beside
from ..fs.beside import fsync_path
from ..fs.checksum import crc32c
from ..store.table import ZarrTable
from ..store.build import create as create_table
from ..store.table import open as open_table

__all__ = ["TrainStore", "train_dir", "read_checkpoints", "TrainerBusyError"]

PRIVATE = ("vectors", ".embstore", "train")
RECORDS = "checkpoints.json"
KEEP_RECORDS = 64
SCAN_BLOCK_BYTES = 4 << 20  # rows compared at a time when resuming from an older checkpoint


class TrainerBusyError(EmbstoreError):
    """Another trainer (a module with an optimizer, in this or another process) holds the
    table."""


def train_dir(path) -> Path:
    return Path(path).joinpath(*PRIVATE)


def read_checkpoints(path) -> list[dict]:
    """The checkpoints of the table at ``path``, oldest first ([] if it has none)."""
    f = train_dir(path) / RECORDS
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise CorruptStoreError(f"{f}: unreadable ({exc})", path=str(f)) from None
    recs = doc.get("checkpoints") if isinstance(doc, dict) else None
    if not isinstance(recs, list) or doc.get("crc32c") != _crc(recs):
        raise CorruptStoreError(f"{f}: checksum mismatch: the checkpoint list is damaged",
                                path=str(f))
    return recs


def _crc(recs: list) -> int:
    return crc32c(json.dumps(recs, sort_keys=True).encode())


def _append_ids(path: Path, ids: np.ndarray) -> None:
    """One record of ``pending-<id>.log``: count, crc32c, int64 ids; fsynced (the ids
    written from the array itself: no copy of them)."""
    body = np.ascontiguousarray(ids, dtype="<i8").data.cast("B")
    head = struct.pack("<II", ids.size, crc32c(body, crc32c(struct.pack("<I", ids.size))))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        done, want = 0, len(head) + len(body)
        while done < want:  # a loop per system call (one, but for short writes)
            parts: list[bytes | memoryview] = (
                [head[done:], body] if done < len(head) else [body[done - len(head):]])
            done += os.writev(fd, parts)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_ids(path: Path) -> np.ndarray:
    """The ids of every complete record of a pending log (a torn last record: its commits
    never started)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return np.empty(0, np.int64)
    parts, at = [], 0
    while at + 8 <= len(data):  # a loop per write-back since the checkpoint
        n, crc = struct.unpack_from("<II", data, at)
        body = data[at + 8: at + 8 + 8 * n]
        if len(body) != 8 * n or crc32c(body, crc32c(struct.pack("<I", n))) != crc:
            break
        parts.append(np.frombuffer(body, "<i8"))
        at += 8 + 8 * n
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


class TrainStore:
    """The on-disk side of a trainer over ``table`` (a :class:`ZarrTable` opened "r+"):
    the state table, the pending log, checkpoints and resuming (see the module doc)."""

    def __init__(self, table: ZarrTable, optimizer: str, state_cols: int,
                 resume: int | None = None):
        self.table, self.optimizer = table, optimizer
        if table.is_remote:
            raise ReadOnlyError(
                f"{table.path}: training a table on object storage is not supported: its "
                "optimizer state, checkpoint list and pending log (docs/FORMAT.md §12) are "
                "local files locked, appended to and replaced by rename, which object stores "
                "lack; train a local copy (`embstore copy`) and save it to the URL, or write "
                "rows with `write` (each one commit)")
        if not table.version:
            raise FormatError(f"{table.path}: training checkpoints are versions: this table "
                              "has none (format 1); `embstore upgrade` makes it versioned")
        self.dir = train_dir(table.path)
        self.dir.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        self._lock_fd: int | None = os.open(self.dir / "lock", flags, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise TrainerBusyError(f"{table.path}: another trainer holds this table (one "
                                   "module with an optimizer per table at a time)") from None
        self._bases: list = []
        self.state: ZarrTable | None = None
        try:
            self._defer()
            self.step = self._resume(state_cols, resume)
            self._defer()
        except BaseException:
            self.close()
            raise

    # -- resuming ----------------------------------------------------------------------
    def _state_path(self) -> Path:
        return self.dir / f"state-{self.optimizer}"

    def _resume(self, state_cols: int, resume: int | None) -> int:
        self.table.refresh()
        recs = read_checkpoints(self.table.path)
        base = recs[-1] if recs else None
        if resume is not None:
            base = next((r for r in recs if r["rows"] == resume), None)
            if base is None:
                raise EmbstoreError(f"{self.table.path}: rows version {resume} is no "
                                    f"checkpoint (checkpoints: "
                                    f"{[r['rows'] for r in recs] or 'none'})")
        sv = None if base is None else base.get("state", {}).get(self.optimizer)
        if state_cols:
            sp = self._state_path()
            if sv is None or not sp.is_dir():
                self.state = create_table(sp, shape=(self.table.vocab_size, state_cols),
                                          overwrite=True)
                self.state.close()
                sv = None
            self.state = open_table(sp, mode="r+", cache_bytes=0)
        if base is None:
            self._record(0)
            return 0
        ids = _read_ids(self.dir / f"pending-{base['id']}.log")
        if base is not recs[-1]:  # an older checkpoint: every row changed since it
            ids = np.union1d(ids, self._changed_since(base["rows"]))
        rolled = self._restore(self.table, base["rows"], ids)
        if self.state is not None and sv is not None:
            rolled |= self._restore(self.state, sv, ids)
        if rolled or base is not recs[-1] or (self.state is not None and sv is None):
            self._record(int(base.get("step", 0)))
        else:
            self._lease(base)
            self._current = base
        return int(base.get("step", 0))

    def _changed_since(self, version: int) -> np.ndarray:
        """Ids whose rows differ between ``version`` and the newest (a full scan, by
        blocks: resuming from a checkpoint older than the newest)."""
        out = []
        step = max(1, SCAN_BLOCK_BYTES // (4 * self.table.dim))
        with open_table(self.table.path, version=version, cache_bytes=0) as old:
            for a in range(0, self.table.vocab_size, step):  # a loop per block of rows
                b = min(a + step, self.table.vocab_size)
                diff = (old[a:b] != self.table[a:b]).any(axis=1)
                out.append(np.flatnonzero(diff) + a)
        return np.concatenate(out) if out else np.empty(0, np.int64)

    @staticmethod
    def _restore(handle: ZarrTable, version: int, ids: np.ndarray) -> bool:
        """Put rows ``ids`` of ``handle`` back to their values at ``version``: one commit,
        the rows read a block at a time (``write_blocks``: a roll-back of a checkpoint's
        flush of a large row cache holds a block of them, not all); idempotent: a crash in
        it is resumed again."""
        handle.refresh()
        if handle.version == version or not ids.size:
            return False
        with open_table(handle.path, version=version, cache_bytes=0) as old:
            handle.write_blocks(ids, lambda pos: old.lookup(ids[pos]))
        return True

    # -- write-backs and checkpoints ---------------------------------------------------
    def write_back(self, ids: np.ndarray, rows: np.ndarray, state: np.ndarray) -> None:
        """Persist rows (sorted unique ``ids``) and their state: logged first, then the
        state committed, then the rows."""
        _append_ids(self.dir / f"pending-{self._current['id']}.log", ids)
        if self.state is not None:
            self.state.write(ids, state)
        self.table.write(ids, rows)

    def flush_back(self, ids: np.ndarray, rows_at: Callable[[np.ndarray], np.ndarray],
                   state_at: Callable[[np.ndarray], np.ndarray]) -> None:
        """Persist rows (sorted unique ``ids``) given a block at a time (a flush of the row
        cache): logged first, then the state committed, then the rows, one commit each."""
        _append_ids(self.dir / f"pending-{self._current['id']}.log", ids)
        if self.state is not None:
            self.state.write_blocks(ids, state_at)
        self.table.write_blocks(ids, rows_at)

    def checkpoint(self, step: int, flush: Callable[[], int]) -> int:
        """A checkpoint: ``flush`` (the row cache's: every dirty row written back, one
        commit of state and one of rows, :meth:`flush_back`), each commit folding the
        pending rows when they pass the threshold, only into the chunks dense in them
        (the handles' ``compaction`` is "dense" meanwhile: :func:`compact_dense`), then
        the current versions of rows and state recorded; returns the rows' version.
        (Before: the cache written back 32,768 rows a commit, each past the threshold
        folding every pending row into every chunk it touched: the table rewritten several
        times a checkpoint.)  Between checkpoints write-backs only add deltas
        (:meth:`_defer`)."""
        for h in self._handles():  # (a loop per table: rows, state)
            h.compaction = "dense"
        try:
            flush()
        finally:
            self._defer()
        for h in self._handles():  # (nothing was left to flush: the deltas alone)
            compact_dense(h)
        self._record(step)
        return int(self._current["rows"])

    def _handles(self) -> list[ZarrTable]:
        return [h for h in (self.table, self.state) if h is not None]

    def _defer(self) -> None:
        """Write-backs between checkpoints never fold the deltas into the chunks (only
        merge delta files past 32): a trainer's evictions scatter over every chunk, and
        compacting them would rewrite the table again and again.  The deltas stay on disk
        (mapped); the handles hold 16 bytes a pending row."""
        for h in self._handles():  # (a loop per table: rows, state)
            h.compaction = "deferred"

    def _record(self, step: int) -> None:
        rec = {"id": uuid.uuid4().hex[:16], "rows": int(self.table.version),
               "state": {} if self.state is None else {self.optimizer: int(self.state.version)},
               "step": int(step), "time": time.time()}
        recs = (read_checkpoints(self.table.path) + [rec])[-KEEP_RECORDS:]
        with write_beside(self.dir / RECORDS, overwrite=True) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"embstore_train": 1, "checkpoints": recs, "crc32c": _crc(recs)}, f)
                f.flush()
                os.fsync(f.fileno())
        fsync_path(self.dir, directory=True)  # the record is durable: the commit point
        self._current = rec
        self._lease(rec)
        for old in self.dir.glob("pending-*.log"):  # a loop per older log (one or two)
            if old.name != f"pending-{rec['id']}.log":
                old.unlink(missing_ok=True)

    def _lease(self, rec: dict) -> None:
        """Hold the checkpoint's versions open (their leases keep them from ``vacuum``
        while training writes newer ones: a resume reads them)."""
        bases = [open_table(self.table.path, version=int(rec["rows"]), cache_bytes=0)]
        sv = rec["state"].get(self.optimizer)
        if self.state is not None and sv:
            bases.append(open_table(self.state.path, version=int(sv), cache_bytes=0))
        for b in self._bases:
            b.close()
        self._bases = bases

    def close(self) -> None:
        self.table.compaction = "auto"  # (the caller's handle, as it was)
        for b in self._bases:
            b.close()
        self._bases = []
        if self.state is not None:
            self.state.close()
            self.state = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def compact_dense(h: ZarrTable) -> int | None:
    """A checkpoint's compaction of ``h`` when its deltas are past the threshold: only the
    chunks dense in pending rows are rewritten, the thinly scattered rows staying in one
    delta file of the same commit (``ZarrTable.compact_if_due(dense=True)``).  A trainer's
    evictions scatter over every chunk: folding them all rewrote the whole table at each
    checkpoint past 5%.  Returns the new version, or None (nothing due)."""
    return h.compact_if_due(dense=True)

"""The writer lock of a table: one writer at a time, across processes and handles.

An exclusive ``flock`` on the table's directory itself (no lock file: Zarr readers warn
about files they do not know).  ``flock`` locks belong to an open file description, so
two handles in one process exclude each other as two processes do; the lock goes with
the descriptor when a process dies, so a killed writer never leaves a stale lock.
Readers never take it (except, without waiting, to finish a commit a dead writer left:
:mod:`embstore.store.versions.commit`).

A forked child inherits the descriptor, and with it the lock (the open file description
is shared): a fork while a thread of the parent held it left the lock held for as long as
the child lived (the parent's next write waited for the child; the child's own write timed
out against its copy).  A forked child therefore closes its copies of every lock descriptor
at once (closing a copy never releases the parent's lock; ``LOCK_UN`` would).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import LockTimeoutError

__all__ = ["writer_lock", "try_writer_lock", "LOCK_TIMEOUT"]

LOCK_TIMEOUT = 300.0  # seconds a writer waits for another one by default
_POLL_MAX = 0.02  # longest sleep between attempts (flock itself has no timeout)
_held: dict[int, object] = {}  # descriptor -> token, this process's writer locks


def _open_dir(root: Path) -> tuple[int, object]:
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    token = _held[fd] = object()
    return fd, token


def _close(fd: int, token: object) -> None:
    """Close ``fd`` unless a fork closed it already (its number may be another file now)."""
    if _held.get(fd) is token:
        del _held[fd]
        os.close(fd)


def _drop_in_child() -> None:
    """In a forked child: close the inherited lock descriptors (the parent keeps its lock)."""
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


@contextmanager
def writer_lock(root: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold the writer lock of the table at ``root``; wait up to ``timeout`` seconds
    (default :data:`LOCK_TIMEOUT`) for another writer, then raise :class:`LockTimeoutError`."""
    timeout = LOCK_TIMEOUT if timeout is None else float(timeout)
    fd, token = _open_dir(root)
    try:
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"{root}: another writer has held the table's writer lock for more "
                        f"than {timeout:g} s (one writer at a time; raise the lock timeout "
                        "to wait longer)", path=str(root), timeout=timeout) from None
                time.sleep(delay)
                delay = min(delay * 2, _POLL_MAX)
        yield
    finally:
        _close(fd, token)  # releases the lock


@contextmanager
def try_writer_lock(root: Path) -> Iterator[bool]:
    """The writer lock if it is free right now (True), else False; never waits."""
    fd, token = _open_dir(root)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        _close(fd, token)

"""The writer lock of a table: one writer at a time, across processes and handles, served
in the order the writers came.

An exclusive ``flock`` on the table's directory itself (no lock file: Zarr readers warn
about files they do not know).  ``flock`` locks belong to an open file description, so
two handles in one process exclude each other as two processes do; the lock goes with
the descriptor when a process dies, so a killed writer never leaves a stale lock.
Readers never take it (except, without waiting, to finish a commit a dead writer left:
:mod:`embstore.store.versions.commit`).

**Fairness.**  ``flock`` has no queue: a writer that lets go and takes the lock again at
once wins over one that waits (a process appending in a loop starved a waiting one into
:class:`LockTimeoutError`).  So a writer first takes a ticket, the file
``vectors/.embstore/writers/q-<time ns>-<pid>-<random>``, locked (``flock``) from the
moment it has that name (it is made under a ``t-`` name, locked, then hard-linked), and
waits until no live ticket older than its own is left before it tries the table's lock;
it removes its ticket once it holds the table's lock.  A ticket whose ``flock`` is free
belongs to a dead process (its holder removes it before closing it): the next waiter
removes it, so a killed waiter never blocks the queue.  The table's ``flock`` alone
still decides who writes; the tickets only decide who tries, so a writer of an older
embstore (or a table directory where no ticket can be made: then it waits unqueued)
is still excluded, only not ordered.

A forked child inherits the descriptors, and with them the locks (the open file
description is shared): a fork while a thread of the parent held it left the lock held
for as long as the child lived (the parent's next write waited for the child; the
child's own write timed out against its copy).  A forked child therefore closes its
copies of every lock and ticket descriptor at once (closing a copy never releases the
parent's lock; ``LOCK_UN`` would).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import EmbstoreError, LockTimeoutError
from ...fs.files import create_new, real_dir

__all__ = ["writer_lock", "try_writer_lock", "LOCK_TIMEOUT", "QUEUE"]

LOCK_TIMEOUT = 300.0  # seconds a writer waits for another one by default
QUEUE = ("vectors", ".embstore", "writers")  # the waiting writers' tickets
_POLL_MAX = 0.005  # longest sleep between attempts (flock itself has no timeout)
_STALE_NEW = 60.0  # seconds after which an unlocked ``t-`` file is a dead writer's
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_held: dict[int, object] = {}  # descriptor -> token, this process's locks and tickets


def _open_dir(root: Path) -> tuple[int, object]:
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
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


def _timeout(root: Path, timeout: float) -> LockTimeoutError:
    return LockTimeoutError(
        f"{root}: another writer has held the table's writer lock for more than "
        f"{timeout:g} s (one writer at a time; raise the lock timeout to wait longer)",
        path=str(root), timeout=timeout)


def _ticket(root: Path) -> tuple[Path, int, object] | None:
    """This writer's ticket (its path, locked descriptor and token), or None where the
    table's directory has no room for one (no ``vectors/``, read-only, not a table)."""
    if not os.path.isdir(root / "vectors"):
        return None
    try:
        queue = real_dir(root, QUEUE, create=True)
        tag = f"{os.getpid()}-{secrets.token_hex(6)}"
        new = queue / f"t-{tag}"
        fd = create_new(new)
    except (OSError, EmbstoreError):
        return None
    token = _held[fd] = object()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: never blocks
        path = queue / f"q-{time.time_ns():020d}-{tag}"
        os.link(new, path, follow_symlinks=False)
    except OSError:
        _close(fd, token)
        _unlink(new)
        return None
    _unlink(new)
    return path, fd, token


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _dead(path: Path, *, older_than: float = 0.0) -> bool:
    """Whether the ticket at ``path`` is gone or its writer is (its ``flock`` free, and
    older than ``older_than`` seconds); a dead writer's ticket is removed."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return True
    token = _held[fd] = object()
    try:
        if older_than and time.time() - os.fstat(fd).st_mtime < older_than:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    else:
        _unlink(path)
        return True
    finally:
        _close(fd, token)


def _ahead(ticket: Path) -> list[Path]:
    """The tickets older than ``ticket``, newest first (dead writers' new files swept)."""
    names = os.listdir(ticket.parent)
    for name in names:  # a loop per waiting writer
        if name.startswith("t-"):
            _dead(ticket.parent / name, older_than=_STALE_NEW)
    return [ticket.parent / n for n in sorted(names, reverse=True)
            if n.startswith("q-") and n < ticket.name]


def _wait_turn(ticket: Path, deadline: float, root: Path, timeout: float) -> None:
    """Wait until no live ticket older than ``ticket`` is left."""
    delay = 0.0005
    while True:
        try:
            ahead = _ahead(ticket)
        except OSError:
            return  # the queue is gone (the table was replaced): the flock decides
        if all(_dead(p) for p in ahead):  # stops at the first live one
            return
        if time.monotonic() >= deadline:
            raise _timeout(root, timeout)
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)


def _nobody_waits(root: Path) -> bool:
    try:
        return not any(n.startswith("q-") for n in os.listdir(root.joinpath(*QUEUE)))
    except OSError:
        return True


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _take(fd: int, deadline: float, root: Path, timeout: float) -> None:
    delay = 0.0005
    while not _try(fd):
        if time.monotonic() >= deadline:
            raise _timeout(root, timeout)
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)


@contextmanager
def writer_lock(root: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold the writer lock of the table at ``root``; wait up to ``timeout`` seconds
    (default :data:`LOCK_TIMEOUT`) for the writers that came first, then raise
    :class:`LockTimeoutError`."""
    timeout = LOCK_TIMEOUT if timeout is None else float(timeout)
    deadline = time.monotonic() + timeout
    fd, token = _open_dir(root)
    ticket = None
    try:
        if not (_nobody_waits(Path(root)) and _try(fd)):
            ticket = _ticket(Path(root))
            if ticket is not None:
                _wait_turn(ticket[0], deadline, root, timeout)
            _take(fd, deadline, root, timeout)
        if ticket is not None:
            _unlink(ticket[0])  # before closing it: a free ticket is a dead writer's
            _close(ticket[1], ticket[2])
            ticket = None
        yield
    finally:
        if ticket is not None:
            _unlink(ticket[0])
            _close(ticket[1], ticket[2])
        _close(fd, token)  # releases the lock


@contextmanager
def try_writer_lock(root: Path) -> Iterator[bool]:
    """The writer lock if it is free right now (True), else False; never waits."""
    fd, token = _open_dir(root)
    try:
        yield _try(fd)
    finally:
        _close(fd, token)

"""Locks that survive ``fork``.

A child process gets a copy of every lock in the state it had at the moment of the fork:
a lock held by another thread of the parent (one inside a lookup) stays held forever in
the child, whose copy of that thread does not exist.  A PyTorch ``DataLoader`` forks its
workers by default, so this is the ordinary way embstore tables reach a child.

``renew_after_fork(obj, *names)`` registers ``obj``: in a forked child each attribute
``names`` is replaced by a new lock of the same kind, and ``obj._after_fork()`` (if it has
one) runs, to drop state that a thread of the parent may have left half-updated.
"""

from __future__ import annotations

import os
import threading
import weakref

__all__ = ["renew_after_fork"]

_tracked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RLOCK = type(threading.RLock())


def renew_after_fork(obj, *names: str) -> None:
    """Give ``obj`` new locks ``names`` (and call ``obj._after_fork()``) in a forked child."""
    _tracked[obj] = names


def _in_child() -> None:
    for obj, names in list(_tracked.items()):
        for name in names:
            old = getattr(obj, name, None)
            setattr(obj, name, threading.RLock() if isinstance(old, _RLOCK) else threading.Lock())
        hook = getattr(obj, "_after_fork", None)
        if hook is not None:
            hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)

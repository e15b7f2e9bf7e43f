"""Child processes that make one change to a table and SIGKILL themselves at the N-th file
system call that makes a change durable or visible (``os.replace``, ``os.rename``,
``os.fsync``, ``os.mkdir``, ``os.link``); N = 0 runs to the end and prints how many calls it made.

An ``os.fsync`` is counted as a step but not sent to the device: what these tests kill is
the process, and a killed process's writes stay in the page cache whether or not they
were flushed (the flushes cost most of a child's time on this disk: 0.5 s of the 0.55 s a
kill point took).  The order of the flushes against the renames is what the step count
covers."""

from __future__ import annotations

import subprocess

import forked

_HEADER = r"""
import os, signal, sys
import numpy as np
path, op, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
calls = [0]
def wrap(fn):
    def inner(*a, **k):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*a, **k)
    return inner
def flushed(fd):  # counted as a step, not sent to the device (see the module's doc)
    os.fstat(fd)
import embstore
with embstore.open(path, mode="r+") as t:
    os.fsync = flushed
    for name in ("replace", "rename", "fsync", "mkdir", "link"):
        setattr(os, name, wrap(getattr(os, name)))
"""


def child_script(change: str) -> str:
    """The child's code: ``change`` (lines indented by 4, using ``t``, ``op`` and ``np``)
    runs on the table opened ``r+`` with the kill wrapper in place."""
    return _HEADER + change.strip("\n") + "\nprint(calls[0])\n"


def run_child(script: str, path, op: str, kill_at: int) -> subprocess.CompletedProcess:
    """Run the child to its end or its kill, forked from tests/forked.py's server (which has
    imported numpy and embstore and used a table: a child that starts Python and imports
    them costs ~1 s; a fork ~10 ms, and the kill-at-every-step tests start a few hundred)."""
    return forked.run(script, path, op, kill_at, timeout=300)

"""Child processes that make one change to a table and SIGKILL themselves at the N-th file
system call that makes a change durable or visible (``os.replace``, ``os.rename``,
``os.fsync``, ``os.mkdir``); N = 0 runs to the end and prints how many calls it made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

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
import embstore
with embstore.open(path, mode="r+") as t:
    for name in ("replace", "rename", "fsync", "mkdir"):
        setattr(os, name, wrap(getattr(os, name)))
"""


def child_script(change: str) -> str:
    """The child's code: ``change`` (lines indented by 4, using ``t``, ``op`` and ``np``)
    runs on the table opened ``r+`` with the kill wrapper in place."""
    return _HEADER + change.strip("\n") + "\nprint(calls[0])\n"


def child_args(script: str, path, op: str, kill_at: int) -> tuple[list[str], dict]:
    """The command line and environment that run ``script`` on ``path``."""
    return ([sys.executable, "-c", script, str(path), op, str(kill_at)],
            {**os.environ, "PYTHONPATH": str(REPO)})


def run_child(script: str, path, op: str, kill_at: int) -> subprocess.CompletedProcess:
    """Run the child to its end or its kill (two minutes at most)."""
    argv, env = child_args(script, path, op, kill_at)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

"""A training run that a crash test SIGKILLs (issue 40): ``python trainchild.py PATH TOTAL
EVERY KILL_AT`` trains the table at PATH with row-wise Adagrad up to step TOTAL (resuming
from its newest checkpoint), checkpointing every EVERY steps, through a row cache of a
few rows (write-backs between checkpoints); it SIGKILLs itself at the KILL_AT-th call
that makes a change durable or visible (``os.replace``, ``os.rename``, ``os.fsync``,
``os.mkdir``, ``os.link``; 0: never) and prints how many it made.  An ``os.fsync`` is
counted, not sent to the device (a killed process's writes stay in the page cache).

:func:`batch` and :func:`train` are what the test's uninterrupted run uses too."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

V, D, LR = 80, 8, 0.05
CACHE_ROWS = 30


def batch(step: int):
    import torch
    rng = np.random.default_rng([11, step])
    ids = torch.from_numpy(rng.integers(0, V, size=(4, 5)))
    c = torch.from_numpy(rng.standard_normal((4, 5, D)).astype(np.float32))
    return ids, c


def train(path, total: int, every: int) -> int:
    import torch

    import embstore.torch as et
    emb = et.Embedding(path, optimizer="rowwise_adagrad", lr=LR,
                       row_cache_bytes=CACHE_ROWS * (4 * (D + 1) + 17))
    for step in range(emb.step, total):  # a loop per step
        ids, c = batch(step)
        x = emb(ids)
        ((x * c).sum() + 0.1 * (x * x).sum()).backward()
        if emb.step % every == 0:
            emb.checkpoint()
    version = emb.checkpoint()
    emb.close()
    del torch
    return version


def main() -> None:
    path, total, every, kill_at = sys.argv[1], *map(int, sys.argv[2:5])
    import torch
    torch.set_num_threads(1)
    import embstore.torch  # noqa: F401 (imported before the calls are counted)
    print(run(path, total, every, kill_at))


def run(path, total: int, every: int, kill_at: int) -> int:
    """:func:`train`, SIGKILLed at the ``kill_at``-th durable call (in a process of its
    own: the calls of ``os`` stay wrapped); returns how many calls it made."""
    calls = [0]

    def wrap(fn):
        def inner(*a, **k):
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*a, **k)
        return inner

    os.fsync = lambda fd: os.fstat(fd) and None  # type: ignore[assignment]
    for name in ("replace", "rename", "fsync", "mkdir", "link"):
        setattr(os, name, wrap(getattr(os, name)))
    train(path, total, every)
    return calls[0]


if __name__ == "__main__":
    main()

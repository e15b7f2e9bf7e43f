"""Imported by the fork server of tests/forked.py before it forks any child: a small table
saved, opened, written and appended to (float32 and int8, with keys), so the modules those
load on first use are loaded once, in the server, not in each child."""

from __future__ import annotations

import os
import tempfile

import numpy as np

import embstore


def _warm() -> None:
    with tempfile.TemporaryDirectory(prefix="forkwarm-") as d:
        for dtype in ("float32", "int8"):
            path = os.path.join(d, dtype)
            embstore.save(path, np.arange(8, dtype=np.float32).reshape(4, 2), keys=list("abcd"),
                          dtype=dtype).close()
            with embstore.open(path, mode="r+") as t:
                t.append(np.ones((2, 2), np.float32), keys=["e", "f"])
                t.write([0], np.ones((1, 2), np.float32))
                t[[0, 5]]
                t.ids_of(["a", "f"])


_warm()

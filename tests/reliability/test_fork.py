"""``fork()`` never hands a child a held writer lock, and object storage in a forked child
fails at once instead of waiting forever.

Each case runs in a fresh interpreter (forking pytest itself, with its threads, would be
the test's own hazard); the subprocess timeout turns a hang into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from relhelpers import REPO

import embstore

LOCK_CHILD = r"""
import json, os, sys, threading, numpy as np, embstore
from embstore.store.place.lock import writer_lock
path = sys.argv[1]
held, release = threading.Event(), threading.Event()

def writer():  # another thread in the middle of a write: it holds the writer lock
    with writer_lock(path):
        held.set()
        release.wait()

th = threading.Thread(target=writer)
th.start()
held.wait()
to_child_r, to_child_w = os.pipe()
to_parent_r, to_parent_w = os.pipe()
pid = os.fork()
if pid == 0:
    code = 0
    try:
        with embstore.open(path, mode="r+", lock_timeout=10) as t:
            t.append(np.full((1, 4), 7.0, np.float32))
        os.write(to_parent_w, b"appended\n")
    except BaseException as exc:
        os.write(to_parent_w, f"{type(exc).__name__}: {exc}\n".encode())
        code = 3
    os.read(to_child_r, 1)  # alive until the parent has written again
    os._exit(code)
release.set()
th.join()
child_said = os.read(to_parent_r, 1000).decode().strip()
try:  # the child is alive: the parent's own write must not wait for it
    with embstore.open(path, mode="r+", lock_timeout=5) as t:
        t.append(np.full((1, 4), 8.0, np.float32))
    parent = "appended"
except BaseException as exc:
    parent = f"{type(exc).__name__}: {exc}"
os.write(to_child_w, b"x")
_, status = os.waitpid(pid, 0)
with embstore.open(path) as t:
    rows = t[np.arange(len(t))][:, 0].tolist()
print(json.dumps({"child": child_said, "parent": parent, "status": status, "rows": rows}))
"""

S3_CHILD = r"""
import json, os, sys, time, numpy as np, embstore
from benchmarks import s3server
srv = s3server.start()
os.environ.update(srv.env())
srv.make_bucket("fork-bucket")
E = np.arange(400 * 8, dtype=np.float32).reshape(400, 8)
embstore.save("s3://fork-bucket/t.emb", E, keys=[f"k{i}" for i in range(400)],
              chunk_rows=16, shard_rows=64).close()
t = embstore.open("s3://fork-bucket/t.emb", cache_bytes=0)
before = float(t[np.arange(0, 400, 7)].sum())
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        got = t[np.arange(0, 400, 3)]  # the parent's handle
        with embstore.open("s3://fork-bucket/t.emb", cache_bytes=0) as t2:  # a new one
            opened = float(t2[np.arange(5, 9)].sum())
            keys = list(t2.keys[[3, 399]])
        os.write(w, json.dumps({"rows": float(got.sum()), "opened": opened,
                                "keys": keys}).encode())
    except BaseException as exc:
        os.write(w, json.dumps({"error": type(exc).__name__, "message": str(exc)}).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 100000))
after = float(t[np.arange(0, 400, 3)].sum())  # the parent's handle still works
print(json.dumps({"before": before, "after": after, "child": child}))
"""


def _run(code: str, *args, timeout: float = 90) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                         text=True, timeout=timeout, env=env, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_child_forked_while_a_thread_writes_does_not_hold_the_writer_lock(tmp_path):
    path = tmp_path / "t.emb"
    embstore.save(path, np.zeros((2, 4), np.float32)).close()
    got = _run(LOCK_CHILD, path)
    assert got["child"] == "appended", got
    assert got["parent"] == "appended", got
    assert got["status"] == 0
    assert got["rows"] == [0.0, 0.0, 7.0, 8.0]


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_a_table_on_s3_used_before_fork_works_in_the_child():
    """The child's requests hung in obstore's get_range (its runtime's threads are the
    parent's); now a helper process makes them (embstore/store/remote/proxy.py)."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    got = _run(S3_CHILD, timeout=120)
    E = np.arange(400 * 8, dtype=np.float32).reshape(400, 8)
    assert got["before"] == float(E[::7].sum())
    assert got["child"] == {"rows": float(E[::3].sum()), "opened": float(E[5:9].sum()),
                            "keys": ["k3", "k399"]}, got
    assert got["after"] == float(E[::3].sum())  # the parent's handle still works

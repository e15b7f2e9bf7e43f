"""``append`` (with keys) and multi-shard ``write`` killed at every step of the commit.

A child process opens the table ``r+`` and makes one change; a wrapper around the file
system calls that make a change durable or visible (``os.replace``, ``os.rename``,
``os.fsync``, ``os.mkdir``) sends it SIGKILL at the N-th call, for every N the change
makes, and at random moments (``slow``).  After each kill: the table opens (mode ``r``),
holds exactly the old or exactly the new rows and keys, ``verify`` passes, and once a
writer opens it no temporary file is left.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from killchild import child_script, run_child
from relhelpers import KILL_POINTS, TRIED

import embstore
import forked

ROWS, DIM, SHARD = 1000, 8, 128

CHILD = child_script(r"""
    if op == "append":
        n = 300  # grows the last shard and adds three
        t.append(np.full((n, %(dim)d), 5000, np.float32) + np.arange(n)[:, None],
                 keys=[f"new{i}" for i in range(n)])
    else:
        ids = np.arange(5, %(rows)d, 97)  # every shard
        t.write(ids, -np.repeat(ids[:, None].astype(np.float32), %(dim)d, 1))
""" % {"dim": DIM, "rows": ROWS})


def _old() -> np.ndarray:
    return np.repeat(np.arange(ROWS, dtype=np.float32)[:, None], DIM, 1)


def _contents(path: Path) -> tuple[np.ndarray, list[str]]:
    with embstore.open(path) as t:
        return t.to_numpy(), list(t.keys)


#: every layout a writer may choose, and a table written as format 1 (its first commit makes
#: it versioned in place)
CRASH_LAYOUTS = {"": {"chunk_rows": 16, "shard_rows": SHARD},
                 "format2": {"chunk_rows": 512, "format_version": 2},
                 "zstd": {"chunk_rows": 16, "shard_rows": SHARD, "compression": "zstd"},
                 "format1": {"chunk_rows": 16, "shard_rows": SHARD, "format_version": 1}}


@pytest.fixture(scope="module", params=[
    "float32", "int8", "float32-format2", "int8-format2",
    pytest.param("float32-zstd", marks=pytest.mark.slow),
    pytest.param("int8-format1", marks=pytest.mark.slow)])
def base(tmp_path_factory, request) -> Path:
    """A keyed table (int8: two arrays, codes and row scales, committed together; sharded
    chunks (zstd: compressed); format 2: rows in chunk files of 512 rows with their page
    checksums, 2 chunks, an append adds one; format 1: unversioned until the commit)."""
    path = tmp_path_factory.mktemp("crash") / "base"
    old = _old()
    old[:, 1] = -old[:, 0] / 3  # int8 rows need a spread to quantise
    dtype, _, fmt = request.param.partition("-")
    layout = CRASH_LAYOUTS[fmt]
    embstore.save(path, old, keys=[f"k{i}" for i in range(ROWS)], dtype=dtype,
                  **layout).close()
    return path


def _run(path: Path, op: str, kill_at: int) -> subprocess.CompletedProcess:
    return run_child(CHILD, path, op, kill_at)


def _temp_files(path: Path) -> list[str]:
    out = []
    for d, dirs, files in os.walk(path):
        for name in dirs + files:
            rel = os.path.relpath(os.path.join(d, name), path)
            if ".tmp-" in name or "__tmp__" in name or "__old__" in name or \
                    name.startswith("txn-") or name == "journal":
                out.append(rel)
    return out


def _check(path: Path, old: tuple, new: tuple) -> str:
    """'old' or 'new' (asserting it is exactly one of them, rows and keys), then the
    writer's cleanup."""
    with embstore.open(path) as t:
        got, keys = t.to_numpy(), list(t.keys)
        probe = keys[-3:] + keys[:2]
        np.testing.assert_array_equal(t.ids_of(probe), [keys.index(k) for k in probe])
    if got.shape == new[0].shape and np.array_equal(got, new[0]) and keys == new[1]:
        state = "new"
    else:
        np.testing.assert_array_equal(got, old[0], err_msg="neither the old nor the new table")
        assert keys == old[1]
        state = "old"
    report = embstore.verify(path)
    assert report.ok, str(report)
    embstore.open(path, mode="r+").close()  # the next writer clears every leftover
    assert _temp_files(path) == []
    np.testing.assert_array_equal(_contents(path)[0], (new if state == "new" else old)[0])
    return state


@pytest.mark.parametrize("every", [pytest.param(False, id="sample"),
                                   pytest.param(True, id="all", marks=pytest.mark.slow)])
@pytest.mark.parametrize("op", ["append", "write"])
def test_killed_at_steps(tmp_path, base, op, every):
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    done = _run(probe, op, 0)
    assert done.returncode == 0, done.stderr
    old, new = _contents(base), _contents(probe)
    steps = int(done.stdout.split()[-1])
    assert steps > 5
    seen = {"old": 0, "new": 0}
    points = range(1, steps + 1) if every else sorted(
        {1, steps, *np.linspace(1, steps, 9).astype(int).tolist()})
    for n in points:
        path = tmp_path / f"k{n}"
        shutil.copytree(base, path)
        res = _run(path, op, n)
        assert res.returncode == -signal.SIGKILL, (n, res.stderr)
        seen[_check(path, old, new)] += 1
        TRIED[f"kill: {op} at step"] += 1
        shutil.rmtree(path)
    assert seen["old"] and seen["new"], seen  # the commit point lies between the steps


@pytest.mark.slow
@pytest.mark.parametrize("op", ["append", "write"])
def test_killed_at_random_moments(tmp_path, base, op):
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    t0 = time.monotonic()  # a whole child, started as the killed ones are (forked.py)
    assert forked.run(CHILD, probe, op, 0, timeout=120).returncode == 0
    horizon = time.monotonic() - t0
    old, new = _contents(base), _contents(probe)
    rng = random.Random(op)
    # 8 moments per table and change by default (EMBSTORE_KILL_POINTS=10 gives the 20 of
    # before): each is a whole copy, child and check, and the kills at every step above
    # already land on each point where the commit changes what a reader sees
    for i in range(KILL_POINTS * 2):
        path = tmp_path / f"r{i}"
        shutil.copytree(base, path)
        p = forked.start(CHILD, path, op, 0)
        time.sleep(rng.uniform(0.3 * horizon, 1.0 * horizon))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        _check(path, old, new)
        TRIED[f"kill: {op} at random"] += 1
        shutil.rmtree(path)

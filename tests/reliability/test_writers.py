"""Several writers at once: processes (spawn) and handles appending and writing rows.

Every appended row holds ``1000 * writer + i`` in all its columns under the key
``w<writer>-<i>``; writers also rewrite rows of the base table (disjoint per writer, and
one row all of them write).  Afterwards: the row count is the base plus every append,
every key maps to its vector, every written row holds its writer's last value, and no
row is lost or zeroed.  Also: stale handles, the lock timeout, readers during a held lock.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from relhelpers import TRIED

import embstore
import forked  # (processes forked from a server that has imported embstore)
from embstore.errors import LockTimeoutError, ShapeMismatchError
from embstore.store.place.lock import writer_lock

BASE, DIM = 500, 4


def _row(v) -> np.ndarray:
    return np.repeat(np.asarray(v, dtype=np.float32).reshape(-1, 1), DIM, 1)


def _worker(path: str, w: int, batches: int, per: int, writers: int, q) -> None:
    ids_seen = []
    with embstore.open(path, mode="r+") as t:
        for b in range(batches):
            vals = 1000 * (w + 1) + np.arange(b * per, (b + 1) * per)
            got = t.append(_row(vals), keys=[f"w{w}-{i}" for i in range(b * per, (b + 1) * per)])
            ids_seen.append(got)
            mine = np.arange(w, BASE, writers)  # disjoint rows of the base table
            t.write(mine, _row(-(mine + 1000 * (w + 1) + b)))
            t.write([0], _row(-1.0 - w))  # the same row for all: someone's value wins
    q.put((w, np.concatenate(ids_seen).tolist()))


def _run_writers(path, writers: int, batches: int, per: int) -> dict:
    ctx = forked.context()
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(path), w, batches, per, writers, q))
             for w in range(writers)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    return got


def _check_table(path, writers: int, batches: int, per: int, returned: dict) -> None:
    with embstore.open(path) as t:
        assert len(t) == BASE + writers * batches * per
        data = t.to_numpy()
        keys = list(t.keys)
        assert (data == data[:, :1]).all()
        col = data[:, 0]
        for w in range(writers):
            names = [f"w{w}-{i}" for i in range(batches * per)]
            ids = t.ids_of(names)
            np.testing.assert_array_equal(ids, returned[w])  # append returned the real ids
            np.testing.assert_array_equal(col[ids], 1000 * (w + 1) + np.arange(batches * per))
            mine = np.arange(w, BASE, writers)
            mine = mine[mine != 0]
            np.testing.assert_array_equal(col[mine], -(mine + 1000 * (w + 1) + batches - 1))
        assert col[0] in [-1.0 - w for w in range(writers)]
        assert keys[:BASE] == [f"b{i}" for i in range(BASE)]
    assert embstore.verify(path).ok


def _base(path) -> None:
    embstore.save(path, _row(np.arange(BASE)), keys=[f"b{i}" for i in range(BASE)],
                  chunk_rows=8, shard_rows=64).close()


@pytest.mark.parametrize("writers,batches,per", [
    pytest.param(2, 4, 60, id="2-procs"),
    pytest.param(4, 6, 90, id="4-procs", marks=pytest.mark.slow),
])
def test_processes_append_and_write_at_once(tmp_path, writers, batches, per):
    _base(tmp_path / "t")
    returned = _run_writers(tmp_path / "t", writers, batches, per)
    _check_table(tmp_path / "t", writers, batches, per, returned)
    TRIED[f"writers: {writers} processes, rows appended"] += writers * batches * per


def test_stale_handles_never_undo_newer_rows(tmp_path):
    path = tmp_path / "t"
    _base(path)
    a = embstore.open(path, mode="r+")
    b = embstore.open(path, mode="r+")
    try:
        a[3]  # a maps the shards and caches rows
        ids_b = b.append(_row([7.0, 8.0]), keys=["x", "y"])
        b.write([3, 499], _row([33.0, 4990.0]))
        a.write([4], _row([44.0]))  # must not bring back row 3 or drop b's rows
        ids_a = a.append(_row([9.0]), keys=["z"])
        with pytest.raises(ShapeMismatchError, match="'y' already exists"):
            a.append(_row([1.0]), keys=["y"])  # known to b only, seen under the lock
        assert a[3][0] == 33.0 and len(a) == BASE + 3
        b.write([BASE + 2], _row([99.0]))  # a row b has not seen yet: b catches up
        assert b[BASE + 2][0] == 99.0 and len(b) == BASE + 3
        np.testing.assert_array_equal(ids_b, [BASE, BASE + 1])
        np.testing.assert_array_equal(ids_a, [BASE + 2])
    finally:
        a.close()
        b.close()
    with embstore.open(path) as t:
        col = t.to_numpy()[:, 0]
        np.testing.assert_array_equal(col[[3, 4, 499, BASE, BASE + 1, BASE + 2]],
                                      [33, 44, 4990, 7, 8, 99])
        np.testing.assert_array_equal(t.ids_of(["x", "y", "z"]), [BASE, BASE + 1, BASE + 2])
        assert col[5] == 5 and len(t) == BASE + 3


def _hold_lock(path: str, ready, release) -> None:
    from pathlib import Path
    with writer_lock(Path(path)):
        ready.set()
        release.wait(60)


def test_second_writer_waits_then_times_out_and_readers_never_wait(tmp_path):
    path = tmp_path / "t"
    _base(path)
    ctx = forked.context()
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(path), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        with embstore.open(path) as r:  # readers: no lock
            assert r[7][0] == 7.0
        with pytest.raises(LockTimeoutError, match="writer lock for more than 0.3 s"):
            embstore.open(path, mode="r+", lock_timeout=0.3)
        release.set()
        holder.join(60)
        with embstore.open(path, mode="r+", lock_timeout=0.3) as w:
            w.write([7], _row([70.0]))
        with embstore.open(path) as r:
            assert r[7][0] == 70.0
    finally:
        release.set()
        holder.join(60)


def test_a_write_waits_for_the_other_writer(tmp_path):
    """The lock is held per call: a handle opened before another process started writing
    waits for it (it does not fail), then writes on top of its rows."""
    path = tmp_path / "t"
    _base(path)
    ctx = forked.context()
    ready, release = ctx.Event(), ctx.Event()
    with embstore.open(path, mode="r+") as t:
        holder = ctx.Process(target=_hold_lock, args=(str(path), ready, release))
        holder.start()
        assert ready.wait(60)
        release_later = __import__("threading").Timer(0.5, release.set)
        release_later.start()
        t0 = time.monotonic()
        t.write([1], _row([11.0]))
        assert time.monotonic() - t0 >= 0.4  # it waited for the other writer
        holder.join(60)
    with embstore.open(path) as r:
        assert r[1][0] == 11.0


def test_threads_with_handles_of_their_own(tmp_path):
    """Handles in one process exclude each other as processes do (flock per handle)."""
    import threading

    path = tmp_path / "t"
    _base(path)
    errors = []

    def work(w):
        try:
            with embstore.open(path, mode="r+") as t:
                for b in range(5):
                    t.append(_row(1000 * (w + 1) + np.arange(b * 10, b * 10 + 10)),
                             keys=[f"w{w}-{i}" for i in range(b * 10, b * 10 + 10)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    with embstore.open(path) as t:
        assert len(t) == BASE + 150
        for w in range(3):
            ids = t.ids_of([f"w{w}-{i}" for i in range(50)])
            np.testing.assert_array_equal(t[ids][:, 0], 1000 * (w + 1) + np.arange(50))
    assert embstore.verify(path).ok
    area = path / "vectors" / ".embstore"
    assert sorted(set(os.listdir(area)) - {"readers", "versions", "writers"}) \
        == ["last"]  # (no journal, no staged file left)
    assert not (area / "writers").exists() or os.listdir(area / "writers") == []  # no ticket

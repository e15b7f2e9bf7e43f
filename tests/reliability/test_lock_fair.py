"""The writer lock serves waiting writers in order: a writer that lets go and takes it
again at once (appending in a loop) no longer starves one that waits, and a killed
waiter's ticket never blocks the queue."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

import embstore
import forked  # (processes forked from a server that has imported embstore)
from embstore.store.place.lock import QUEUE, writer_lock

DIM = 4


def _base(path) -> None:
    embstore.save(path, np.zeros((100, DIM), np.float32), keys=[f"k{i}" for i in range(100)])


def _append_loop(path: str, started, stop, counts) -> None:
    with embstore.open(path, mode="r+") as t:
        n = 0
        while not stop.is_set():
            t.append(np.full((1, DIM), n, np.float32), keys=[f"a{n}"])
            n += 1
            if n == 3:
                started.set()
    counts.put(n)


def _lock_loop(path: str, started, stop) -> None:
    """Re-takes the lock the moment it lets go, holding it 5 ms each time."""
    root = Path(path)
    n = 0
    while not stop.is_set():
        with writer_lock(root):
            time.sleep(0.005)
        n += 1
        if n == 3:
            started.set()


def _waited(path, loop) -> float:
    ctx = forked.context()
    started, stop, counts = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (str(path), started, stop, counts) if loop is _append_loop else (str(path), started, stop)
    proc = ctx.Process(target=loop, args=args)
    proc.start()
    try:
        assert started.wait(120)
        time.sleep(0.2)  # well inside its loop
        t0 = time.monotonic()
        with writer_lock(Path(path), timeout=20):
            waited = time.monotonic() - t0
        print(f"waited {waited:.3f} s")
    finally:
        stop.set()
        proc.join(120)
    assert proc.exitcode == 0
    return waited


def test_a_waiting_writer_gets_the_lock_while_another_process_appends_in_a_loop(tmp_path):
    path = tmp_path / "t"
    _base(path)
    assert _waited(path, _append_loop) < 2.0
    with embstore.open(path) as t:  # the appends all landed
        n = len(t) - 100
        np.testing.assert_array_equal(t.to_numpy()[100:, 0], np.arange(n, dtype=np.float32))


def test_a_waiting_writer_gets_the_lock_from_one_that_retakes_it_at_once(tmp_path):
    path = tmp_path / "t"
    _base(path)
    assert _waited(path, _lock_loop) < 2.0


def _ticket_then_hang(path: str, ready) -> None:
    root = Path(path)
    with writer_lock(root):  # holds the lock while a second thread queues behind it
        import threading

        def queue_up() -> None:
            with writer_lock(root, timeout=600):
                pass

        threading.Thread(target=queue_up, daemon=True).start()
        qdir = root.joinpath(*QUEUE)
        while not (qdir.is_dir() and any(n.startswith("q-") for n in os.listdir(qdir))):
            time.sleep(0.01)
        ready.set()
        time.sleep(600)


def test_a_killed_waiters_ticket_does_not_block_the_queue(tmp_path):
    path = tmp_path / "t"
    _base(path)
    ctx = forked.context()
    ready = ctx.Event()
    proc = ctx.Process(target=_ticket_then_hang, args=(str(path), ready))
    proc.start()
    try:
        assert ready.wait(120)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
    qdir = path.joinpath(*QUEUE)
    assert any(n.startswith("q-") for n in os.listdir(qdir))  # left behind by the kill
    t0 = time.monotonic()
    with embstore.open(path, mode="r+", lock_timeout=5) as w:
        w.write([3], np.full((1, DIM), 7.0, np.float32))
    assert time.monotonic() - t0 < 5
    assert not any(n.startswith("q-") for n in os.listdir(qdir))  # swept
    with embstore.open(path) as t:
        np.testing.assert_array_equal(t[3], np.full(DIM, 7.0, np.float32))


def _take_in_turn(path: str, me: int, order) -> None:
    with writer_lock(Path(path), timeout=60):
        order.put(me)


def test_waiting_writers_are_served_in_the_order_they_came(tmp_path):
    path = tmp_path / "t"
    _base(path)
    ctx = forked.context()
    order = ctx.Queue()
    qdir = path.joinpath(*QUEUE)
    with writer_lock(path):
        procs = []
        for me in range(3):
            p = ctx.Process(target=_take_in_turn, args=(str(path), me, order))
            p.start()
            procs.append(p)
            deadline = time.monotonic() + 60  # the next one comes once this one waits
            while not qdir.is_dir() or sum(n.startswith("q-") for n in os.listdir(qdir)) < me + 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
    got = [order.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    assert got == [0, 1, 2]

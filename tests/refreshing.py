"""Threads reading through one handle while another thread refreshes it: the harness the
snapshot-read tests share."""

from __future__ import annotations

import threading
from collections.abc import Callable


def hammer(t, read: Callable[[int, threading.Event], None], wait: Callable[[], object],
           readers: int = 3) -> None:
    """Run ``read(seed, done)`` in ``readers`` threads and ``t.refresh()`` in a loop in one
    more, until ``wait()`` returns (a writer finished); then stop and join them all."""
    done = threading.Event()

    def refresh() -> None:
        while not done.is_set():
            t.refresh()
    threads = [threading.Thread(target=read, args=(s, done)) for s in range(readers)]
    threads.append(threading.Thread(target=refresh))
    for th in threads:
        th.start()
    try:
        wait()
    finally:
        done.set()
        for th in threads:
            th.join()


class MixCounter:
    """``read(seed, done)`` for :func:`hammer`: random lookups of ``batch`` rows of a table
    of ``rows`` rows whose every commit writes one value everywhere; counts the lookups,
    those holding two values (rows of two versions mixed) and the errors."""

    def __init__(self, t, rows: int, batch: int):
        self.t, self.rows, self.batch = t, rows, batch
        self.lookups = self.mixed = 0
        self.errors: list[str] = []

    def read(self, seed: int, done: threading.Event) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        while not done.is_set():
            try:
                got = self.t[rng.integers(0, self.rows, self.batch)]
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                self.errors.append(repr(exc))
                continue
            self.mixed += int(got.min() != got.max())
            self.lookups += 1

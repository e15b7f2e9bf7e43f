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

"""Blocks parsed by a thread of their own while the caller stores the previous ones.

An import is two halves that each take about as long: parsing the file (NumPy over a
buffer) and storing the rows (key hashing, checksums, writes, fsync).  Both spend most of
their time outside the GIL, so on two cores a thread that runs the parser one block ahead
overlaps them.  Memory stays bounded: at most ``depth`` parsed blocks wait, plus the one
being parsed.  An error of the parser is raised to the caller as it came (the same
exception, with its file and row), when the caller reaches that block.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator
from typing import TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")
_END = object()
_POLL = 0.05  # seconds between checks that the caller still wants blocks


def read_ahead(blocks: Generator[T, None, None], *, depth: int = 1) -> Generator[T, None, None]:
    """The items of ``blocks``, produced by a thread up to ``depth`` items ahead.

    Closing this iterator (or an error in the caller's loop) stops the thread after the
    block it is parsing and closes ``blocks``.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in blocks:
                if not put((item, None)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            put((_END, exc))
            return
        put((_END, None))

    thread = threading.Thread(target=produce, name="embstore-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, exc = q.get()
            if item is _END:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        thread.join()
        blocks.close()

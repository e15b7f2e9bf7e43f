"""Blocks parsed by a thread of their own while the caller stores the previous ones.

An import is two halves that each take about as long: parsing the file (NumPy over a
buffer) and storing the rows (key hashing, checksums, writes, fsync).  Both spend much of
their time outside the GIL, so on two cores a thread that runs the parser one block ahead
overlaps them; it starts as soon as the blocks are asked for, so the first block is being
parsed while the caller sets up its table.  Memory stays bounded: at most ``depth`` parsed
blocks wait, plus the one being parsed.  An error of the parser is raised to the caller as
it came (the same exception, with its file and row), when the caller reaches that block.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator
from typing import Generic, TypeVar

__all__ = ["ReadAhead"]

T = TypeVar("T")
_END = object()
_POLL = 0.05  # seconds between checks that the caller still wants blocks


def _produce(blocks: Generator, q: queue.Queue, stop: threading.Event) -> None:
    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    try:
        for item in blocks:
            if not put((item, None)):
                return
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
        put((_END, exc))
        return
    put((_END, None))


class ReadAhead(Generic[T]):
    """The items of ``blocks``, produced by a thread (started at once) up to ``depth`` items
    ahead.  :meth:`close` (also run when the last item is taken, or the iterator is
    dropped) stops the thread after the block it is parsing and closes ``blocks``."""

    def __init__(self, blocks: Generator[T, None, None], *, depth: int = 1):
        self._blocks = blocks
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = threading.Thread(
            target=_produce, args=(blocks, self._q, self._stop), name="embstore-read-ahead",
            daemon=True)
        self._thread.start()

    def __iter__(self) -> ReadAhead[T]:
        return self

    def __next__(self) -> T:
        if self._thread is None:
            raise StopIteration
        item, exc = self._q.get()
        if item is _END:
            self.close()
            if exc is not None:
                raise exc
            raise StopIteration
        return item

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
            self._blocks.close()

    def __del__(self) -> None:
        self.close()

"""Progress reporting of long operations: ``on_progress(done, total)`` callbacks.

The library never draws anything; the command line turns these calls into a
progress bar (see :func:`embstore.cli.progress`).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Progress", "Tally"]

Progress = Callable[[int, "int | None"], None]
"""``on_progress(done, total)``: units done so far, and the total if known."""


class Tally:
    """Counts units as they finish and reports the running total to ``on_progress``."""

    def __init__(self, total: int | None, on_progress: Progress | None, done: int = 0):
        self.total, self.done, self._report = total, done, on_progress
        if on_progress is not None and done:
            on_progress(done, total)

    def update(self, n: int) -> None:
        self.done += n
        if self._report is not None:
            self._report(self.done, self.total)

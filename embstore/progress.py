"""Progress reporting of long operations: ``on_progress(done, total)`` callbacks.

The library never draws anything; the command line turns these calls into a
progress display (:func:`display`, used by :mod:`embstore.cli`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

__all__ = ["Progress", "Tally", "Display", "display", "plural"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 block``, ``2 blocks`` (``many``: the plural when it is not ``word + "s"``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"

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


def _amount(n: float, unit: str) -> str:
    """``1.2 GB``, ``350 kB``, ``12,345 rows``."""
    if unit != "bytes":
        return f"{int(n):,} {unit}"
    for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return f"{n / scale:.1f} {name}"
    return f"{int(n)} B"


class Display:
    """An ``on_progress(done, total)`` callback that shows progress on a text stream.

    On a terminal: one line redrawn in place (done, total, percent, rate, time left), at
    most ``redraws`` times a second.  Elsewhere (a log, a pipe): a one-line status every
    ``interval`` seconds, so a long job shows it is alive without flooding the log, and
    nothing for work that ends sooner.  :meth:`close` ends the line.
    """

    def __init__(self, label: str, *, unit: str = "rows", stream=None, tty: bool | None = None,
                 interval: float = 10.0, redraws: float = 10.0, clock=None):
        self.label, self.unit = label, unit
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self._clock = time.monotonic if clock is None else clock
        self._every = 1.0 / redraws if self.tty else interval
        self._t0 = self._last = self._clock()
        self._drawn = False
        self.done: int = 0
        self.total: int | None = None

    def line(self) -> str:
        elapsed = max(self._clock() - self._t0, 1e-9)
        rate = self.done / elapsed
        text = f"{self.label}: {_amount(self.done, self.unit)}"
        if self.total:
            pct = 100.0 * self.done / self.total
            text += f" of {_amount(self.total, self.unit)} ({pct:.0f}%)"
        text += f", {_amount(rate, self.unit)}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", {(self.total - self.done) / rate:.0f} s left"
        return text

    def __call__(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        now = self._clock()
        if now - self._last < self._every and not (self.tty and total and done >= total):
            return
        self._last = now
        if self.tty:
            self.stream.write("\r\x1b[K" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()


@contextlib.contextmanager
def display(label: str, *, quiet: bool = False, unit: str = "rows") -> Iterator[Progress]:
    """An ``on_progress(done, total)`` callback showing progress on stderr (nothing if quiet)."""
    if quiet:
        yield lambda done, total: None
        return
    shown = Display(label, unit=unit, stream=sys.stderr)
    try:
        yield shown
    finally:
        shown.close()

"""Progress bars on stderr for long work, silent when asked or when stderr is not a terminal."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import click

__all__ = ["progress"]


class _Null:
    def update(self, n: int) -> None:
        pass


@contextmanager
def progress(total: int | None, label: str, *, quiet: bool = False, unit: str = "rows"):
    """``with progress(n, "importing") as bar: bar.update(k)``.

    Shows a click progress bar on stderr only when stderr is a terminal and
    ``quiet`` is false; otherwise every ``update`` is a no-op.
    """
    if quiet or not sys.stderr.isatty():
        yield _Null()
        return
    with click.progressbar(length=total, label=label, file=sys.stderr,
                           show_pos=True, item_show_func=None) as bar:
        yield bar

"""What every command shares: the --json/-q options, messages, path types, standard input."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Iterator

import click

from ..atomic import remove, temp_path
from ..formats import SPECS

TEXT_FORMATS = ("word2vec", "word2vec-binary", "glove", "fasttext")  # progress in bytes


def options(func):
    """``--json`` and ``-q/--quiet``, the options every command takes."""
    func = click.option("--quiet", "-q", is_flag=True,
                        help="No progress display or messages on stderr.")(func)
    return click.option("--json", "as_json", is_flag=True,
                        help="Print a JSON summary on stdout.")(func)


def say(message: str, quiet: bool) -> None:
    if not quiet:
        click.echo(message, err=True)


def print_json(doc) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


FILE = click.Path(exists=True, dir_okay=False, allow_dash=True)
TABLE = click.Path(exists=True)  # a file gets the library's 'not a table' message
TENSOR_FORMATS = tuple(f.name for f in SPECS if f.takes_tensor)


@contextlib.contextmanager
def stdin_file(src: str, dest: str) -> Iterator[str]:
    """``src``, or for ``-`` standard input copied (1 MiB at a time) to a temporary file
    beside ``dest`` (formats are detected from their first bytes, so the input must be
    seekable); the copy is removed afterwards."""
    if src != "-":
        yield src
        return
    tmp = temp_path(dest)
    try:
        with open(tmp, "xb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        yield tmp
    finally:
        remove(tmp)

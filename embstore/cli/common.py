"""What every command shares: the --json/-q options, messages, path types, standard input.

It loads no import format and no upload path: ``embstore info`` imports it too."""

from __future__ import annotations

import json

import click

from ..store.place.objstore import is_url



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


class PathOrUrl(click.ParamType):
    """A local path (checked as ``path_type`` checks it) or an object-store URL (as is)."""

    name = "path"

    def __init__(self, path_type: click.Path):
        self.path_type = path_type

    def convert(self, value, param, ctx):
        return value if is_url(value) else self.path_type.convert(value, param, ctx)


class SourceArg(click.ParamType):
    """An import's SRC: an existing path, '-', or a URL (s3://, gs://, az://, http(s)://)."""

    name = "path"
    _path = click.Path(exists=True, allow_dash=True)

    def convert(self, value, param, ctx):
        if is_url(value):
            return value
        if "://" in str(value):
            self.fail(f"cannot read {value}: expected a local path, s3:// (gs://, az://) or "
                      "http(s)://", param, ctx)
        return self._path.convert(value, param, ctx)


# a file gets the library's 'not a table' message; URLs (s3://...) are tables on object storage
TABLE = PathOrUrl(click.Path(exists=True))
DEST = PathOrUrl(click.Path())


def version_option(func):
    """``--version N``: the read commands' way to an earlier version of a table."""
    return click.option("--version", "version", type=click.IntRange(min=1), default=None,
                        metavar="N", help="Read version N of TABLE (an earlier one while it "
                        "is retained: `embstore log TABLE` lists them); default the newest."
                        )(func)

"""The ``embstore`` command line (a click group): the group, its error display and every command.

Every :class:`~embstore.errors.EmbstoreError` (and a missing or unreadable
file) becomes one line ``Error: ...`` on stderr and exit code 1, never a
traceback; usage errors are click's own (exit 2).  Every command takes
``--json`` (a JSON summary on stdout; messages stay on stderr) and ``-q``.
The library reports progress through ``on_progress(done, total)`` callbacks;
:func:`embstore.progress.display` shows them.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from ..errors import EmbstoreError, NotATableError
from .common import flag_terms
from .files import export_cmd, import_cmd, lookup
from .versions import compact_cmd, log_cmd, vacuum_cmd
from .tables import (copy_cmd, demo_cmd, index_cmd, info_cmd, reindex_cmd, repair_cmd,
                     similar_cmd, upgrade_cmd, verify_cmd)

__all__ = ["main", "cli", "flag_terms"]

def _one_line(message: str) -> str:
    return " ".join(message.split("\n")) if "\n" in message else message


class _Group(click.Group):
    def invoke(self, ctx):
        # zarr-python decodes in asyncio tasks: when one fails, the others' failures are
        # logged at garbage collection ("Future exception was never retrieved"); the one
        # error that matters is printed below
        logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `embstore similar ... | head`: the reader has all it wants
            _quiet_exit()
        except NotATableError as exc:
            hint = (f"; to make a table of it: embstore import {exc.path} TABLE"
                    if exc.is_file and not str(exc.path).lower().endswith(".npy") else "")
            raise click.ClickException(f"{flag_terms(str(exc))}{hint}") from None
        except EmbstoreError as exc:
            raise click.ClickException(_one_line(flag_terms(str(exc)))) from None
        except OSError as exc:  # a missing or unreadable file, a full disk, no descriptors
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            raise click.ClickException(_one_line(f"{where}{exc.strerror or exc}")) from None
        except MemoryError:
            raise click.ClickException("out of memory") from None


def _quiet_exit() -> None:
    """Leave with status 0 and nothing more on a closed standard output (as Unix tools do):
    what is still buffered for it goes to /dev/null, not into a second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="embstore")
def cli() -> None:
    """embstore: embedding tables larger than RAM.

    Import and export word2vec, GloVe, fastText, npy, safetensors and PyTorch
    tables; inspect and verify stores; run batch lookup jobs.  Every command
    takes --json (a JSON summary on stdout) and -q (no progress or messages).

    \b
    Example:
      embstore import vectors.txt vectors.emb
      embstore similar vectors.emb king -k 5
    """


def main() -> None:
    try:
        cli(prog_name="embstore")
    except SystemExit as exc:
        if exc.code not in (0, None) and "zarr" in sys.modules:
            # zarr-python's event loop thread, torn down at exit with tasks pending after a
            # failed read, prints pages of asyncio noise under the one-line error: the
            # command has failed and written its message, so leave without the teardown
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.code if isinstance(exc.code, int) else 1)
        if exc.code in (0, None):
            try:  # what is still buffered: a reader gone by now is no error either
                sys.stdout.flush()
            except BrokenPipeError:
                _quiet_exit()
        raise




for _command in (import_cmd, export_cmd, info_cmd, verify_cmd, reindex_cmd, repair_cmd,
                 upgrade_cmd, similar_cmd, index_cmd, lookup, copy_cmd, demo_cmd, log_cmd,
                 compact_cmd, vacuum_cmd):
    cli.add_command(_command)

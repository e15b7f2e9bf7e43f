"""The ``embstore`` command line (a click group): the group, its error display and every command.

Every :class:`~embstore.errors.EmbstoreError` (and a missing or unreadable
file) becomes one line ``Error: ...`` on stderr and exit code 1, never a
traceback; usage errors are click's own (exit 2).  Every command takes
``--json`` (a JSON summary on stdout; messages stay on stderr) and ``-q``.
The library reports progress through ``on_progress(done, total)`` callbacks;
:func:`embstore.progress.display` shows them.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from ..errors import EmbstoreError, NotATableError
from .terms import flag_terms

__all__ = ["main", "cli", "flag_terms"]

# Each command is imported when it runs: `embstore --help` lists them from this table
# without loading NumPy, and `embstore info` loads what info needs.  The short help here is
# the one each command declares (a test checks that they agree).
COMMANDS: dict[str, tuple[str, str, str]] = {  # name: (module, command, short help)
    "compact": ("versions", "compact_cmd", "Fold rows written since the last compaction in."),
    "copy": ("tables", "copy_cmd", "Copy a table (local folders, object storage)."),
    "demo": ("tables", "demo_cmd", "Run the main job end to end (a tour)."),
    "export": ("files", "export_cmd", "Export a table to a vectors file."),
    "import": ("files", "import_cmd", "Import a vectors file as a table."),
    "index": ("tables", "index_cmd", "Build a table's approximate nearest-neighbour index."),
    "info": ("info", "info_cmd", "Describe a table: size, dtype, layout, keys."),
    "log": ("versions", "log_cmd", "List a table's versions."),
    "lookup": ("lookup", "lookup", "Batch job: vectors of every id in a file."),
    "reindex": ("tables", "reindex_cmd", "Build a table's key index (or row norms) again."),
    "repair": ("tables", "repair_cmd", "Finish or clear interrupted writes, then verify."),
    "similar": ("tables", "similar_cmd", "Nearest rows by cosine similarity."),
    "upgrade": ("tables", "upgrade_cmd", "Rewrite a format-1 table as format 2."),
    "vacuum": ("versions", "vacuum_cmd", "Remove versions past the retention setting."),
    "verify": ("tables", "verify_cmd", "Check every stored chunk's checksum."),
}

def _one_line(message: str) -> str:
    return " ".join(message.split("\n")) if "\n" in message else message


class _Group(click.Group):
    """The group: commands loaded by name on first use, errors shown as one line."""

    def list_commands(self, ctx):
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name, _ = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(f"{__name__}.{module}"), name))
        return self.commands.get(cmd_name)

    def format_commands(self, ctx, formatter):
        """The list of commands, from the table (no command module is imported)."""
        width = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = [(name, COMMANDS[name][2] if name not in self.commands
                 else self.commands[name].get_short_help_str(width))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        # zarr-python decodes in asyncio tasks: when one fails, the others' failures are
        # logged at garbage collection ("Future exception was never retrieved"); the one
        # error that matters is printed below (logging imported here: `--help` needs none)
        import logging

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


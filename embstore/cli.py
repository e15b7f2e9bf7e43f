"""The ``embstore`` command line (a click group).

Every :class:`~embstore.errors.EmbstoreError` (and a missing or unreadable
file) becomes one line ``Error: ...`` on stderr and exit code 1, never a
traceback; usage errors are click's own (exit 2).
"""

from __future__ import annotations

import click

from .errors import EmbstoreError

__all__ = ["main", "cli"]


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EmbstoreError as exc:
            raise click.ClickException(str(exc)) from None
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError,
                PermissionError) as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from None
        except MemoryError:
            raise click.ClickException("out of memory") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="embstore")
def cli() -> None:
    """embstore: embedding tables larger than RAM.

    Import and export word2vec, GloVe, fastText, npy, safetensors and PyTorch
    tables; inspect and verify stores; run batch lookup jobs.
    """


def _register() -> None:
    import importlib

    for module in ("cli_convert", "cli_lookup", "demo"):
        try:
            mod = importlib.import_module(f".{module}", __package__)
        except ImportError as exc:  # pragma: no cover - a module still being written
            if module not in str(exc):
                raise
            continue
        for command in getattr(mod, "COMMANDS", ()):
            cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="embstore")

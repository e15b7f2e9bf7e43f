"""``embstore lookup``: the batch job (the vectors of every id or key in a file), in a module
of its own so that import and export never load the batch pipeline."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import click

from ..batch import lookup_file, output_kind
from ..batch.parquet import is_parquet
from ..progress import display as progress, plural
from ..store import open as open_store
from ..store.place.objstore import is_url
from .common import DEST, TABLE, PathOrUrl, options, print_json, say, version_option

__all__ = ["lookup"]


@contextlib.contextmanager
def _stdin_file(output: str, keys: bool) -> Iterator[str]:
    """Standard input copied to a file beside OUTPUT (a job reads its input twice: once to
    check it, once to look it up), removed when the job ends."""
    where = tempfile.gettempdir() if is_url(output) else os.path.dirname(os.path.abspath(output))
    fd, path = tempfile.mkstemp(prefix=".embstore-stdin-", suffix=".txt" if keys else ".npy",
                                dir=where)
    try:
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 8 << 20)
        yield path
    finally:
        os.remove(path)


@click.command("lookup", short_help="Batch job: vectors of every id in a file.")
@click.argument("table", type=TABLE)
@click.argument("input", type=PathOrUrl(click.Path(exists=True, dir_okay=False,
                                                   allow_dash=True)))
@click.argument("output", type=DEST)
@click.option("--keys", is_flag=True,
              help="INPUT is a text file of keys: one whitespace-separated sequence a line.")
@click.option("--oov", type=click.Choice(["error", "zero", "unk", "subword"]), default="error",
              show_default=True,
              help="Unknown keys and out-of-range ids: fail, zero rows, row --unk-id, or (--keys, "
                   "tables imported from a fastText .bin) composed from character n-grams.")
@click.option("--unk-id", type=int, default=None, help="The row used by --oov unk.")
@click.option("--lengths", type=click.Path(dir_okay=False), default=None,
              help="With --keys: write each line's length to this .npy file.")
@click.option("--batch-rows", type=click.IntRange(min=1), default=None,
              help="Leading rows of INPUT per block (default: about 16 MiB of output).")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Run on Dask: 'local' starts a cluster here, or tcp://HOST:PORT.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker processes of --scheduler local.")
@click.option("--cache-bytes", default="auto", show_default=True,
              help="Row cache of the table in each process, e.g. 256MiB; 'auto': none for "
                   "an uncompressed store, 64MiB for a compressed one.")
@click.option("--warm", type=click.Path(exists=True, dir_okay=False), default=None,
              metavar="FILE", help="Load these hot rows into the row cache first (needs "
              "--cache-bytes on an uncompressed store): a .npy or text file of ids, hottest "
              "first or a sample of traffic, or of 'id count' rows.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT (and --lengths) if they exist.")
@click.option("--resume", is_flag=True,
              help="Continue a killed job from the blocks already written (Zarr OUTPUT).")
@click.option("--column", default=None, metavar="NAME",
              help="Parquet INPUT: the column of ids or keys (or lists of them); default: "
                   "input_ids (ids, tokens), else the only column of integer ids.")
@click.option("--keep", multiple=True, metavar="NAME",
              help="Parquet INPUT: an input column to copy to OUTPUT (repeatable).")
@version_option
@options
def lookup(table, input, output, keys, oov, unk_id, lengths, batch_rows, scheduler, workers,
           cache_bytes, warm, overwrite, resume, column, keep, version, as_json, quiet):
    """Write the vectors of every id in INPUT to OUTPUT.

    INPUT is a .npy of integer ids of any shape (or, with --keys, a text file
    of keys: lines are padded to the longest with zero rows); '-' reads it from
    standard input.  OUTPUT is a
    .npy file or a .zarr directory of shape ids.shape + (dim,), written
    beside OUTPUT and renamed into place when complete.  TABLE is a store
    or a 2-D .npy file.  A .parquet INPUT gives a .parquet OUTPUT: --column
    names the ids or keys (or lists of them), --keep the columns copied beside
    the vectors (a fixed-size list of floats per id); with --scheduler it is a
    directory of part files (OUTPUT/part-00000.parquet, ...).

    \b
    Examples:
      embstore lookup news.emb ids.npy vectors.npy
      tokenize docs.txt | embstore lookup news.emb - vectors.npy --keys --oov zero
      embstore lookup news.emb sentences.txt vectors.zarr --keys --oov zero
      embstore lookup news.emb ids.npy vectors.zarr --scheduler local --workers 2
      embstore lookup news.emb docs.parquet vecs.parquet --column tokens --keep doc_id
      embstore lookup s3://b/news.emb s3://b/ids.npy s3://b/out.zarr --scheduler tcp://h:8786
    """
    if version is not None:
        if scheduler is not None:
            raise click.UsageError("--version with --scheduler: workers open the newest "
                                   "version (export the version first, or run without it)")
        with open_store(table, version=version, cache_bytes=cache_bytes) as t:
            return lookup.callback(t, input, output, keys, oov, unk_id, lengths, batch_rows,
                                   None, workers, cache_bytes, warm, overwrite, resume,
                                   column, keep, None, as_json, quiet)
    if oov == "unk" and unk_id is None:
        raise click.UsageError("--oov unk needs --unk-id")
    if warm is not None and scheduler is not None:
        raise click.UsageError("--warm with --scheduler: the workers open the table with "
                               "their own row caches (run the job here to warm one)")
    if unk_id is not None and oov != "unk":
        raise click.UsageError("--unk-id is used only with --oov unk")
    if is_parquet(input):
        _lookup_parquet(table, input, output, keys=keys, lengths=lengths, resume=resume,
                        column=column, keep=keep, oov=oov, unk_id=unk_id, batch_rows=batch_rows,
                        overwrite=overwrite, cache_bytes=cache_bytes, scheduler=scheduler,
                        workers=workers, warm=warm, as_json=as_json, quiet=quiet)
        return
    if column is not None or keep:
        raise click.UsageError("--column and --keep need a .parquet INPUT")
    if oov == "subword" and not keys:
        raise click.UsageError("--oov subword needs --keys (ids have no characters)")
    if lengths is not None and not keys:
        raise click.UsageError("--lengths needs --keys")
    if resume and output_kind(output) != "zarr":
        raise click.UsageError("--resume needs a .zarr OUTPUT (a .npy job starts over)")
    if resume and input == "-":
        raise click.UsageError("--resume needs an INPUT file (standard input is read once)")
    with progress("lookup", quiet=quiet or as_json) as on_progress, \
            _stdin_file(output, keys) if input == "-" else contextlib.nullcontext(input) as input:
        summary = lookup_file(table, input, output, keys=keys, oov=oov, unk_id=unk_id,
                              batch_rows=batch_rows, scheduler=scheduler, overwrite=overwrite,
                              resume=resume, lengths=lengths, cache_bytes=cache_bytes,
                              n_workers=workers, on_progress=on_progress, warm=warm)
    _say_written(summary, as_json, quiet)


def _lookup_parquet(table, input: str, output: str, *, keys: bool, lengths, resume: bool,
                    column, keep, oov, unk_id, batch_rows, overwrite: bool, cache_bytes,
                    scheduler, workers: int, warm, as_json: bool, quiet: bool) -> None:
    """``embstore lookup`` of a .parquet INPUT: its flags checked, the job run, reported."""
    if "vector" in keep:
        raise click.UsageError("--keep vector: the output's vector column is named "
                               "'vector'; an input column of that name cannot be kept")
    for flag, value in (("--keys", keys), ("--lengths", lengths), ("--resume", resume)):
        if value:
            raise click.UsageError(f"{flag} does not apply to a .parquet INPUT")
    with progress("lookup", quiet=quiet or as_json) as on_progress:
        summary = lookup_file(table, input, output, column=column, keep=keep, oov=oov,
                              unk_id=unk_id, batch_rows=batch_rows, overwrite=overwrite,
                              cache_bytes=cache_bytes, scheduler=scheduler,
                              n_workers=workers, on_progress=on_progress, warm=warm)
    if as_json:
        print_json(summary)
    else:
        parts = f" in {plural(summary['parts'], 'part file')}" if summary["scheduler"] \
            else ""
        say(f"wrote {summary['output']}{parts}: {plural(summary['rows'], 'row')} "
            f"({plural(summary['ids'], 'id')} in {plural(summary['batches'], 'batch', 'batches')}"
            f", {summary['seconds']:.2f} s)", quiet)


def _say_written(summary: dict, as_json: bool, quiet: bool) -> None:
    """The summary of an ids or key-file job: as JSON, or one line on standard error."""
    if as_json:
        print_json(summary)
    elif not quiet and summary.get("nothing_to_do"):
        click.echo(f"nothing to do: {summary['output']} is complete (shape {summary['shape']}, "
                   f"{summary['dtype']}); pass --overwrite to compute it again", err=True)
    elif not quiet:
        resumed = summary["resumed_blocks"]
        click.echo(f"wrote {summary['output']}: shape {summary['shape']}, {summary['dtype']} "
                   f"({plural(summary['ids'], 'id')} in {plural(summary['blocks'], 'block')}"
                   f"{f', {resumed} resumed' if resumed else ''}, {summary['seconds']:.2f} s)",
                   err=True)

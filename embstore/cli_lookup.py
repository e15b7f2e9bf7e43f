"""``embstore lookup``: the batch lookup job on the command line (see :mod:`embstore.batch`)."""

from __future__ import annotations

import click

__all__ = ["lookup", "COMMANDS"]


@click.command("lookup")
@click.argument("table", type=click.Path(exists=True))
@click.argument("input", type=click.Path(exists=True, dir_okay=False))
@click.argument("output", type=click.Path())
@click.option("--keys", is_flag=True,
              help="INPUT is a text file of keys: one whitespace-separated sequence a line.")
@click.option("--oov", type=click.Choice(["error", "zero", "unk"]), default="error",
              show_default=True,
              help="Unknown keys and out-of-range ids: fail, zero rows, or row --unk-id.")
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
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT (and --lengths) if they exist.")
@click.option("--resume", is_flag=True,
              help="Continue a killed job from the blocks already written (Zarr OUTPUT).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
def lookup(table, input, output, keys, oov, unk_id, lengths, batch_rows, scheduler, workers,
           cache_bytes, overwrite, resume, quiet):
    """Write the vectors of every id in INPUT to OUTPUT.

    INPUT is a .npy of integer ids of any shape (or, with --keys, a text file
    of keys: lines are padded to the longest with zero rows).  OUTPUT is a
    .npy file or a .zarr directory of shape ids.shape + (dim,), written
    beside OUTPUT and renamed into place when complete.  TABLE is a store
    or a 2-D .npy file.
    """
    from .batch import lookup_file
    from .batch_io import output_kind

    if oov == "unk" and unk_id is None:
        raise click.UsageError("--oov unk needs --unk-id")
    if unk_id is not None and oov != "unk":
        raise click.UsageError("--unk-id is used only with --oov unk")
    if lengths is not None and not keys:
        raise click.UsageError("--lengths needs --keys")
    if resume and output_kind(output) != "zarr":
        raise click.UsageError("--resume needs a .zarr OUTPUT (a .npy job starts over)")
    summary = lookup_file(table, input, output, keys=keys, oov=oov, unk_id=unk_id,
                          batch_rows=batch_rows, scheduler=scheduler, overwrite=overwrite,
                          resume=resume, lengths=lengths, quiet=quiet, cache_bytes=cache_bytes,
                          n_workers=workers)
    if not quiet:
        resumed = summary["resumed_blocks"]
        click.echo(f"wrote {summary['output']}: shape {summary['shape']}, {summary['dtype']} "
                   f"({summary['ids']} ids in {summary['blocks']} blocks"
                   f"{f', {resumed} resumed' if resumed else ''}, {summary['seconds']:.2f} s)",
                   err=True)


COMMANDS = [lookup]

"""The ``embstore`` command line (a click group): every command and the progress display.

Every :class:`~embstore.errors.EmbstoreError` (and a missing or unreadable
file) becomes one line ``Error: ...`` on stderr and exit code 1, never a
traceback; usage errors are click's own (exit 2).  The library below reports
progress through ``on_progress(done, total)`` callbacks; the bars live here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from . import demo as demo_steps
from .batch import lookup_file, output_kind
from .convert import export_format_for, export_table, import_file
from .errors import EmbstoreError, NotATableError
from .formats import READ_FORMATS, WRITE_FORMATS
from .layer import Embedding
from .store import open as open_table
from .store import verify as verify_table

__all__ = ["main", "cli"]


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except NotATableError as exc:
            hint = (f"; to make a table of it: embstore import {exc.path} TABLE"
                    if exc.is_file and not str(exc.path).lower().endswith(".npy") else "")
            raise click.ClickException(f"{exc}{hint}") from None
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


def main() -> None:
    cli(prog_name="embstore")


@contextmanager
def progress(label: str, *, quiet: bool = False) -> Iterator[Callable[[int, int | None], None]]:
    """An ``on_progress(done, total)`` callback drawing a bar on stderr.

    The bar is shown only when stderr is a terminal and ``quiet`` is false;
    otherwise the callback does nothing.
    """
    if quiet or not sys.stderr.isatty():
        yield lambda done, total: None
        return
    state: dict = {"bar": None, "done": 0}

    def on_progress(done: int, total: int | None) -> None:
        if state["bar"] is None:
            state["bar"] = click.progressbar(length=total, label=label, file=sys.stderr,
                                             show_pos=True, item_show_func=None)
            state["bar"].__enter__()
        state["bar"].update(done - state["done"])
        state["done"] = done

    try:
        yield on_progress
    finally:
        if state["bar"] is not None:
            state["bar"].__exit__(None, None, None)


_FILE = click.Path(exists=True, dir_okay=False)
_TABLE = click.Path(exists=True)  # a file gets the library's 'not a table' message


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        click.echo(message, err=True)


@click.command("import")
@click.argument("src", type=_FILE)
@click.argument("dest", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(("auto",) + READ_FORMATS), default="auto",
              show_default=True, help="Source format; auto decides from extension and first bytes.")
@click.option("--tensor", default=None, help="safetensors/torch: the tensor to import "
              "(default: the only 2-D float tensor).")
@click.option("--vocab", type=_FILE, default=None,
              help="Text file with one key per line, for formats without keys.")
@click.option("--dtype", type=click.Choice(("float32", "float16", "float64")), default=None,
              help="Stored dtype (default: the source's; text formats: float32).")
@click.option("--compression", type=click.Choice(("none", "zstd", "blosc")), default="none",
              show_default=True, help="Compression of the stored chunks.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=None,
              help="Rows per inner chunk (default: about 16 KiB of rows).")
@click.option("--shard-rows", type=click.IntRange(min=1), default=None,
              help="Rows per shard file, a multiple of --chunk-rows.")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Import only the first N rows.")
@click.option("--unicode-errors", type=click.Choice(("strict", "replace")), default="strict",
              show_default=True, help="Keys that are not valid UTF-8: an error, or U+FFFD.")
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
def import_cmd(src, dest, fmt, tensor, vocab, dtype, compression, chunk_rows, shard_rows, limit,
               unicode_errors, overwrite, quiet):
    """Import SRC (word2vec, fastText, GloVe, npy, safetensors, PyTorch) as a table at DEST."""
    if tensor is not None and fmt not in ("auto", "safetensors", "torch"):
        raise click.UsageError("--tensor applies to --format safetensors or torch only")
    with progress(f"importing {os.path.basename(src)}", quiet=quiet) as on_progress:
        res = import_file(src, dest, format=fmt, tensor=tensor, vocab=vocab, dtype=dtype,
                          limit=limit, unicode_errors=unicode_errors, compression=compression,
                          chunk_rows=chunk_rows, shard_rows=shard_rows, overwrite=overwrite,
                          on_progress=on_progress)
    what = f" tensor {res.tensor}" if res.tensor else ""
    _say(f"imported {res.rows} x {res.dim} {res.dtype} from {src} ({res.format}{what}) "
         f"into {dest}", quiet)
    if res.duplicates:
        click.echo(f"{res.duplicates} duplicate key(s) dropped (the first occurrence wins)",
                   err=True)


@click.command("export")
@click.argument("src", type=_TABLE)
@click.argument("dest", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(WRITE_FORMATS), default=None,
              help="Output format (default: from DEST's extension: .npy .safetensors .bin "
                   ".vec .txt).")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Export only the first N rows.")
@click.option("--vocab-out", type=click.Path(dir_okay=False), default=None,
              help="Where the keys go for formats without keys (npy, safetensors); default: "
                   "DEST with the extension .vocab.txt.")
@click.option("--no-vocab-out", is_flag=True,
              help="Write no keys file for formats without keys (the keys are lost).")
@click.option("--tensor", default=None, help="safetensors: the tensor's name (default: weight).")
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
def export_cmd(src, dest, fmt, limit, vocab_out, no_vocab_out, tensor, overwrite, quiet):
    """Export the table SRC to the file DEST.

    \b
    Example:
      embstore export news.emb news.txt --format word2vec
    """
    if vocab_out is not None and no_vocab_out:
        raise click.UsageError("--vocab-out and --no-vocab-out exclude each other")
    fmt = fmt or export_format_for(dest)
    with progress(f"exporting {os.path.basename(dest)}", quiet=quiet) as on_progress:
        res = export_table(src, dest, format=fmt, limit=limit, overwrite=overwrite,
                           vocab_out=False if no_vocab_out else vocab_out, tensor=tensor,
                           on_progress=on_progress)
    keys = f"; keys in {res.vocab_path}" if res.vocab_path else ""
    _say(f"exported {res.rows} rows of {src} to {dest} ({fmt}){keys}", quiet)
    if res.keys_dropped:
        click.echo(f"Warning: {src} has keys and {fmt} cannot hold them: they were not "
                   "written (--no-vocab-out)", err=True)


@click.command("info")
@click.argument("path", type=_TABLE)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def info_cmd(path, as_json):
    """Describe the table at PATH: size, dtype, layout, keys, bytes."""
    with open_table(path) as t:
        info = t.info()
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    for k in ("path", "vocab_size", "dim", "dtype", "has_keys", "chunk_rows", "shard_rows",
              "compression", "nbytes", "stored_bytes"):
        click.echo(f"{k + ':':14}{info.get(k)}")
    src = info.get("attributes", {}).get("source")
    if src:
        click.echo(f"{'source:':14}{json.dumps(src)}")


@click.command("verify")
@click.argument("path", type=_TABLE)
def verify_cmd(path):
    """Check every stored chunk of the table at PATH (checksums); exit 1 on damage."""
    report = verify_table(path)
    if not report.ok:
        click.echo(str(report), err=True)
        sys.exit(1)
    click.echo(str(report))


@click.command("similar")
@click.argument("table", type=_TABLE)
@click.argument("query", nargs=-1, required=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many neighbours.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def similar_cmd(table, query, k, as_json):
    """The K rows most cosine-similar to each QUERY (a key, or a row id if TABLE has no keys)."""
    with open_table(table) as t:
        keyed = t.keys is not None
        if keyed:
            queries = list(query)
        else:
            try:
                queries = [int(q) for q in query]
            except ValueError:
                raise click.UsageError(f"{table} has no keys; QUERY must be row ids, got "
                                       f"{query!r}") from None
        ids, scores = Embedding(t).most_similar(queries, k=k)
        result = []
        for q, row_ids, row_scores in zip(query, ids.tolist(), scores.tolist()):
            pairs = [(i, s) for i, s in zip(row_ids, row_scores) if i >= 0]
            names = t.keys[[i for i, _ in pairs]] if keyed and pairs else [i for i, _ in pairs]
            result.append({"query": q, "neighbours": [
                {"id": i, "key": names[j] if keyed else None, "score": s}
                for j, (i, s) in enumerate(pairs)]})
    if as_json:
        click.echo(json.dumps(result if len(result) > 1 else result[0], indent=2))
        return
    for entry in result:
        click.echo(f"{entry['query']}:")
        for n in entry["neighbours"]:
            label = n["key"] if n["key"] is not None else n["id"]
            click.echo(f"  {n['score']:.6f}  {label}")


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
    if oov == "unk" and unk_id is None:
        raise click.UsageError("--oov unk needs --unk-id")
    if unk_id is not None and oov != "unk":
        raise click.UsageError("--unk-id is used only with --oov unk")
    if lengths is not None and not keys:
        raise click.UsageError("--lengths needs --keys")
    if resume and output_kind(output) != "zarr":
        raise click.UsageError("--resume needs a .zarr OUTPUT (a .npy job starts over)")
    with progress("lookup", quiet=quiet) as on_progress:
        summary = lookup_file(table, input, output, keys=keys, oov=oov, unk_id=unk_id,
                              batch_rows=batch_rows, scheduler=scheduler, overwrite=overwrite,
                              resume=resume, lengths=lengths, cache_bytes=cache_bytes,
                              n_workers=workers, on_progress=on_progress)
    if not quiet:
        resumed = summary["resumed_blocks"]
        click.echo(f"wrote {summary['output']}: shape {summary['shape']}, {summary['dtype']} "
                   f"({summary['ids']} ids in {summary['blocks']} blocks"
                   f"{f', {resumed} resumed' if resumed else ''}, {summary['seconds']:.2f} s)",
                   err=True)


@click.command("demo")
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option("--no-dask", is_flag=True, help="Skip the Dask part of the batch job.")
def demo_cmd(directory: str | None, no_dask: bool) -> None:
    """Run the main job end to end in DIRECTORY (default: a temporary folder)."""
    demo_steps.run(directory, no_dask=no_dask,
                   run_cli=lambda args: cli.main(list(args), prog_name="embstore",
                                                 standalone_mode=False))


for _command in (import_cmd, export_cmd, info_cmd, verify_cmd, similar_cmd, lookup, demo_cmd):
    cli.add_command(_command)

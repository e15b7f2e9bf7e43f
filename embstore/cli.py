"""The ``embstore`` command line (a click group): every command, and progress on stderr.

Every :class:`~embstore.errors.EmbstoreError` (and a missing or unreadable
file) becomes one line ``Error: ...`` on stderr and exit code 1, never a
traceback; usage errors are click's own (exit 2).  Every command takes
``--json`` (a JSON summary on stdout; messages stay on stderr) and ``-q``.
The library reports progress through ``on_progress(done, total)`` callbacks;
:func:`embstore.progress.display` shows them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import click

from . import demo as demo_steps
from .batch import lookup_file, output_kind
from .convert import export_format_for, export_table, import_file
from .errors import EmbstoreError, NotATableError
from .formats import READ_FORMATS, WRITE_FORMATS, detect
from .layer import Embedding
from .progress import display as progress
from .store import open as open_table
from .keys.foreign import build_key_index
from .store.objstore import is_url
from .store.transfer import copy_table, staged
from .store import verify as verify_table
from .store.verify import checksum_status

__all__ = ["main", "cli"]

_TEXT_FORMATS = ("word2vec", "word2vec-binary", "glove", "fasttext")  # progress in bytes


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
    tables; inspect and verify stores; run batch lookup jobs.  Every command
    takes --json (a JSON summary on stdout) and -q (no progress or messages).

    \b
    Example:
      embstore import vectors.txt vectors.emb
      embstore similar vectors.emb king -k 5
    """


def main() -> None:
    cli(prog_name="embstore")


def _options(func):
    """``--json`` and ``-q/--quiet``, the options every command takes."""
    func = click.option("--quiet", "-q", is_flag=True,
                        help="No progress display or messages on stderr.")(func)
    return click.option("--json", "as_json", is_flag=True,
                        help="Print a JSON summary on stdout.")(func)


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        click.echo(message, err=True)


def _print_json(doc) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


_FILE = click.Path(exists=True, dir_okay=False, allow_dash=True)


class _PathOrUrl(click.ParamType):
    """A local path (checked as ``path_type`` checks it) or an object-store URL (as is)."""

    name = "path"

    def __init__(self, path_type: click.Path):
        self.path_type = path_type

    def convert(self, value, param, ctx):
        return value if is_url(value) else self.path_type.convert(value, param, ctx)


# a file gets the library's 'not a table' message; URLs (s3://...) are tables on object storage
_TABLE = _PathOrUrl(click.Path(exists=True))
_DEST = _PathOrUrl(click.Path())


@contextlib.contextmanager
def _local_for(dest: str, overwrite: bool, quiet: bool) -> Iterator[str]:
    """``dest`` itself, or for a URL a local folder uploaded to it when the block ends."""
    if not is_url(dest):
        yield dest
        return
    with progress(f"uploading to {dest}", quiet=quiet, unit="bytes") as on_progress, \
            staged(dest, overwrite=overwrite, on_progress=on_progress) as local:
        yield str(local)


@contextlib.contextmanager
def _stdin_file(src: str, dest: str) -> Iterator[str]:
    """``src``, or for ``-`` standard input copied (1 MiB at a time) to a temporary file
    beside ``dest`` (formats are detected from their first bytes, so the input must be
    seekable); the copy is removed afterwards."""
    if src != "-":
        yield src
        return
    parent = os.path.dirname(os.path.abspath(dest))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.stdin-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        yield tmp
    finally:
        os.remove(tmp)


@click.command("import", short_help="Import a vectors file as a table.")
@click.argument("src", type=_FILE)
@click.argument("dest", type=_DEST)
@click.option("--format", "fmt", type=click.Choice(("auto",) + READ_FORMATS), default="auto",
              show_default=True, help="Source format; auto decides from extension and first bytes.")
@click.option("--tensor", default=None, help="safetensors/torch: the tensor to import "
              "(default: the only 2-D float tensor).")
@click.option("--vocab", type=_FILE, default=None,
              help="Text file with one key per line, for formats without keys.")
@click.option("--dtype", type=click.Choice(("float32", "float16", "float64", "bfloat16", "int8")),
              default=None, help="Stored dtype (default: the source's, bfloat16 kept; text "
              "formats: float32). bfloat16 and int8 (row-wise quantised) are looked up as "
              "float32.")
@click.option("--compression", type=click.Choice(("none", "zstd", "blosc")), default="none",
              show_default=True, help="Compression of the stored chunks.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=None,
              help="Rows per inner chunk (default: about 1 KiB of rows).")
@click.option("--shard-rows", type=click.IntRange(min=1), default=None,
              help="Rows per shard file, a multiple of --chunk-rows.")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Import only the first N rows.")
@click.option("--unicode-errors", type=click.Choice(("strict", "replace")), default="strict",
              show_default=True, help="Keys that are not valid UTF-8: an error, or U+FFFD.")
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@_options
def import_cmd(src, dest, fmt, tensor, vocab, dtype, compression, chunk_rows, shard_rows, limit,
               unicode_errors, overwrite, as_json, quiet):
    """Import SRC (word2vec, fastText .vec, GloVe, npy, safetensors, PyTorch) as a table
    at DEST.  SRC '-' reads standard input.

    \b
    Examples:
      embstore import GoogleNews-vectors-negative300.bin news.emb
      embstore import model.safetensors bert.emb --tensor embeddings.word_embeddings.weight --vocab vocab.txt
      gunzip -c glove.txt.gz | embstore import - glove.emb --format glove
    """
    if tensor is not None and fmt not in ("auto", "safetensors", "torch"):
        raise click.UsageError("--tensor applies to --format safetensors or torch only")
    with _local_for(dest, overwrite, quiet or as_json) as local, _stdin_file(src, local) as path:
        unit = "bytes" if (fmt if fmt != "auto" else detect(path)) in _TEXT_FORMATS else "rows"
        with progress(f"importing {os.path.basename(src)}", quiet=quiet or as_json,
                      unit=unit) as on_progress:
            res = import_file(path, local, format=fmt, tensor=tensor, vocab=vocab, dtype=dtype,
                              limit=limit, unicode_errors=unicode_errors,
                              compression=compression, chunk_rows=chunk_rows,
                              shard_rows=shard_rows, overwrite=overwrite,
                              on_progress=on_progress)
    if as_json:
        _print_json({"source": src, "path": dest, "format": res.format, "rows": res.rows,
                     "dim": res.dim, "dtype": res.dtype, "duplicates": res.duplicates,
                     "tensor": res.tensor})
    what = f" tensor {res.tensor}" if res.tensor else ""
    _say(f"imported {res.rows} x {res.dim} {res.dtype} from {src} ({res.format}{what}) "
         f"into {dest}", quiet or as_json)
    if res.duplicates and not quiet:
        click.echo(f"{res.duplicates} duplicate key(s) dropped (the first occurrence wins)",
                   err=True)


@click.command("export", short_help="Export a table to a vectors file.")
@click.argument("src", type=_TABLE)
@click.argument("dest", type=click.Path(allow_dash=True))
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
@_options
def export_cmd(src, dest, fmt, limit, vocab_out, no_vocab_out, tensor, overwrite, as_json, quiet):
    """Export the table SRC to the file DEST ('-': standard output, with --format).

    \b
    Examples:
      embstore export news.emb news.txt --format word2vec
      embstore export bert.emb bert.safetensors --tensor embed_tokens.weight
      embstore export news.emb - --format glove | gzip > news.glove.gz
    """
    if vocab_out is not None and no_vocab_out:
        raise click.UsageError("--vocab-out and --no-vocab-out exclude each other")
    if dest == "-":
        if fmt is None:
            raise click.UsageError("export to standard output ('-') needs --format")
        if as_json:
            raise click.UsageError("--json and DEST '-' both write to standard output")
    fmt = fmt or export_format_for(dest)
    with progress(f"exporting {os.path.basename(dest)}", quiet=quiet or as_json) as on_progress:
        res = export_table(src, sys.stdout.buffer if dest == "-" else dest,
                           format=fmt, limit=limit, overwrite=overwrite,
                           vocab_out=False if no_vocab_out else vocab_out, tensor=tensor,
                           on_progress=on_progress)
    if as_json:
        _print_json({"table": src, "path": dest, "format": fmt, "rows": res.rows,
                     "vocab_path": res.vocab_path, "keys_dropped": res.keys_dropped})
    keys = f"; keys in {res.vocab_path}" if res.vocab_path else ""
    _say(f"exported {res.rows} rows of {src} to {dest} ({fmt}){keys}", quiet or as_json)
    if res.keys_dropped and not quiet:
        click.echo(f"Warning: {src} has keys and {fmt} cannot hold them: they were not "
                   "written (use --vocab-out FILE to keep them)", err=True)


@click.command("info", short_help="Describe a table: size, dtype, layout, keys.")
@click.argument("path", type=_TABLE)
@_options
def info_cmd(path, as_json, quiet):
    """Describe the table at PATH: size, dtype, layout, keys, bytes.

    \b
    Example:
      embstore info news.emb --json
    """
    with open_table(path) as t:
        info = t.info()
    # arrays written without crc32c cannot be verified (a remote table: its rows' layout says)
    sums = {"vectors": info.pop("checksummed")} if is_url(path) else checksum_status(path)
    info["checksummed"] = sums.get("vectors", False)  # the rows: what verify vouches for
    info["unchecksummed_arrays"] = [name for name, ok in sums.items() if not ok]
    if as_json:
        _print_json(info)
        return
    for k in ("path", "vocab_size", "dim", "dtype", "storage_dtype", "has_keys", "chunk_rows",
              "shard_rows", "compression", "nbytes", "stored_bytes", "saved_bytes"):
        click.echo(f"{k + ':':15}{info.get(k)}")
    bare = info["unchecksummed_arrays"]
    click.echo(f"{'checksummed:':15}" + ("yes" if info["checksummed"] else "no (vectors "
                                         "written without crc32c: rows cannot be verified)")
               + (f"; not checksummed: {', '.join(bare)}" if bare and bare != ["vectors"]
                  else ""))
    src = info.get("attributes", {}).get("source")
    if src:
        click.echo(f"{'source:':15}{json.dumps(src)}")


@click.command("verify", short_help="Check every stored chunk's checksum.")
@click.argument("path", type=click.Path(exists=True))
@_options
def verify_cmd(path, as_json, quiet):
    """Check every stored chunk of the table at PATH (checksums); exit 1 on damage, or when
    chunks of vectors carry no checksum (written without crc32c: they cannot be verified).

    \b
    Example:
      embstore verify news.emb
    """
    report = verify_table(path)
    if as_json:
        _print_json({"path": report.path, "ok": report.ok, "vocab_size": report.vocab_size,
                     "shards": report.shards, "chunks": report.chunks, "arrays": report.arrays,
                     "checksummed": report.checksummed, "unchecked": report.unchecked,
                     "unchecked_arrays": report.unchecked_arrays,
                     "damaged": [{"file": d.file, "chunk": d.chunk, "message": d.message}
                                 for d in report.damaged]})
    elif not report.damaged and not report.checksummed:
        raise click.ClickException(f"{report.path} cannot be verified: "
                                   f"{report.unchecked_line()}")
    elif not report.ok:
        click.echo(str(report), err=True)
    elif not quiet:
        click.echo(str(report))
    if not report.ok:
        sys.exit(1)


@click.command("reindex", short_help="Build a table's key index from its keys array.")
@click.argument("path", type=_TABLE)
@_options
def reindex_cmd(path, as_json, quiet):
    """Build (or rebuild) the key index of the table at PATH from its `keys` array.

    For a table whose keys were written by another Zarr tool, or whose key index
    `verify` reports damaged.

    \b
    Example:
      embstore reindex vectors.zarr
    """
    with open_table(path, mode="r+") as t:
        if not t.info()["has_keys"]:
            raise click.ClickException(f"{path} has no keys array: nothing to index")
        build_key_index(t.path, t.vocab_size)
    with open_table(path) as t:
        n = len(t.keys)
    if as_json:
        _print_json({"path": path, "keys": n})
    else:
        _say(f"indexed {n} keys of {path}", quiet)


@click.command("similar", short_help="Nearest rows by cosine similarity.")
@click.argument("table", type=_TABLE)
@click.argument("query", nargs=-1, required=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many neighbours.")
@click.option("--ids", "by_id", is_flag=True,
              help="QUERY are row ids (the default when TABLE has no keys).")
@_options
def similar_cmd(table, query, k, by_id, as_json, quiet):
    """The K rows most cosine-similar to each QUERY: a key, or a row id with --ids (or when
    TABLE has no keys).

    \b
    Examples:
      embstore similar news.emb king queen -k 5
      embstore similar news.emb --ids 0 17 --json
    """
    with open_table(table) as t:
        keyed = t.keys is not None
        queries: list
        if keyed and not by_id:
            queries = list(query)
        else:
            try:
                queries = [int(q) for q in query]
            except ValueError:
                why = "with --ids" if keyed else f"{table} has no keys, so"
                raise click.UsageError(f"{why} QUERY must be row ids, got {query!r}") from None
        ids, scores = Embedding(t).most_similar(queries, k=k)
        result = []
        for q, row_ids, row_scores in zip(queries, ids.tolist(), scores.tolist()):
            pairs = [(i, s) for i, s in zip(row_ids, row_scores) if i >= 0]
            names = t.keys[[i for i, _ in pairs]] if keyed and pairs else [None] * len(pairs)
            result.append({"query": q, "neighbours": [
                {"id": i, "key": names[j],
                 "score": None if s != s else s}  # NaN (zero-norm row): null in JSON
                for j, (i, s) in enumerate(pairs)]})
    if as_json:
        _print_json(result if len(result) > 1 else result[0])
        return
    for entry in result:
        click.echo(f"{entry['query']}:")
        for n in entry["neighbours"]:
            label = n["key"] if n["key"] is not None else n["id"]
            score = "undefined (zero norm)" if n["score"] is None else f"{n['score']:.6f}"
            click.echo(f"  {score}  {label}")


@click.command("lookup", short_help="Batch job: vectors of every id in a file.")
@click.argument("table", type=_TABLE)
@click.argument("input", type=_PathOrUrl(click.Path(exists=True, dir_okay=False)))
@click.argument("output", type=_DEST)
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
@_options
def lookup(table, input, output, keys, oov, unk_id, lengths, batch_rows, scheduler, workers,
           cache_bytes, overwrite, resume, as_json, quiet):
    """Write the vectors of every id in INPUT to OUTPUT.

    INPUT is a .npy of integer ids of any shape (or, with --keys, a text file
    of keys: lines are padded to the longest with zero rows).  OUTPUT is a
    .npy file or a .zarr directory of shape ids.shape + (dim,), written
    beside OUTPUT and renamed into place when complete.  TABLE is a store
    or a 2-D .npy file.

    \b
    Examples:
      embstore lookup news.emb ids.npy vectors.npy
      embstore lookup news.emb sentences.txt vectors.zarr --keys --oov zero
      embstore lookup news.emb ids.npy vectors.zarr --scheduler local --workers 2
      embstore lookup s3://b/news.emb s3://b/ids.npy s3://b/out.zarr --scheduler tcp://h:8786
    """
    if oov == "unk" and unk_id is None:
        raise click.UsageError("--oov unk needs --unk-id")
    if unk_id is not None and oov != "unk":
        raise click.UsageError("--unk-id is used only with --oov unk")
    if lengths is not None and not keys:
        raise click.UsageError("--lengths needs --keys")
    if resume and output_kind(output) != "zarr":
        raise click.UsageError("--resume needs a .zarr OUTPUT (a .npy job starts over)")
    with progress("lookup", quiet=quiet or as_json) as on_progress:
        summary = lookup_file(table, input, output, keys=keys, oov=oov, unk_id=unk_id,
                              batch_rows=batch_rows, scheduler=scheduler, overwrite=overwrite,
                              resume=resume, lengths=lengths, cache_bytes=cache_bytes,
                              n_workers=workers, on_progress=on_progress)
    if as_json:
        _print_json(summary)
    elif not quiet:
        resumed = summary["resumed_blocks"]
        click.echo(f"wrote {summary['output']}: shape {summary['shape']}, {summary['dtype']} "
                   f"({summary['ids']} ids in {summary['blocks']} blocks"
                   f"{f', {resumed} resumed' if resumed else ''}, {summary['seconds']:.2f} s)",
                   err=True)


@click.command("copy", short_help="Copy a table to or from object storage.")
@click.argument("src", type=_TABLE)
@click.argument("dest", type=_DEST)
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@_options
def copy_cmd(src, dest, overwrite, as_json, quiet):
    """Copy the table SRC to DEST between a local folder and object storage (s3://...); an
    upload becomes visible only when complete (its zarr.json is written last).

    \b
    Example:
      embstore copy news.emb s3://bucket/news.emb
    """
    if not (is_url(src) or is_url(dest)):
        raise click.UsageError("copy moves tables to or from object storage: SRC or DEST "
                               "must be a URL such as s3://bucket/table.emb")
    with progress(f"copying {src}", quiet=quiet or as_json, unit="bytes") as on_progress:
        copy_table(src, dest, overwrite=overwrite, on_progress=on_progress)
    if as_json:
        _print_json({"source": src, "path": dest})
    _say(f"copied {src} to {dest}", quiet or as_json)


@click.command("demo", short_help="Run the main job end to end (a tour).")
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option("--no-dask", is_flag=True, help="Skip the Dask part of the batch job.")
@_options
def demo_cmd(directory: str | None, no_dask: bool, as_json: bool, quiet: bool) -> None:
    """Run the main job end to end in DIRECTORY (default: a temporary folder): import a
    real word2vec file, look rows up, run the layer, a batch job, export and verify.

    \b
    Example:
      embstore demo --no-dask
    """
    sink = open(os.devnull, "w") if quiet else sys.stderr  # noqa: SIM115 - closed below
    try:
        # with --json or -q the tour's prose goes to stderr (or nowhere), the summary to stdout
        with contextlib.redirect_stdout(sink) if (as_json or quiet) else contextlib.nullcontext():
            summary = demo_steps.run(directory, no_dask=no_dask,
                                     run_cli=lambda args: cli.main(list(args),
                                                                   prog_name="embstore",
                                                                   standalone_mode=False))
    finally:
        if sink is not sys.stderr:
            sink.close()
    if as_json:
        _print_json(summary)


for _command in (import_cmd, export_cmd, info_cmd, verify_cmd, reindex_cmd, similar_cmd, lookup,
                 copy_cmd,
                 demo_cmd):
    cli.add_command(_command)

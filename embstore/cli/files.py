"""The commands that turn files into files: import, export, lookup."""

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
from ..convert import export_table, import_file
from ..dtypes import STORAGE_DTYPES
from ..formats import READ_FORMATS, WRITE_FORMATS, export_extensions, export_format_for
from ..formats.source import inner_name
from ..progress import display as progress, plural
from ..store import open as open_store
from ..store.codecs import COMPRESSIONS
from ..store.remote.objstore import is_url
from .common import (DEST, FILE, TABLE, TENSOR_FORMATS, PathOrUrl, SourceArg, flag_terms, local_for, options,
                     version_option,
                     print_json, say)

@click.command("import", short_help="Import a vectors file as a table.")
@click.argument("src", type=SourceArg())
@click.argument("dest", type=DEST)
@click.option("--format", "fmt", type=click.Choice(("auto",) + READ_FORMATS), default="auto",
              show_default=True, help="Source format; auto decides from extension and first "
              "bytes (inside gzip/bz2/xz/zstd/zip data too); a folder is a Hugging Face model.")
@click.option("--tensor", default=None, help=f"{'/'.join(TENSOR_FORMATS)}: the tensor to "
              "import (default: the only 2-D float tensor).")
@click.option("--vocab", type=FILE, default=None,
              help="Keys for formats without them: a text file with one key per line, or a "
              "tokenizer.json / vocab.json (keys by token id). Default for npy, safetensors "
              "and PyTorch: SRC's stem + .vocab.txt when it exists (what export writes).")
@click.option("--no-vocab", is_flag=True,
              help="Read no keys file, not even the .vocab.txt beside SRC.")
@click.option("--dtype", type=click.Choice(STORAGE_DTYPES), default=None,
              help="Stored dtype (default: the source's, bfloat16 kept; text formats: "
              "float32). bfloat16 and int8 (row-wise quantised) are looked up as float32.")
@click.option("--compression", type=click.Choice(COMPRESSIONS), default="none",
              show_default=True, help="Compression of the stored chunks.")
@click.option("--chunk-rows", type=click.IntRange(min=1), default=None,
              help="Rows per inner chunk (default: about 1 KiB of rows).")
@click.option("--shard-rows", type=click.IntRange(min=1), default=None,
              help="Rows per shard file, a multiple of --chunk-rows.")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Import only the first N rows.")
@click.option("--unicode-errors", type=click.Choice(("strict", "replace")), default="strict",
              show_default=True, help="Keys that are not valid UTF-8: an error, or U+FFFD.")
@click.option("--encoding", default=None, metavar="NAME",
              help="fasttext-bin: the text encoding of the model's words (default utf-8).")
@click.option("--member", default=None, metavar="NAME",
              help="A zip SRC holding several files (glove.6B.zip holds four): the one to "
                   "import, by name.")
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@options
def import_cmd(src, dest, fmt, tensor, vocab, no_vocab, dtype, compression, chunk_rows,
               shard_rows, limit, unicode_errors, encoding, member, overwrite, as_json, quiet):
    """Import SRC (word2vec, fastText .vec or .bin model, GloVe, npy, safetensors, PyTorch,
    a Hugging Face model folder, Parquet of words and vectors) as a table at DEST.  SRC may
    be gzip, bz2, xz, zstd or zip compressed (told by its first bytes; --member picks one
    file of a zip holding several), a URL (s3://bucket/vectors.vec, https://...: streamed),
    or '-' for standard input.  A fastText .bin
    brings its subword n-grams along: unknown words get vectors (lookup --oov subword,
    similar).

    \b
    Examples:
      embstore import GoogleNews-vectors-negative300.bin news.emb
      embstore import cc.en.300.vec.gz cc.emb
      embstore import glove.6B.zip glove.emb --member glove.6B.300d.txt
      embstore import s3://bucket/vectors/cc.en.300.vec.gz cc.emb
      embstore import ./all-MiniLM-L6-v2 minilm.emb
      embstore import model.safetensors bert.emb --tensor embeddings.word_embeddings.weight --vocab vocab.txt
      zcat glove.txt.gz | embstore import - glove.emb --format glove
    """
    if vocab is not None and no_vocab:
        raise click.UsageError("--vocab and --no-vocab exclude each other")
    if no_vocab:
        vocab = False
    if tensor is not None and fmt not in ("auto",) + TENSOR_FORMATS:
        raise click.UsageError(f"--tensor applies to --format {' or '.join(TENSOR_FORMATS)} only")
    with local_for(dest, overwrite, quiet or as_json) as local:
        with progress(f"importing {os.path.basename(src)}", quiet=quiet or as_json,
                      unit="bytes") as on_progress:
            res = import_file(sys.stdin.buffer if src == "-" else src, local, format=fmt, tensor=tensor, vocab=vocab, dtype=dtype,
                              limit=limit, unicode_errors=unicode_errors,
                              compression=compression, chunk_rows=chunk_rows,
                              shard_rows=shard_rows, overwrite=overwrite,
                              on_progress=on_progress, member=member,
                              **({} if encoding is None else {"encoding": encoding}))
    if as_json:
        print_json({"source": src, "path": dest, "format": res.format, "rows": res.rows,
                     "dim": res.dim, "dtype": res.dtype, "duplicates": res.duplicates,
                     "duplicate_keys": list(res.duplicate_keys), "tensor": res.tensor})
    what = f" tensor {res.tensor}" if res.tensor else ""
    packed = f"{res.compression}-compressed " if res.compression else ""
    say(f"imported {res.rows} x {res.dim} {res.dtype} from {src} ({packed}{res.format}{what}) "
        f"into {dest}", quiet or as_json)
    for note in res.notes:
        say(f"Note: {flag_terms(note.replace('vocab=False', '--no-vocab'))}", quiet or as_json)
    if res.duplicates and not quiet:
        named = ", ".join(repr(k) for k in res.duplicate_keys)
        more = ", ..." if res.duplicates > len(res.duplicate_keys) else ""
        click.echo(f"{plural(res.duplicates, 'duplicate key')} dropped (the first occurrence wins)"
                   + (f": {named}{more}" if named else ""), err=True)


@click.command("export", short_help="Export a table to a vectors file.")
@click.argument("src", type=TABLE)
@click.argument("dest", type=click.Path(allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(WRITE_FORMATS), default=None,
              help="Output format (default: from DEST's extension: "
                   f"{' '.join(export_extensions())}).")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help="Export only the first N rows.")
@click.option("--vocab-out", type=click.Path(dir_okay=False), default=None,
              help="Where the keys go for formats without keys (npy, safetensors, torch); "
                   "default: DEST's stem + .vocab.txt (model.npy and model.safetensors share "
                   "model.vocab.txt: kept when it holds the same keys, an error when other "
                   "keys unless --overwrite). import reads it back by itself.")
@click.option("--no-vocab-out", is_flag=True,
              help="Write no keys file for formats without keys (the keys are lost).")
@click.option("--tensor", default=None,
              help="safetensors, torch: the tensor's name (default: weight).")
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@version_option
@options
def export_cmd(src, dest, fmt, limit, vocab_out, no_vocab_out, tensor, overwrite, version,
               as_json, quiet):
    """Export the table SRC to the file DEST ('-': standard output, with --format).
    A DEST ending in .gz, .bz2, .xz or .zst is compressed.

    \b
    Examples:
      embstore export news.emb news.txt --format word2vec
      embstore export news.emb news.vec.gz
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
    fmt = fmt or export_format_for(inner_name(dest))
    with progress(f"exporting {os.path.basename(dest)}", quiet=quiet or as_json) as on_progress, \
            (open_store(src, version=version) if version is not None else
             contextlib.nullcontext(src)) as source:
        res = export_table(source, sys.stdout.buffer if dest == "-" else dest,
                           format=fmt, limit=limit, overwrite=overwrite,
                           vocab_out=False if no_vocab_out else vocab_out, tensor=tensor,
                           on_progress=on_progress)
    if as_json:
        print_json({"table": src, "path": dest, "format": fmt, "rows": res.rows,
                     "vocab_path": res.vocab_path, "keys_dropped": res.keys_dropped})
    keys = f"; keys in {res.vocab_path}" if res.vocab_path else ""
    if res.vocab_reused:
        keys += " (already there, the same keys)"
    say(f"exported {res.rows} rows of {src} to {dest} ({fmt}){keys}", quiet or as_json)
    if res.keys_dropped and not quiet:
        click.echo(f"Warning: {src} has keys and {fmt} cannot hold them: they were not "
                   "written (use --vocab-out FILE to keep them)", err=True)


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

"""The commands that turn files into tables and back: import, export."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import click

from ..convert import export_table, import_file
from ..dtypes import STORAGE_DTYPES
from ..formats import (READ_FORMATS, SPECS, WRITE_FORMATS, export_extensions,
                       export_format_for)
from ..formats.source import inner_name
from ..progress import display as progress, plural
from ..store import open as open_store
from ..store.codecs import COMPRESSIONS
from ..store.place.objstore import is_url
from ..store.remote.transfer import staged
from .common import DEST, FILE, TABLE, SourceArg, options, print_json, say, version_option
from .terms import flag_terms

TENSOR_FORMATS = tuple(f.name for f in SPECS if f.takes_tensor)


@contextlib.contextmanager
def local_for(dest: str, overwrite: bool, quiet: bool) -> Iterator[str]:
    """``dest`` itself, or for a URL a local folder uploaded to it when the block ends."""
    if not is_url(dest):
        yield dest
        return
    with progress(f"uploading to {dest}", quiet=quiet, unit="bytes") as on_progress, \
            staged(dest, overwrite=overwrite, on_progress=on_progress) as local:
        yield str(local)


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

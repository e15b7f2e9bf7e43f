"""``embstore import``, ``export``, ``info``, ``verify`` and ``similar``.

Registered on the ``embstore`` group by :mod:`embstore.cli` (``COMMANDS``);
errors become one ``Error: ...`` line there.
"""

from __future__ import annotations

import json
import sys

import click

from .formats import READ_FORMATS, WRITE_FORMATS

__all__ = ["COMMANDS", "import_cmd", "export_cmd", "info_cmd", "verify_cmd", "similar_cmd"]

_FILE = click.Path(exists=True, dir_okay=False)
_TABLE = click.Path(exists=True, file_okay=False)


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
    from .formats.convert import import_file

    if tensor is not None and fmt not in ("auto", "safetensors", "torch"):
        raise click.UsageError("--tensor applies to --format safetensors or torch only")
    res = import_file(src, dest, format=fmt, tensor=tensor, vocab=vocab, dtype=dtype, limit=limit,
                      unicode_errors=unicode_errors, compression=compression,
                      chunk_rows=chunk_rows, shard_rows=shard_rows, overwrite=overwrite,
                      quiet=quiet)
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
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
def export_cmd(src, dest, fmt, limit, overwrite, quiet):
    """Export the table SRC to the file DEST."""
    from .formats.convert import export_format_for, export_table

    fmt = fmt or export_format_for(dest)
    rows = export_table(src, dest, format=fmt, limit=limit, overwrite=overwrite, quiet=quiet)
    _say(f"exported {rows} rows of {src} to {dest} ({fmt})", quiet)


@click.command("info")
@click.argument("path", type=_TABLE)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def info_cmd(path, as_json):
    """Describe the table at PATH: size, dtype, layout, keys, bytes."""
    import embstore

    with embstore.open(path) as t:
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
    import embstore

    report = embstore.verify(path)
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
    import embstore

    with embstore.open(table) as t:
        keyed = t.keys is not None
        if keyed:
            queries = list(query)
        else:
            try:
                queries = [int(q) for q in query]
            except ValueError:
                raise click.UsageError(f"{table} has no keys; QUERY must be row ids, got "
                                       f"{query!r}") from None
        ids, scores = embstore.Embedding(t).most_similar(queries, k=k)
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


COMMANDS = [import_cmd, export_cmd, info_cmd, verify_cmd, similar_cmd]

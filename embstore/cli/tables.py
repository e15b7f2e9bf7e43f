"""The commands about one table: verify, reindex, repair, upgrade, similar, index, copy;
and the demo."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import click

from . import demo as demo_steps
from ..keys.foreign import build_key_index
from ..search.ann import METRICS, StaleIndexWarning, build_index
from ..layer import Embedding
from ..store import open as open_table
from ..store import repair as repair_table
from ..store import upgrade as upgrade_table
from ..store import verify as verify_table
from ..store.stored_norms import store_norms
from ..store.remote.transfer import copy_table
from ..progress import display as progress, plural
from .common import DEST, TABLE, options, print_json, say, version_option

@click.command("verify", short_help="Check every stored chunk's checksum.")
@click.argument("path", type=TABLE)
@options
def verify_cmd(path, as_json, quiet):
    """Check every stored chunk of the table at PATH (checksums); exit 1 on damage, or when
    chunks of vectors carry no checksum (written without crc32c: they cannot be verified).

    \b
    Example:
      embstore verify news.emb
    """
    report = verify_table(path)
    if as_json:
        print_json({"path": report.path, "ok": report.ok, "vocab_size": report.vocab_size,
                     "shards": report.shards, "chunks": report.chunks, "arrays": report.arrays,
                     "checksummed": report.checksummed, "unchecked": report.unchecked,
                     "unchecked_arrays": report.unchecked_arrays,
                     "damaged": [{"file": d.file, "chunk": d.chunk, "message": d.message}
                                 for d in report.damaged]})
    elif not report.damaged and not report.checksummed:
        raise click.ClickException(f"{report.path} cannot be verified: "
                                   f"{report.unchecked_line()}")
    else:
        _echo_report(report, quiet)
    if not report.ok:
        sys.exit(1)


def _echo_report(report, quiet: bool) -> None:
    """A verify report: on stderr when it found damage, else on stdout unless quiet."""
    if not report.ok:
        click.echo(str(report), err=True)
    elif not quiet:
        click.echo(str(report))


@click.command("reindex", short_help="Build a table's key index (or row norms) again.")
@click.argument("path", type=TABLE)
@click.option("--norms", is_flag=True,
              help="Store the rows' norms instead (tables written without them: older "
                   "embstore versions, other Zarr tools), so searches skip computing them.")
@options
def reindex_cmd(path, norms, as_json, quiet):
    """Build (or rebuild) the key index of the table at PATH from its `keys` array; with
    --norms, compute and store its rows' norms.

    For a table whose keys were written by another Zarr tool, or whose key index
    `verify` reports damaged.

    \b
    Examples:
      embstore reindex vectors.zarr
      embstore reindex old.emb --norms
    """
    if norms:
        rows = store_norms(path)
        if as_json:
            print_json({"path": path, "norms": rows})
        else:
            say(f"stored the norms of {rows} rows of {path}", quiet)
        return
    with open_table(path, mode="r+") as t:
        if not t.info()["has_keys"]:
            raise click.ClickException(f"{path} has no keys array: nothing to index")
        build_key_index(t.path, t.vocab_size)
    with open_table(path) as t:
        n = len(t.keys)
    if as_json:
        print_json({"path": path, "keys": n})
    else:
        say(f"indexed {n} keys of {path}", quiet)


@click.command("repair", short_help="Finish or clear interrupted writes, then verify.")
@click.argument("path", type=TABLE)
@options
def repair_cmd(path, as_json, quiet):
    """Finish or clear interrupted writes to the table at PATH, then verify it (exit 1 on
    damage).  Removes the staged files of killed writers, and temporary tables beside PATH
    that killed imports and saves left; the next writer does the same for its table.

    \b
    Example:
      embstore repair news.emb
    """
    removed = repair_table(path)
    report = verify_table(path)
    if as_json:
        print_json({"path": report.path, "removed": removed, "ok": report.ok,
                    "damaged": [d.message for d in report.damaged]})
    else:
        if not quiet:
            click.echo(f"removed {plural(len(removed), 'leftover')} of interrupted writes"
                       + "".join(f"\n  {name}" for name in removed))
        _echo_report(report, quiet)
    if not report.ok:
        sys.exit(1)


@click.command("upgrade", short_help="Rewrite a format-1 table as format 2.")
@click.argument("path", type=TABLE)
@options
def upgrade_cmd(path, as_json, quiet):
    """Rewrite the format-1 table at PATH as format 2 (versioned; uncompressed rows at a
    fixed stride with a checksum per 4 KiB page, a compressed table's codec, chunks and
    shards kept: docs/FORMAT.md), in one step: written beside PATH and swapped in, keys,
    n-grams and the approximate index kept.

    \b
    Example:
      embstore upgrade news.emb
    """
    before = open_table(path, cache_bytes=0)
    was = before.info().get("format", 1)
    before.close()
    with upgrade_table(path, cache_bytes=0) as t:
        now = t.info().get("format", 1)
    if as_json:
        print_json({"path": os.fspath(path), "format_before": was, "format": now})
    elif not quiet:
        click.echo(f"{path}: format {was} -> {now}" if now != was else
                   f"{path}: format {now} (nothing to do)")


@click.command("similar", short_help="Nearest rows by cosine similarity.")
@click.argument("table", type=TABLE)
@click.argument("query", nargs=-1, required=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many neighbours.")
@click.option("--ids", "by_id", is_flag=True,
              help="QUERY are row ids (the default when TABLE has no keys).")
@click.option("--approx", is_flag=True,
              help="Ask the table's approximate index (built by `embstore index`); a stale "
                   "index warns and the search runs exactly.")
@click.option("--ef", type=click.IntRange(min=1), default=None,
              help="Search effort of --approx: lists scanned per query (default: the index's "
                   "nprobe, chosen when it was built).")
@version_option
@options
def similar_cmd(table, query, k, by_id, approx, ef, version, as_json, quiet):
    """The K rows most cosine-similar to each QUERY: a key, or a row id with --ids (or when
    TABLE has no keys).  With --approx, from the approximate index (scores in its metric).
    On a table imported from a fastText .bin an unknown key is queried by its vector
    composed from character n-grams.

    \b
    Examples:
      embstore similar news.emb king queen -k 5
      embstore similar news.emb --ids 0 17 --json
      embstore similar news.emb king --approx --ef 128
    """
    with open_table(table, version=version) as t:
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
        # keys of a fastText table: unknown ones are queried by their subword vectors
        sub = keyed and not by_id and t.subwords is not None
        layer = Embedding(t, oov="subword" if sub else "error")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", StaleIndexWarning)
            ids, scores = layer.most_similar(queries, k=k, approx=approx, ef=ef)
        for w in caught:
            say(f"Warning: {w.message}", quiet)
        result = []
        for q, row_ids, row_scores in zip(queries, ids.tolist(), scores.tolist()):
            pairs = [(i, s) for i, s in zip(row_ids, row_scores) if i >= 0]
            names = t.keys[[i for i, _ in pairs]] if keyed and pairs else [None] * len(pairs)
            result.append({"query": q, "neighbours": [
                {"id": i, "key": names[j],
                 "score": None if s != s else s}  # NaN (zero-norm row): null in JSON
                for j, (i, s) in enumerate(pairs)]})
    if as_json:
        print_json(result)  # a list, one entry per query, however many queries
        return
    for entry in result:
        click.echo(f"{entry['query']}:")
        for n in entry["neighbours"]:
            label = n["key"] if n["key"] is not None else n["id"]
            score = "undefined (zero norm)" if n["score"] is None else f"{n['score']:.6f}"
            click.echo(f"  {score}  {label}")


@click.command("index", short_help="Build a table's approximate nearest-neighbour index.")
@click.argument("table", type=TABLE)
@click.option("--metric", type=click.Choice(METRICS), default="cos", show_default=True,
              help="cos (cosine), ip (inner product) or l2 (Euclidean).")
@click.option("--nlist", type=click.IntRange(min=1), default=None,
              help="Lists (k-means centroids) of the IVF index [default: about sqrt(rows)].")
@click.option("--nprobe", "--expansion-search", "nprobe", type=click.IntRange(min=1),
              default=None, help="Default search effort, lists scanned per query (similar "
              "--ef overrides it) [default: the smallest reaching --recall on a sample].")
@click.option("--recall", type=click.FloatRange(min=0, max=1, min_open=True), default=0.99,
              show_default=True, help="recall@10 the default search effort is chosen for.")
@click.option("--connectivity", type=click.IntRange(min=2), default=None, hidden=True,
              help="HNSW setting of embstore <= 0.4: ignored.")
@click.option("--expansion-add", type=click.IntRange(min=1), default=None, hidden=True,
              help="HNSW setting of embstore <= 0.4: ignored.")
@click.option("--overwrite", is_flag=True, help="Replace an existing index.")
@options
def index_cmd(table, metric, nlist, nprobe, recall, connectivity, expansion_add, overwrite,
              as_json, quiet):
    """Build the approximate index of TABLE (a FAISS IVF index stored inside the table at
    vectors/.embstore/ann/; `similar --approx` maps its lists, reading only the centroids).
    Rows are read in blocks, twice; after a write or append the index is stale until built
    again.

    \b
    Example:
      embstore index news.emb --nlist 4096 --overwrite
    """
    if connectivity is not None or expansion_add is not None:
        say("Warning: --connectivity and --expansion-add are HNSW settings, ignored (the "
            "index is an IVF index: --nlist, --nprobe)", quiet)
    with open_table(table) as t, progress("indexing", quiet=quiet or as_json) as tick:
        meta = build_index(t, metric=metric, nlist=nlist, nprobe=nprobe, recall=recall,
                           overwrite=overwrite, progress=tick)
    if as_json:
        print_json(meta)
    else:
        say(f"indexed {meta['indexed_rows']} rows of {table} ({metric}, {meta['nlist']} "
            f"lists, search effort {meta['nprobe']}, {meta['build_seconds']:.1f} s)", quiet)


@click.command("demo", short_help="Run the main job end to end (a tour).")
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option("--no-dask", is_flag=True, help="Skip the Dask part of the batch job.")
@options
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
            group = click.get_current_context().find_root().command  # the embstore group
            summary = demo_steps.run(directory, no_dask=no_dask,
                                     run_cli=lambda args: group.main(list(args),
                                                                   prog_name="embstore",
                                                                   standalone_mode=False))
    finally:
        if sink is not sys.stderr:
            sink.close()
    if as_json:
        print_json(summary)


@click.command("copy", short_help="Copy a table (local folders, object storage).")
@click.argument("src", type=TABLE)
@click.argument("dest", type=DEST)
@click.option("--overwrite", is_flag=True, help="Replace an existing DEST (once complete).")
@options
def copy_cmd(src, dest, overwrite, as_json, quiet):
    """Copy the table SRC to DEST between a local folder and object storage (s3://...); an
    upload becomes visible only when complete (its zarr.json is written last).  Between two
    local folders it copies as `cp -a` does (hard links and holes kept: the same space on
    disk), with no writer committing meanwhile.

    \b
    Example:
      embstore copy news.emb s3://bucket/news.emb
      embstore copy news.emb /backup/news.emb
    """
    with progress(f"copying {src}", quiet=quiet or as_json, unit="bytes") as on_progress:
        copy_table(src, dest, overwrite=overwrite, on_progress=on_progress)
    if as_json:
        print_json({"source": src, "path": dest})
    say(f"copied {src} to {dest}", quiet or as_json)

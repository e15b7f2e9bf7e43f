"""``embstore info``: a table described, in a module of its own so that the command loads
only what opening a table needs (``store.table``, not ``build``, search, batch jobs or
import formats) and the index's metadata (``search.indexmeta``, not FAISS's pipeline)."""

from __future__ import annotations

import json

import click

from ..errors import IndexNotFoundError
from ..search.indexmeta import index_info
from ..store.table import open as open_table
from ..store.place.objstore import is_url
from ..store.verify.report import checksum_status
from .common import TABLE, options, print_json, version_option

__all__ = ["info_cmd"]


@click.command("info", short_help="Describe a table: size, dtype, layout, keys.")
@click.argument("path", type=TABLE)
@version_option
@options
def info_cmd(path, version, as_json, quiet):
    """Describe the table at PATH: size, dtype, layout, keys, bytes.

    \b
    Example:
      embstore info news.emb --json
    """
    with open_table(path, version=version) as t:
        info = t.info()
    # arrays written without crc32c cannot be verified (a remote table: its rows' layout says)
    sums = {"vectors": info.pop("checksummed")} if is_url(path) else checksum_status(path)
    info["checksummed"] = sums.get("vectors", False)  # the rows: what verify vouches for
    info["unchecksummed_arrays"] = [name for name, ok in sums.items() if not ok]
    try:
        ann = None if is_url(path) else index_info(path)  # approximate indexes: local only
    except IndexNotFoundError as exc:  # damaged metadata: say so, describe the rest
        ann = {"error": str(exc)}
    info["approx_index"] = None if ann is None else {
        k: ann.get(k) for k in ("metric", "nlist", "nprobe", "indexed_rows", "stale", "error")
        if k in ann}
    if as_json:
        print_json(info)
        return
    for k in ("path", "format", "version", "vocab_size", "dim", "dtype", "storage_dtype",
              "has_keys", "pending_rows",
              "chunk_rows",
              "shard_rows", "compression", "nbytes", "stored_bytes", "saved_bytes"):
        value = info.get(k)
        if k == "format" and value is None:  # a group another tool wrote: no embstore format
            value = "none (a Zarr group written by another tool, not by embstore)"
        click.echo(f"{k + ':':15}{value}")
    bare = info["unchecksummed_arrays"]
    click.echo(f"{'checksummed:':15}" + ("yes" if info["checksummed"] else "no (vectors "
                                         "written without crc32c: rows cannot be verified)")
               + (f"; not checksummed: {', '.join(bare)}" if bare and bare != ["vectors"]
                  else ""))
    src = info.get("attributes", {}).get("source")
    if src:
        click.echo(f"{'source:':15}{json.dumps(src)}")
    if ann is not None and "error" in ann:
        click.echo(f"{'approx index:':15}unreadable ({ann['error']})")
    elif ann is not None:
        click.echo(f"{'approx index:':15}{ann.get('metric')}, {ann.get('nlist')} lists, search "
                   f"effort {ann.get('nprobe')}" + (" (stale: the table changed since; "
                   "`embstore index --overwrite` builds it again)" if ann.get("stale") else ""))
    ng = info.get("ngrams")
    if ng:  # a fastText model's subword n-grams (lookup --oov subword)
        click.echo(f"{'ngrams:':15}{ng['rows']} rows (n-grams of {ng['minn']}..{ng['maxn']} "
                   f"characters, {ng['hash']})")

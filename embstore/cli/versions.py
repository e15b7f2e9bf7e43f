"""The commands about a table's versions: log, compact, vacuum (docs/FORMAT.md §6-7)."""

from __future__ import annotations

import time

import click

from ..store import open as open_table
from ..store.objects.version import object_log
from ..store.place.objstore import is_url
from ..store.versions.retain import version_log
from .common import TABLE, options, print_json, say


@click.command("log", short_help="List a table's versions.")
@click.argument("path", type=TABLE)
@options
def log_cmd(path, as_json, quiet):
    """List the retained versions of the table at PATH, oldest first: number, time, rows,
    what changed, and deltas pending compaction.  `--version N` on the read commands reads
    one of them.  Each commit is one version (a write past the compaction threshold is
    also the compaction), and the retention setting counts them.

    \b
    Example:
      embstore log news.emb
    """
    with open_table(path) as t:  # (the newest complete version, settled)
        newest = t.version
    entries = object_log(path) if is_url(path) else version_log(path)
    if as_json:
        print_json({"path": str(path), "version": newest, "versions": entries})
        return
    if not entries and is_url(path):
        say(f"{path}: no commits yet (version 0: the table as uploaded; `write`, `append` "
            "and `compact` on it make versions)", quiet)
        return
    if not entries:
        say(f"{path}: no versions yet (a format-1 table: its first write, or `embstore "
            "upgrade`, gives it versions; a layout another Zarr tool wrote has none)", quiet)
        return
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"] or 0))
        ch = e["change"] or {}
        what = ch.get("kind", "?") + (f" {ch['rows']} rows" if "rows" in ch else "") + (
            ", deltas compacted in" if ch.get("folded") == "chunks" else "")
        pending = f", {e['deltas']} delta file(s) pending" if e["deltas"] else ""
        click.echo(f"{e['version']:>6}  {when}  {e['rows']} rows  {what}{pending}"
                   + ("  (newest)" if e["version"] == newest else ""))


@click.command("compact", short_help="Fold rows written since the last compaction in.")
@click.argument("path", type=TABLE)
@options
def compact_cmd(path, as_json, quiet):
    """Fold the rows written since the last compaction (deltas) into the chunks of the
    table at PATH: one commit, a new version; earlier versions keep theirs.  Afterwards
    other Zarr readers (zarr-python, tensorstore) see the newest rows.

    \b
    Example:
      embstore compact news.emb
    """
    with open_table(path, "r+") as t:
        before, pending = t.version, t.info()["pending_rows"]
        after = t.compact()
    if as_json:
        print_json({"path": str(path), "version_before": before, "version": after,
                    "rows_folded": pending if after != before else 0})
        return
    say(f"{path}: version {before} -> {after} ({pending} rows folded in)" if after != before
        else f"{path}: version {after}, nothing to compact", quiet)


@click.command("vacuum", short_help="Remove versions past the retention setting.")
@click.argument("path", type=TABLE)
@click.option("--keep", type=click.IntRange(min=1), default=None, metavar="N",
              help="Keep the newest N versions (default: the table's retain_versions, 8).")
@click.option("--cutoff", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Object storage: remove only objects older than this (default 3600), so "
                   "commits in flight and their readers keep theirs.")
@options
def vacuum_cmd(path, keep, cutoff, as_json, quiet):
    """Remove the versions of the table at PATH but the newest (--keep) and those that open
    readers on this machine hold; their files go when no version uses them.  On object
    storage (no leases) objects go only past the age --cutoff, and with them the leftovers
    of commits that lost a conflict or were killed.

    \b
    Example:
      embstore vacuum news.emb --keep 2
    """
    with open_table(path, "r+") as t:
        removed = t.vacuum(keep) if cutoff is None else t.vacuum(keep, cutoff)
    if as_json:
        print_json({"path": str(path), "removed": removed})
        return
    say(f"{path}: removed {len(removed)} version(s)"
        + (f" ({', '.join(map(str, removed))})" if removed else ""), quiet)

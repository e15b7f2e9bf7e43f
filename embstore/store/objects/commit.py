"""One commit to a table on object storage: the commit point is creating the next version's
manifest with ``If-None-Match: *`` (docs/FORMAT.md §11a).

A lost response is told apart from a lost race by reading the manifest back: its
``write_id`` is this commit's or another's.  A lost race is rebased onto the winner when
the two changed disjoint rows (appends always are: the loser's rows come after the
winner's), else :class:`~embstore.errors.ConflictError` names the rows both wrote.
409, 503 and transport errors are retried with exponential backoff and jitter (50 ms
doubling to 2 s, for up to ``RETRY_SECONDS``): the manifest is read back first, so a
retried PUT never makes a commit twice.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ConflictError
from ..place.objstore import ObjectClient, RemoteError
from .manifest import HINT, encode, manifest_name, read_manifest
from .merging import kept_by_compaction, place

__all__ = ["Change", "commit", "put_data", "RETRY_SECONDS"]

_log = logging.getLogger("embstore")

RETRY_SECONDS = 60.0  # a commit retried this long on 409/503/transport errors gives up
_FIRST_DELAY, _MAX_DELAY = 0.05, 2.0
_SHOWN = 10  # overlapping rows a ConflictError's message lists


@dataclass
class Change:
    """What a commit adds: ``kind`` ``write``, ``append`` or ``compact``; ``entries`` its
    own deltas (uploaded already); ``ids`` the rows a write sets (sorted); ``appended`` the
    rows an append adds; ``merge`` the entries of a merge of the parent's newest deltas it
    uploaded (docs/FORMAT.md §11a, *Merged deltas*), ``key_merge`` the entry of a merge of
    its newest key deltas (or none); a compaction's new ``base`` and the delta objects it
    folded (``folded``)."""

    kind: str
    write_id: str
    entries: list[dict] = field(default_factory=list)
    ids: np.ndarray | None = None
    appended: int = 0
    base: dict | None = None
    folded: frozenset[str] = frozenset()
    summary: dict = field(default_factory=dict)
    keys: list[str] | None = None  # an append's keys, encoded and hashed (``coded``)
    coded: Any = None
    merge: list[dict] = field(default_factory=list)
    key_merge: list[dict] = field(default_factory=list)
    dropped: set[str] | None = None  # (a compaction's: folded, then the merges of them)


def build(parent: dict, change: Change, now: float) -> dict | None:
    """The manifest ``change`` makes on ``parent`` (an append's rows after its rows; its
    merge in place of what it merged, where that is still there); None: a compaction a
    winner's merge made moot (:func:`~.merging.kept_by_compaction`)."""
    summary = change.summary
    if change.kind == "compact":
        assert change.base is not None
        base, rows = change.base, parent["rows"]
        if change.dropped is None:
            change.dropped = set(change.folded)
        kept = kept_by_compaction(parent["deltas"], change.dropped)
        if kept is None:
            return None
        deltas = kept
    else:
        base, rows = parent["base"], parent["rows"] + change.appended
        earlier, merged = place(parent["deltas"], change.merge)
        if merged:
            summary = dict(summary, merged=len(change.merge[0]["merged"]))
        earlier, merged = place(earlier, change.key_merge)
        if merged:
            summary = dict(summary, merged_keys=len(change.key_merge[0]["merged"]))
        deltas = earlier + [dict(e, first_row=parent["rows"]) if e["kind"] == "append"
                            else e for e in change.entries]
    return {"embstore_objects": 1, "version": parent["version"] + 1,
            "parent": parent["version"], "write_id": change.write_id, "time": round(now, 3),
            "base": base, "rows": rows, "dim": parent["dim"], "dtype": parent["dtype"],
            "change": summary, "deltas": deltas}


def _overlap(change: Change, parent: dict, winner: dict,
             ids_of: Callable[[dict], np.ndarray]) -> np.ndarray:
    """Rows ``change`` writes that ``winner`` wrote too (its own deltas: those ``parent``
    lacks)."""
    if change.kind != "write" or change.ids is None:
        return np.empty(0, np.int64)
    seen = {e["object"] for e in parent["deltas"]}
    hits = [np.intersect1d(change.ids, ids_of(e), assume_unique=True)
            for e in winner["deltas"] if e["object"] not in seen and e["kind"] == "write"
            and e["array"] == "vectors"]
    return np.unique(np.concatenate(hits)) if hits else np.empty(0, np.int64)


def _key_conflict(change: Change, parent: dict, winner: dict, segment_of, url: str
                  ) -> ConflictError | None:
    """The keys ``change`` appends that ``winner`` appended too (or the winner compacted:
    the keys' hashes are of the index the append was made on)."""
    if change.keys is None:
        return None
    if winner["base"] != parent["base"]:
        return ConflictError(f"{url}: version {winner['version']} compacted the table (a new key "
                             f"index) since version {parent['version']}, which this append of "
                             "keys was made on: nothing was committed (refresh the table and "
                             "append again)", path=url, rows=np.empty(0, np.int64),
                             version=winner["version"])
    enc, h = change.coded
    seen = {e["object"] for e in parent["deltas"]}
    found = np.full(len(change.keys), -1, np.int64)
    # the winner's own appends of keys (not its merges: keys of its parent, which this
    # append was checked against already)
    for e in winner["deltas"]:  # a loop per key delta of the winner's own
        if e["object"] not in seen and e["array"] == "keys" and e["kind"] == "append":
            miss = np.flatnonzero(found < 0)
            found[miss] = segment_of(e).find(enc.subset(miss), h[miss])
    both = [change.keys[i] for i in np.flatnonzero(found >= 0)]
    if not both:
        return None
    shown = ", ".join(repr(k) for k in both[:_SHOWN])
    return ConflictError(f"{url}: {len(both)} key(s) this append adds ({shown}"
                         f"{' ...' if len(both) > _SHOWN else ''}) were appended by version "
                         f"{winner['version']} (another writer's commit): nothing was "
                         "committed", path=url, rows=np.empty(0, np.int64), keys=both,
                         version=winner["version"])


def _conflict(url: str, overlap: np.ndarray, parent: dict, winner: dict) -> ConflictError:
    shown = ", ".join(str(int(i)) for i in overlap[:_SHOWN])
    more = f" and {overlap.size - _SHOWN} more" if overlap.size > _SHOWN else ""
    return ConflictError(
        f"{url}: {overlap.size} row(s) this write sets ({shown}{more}) were written by version "
        f"{winner['version']} (another writer's commit) since version {parent['version']}, "
        "which this write was made on: nothing was committed (reopen or refresh the table to "
        "see the other write, then write again)", path=url, rows=overlap,
        version=winner["version"])


def _backoff(delay: float, deadline: float, url: str, why: str) -> float:
    if time.monotonic() > deadline:
        raise RemoteError(f"{url}: the commit was not acknowledged within {RETRY_SECONDS:g} s "
                          f"({why}); nothing of it is visible unless `embstore log` lists it",
                          url=url)
    time.sleep(delay * random.uniform(0.5, 1.0))
    return min(_MAX_DELAY, delay * 2)


def commit(client: ObjectClient, parent: dict, change: Change,
           ids_of: Callable[[dict], np.ndarray], segment_of=None) -> dict | None:
    """Commit ``change`` on the version ``parent`` (its manifest), rebased as often as it
    loses a race; returns the committed manifest, or None for a compaction that lost to
    another compaction or to an append of keys (then compact the newest version again).  ``ids_of(entry)``: the rows of a delta;
    ``segment_of(entry)``: the keys of a key delta (appends of keys)."""
    deadline = time.monotonic() + RETRY_SECONDS
    delay = _FIRST_DELAY
    while True:
        built = build(parent, change, time.time())
        if built is None:
            return None  # (a compaction a winner's merge of later rows made moot: redo)
        doc = built
        n = doc["version"]
        status = client.put_new(manifest_name(n), encode(doc), change.write_id)
        if status == "created":
            break
        try:
            got = read_manifest(client, n)  # (a lost response, or a lost race?)
        except RemoteError:
            delay = _backoff(delay, deadline, client.url, "reading the manifest back failed")
            continue
        if got is not None and got["write_id"] == change.write_id:
            doc = got  # this commit's own manifest: its first response was lost
            break
        if got is None:  # 409, 503 or a transport error before the server applied it
            delay = _backoff(delay, deadline, client.url, f"the version {n} PUT failed")
            continue
        if change.kind == "compact" and (got["change"].get("kind") == "compact" or any(
                e["array"] == "keys" for e in got["deltas"]
                if e["object"] not in {x["object"] for x in parent["deltas"]})):
            return None  # compacted already, or keys hashed under the old index: redo
        overlap = _overlap(change, parent, got, ids_of)
        if overlap.size:
            raise _conflict(client.url, overlap, parent, got)
        clash = _key_conflict(change, parent, got, segment_of, client.url)
        if clash is not None:
            raise clash
        parent = got  # rebased: the next version on the winner
    _hint(client, doc["version"])
    return doc


def put_data(client: ObjectClient, rel: str, data: bytes) -> None:
    """Upload a new immutable object (a delta under a fresh name: overwriting it with the
    same bytes is harmless), retried with backoff past 503s and transport errors."""
    deadline = time.monotonic() + RETRY_SECONDS
    delay = _FIRST_DELAY
    while True:
        try:
            client.put(rel, data)
            return
        except RemoteError as exc:
            if "access denied" in str(exc) or "does not exist" in str(exc):
                raise
            delay = _backoff(delay, deadline, client.url, str(exc))


def _hint(client: ObjectClient, n: int) -> None:
    """Point the hint at version ``n`` (best effort: readers list past it anyway)."""
    try:
        client.put(HINT, json.dumps({"embstore_hint": 1, "version": n}).encode())
    except RemoteError as exc:
        _log.warning("%s: version %d committed; updating the hint failed (%s)", client.url, n,
                     exc)

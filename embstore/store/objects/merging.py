"""Merged deltas on object storage (docs/FORMAT.md §11a, *Merged deltas*): a commit of rows
replaces the newest row deltas of its parent by one merge, so that a version's manifest
(and a fresh open's requests) grows with the bytes in deltas, not with the commits.

:func:`plan` picks the deltas a commit merges (their bytes at most ``max(own,
MERGE_BYTES)``: a commit uploads at most twice its rows' bytes, or ``MERGE_BYTES`` more);
:func:`place` lists a merge on the parent a commit is finally made on (rebased after a lost
race: only where the deltas it replaces are still there, together); :func:`kept_by_compaction`
is what a compaction rebasing onto a winner keeps of the winner's deltas.

Key deltas are merged the same way (*Merged key deltas*): :func:`plan_keys` picks an append's
parent's newest key deltas, :func:`merged_keys` joins their keys (hashes as stored) into the
keys of one key delta.
"""

from __future__ import annotations

import numpy as np

from ...errors import CorruptStoreError
from ...keys.hashing import EncodedKeys
from ...keys.segments import KeySegment
from .manifest import commit_groups, key_entries

__all__ = ["MERGE_BYTES", "plan", "plan_keys", "merged_keys", "place", "kept_by_compaction"]

#: a commit merges its parent's newest deltas while they sum to at most this many bytes, or
#: to its own deltas' bytes when those are more (8 MiB: about what one request's latency
#: costs in bandwidth several times over; small enough to upload beside any commit)
MERGE_BYTES = 8 << 20


def _newest(groups: list[list[dict]], own_bytes: int) -> list[list[dict]]:
    """The newest of ``groups`` (oldest first) while their bytes sum to at most
    ``max(own_bytes, MERGE_BYTES)``; empty when fewer than two fit."""
    budget, total, k = max(own_bytes, MERGE_BYTES), 0, len(groups)
    while k > 0:  # a loop per delta of the version (a few: merges keep them few)
        size = sum(e["bytes"] for e in groups[k - 1])
        if total + size > budget:
            break
        total, k = total + size, k - 1
    return groups[k:] if len(groups) - k >= 2 else []


def plan(doc: dict, own_bytes: int, specs: dict) -> list[list[dict]]:
    """The newest row deltas of version ``doc`` a commit of ``own_bytes`` merges, by commit
    (:func:`~.manifest.commit_groups`), oldest first; empty when fewer than two fit."""
    return _newest(commit_groups(doc, specs), own_bytes)


def plan_keys(doc: dict, own_bytes: int) -> list[dict]:
    """The newest key deltas of version ``doc`` an append whose own key delta is
    ``own_bytes`` merges, oldest first; empty when fewer than two fit."""
    return [g[0] for g in _newest([[e] for e in key_entries(doc)], own_bytes)]


def merged_keys(segs: list[KeySegment]) -> tuple[EncodedKeys, np.ndarray]:
    """The keys of the key deltas ``segs`` (placed as rows of their version, one after
    another) as one batch in row order, with their hashes as stored (in row order)."""
    first = segs[0].first
    for a, b in zip(segs, segs[1:]):  # a loop per merged key delta
        if a.stop != b.first:
            raise CorruptStoreError(f"{b.where}: keys from row {b.first}, expected {a.stop}: "
                                    "the key deltas do not follow each other", path=b.where)
    lengths = np.concatenate([np.diff(s.offsets) for s in segs]).astype(np.int64)
    buf = np.concatenate([s.utf8[: s.nbytes] for s in segs] + [np.zeros(8, np.uint8)])
    hashes = np.empty(lengths.size, np.uint64)
    hashes[np.concatenate([s.rows for s in segs]) - first] = np.concatenate(
        [s.hashes for s in segs])
    return EncodedKeys(buf, np.cumsum(lengths) - lengths, lengths), hashes


def place(deltas: list[dict], merge: list[dict]) -> tuple[list[dict], bool]:
    """``deltas`` (a parent's) with the merge entries ``merge`` (one per row array, or one
    of keys) in place of the objects they replace, and whether it was placed: only if those
    are all in ``deltas`` with no other delta of the same arrays between them (else another
    writer merged or compacted them, and the merge is left out: the commit's own deltas
    suffice).  The merge goes where the last of them was (key deltas stay in row order)."""
    if not merge:
        return deltas, False
    names = {name for e in merge for name in e["merged"]}
    arrays = {e["array"] for e in merge}
    at = [i for i, e in enumerate(deltas) if e["object"] in names]
    if len(at) != len(names):
        return deltas, False
    lo, hi = at[0], at[-1] + 1
    span = deltas[lo:hi]
    if any(e["object"] not in names and e["array"] in arrays for e in span):
        return deltas, False
    return deltas[:lo] + [e for e in span if e["object"] not in names] + merge + deltas[hi:], True


def kept_by_compaction(deltas: list[dict], dropped: set[str]) -> list[dict] | None:
    """What a compaction keeps of ``deltas`` (a winner's, or its own parent's): not the
    objects it folded (``dropped``, which grows with the merges of those it drops here, so
    that a later winner's merge of them is recognised), nor a merge of only such objects
    (its base holds their rows).  None: a merge mixes them with a later commit's rows (the
    compaction is made again on the newest version)."""
    kept = []
    for e in deltas:  # a loop per delta of the version
        if e["object"] in dropped:
            continue
        if e["kind"] == "merge":
            merged = set(e["merged"])
            if merged <= dropped:
                dropped.add(e["object"])
                continue
            if merged & dropped:
                return None
        kept.append(e)
    return kept

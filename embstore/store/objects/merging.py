"""Merged deltas on object storage (docs/FORMAT.md §11a, *Merged deltas*): a commit of rows
replaces the newest row deltas of its parent by one merge, so that a version's manifest
(and a fresh open's requests) grows with the bytes in deltas, not with the commits.

:func:`plan` picks the deltas a commit merges (their bytes at most ``max(own,
MERGE_BYTES)``: a commit uploads at most twice its rows' bytes, or ``MERGE_BYTES`` more);
:func:`place` lists a merge on the parent a commit is finally made on (rebased after a lost
race: only where the deltas it replaces are still there, together); :func:`kept_by_compaction`
is what a compaction rebasing onto a winner keeps of the winner's deltas.
"""

from __future__ import annotations

from .manifest import commit_groups

__all__ = ["MERGE_BYTES", "plan", "place", "kept_by_compaction"]

#: a commit merges its parent's newest deltas while they sum to at most this many bytes, or
#: to its own deltas' bytes when those are more (8 MiB: about what one request's latency
#: costs in bandwidth several times over; small enough to upload beside any commit)
MERGE_BYTES = 8 << 20


def plan(doc: dict, own_bytes: int, specs: dict) -> list[list[dict]]:
    """The newest row deltas of version ``doc`` a commit of ``own_bytes`` merges, by commit
    (:func:`~.manifest.commit_groups`), oldest first; empty when fewer than two fit."""
    groups = commit_groups(doc, specs)
    budget, total, k = max(own_bytes, MERGE_BYTES), 0, len(groups)
    while k > 0:  # a loop per delta of the version (a few: merges keep them few)
        size = sum(e["bytes"] for e in groups[k - 1])
        if total + size > budget:
            break
        total, k = total + size, k - 1
    return groups[k:] if len(groups) - k >= 2 else []


def place(deltas: list[dict], merge: list[dict]) -> tuple[list[dict], bool]:
    """``deltas`` (a parent's) with the merge entries ``merge`` (one per row array) in place
    of the objects they replace, and whether it was placed: only if those are all in
    ``deltas`` with no other row delta between them (else another writer merged or compacted
    them, and the merge is left out: the commit's own deltas suffice)."""
    if not merge:
        return deltas, False
    names = {name for e in merge for name in e["merged"]}
    at = [i for i, e in enumerate(deltas) if e["object"] in names]
    if len(at) != len(names):
        return deltas, False
    lo, hi = at[0], at[-1] + 1
    span = deltas[lo:hi]
    if any(e["object"] not in names and e["array"] != "keys" for e in span):
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

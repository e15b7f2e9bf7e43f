"""A handle's version of a table on object storage, and the commits that make the next one
(docs/FORMAT.md §11a): :func:`open_version`, :func:`commit_rows`, :func:`object_log`,
:func:`vacuum_objects`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...errors import CorruptStoreError, FormatError, ReadOnlyError, ShapeMismatchError
from ..place.objstore import ObjectClient
from ..remote.open import META, open_remote_source, parse_remote_meta
from ..versions.retain import RETAIN_VERSIONS
from ..versions.version import Version
from .commit import Change, commit, put_data
from ...ids import refuse_existing
from ...keys.index import DiskVocab
from ...keys.segments import KeySegment, SegmentedVocab
from ..versions.keydelta import encoded_new_keys
from .manifest import (AREA, HINT, DeltaCache, array_specs, data_name, delta_bytes, initial,
                       key_delta_bytes, key_entries, key_segment, list_versions,
                       manifest_name, merge, need_manifest, new_write_id, newest_version)
from .merging import merged_keys, plan, plan_keys
from .source import ObjectVersionSource

__all__ = ["open_version", "commit_rows", "object_vocab", "object_log", "vacuum_objects", "VACUUM_CUTOFF"]

#: objects younger than this (seconds) are never vacuumed: a commit in flight may need them
VACUUM_CUTOFF = 3600.0


def _check_base(doc: dict, attrs: dict, base, where: str) -> None:
    b = doc["base"]
    if (b["rows"] != base.shape[0] or doc["dim"] != base.shape[1]
            or doc["dtype"] != base.storage_dtype
            or (b["prefix"] == "" and b.get("write_id") != attrs.get("write_id"))):
        raise CorruptStoreError(f"{where}: version {doc['version']} was made on another table "
                                f"than the one at its base {b['prefix'] or '(the URL)'} "
                                f"({b['rows']} x {doc['dim']} {doc['dtype']}, write id "
                                f"{b.get('write_id')}): the table was replaced under its "
                                "versions", path=where)


def open_version(url: str, want: int | None, remote: dict, deltas: DeltaCache,
                 old: Version | None = None) -> Version:
    """Version ``want`` (default the newest) of the table at ``url``: its manifest, then
    only the immutable objects it names.  ``old``: the handle's current version (its base
    and clients are reused when the base is the same).  A first open lists the manifests
    (or reads version ``want``'s) and reads the URL's two ``zarr.json`` at once: the base
    of most versions is the table at the URL, read through the same client."""
    prev = old.source if old is not None and isinstance(old.source, ObjectVersionSource) \
        else None
    client = prev.client if prev is not None else ObjectClient(url,
                                                               remote.get("storage_options"))
    try:
        here = None
        if prev is None:
            first, here = _first_reads(client, want)
            n, doc = (first, None) if want is None else (want, first)
        else:
            n, doc = (newest_version(client) if want is None else want), None
        if doc is None and n != 0:
            doc = need_manifest(client, n)
        if prev is not None and doc is not None and doc["base"] == prev.doc["base"]:
            assert old is not None
            attrs, base, objects = old.attrs, prev.base, old.objects
        else:
            prefix = "" if doc is None else doc["base"]["prefix"]
            shared: dict[str, Any] = {} if prefix or prev is not None else {
                "client": client, "meta": here}
            attrs, base, objects = open_remote_source(f"{url}/{prefix}" if prefix else url,
                                                      "r", **remote, **shared)
        if doc is None:
            doc = initial(attrs, base.shape[0], base.shape[1], base.storage_dtype)
        else:
            _check_base(doc, attrs, base, client.where(manifest_name(n)))
        deltas.load(client, doc["deltas"], base.shape[1], doc["dtype"])
        merged = deltas.merged(doc, base.shape[1], doc["dtype"])
        deltas.keep(doc)
    except BaseException:
        if prev is None:
            client.close()
        raise
    return _version(doc, _source(base, doc, merged, client), attrs, objects)


def _source(base, doc: dict, merged: tuple, client) -> ObjectVersionSource:
    """The rows of version ``doc``: ``base`` with the deltas ``merged`` (ids, codes[, side])."""
    return ObjectVersionSource(base, doc, merged[0], merged[1], client,
                               merged[2] if len(merged) > 2 else None)


def _first_reads(client: ObjectClient, want: int | None):
    """``(newest version number, or version want's manifest; the URL's metadata)``, the
    three requests in flight together (the metadata None if the URL holds no table: a base
    elsewhere may still be named by the manifest; if not, opening it says what is wrong)."""
    first = (lambda: newest_version(client)) if want is None else (
        lambda: need_manifest(client, want) if want > 0 else None)
    got = client.map(lambda job: job(), [first] + [
        lambda rel=rel: client.get(rel) for rel in META])
    try:
        here = parse_remote_meta(client, got[1], got[2])
    except (FormatError, CorruptStoreError):
        here = None
    return got[0], here


def _version(doc: dict, source: ObjectVersionSource, attrs: dict, objects: Any) -> Version:
    return Version(root=None, number=doc["version"], source=source, attrs=attrs,
                   has_keys=bool(attrs.get("has_keys")), objects=objects,
                   commit=doc["write_id"], versioned=True)


def _writable(src: ObjectVersionSource, kind: str, keys, vocab) -> None:
    url = src.client.url
    if keys is not None and not isinstance(vocab, (DiskVocab, SegmentedVocab)):
        raise ReadOnlyError(f"{url}: appending keys needs embstore's key index (this table's "
                            "keys were written by another tool)")


def object_vocab(v: Version, deltas: DeltaCache):
    """The key index of version ``v``: its base's, with the version's key deltas."""
    src = v.source
    assert isinstance(src, ObjectVersionSource)
    b = src.doc["base"]
    at = (b["prefix"], b.get("write_id"), b["rows"])
    if at not in deltas.base_vocab:  # (a base's key index never changes: opened once, not
        deltas.base_vocab = {at: v.objects.vocab(b["rows"])}  # on each version's commit)
    base = deltas.base_vocab[at]
    segs = [deltas.segment(src.client, e) for e in key_entries(src.doc)]
    if base is not None and not segs and src.rows != len(base):
        raise CorruptStoreError(f"{src.client.where(manifest_name(src.doc['version']))}: "
                                f"{src.rows - len(base)} rows appended without their keys: "
                                "the manifest is damaged", path=src.client.url)
    if base is None or not segs:
        return base
    if not isinstance(base, DiskVocab):
        raise CorruptStoreError(f"{src.client.url}: key deltas on keys another tool wrote",
                                path=src.client.url)
    return SegmentedVocab(base, segs)


def _key_object(client, w: str, kind: str, enc, h: np.ndarray, first: int,
                merged: list[str] | None = None) -> tuple[dict, bytes, KeySegment]:
    """The key delta object of the keys ``enc`` (hashes ``h``): its manifest entry, bytes
    and segment (``merged``: the key deltas a merge replaces)."""
    data = key_delta_bytes(enc, h)
    name = data_name(w, "keys")
    entry = {"object": name, "array": "keys", "kind": kind, "first_row": first,
             "rows": len(enc), "bytes": len(data)}
    if merged is not None:
        entry["merged"] = merged
    return entry, data, key_segment(enc, h, client.where(name))


def _key_objects(src: ObjectVersionSource, w: str, vocab, keys: list[str],
                 deltas: DeltaCache) -> tuple[list[tuple[dict, bytes, KeySegment]], Any]:
    """The key delta of an append of ``keys`` (checked new) and a merge of the parent's
    newest key deltas (docs/FORMAT.md §11a, *Merged key deltas*; none when fewer than two
    fit :func:`~.merging.plan_keys`), and the encoded keys with their hashes (for conflict
    checks)."""
    enc, h = encoded_new_keys(vocab, keys, src.rows)
    refuse_existing(vocab.probe_hashed(enc, h), keys)
    own = _key_object(src.client, w, "append", enc, h, 0)
    out = [own]
    group = plan_keys(src.doc, own[0]["bytes"])
    if group:
        menc, mh = merged_keys([deltas.segment(src.client, e) for e in group])
        out.append(_key_object(src.client, new_write_id(), "merge", menc, mh,
                               group[0]["first_row"], [e["object"] for e in group]))
    return out, (enc, h)


def _encode(src: ObjectVersionSource, values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The stored values of rows ``values`` (finite, checked by the table): codes and side
    rows of a bfloat16 or int8 table; a row that rounds to infinity (bfloat16) is refused."""
    rec = src.record
    codes, side = rec.encode(np.ascontiguousarray(values, dtype=src.dtype))
    ok = rec.finite(codes)
    if ok is not None and not ok.all():
        i = int(np.argmin(ok))
        err = ShapeMismatchError(f"{src.client.url}: vector {i} of this write holds values "
                                 f"past the range of {rec.name} (it rounds to infinity): "
                                 "nothing was committed")
        err.row = i
        raise err
    return np.ascontiguousarray(codes), side


def _delta_objects(w: str, kind: str, rel: np.ndarray, arrays: dict, merged=None
                   ) -> list[tuple[dict, bytes, np.ndarray, np.ndarray]]:
    """One delta object per row array (``arrays``: name -> stored rows of ids ``rel``):
    its manifest entry, bytes, ids and rows (``merged``: per array, the objects a merge
    replaces)."""
    out = []
    for k, (array, vals) in enumerate(arrays.items()):  # a loop per row array
        data = delta_bytes(rel, vals, array)
        entry = {"object": data_name(w, array), "array": array, "kind": kind,
                 "first_row": 0, "rows": int(rel.size), "bytes": len(data)}
        if merged is not None:
            entry["merged"] = merged[k]
        out.append((entry, data, rel, vals))
    return out


def _merge_objects(src: ObjectVersionSource, own_bytes: int, deltas: DeltaCache
                   ) -> list[tuple[dict, bytes, np.ndarray, np.ndarray]]:
    """The merge of the parent's newest deltas this commit uploads (docs/FORMAT.md §11a,
    *Merged deltas*; :func:`~.merging.plan`), or none."""
    specs = array_specs(src.shape[1], src.doc["dtype"])
    groups = plan(src.doc, own_bytes, specs)
    if not groups:
        return []
    out = merge(deltas.parts(groups), list(specs.values()))
    return _delta_objects(new_write_id(), "merge", out[0], dict(zip(specs, out[1:])),
                          [[g[k]["object"] for g in groups] for k in range(len(specs))])


def _upload(client, objects: list[tuple], deltas: DeltaCache) -> None:
    """Upload ``objects`` (``(entry, bytes, ids, rows)`` of row deltas, ``(entry, bytes,
    segment)`` of key deltas) together (new names: no reader reads them before the
    commit); their rows and keys stay in the handle's delta cache."""
    client.map(lambda job: put_data(client, job[0]["object"], job[1]), objects)
    for entry, _, *part in objects:
        if entry["array"] == "keys":
            deltas.put_keys(entry, part[0])
        else:
            deltas.put(entry, part[0], part[1])


def commit_rows(v: Version, kind: str, ids: np.ndarray | None, values: np.ndarray,
                keys: list[str] | None, deltas: DeltaCache, vocab=None):
    """Commit a ``write`` of rows ``ids`` (sorted, unique) or an ``append`` of ``values``
    on version ``v``: one delta object per row array (the stored values: bfloat16 or int8
    codes, int8's row scales beside them) and a merge of the parent's newest deltas, then
    the manifest (rebased on races).  Returns the committed version and the first appended
    row (an append; else -1); or, when it was rebased onto a compaction (another base),
    ``(None, (first row, version number))``: open that version (:func:`open_version`)."""
    src = v.source
    assert isinstance(src, ObjectVersionSource)
    _writable(src, kind, keys, vocab)
    codes, side = _encode(src, values)
    n = int(codes.shape[0])
    rel = np.arange(n, dtype=np.int64) if kind == "append" else ids
    assert rel is not None
    w = new_write_id()
    arrays = {"vectors": codes}
    if side is not None:
        assert src.record.side is not None
        arrays[src.record.side.name] = side
    client = src.client
    own = _delta_objects(w, kind, rel, arrays)
    merged = _merge_objects(src, sum(len(job[1]) for job in own), deltas)
    keyed, coded = _key_objects(src, w, vocab, keys, deltas) if keys is not None else ([], None)
    _upload(client, own + merged + keyed, deltas)
    dim, dt = src.shape[1], src.doc["dtype"]
    entries = [job[0] for job in own] + [job[0] for job in keyed[:1]]
    change = Change(kind, w, entries, ids=ids if kind == "write" else None,
                    appended=n if kind == "append" else 0,
                    summary={"kind": kind, "rows": n, **({"keys": keys is not None}
                                                          if kind == "append" else {})},
                    merge=[job[0] for job in merged], keys=keys, coded=coded,
                    key_merge=[job[0] for job in keyed[1:]])
    doc = commit(client, src.doc, change, lambda e: deltas.ids_of(client, e, dim, dt),
                 lambda e: deltas.segment(client, e))
    assert doc is not None  # (only a compaction may come back empty)
    mine = next(e for e in doc["deltas"] if e["object"] == entries[0]["object"])
    first = mine["first_row"] if kind == "append" else -1
    if doc["base"] != src.doc["base"]:
        return None, (first, doc["version"])
    deltas.load(client, doc["deltas"], dim, dt)  # (the winners' it rebased onto)
    deltas.keep(doc)
    new = _version(doc, _source(src.base, doc, deltas.merged(doc, dim, dt), client),
                   v.attrs, v.objects)
    return new, first


def object_log(url: str, storage_options: dict | None = None) -> list[dict]:
    """One entry per retained version, oldest first, as the local log's: ``version``,
    ``time``, ``rows``, ``change``, ``deltas``."""
    client = ObjectClient(url, storage_options)
    try:
        nums = [n for n, _, _ in list_versions(client)]
        docs = client.map(lambda n: need_manifest(client, n), nums)
        return [{"version": d["version"], "time": d["time"], "rows": d["rows"],
                 "change": d["change"], "deltas": len(d["deltas"]),
                 "write_id": d["write_id"]} for d in docs]
    finally:
        client.close()


def vacuum_objects(client: ObjectClient, keep: int | None = None,
                   cutoff: float | None = None, now: float | None = None) -> list[int]:
    """Delete what no retained version needs (the newest ``keep`` manifests, default 8)
    and is older than ``cutoff`` seconds (default ``VACUUM_CUTOFF``): manifests of other
    versions, deltas and bases of commits that lost or were killed.  Returns the versions
    removed.  Nothing outside the commit area is touched."""
    keep = RETAIN_VERSIONS if keep is None else max(1, int(keep))
    cut = (time.time() if now is None else now) - (VACUUM_CUTOFF if cutoff is None else cutoff)
    found = list_versions(client)
    kept = [n for n, _, _ in found][-keep:]
    docs = client.map(lambda n: need_manifest(client, n), kept)
    needed = {manifest_name(n) for n in kept} | {HINT}
    needed |= {e["object"] for d in docs for e in d["deltas"]}
    bases = tuple({d["base"]["prefix"] + "/" for d in docs if d["base"]["prefix"]})
    doomed = [rel for rel, _, mtime in client.list_after(AREA)
              if mtime < cut and rel not in needed and not rel.startswith(bases)]
    client.delete(doomed)
    gone = set(doomed)
    return [n for n, _, _ in found if manifest_name(n) in gone]

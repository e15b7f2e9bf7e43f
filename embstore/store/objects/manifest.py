"""The commit area of a table on object storage: object names, manifests, deltas
(docs/FORMAT.md §11a).

Version ``N``'s manifest is ``vectors/.embstore/commits/v<N, 20 digits>.json``: zero-padded,
so name order is version order and one LIST starting after the hint's name finds the
newest.  Deltas are the local delta files (§6c) of the stored values (codes for bfloat16 and
int8 tables, and int8's ``row_scale`` beside them), uploaded as
``commits/data/<write id>.<array>``.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ...dtypes import DTYPES, SIDE_ARRAYS
from ...errors import CorruptStoreError
from ..place.objstore import LIST_PAGE, ObjectClient
from ...keys.segments import KeySegment
from ..versions.delta import read_delta, write_delta
from ..versions.keydelta import read_key_delta, write_key_delta
from ..versions.snapshot import VersionNotFoundError, manifest_crc

__all__ = ["AREA", "HINT", "manifest_name", "data_name", "new_write_id", "encode",
           "read_manifest", "need_manifest", "newest_version", "list_versions", "initial", "DeltaCache",
           "delta_bytes", "key_delta_bytes", "key_segment", "rows_entries", "key_entries", "array_specs",
           "commit_groups", "merge"]

AREA = "vectors/.embstore/commits/"
HINT = AREA + "latest.json"
_VNAME = re.compile(r"^vectors/\.embstore/commits/v([0-9]{20})\.json$")
_DATA = re.compile(r"^vectors/\.embstore/commits/data/[0-9a-f]{32}\.[A-Za-z0-9_]+$")
_BASE = re.compile(r"^vectors/\.embstore/commits/base-[0-9a-f]{32}$")
_KINDS = ("write", "append", "merge")
#: (array, kind) of a delta entry: rows of ``vectors`` or of a side array (int8's row scales)
#: written, appended or merged; keys appended or merged
_ENTRIES = {(a, k) for a in ("vectors",) + SIDE_ARRAYS for k in _KINDS} | {
    ("keys", "append"), ("keys", "merge")}


def manifest_name(n: int) -> str:
    return f"{AREA}v{n:020d}.json"


def data_name(write_id: str, array: str) -> str:
    return f"{AREA}data/{write_id}.{array}"


def new_write_id() -> str:
    return secrets.token_hex(16)


def encode(doc: dict) -> bytes:
    """The manifest ``doc`` with its crc32c, as stored."""
    body = {k: v for k, v in doc.items() if k != "crc32c"}
    return json.dumps({**body, "crc32c": manifest_crc(body)}, sort_keys=True).encode()


def initial(attrs: dict, rows: int, dim: int, dtype: str) -> dict:
    """Version 0: the published view (the table as uploaded), without deltas (``dtype``:
    the storage dtype)."""
    return {"embstore_objects": 1, "version": 0, "parent": None, "write_id": None,
            "base": {"prefix": "", "write_id": attrs.get("write_id"), "rows": rows},
            "rows": rows, "dim": dim, "dtype": dtype, "change": {"kind": "save"}, "deltas": []}


def _check(doc, n: int, where: str) -> dict:
    def bad(why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{where}: {why}: the manifest is damaged", path=where)
    if not isinstance(doc, dict) or doc.get("embstore_objects") != 1:
        raise bad("not a manifest of a table on object storage")
    if doc.get("crc32c") != manifest_crc(doc):
        raise bad("crc32c mismatch")
    if doc.get("version") != n or type(doc.get("rows")) is not int:
        raise bad(f"version {doc.get('version')!r} in the object of version {n}")
    base, deltas = doc.get("base"), doc.get("deltas")
    if not (isinstance(base, dict) and type(base.get("rows")) is int
            and 0 <= base["rows"] <= doc["rows"]
            and (base.get("prefix") == "" or _BASE.match(str(base.get("prefix"))))):
        raise bad(f"base {base!r}")
    if not isinstance(deltas, list) or not isinstance(doc.get("write_id"), str):
        raise bad("deltas or write_id")
    for e in deltas:
        if not (isinstance(e, dict) and _DATA.match(str(e.get("object")))
                and e.get("kind") in _KINDS and type(e.get("first_row")) is int
                and (e.get("array"), e["kind"]) in _ENTRIES
                and type(e.get("rows")) is int and type(e.get("bytes")) is int
                and 0 <= e["first_row"] and 0 <= e["rows"]
                and e["first_row"] + (e["rows"] if _placed(e) else 0) <= doc["rows"]
                and (e["kind"] != "merge" or _merged_ok(e))):
            raise bad(f"delta entry {e!r}")
    gap = _key_gap(doc)
    if gap is not None:
        raise bad(gap)
    return doc


def _key_gap(doc: dict) -> str | None:
    """Why the key entries of ``doc`` (if any) do not cover its rows from its base's on,
    one after another in manifest order (None: they do)."""
    at = doc["base"]["rows"]
    keys = [e for e in doc["deltas"] if e["array"] == "keys"]
    for e in keys:  # a loop per key delta (a few: merges keep them few)
        if e["first_row"] != at:
            return f"key delta {e['object']} from row {e['first_row']}, expected {at}"
        at += e["rows"]
    if keys and at != doc["rows"]:
        return f"key deltas up to row {at}, the version has {doc['rows']} rows"
    return None


def _placed(e: dict) -> bool:
    """Whether entry ``e``'s ids are ``0 .. rows-1`` placed at ``first_row`` (appends, key
    deltas), not rows of the version (writes, merges of rows)."""
    return e["kind"] == "append" or e["array"] == "keys"


def _merged_ok(e: dict) -> bool:
    """A merge entry's own fields: ``first_row`` 0 (a merge of rows: its ids are rows of
    the version) and ``merged`` the names of two or more delta objects it replaces."""
    names = e.get("merged")
    return ((e["first_row"] == 0 or e["array"] == "keys") and isinstance(names, list)
            and len(names) >= 2 and all(isinstance(x, str) and _DATA.match(x) for x in names))


def read_manifest(client: ObjectClient, n: int) -> dict | None:
    """Version ``n``'s manifest, checked; None if there is none."""
    rel = manifest_name(n)
    raw = client.get(rel)
    if raw is None:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorruptStoreError(f"{client.where(rel)}: broken JSON ({exc}): the manifest is "
                                "damaged", path=client.where(rel)) from None
    return _check(doc, n, client.where(rel))


def list_versions(client: ObjectClient, after: int = 0, *,
                  pages: int | None = None) -> list[tuple[int, int, float]]:
    """``(version, size, last-modified)`` of every manifest after version ``after``."""
    out = []
    for rel, size, mtime in client.list_after(AREA, manifest_name(after) if after > 0
                                              else AREA + "v", pages=pages):
        m = _VNAME.match(rel)
        if m:
            out.append((int(m.group(1)), size, mtime))
    return out


def newest_version(client: ObjectClient) -> int:
    """The newest version's number (0: none).  One LIST of the manifests (names after
    ``v``: the commit area's data and bases sort before them) when they fit one page, as
    they do between vacuums; else the hint, then a LIST after its name."""
    first = list_versions(client, pages=1)
    if len(first) < LIST_PAGE:
        return max((n for n, _, _ in first), default=0)
    hint = 0
    try:
        raw = client.get(HINT)
        if raw is not None:
            doc = json.loads(raw.decode("utf-8"))
            if type(doc.get("version")) is int and doc["version"] > 0:
                hint = doc["version"]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        hint = 0  # (a damaged hint only costs a longer listing)
    found = list_versions(client, max(0, hint - 1))
    if found:
        return max(n for n, _, _ in found)
    # the hint names a version that is gone (a table replaced by an upload): list them all
    return max((n for n, _, _ in list_versions(client)), default=0)


def need_manifest(client: ObjectClient, n: int) -> dict:
    doc = read_manifest(client, n)
    if doc is None:
        kept = [v for v, _, _ in list_versions(client)]
        raise VersionNotFoundError(f"{client.url}: no version {n} (the table holds versions "
                                   f"{kept or 'none'}; `embstore log` lists them)")
    return doc


def delta_bytes(ids: np.ndarray, values: np.ndarray, array: str = "vectors") -> bytes:
    """A delta file (§6c) of rows ``ids`` (sorted, unique) as bytes."""
    with tempfile.TemporaryDirectory(prefix="embstore-delta-") as d:
        path = Path(d) / "delta"
        write_delta(path, array, ids, values)
        return path.read_bytes()


def rows_entries(doc: dict) -> list[dict]:
    return [e for e in doc["deltas"] if e["array"] == "vectors"]


def key_entries(doc: dict) -> list[dict]:
    return [e for e in doc["deltas"] if e["array"] == "keys"]


def key_delta_bytes(enc, hashes: np.ndarray) -> bytes:
    """A key delta file (§6d) of the keys ``enc`` as rows ``0..`` (the manifest's
    ``first_row`` places them: a rebased append moves them without a new upload)."""
    with tempfile.TemporaryDirectory(prefix="embstore-delta-") as d:
        path = Path(d) / "keys"
        write_key_delta(path, 0, enc, hashes, fsync=False)
        return path.read_bytes()


def key_segment(enc, hashes: np.ndarray, where: str) -> KeySegment:
    """The segment a reader reads from :func:`key_delta_bytes` ``(enc, hashes)``: rows
    ``0..`` (a writer keeps it for the key delta it uploads instead of reading it back)."""
    order = np.argsort(hashes, kind="stable").astype(np.int64)
    offsets = np.zeros(len(enc) + 1, np.int64)
    np.cumsum(enc.lengths, out=offsets[1:])
    nb = int(offsets[-1])
    utf8 = np.zeros(nb + 8 + (-(nb + 8) % 8), np.uint8)
    utf8[:nb] = enc.buf[:nb]
    return KeySegment(0, hashes[order].astype(np.uint64), order, offsets, utf8, where)


def merge(parts: list[tuple[np.ndarray, ...]], specs: list[tuple[int, np.dtype]]
          ) -> tuple[np.ndarray, ...]:
    """One sorted ``(ids, values, ...)`` of deltas given oldest first (the newest row of an
    id wins); each part is ``(ids, values of each array)``, ``specs`` the arrays' columns and
    dtypes (the rows of an empty merge)."""
    if not parts:
        return (np.empty(0, np.int64),) + tuple(np.empty((0, c), d) for c, d in specs)
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate([p[0] for p in parts])
    uniq, last = np.unique(ids[::-1], return_index=True)  # the last (newest) occurrence wins
    return (uniq,) + tuple(np.concatenate([p[k] for p in parts])[::-1][last]
                           for k in range(1, len(specs) + 1))


def array_specs(dim: int, dtype: str) -> dict[str, tuple[int, np.dtype]]:
    """The row arrays a delta of a table of storage dtype ``dtype`` changes, with their
    columns and stored dtypes: ``vectors`` (codes for bfloat16 and int8), then the side
    array (int8's ``row_scale``)."""
    rec = DTYPES[dtype]
    out = {"vectors": (dim, rec.code)}
    if rec.side is not None:
        out[rec.side.name] = (rec.side.columns, np.dtype(rec.side.dtype))
    return out


def commit_groups(doc: dict, specs: dict) -> list[list[dict]]:
    """The row deltas of version ``doc`` oldest first, one group per commit (or merge): its
    ``vectors`` entry, then its side arrays' entries (``specs``: :func:`array_specs`)."""
    rows = rows_entries(doc)
    sides = [side_entries(doc, name) for name in list(specs)[1:]]
    return [[e] + [s[k] for s in sides] for k, e in enumerate(rows)]


def side_entries(doc: dict, side: str) -> list[dict]:
    """The deltas of side array ``side``, one beside each ``vectors`` delta (damage else)."""
    rows, sides = rows_entries(doc), [e for e in doc["deltas"] if e["array"] == side]
    if [(e["kind"], e["first_row"], e["rows"]) for e in rows] != \
            [(e["kind"], e["first_row"], e["rows"]) for e in sides]:
        raise CorruptStoreError(f"version {doc['version']}: the {side} deltas do not match "
                                "the vectors deltas one for one: the manifest is damaged")
    return sides


class DeltaCache:
    """The deltas a handle has read, by object name (objects never change): a commit or a
    refresh reads only the new ones."""

    def __init__(self) -> None:
        self.parts_of: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.keys: dict[str, KeySegment] = {}  # (rows 0..: placed by first_row)
        self.base_vocab: dict[tuple, Any] = {}  # the key index of the base last read

    def segment(self, client: ObjectClient, e: dict) -> KeySegment:
        """The keys of the key delta ``e`` as rows of its version."""
        if e["object"] not in self.keys:
            where = client.where(e["object"])
            raw = client.get(e["object"])
            if raw is None or len(raw) != e["bytes"]:
                raise CorruptStoreError(f"{where}: {'missing' if raw is None else len(raw)} "
                                        f"(the manifest says {e['bytes']} bytes): a key delta "
                                        "of this version is damaged or was vacuumed",
                                        path=where)
            with tempfile.TemporaryDirectory(prefix="embstore-delta-") as d:
                path = Path(d) / "keys"
                path.write_bytes(raw)
                try:
                    seg = read_key_delta(path)
                except CorruptStoreError as exc:
                    raise CorruptStoreError(str(exc).replace(str(path), where),
                                            path=where) from None
            if seg.first != 0 or seg.n != e["rows"]:
                raise CorruptStoreError(f"{where}: {seg.n} keys from row {seg.first}, the "
                                        f"manifest says {e['rows']} from 0: damaged", path=where)
            self.keys[e["object"]] = seg
        seg = self.keys[e["object"]]
        f = e["first_row"]
        return KeySegment(f, seg.hashes, seg.rows + f, seg.offsets, seg.utf8, seg.where)

    def put(self, entry: dict, ids: np.ndarray, values: np.ndarray) -> None:
        self.parts_of[entry["object"]] = (ids, values)

    def put_keys(self, entry: dict, seg: KeySegment) -> None:
        """The keys of the key delta ``entry`` a writer uploaded (rows ``0..``)."""
        self.keys[entry["object"]] = seg

    def ids_of(self, client: ObjectClient, entry: dict, dim: int, dtype) -> np.ndarray:
        self.load(client, [entry], dim, dtype)
        return self.parts_of[entry["object"]][0] + entry["first_row"]

    def load(self, client: ObjectClient, entries: list[dict], dim: int, dtype: str) -> None:
        """Read the row deltas among ``entries`` not read yet (concurrently), checked;
        ``dtype`` is the table's storage dtype (:func:`array_specs`)."""
        specs = array_specs(dim, dtype)
        todo = [e for e in entries if e["object"] not in self.parts_of and e["array"] in specs]

        def fetch(e: dict) -> tuple[np.ndarray, np.ndarray]:
            raw = client.get(e["object"])
            where = client.where(e["object"])
            if raw is None or len(raw) != e["bytes"]:
                raise CorruptStoreError(f"{where}: {'missing' if raw is None else len(raw)} "
                                        f"(the manifest says {e['bytes']} bytes): a delta of "
                                        "this version is damaged or was vacuumed under this "
                                        "reader (reopen it)", path=where)
            cols, dt = specs[e["array"]]
            with tempfile.TemporaryDirectory(prefix="embstore-delta-") as d:
                path = Path(d) / "delta"
                path.write_bytes(raw)
                try:
                    ids, vals = read_delta(path, e["array"], cols, dt, e["rows"]
                                           if e["kind"] == "append" else 1 << 62)
                except CorruptStoreError as exc:
                    raise CorruptStoreError(str(exc).replace(str(path), where),
                                            path=where) from None
            if e["kind"] == "append" and not np.array_equal(ids, np.arange(e["rows"])):
                raise CorruptStoreError(f"{where}: an append's ids must be 0..{e['rows'] - 1}"
                                        ": the delta is damaged", path=where)
            return ids, vals
        for e, part in zip(todo, client.map(fetch, todo)):
            self.parts_of[e["object"]] = part

    def parts(self, groups: list[list[dict]]) -> list[tuple[np.ndarray, ...]]:
        """``(ids as rows of the version, values[, side rows])`` of each group of
        :func:`commit_groups` (read already: :meth:`load`), oldest first."""
        parts = []
        for group in groups:  # a loop per delta of the version
            e = group[0]
            ids, vals = self.parts_of[e["object"]]
            part = [ids + e["first_row"] if e["first_row"] else ids, vals]
            for s in group[1:]:
                sids, svals = self.parts_of[s["object"]]
                if not np.array_equal(sids, ids):
                    raise CorruptStoreError(f"{s['object']}: its ids are not those of "
                                            f"{e['object']}: the delta is damaged")
                part.append(svals)
            parts.append(tuple(part))
        return parts

    def merged(self, doc: dict, dim: int, dtype: str) -> tuple[np.ndarray, ...]:
        """``(ids, values[, side])`` of version ``doc``'s deltas, newest row of an id
        winning: ``values`` as stored (codes), ``side`` the side array's rows (int8's row
        scales) for the same ids."""
        specs = array_specs(dim, dtype)
        out = merge(self.parts(commit_groups(doc, specs)), list(specs.values()))
        ids, b = out[0], doc["base"]["rows"]
        if ids.size and ids[-1] >= doc["rows"]:
            raise CorruptStoreError(f"version {doc['version']}: a delta row {int(ids[-1])} "
                                    f"past its {doc['rows']} rows: the manifest is damaged")
        past = ids.size - int(np.searchsorted(ids, b))
        if past != doc["rows"] - b:
            raise CorruptStoreError(f"version {doc['version']}: {past} rows past its base's "
                                    f"{b} in its deltas, {doc['rows'] - b} appended: the "
                                    "manifest is damaged")
        return out

    def keep(self, doc: dict) -> None:
        """Forget the deltas version ``doc`` does not name (a handle reads one version: an
        object merged away or compacted is not read again)."""
        named = {e["object"] for e in doc["deltas"]}
        for name in [n for n in self.parts_of if n not in named]:
            del self.parts_of[name]
        for name in [n for n in self.keys if n not in named]:
            del self.keys[name]

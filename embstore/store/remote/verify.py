"""``embstore.verify(url)``: check every stored byte of a table on object storage.

As :func:`embstore.store.verify.verify` does for a local table, with the same report:

- ``vectors`` (and ``row_scale``): every shard's index (one suffix GET, its crc32c), then
  every stored chunk, fetched by ranges of at most 8 MiB, a few at a time (memory stays
  bounded whatever the table's size), its crc32c checked and compressed chunks decoded;
- every other object (``keys``, the key index, its block sidecars) downloaded to a
  temporary folder, then the deep check of the key index (sorted hashes, permutation,
  hashes recomputed from the key bytes, ``keys`` equal to the stored bytes) and each block
  sidecar recomputed from its chunk file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..._types import PathLike
from ...errors import CorruptStoreError, FormatError, NotATableError
from .ranged import block_sidecar, sidecar_name
from ...keys.writer import INDEX_ARRAYS
from ..codecs import Layout, check_chunk
from ..rows.layout import RowLayout, crc_array
from ..rows.pages import decode_crc_file, page_crcs
from .objstore import ObjectClient, is_url
from ..objects.check import check_versions
from ...dtypes import SIDE_ARRAYS
from .source import RemoteShardSource, _regions
from .keys import download_key_arrays
from .open import read_remote_meta
from ..verify import VerifyReport, _deep_check_keys, _read_all, checksummed
from ..verify import verify as verify_local

__all__ = ["verify", "verify_remote"]

_REQUEST = 8 << 20  # bytes per request
_WINDOW = 4  # requests in flight: at most 32 MiB of a shard held at once


def verify(path: PathLike, *, storage_options: dict | None = None) -> VerifyReport:
    """Check every chunk of the table at ``path`` (a folder, or a URL such as
    ``s3://bucket/t.emb`` with ``storage_options``); never raises for damage, reports it.

    A path that is no table at all raises :class:`~embstore.errors.NotATableError`."""
    if is_url(path):
        return verify_remote(str(path), storage_options=storage_options)
    if storage_options:
        raise TypeError("storage_options: an option of tables on object storage, got the "
                        f"local path {os.fspath(path)!r}")
    return verify_local(path)


def verify_remote(url: str, *, storage_options: dict | None = None) -> VerifyReport:
    url = url.rstrip("/")
    report = VerifyReport(url)
    client = ObjectClient(url, storage_options)
    try:
        if client.get("zarr.json") is None:  # (a GET: a HEAD cannot tell a missing bucket)
            raise NotATableError("not an embstore table: the group's zarr.json is missing",
                                 path=url)
        try:
            attrs, meta, _ = read_remote_meta(client)
        except (FormatError, CorruptStoreError) as exc:
            report.add(url, None, str(exc))
            return report
        _check_rows(client, meta, report)
        _check_rest(client, attrs, report)
        versions, bases = check_versions(client, report.add)  # (§11a)
        report.arrays += [f"manifest {n}" for n in versions]  # (and their deltas)
        for prefix in sorted(bases):  # the compacted bases of retained versions: tables
            base = ObjectClient(f"{url}/{prefix}", storage_options)
            try:
                battrs, bmeta, _ = read_remote_meta(base)
                _check_rows(base, bmeta, report)
                _check_rest(base, battrs, report)
            except (FormatError, CorruptStoreError) as exc:
                report.add(base.url, None, str(exc))
            finally:
                base.close()
    finally:
        client.close()
    if report.unchecked:
        report.ok = False
    return report


def _check_rows(client: ObjectClient, meta: dict, report: VerifyReport) -> None:
    for name in ("vectors", *SIDE_ARRAYS):
        if name == "vectors":
            m: dict | None = meta
        else:
            raw = client.get(f"{name}/zarr.json")
            m = None if raw is None else _json(raw)
        if m is None:
            continue
        rows = RowLayout.from_metadata(m)
        if rows is not None and client.get(f"{crc_array(name)}/zarr.json") is not None:
            _check_pages(client, rows, report, name)  # format 2
            continue
        layout = Layout.from_metadata(m)
        if layout is None:
            report.add(client.where(name), None, f"{client.where(name)}: not in the sharded "
                       "layout of format v1; copy the table to a local folder to verify it")
            continue
        src = RemoteShardSource(client, layout, name=name)
        checked = 0
        for k in range(layout.n_shards):  # a loop per shard: bounded memory
            checked += _check_shard(src, k, report)
        if name == "vectors":
            report.vocab_size, report.shards = layout.rows, layout.n_shards
            if layout.has_crc:
                report.chunks = checked
            else:
                report.unchecked = checked
        else:
            report.arrays.append(name)
            if not layout.has_crc:
                report.unchecked_arrays.append(name)


def _check_pages(client: ObjectClient, L: RowLayout, report: VerifyReport,
                 name: str = "vectors") -> None:
    """Every committed page of every chunk of a format-2 row array against its page
    checksums (a chunk's committed bytes in one ranged GET; the chunks side by side)."""
    def one(k: int) -> list[tuple[str, str]]:
        key = L.chunk_key(k).replace(L.separator, "/")
        obj, crc_obj = f"{name}/{key}", f"{crc_array(name)}/{key}"
        raw = client.get(crc_obj)
        if raw is None:
            return [(client.where(crc_obj), f"{client.where(crc_obj)}: missing (the page "
                                            f"checksums of chunk {k})")]
        try:
            stored = decode_crc_file(raw, L.pages_per_chunk, client.where(crc_obj))
        except CorruptStoreError as exc:
            return [(client.where(crc_obj), str(exc))]
        end = L.chunk_end(k)
        data = client.get_range(obj, 0, end) if end else b""
        if data is None or len(data) != end:
            return [(client.where(obj), f"{client.where(obj)}: missing or short (chunk {k} "
                                        "of the rows)")]
        got = page_crcs(data, end, L.pages_per_chunk)
        bad = np.flatnonzero(got != stored)
        if bad.size:
            return [(client.where(obj), f"{client.where(obj)}: crc32c mismatch in "
                     f"{bad.size} of its pages ({int(bad[0])} first): the stored rows are "
                     "damaged")]
        return []
    for problems in client.map(one, list(range(L.n_chunks))):  # (bounded by the pool)
        for where, message in problems:
            report.add(where, None, message)
    if name == "vectors":
        report.vocab_size, report.shards, report.chunks = L.rows, L.n_chunks, L.n_chunks
    else:
        report.arrays.append(name)


def _json(raw: bytes) -> dict | None:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _check_shard(src: RemoteShardSource, k: int, report: VerifyReport) -> int:
    """Check shard ``k``'s index and chunks; returns the chunks checked."""
    L, client = src._layout, src.client
    where = client.where(src.shard_object(k))
    try:
        off, nb = src._load_index(k)
    except CorruptStoreError as exc:
        report.add(where, None, str(exc))
        return 0
    present = np.flatnonzero(off >= 0)
    if present.size == 0:
        return 0
    order = present[np.argsort(off[present], kind="stable")]
    regions = _regions(np.zeros(order.size, np.int64), off[order], nb[order], 1 << 16,
                       max(_REQUEST, L.chunk_bytes + 4))

    def fetch(region: tuple[int, int]) -> list[tuple[int, str]]:
        lo, hi = region
        js = order[lo:hi]
        start, stop = int(off[js[0]]), int(off[js[-1]] + nb[js[-1]])
        buf = memoryview(client.get_range(src.shard_object(k), start, stop)).cast("B")
        bad = []
        for i in js.tolist():  # a loop per chunk
            at = f"shard {where}, chunk {i}"
            a = int(off[i]) - start
            raw = buf[a: a + int(nb[i])]
            try:
                if len(raw) != int(nb[i]):
                    raise CorruptStoreError(f"{at}: truncated ({len(raw)} of {int(nb[i])} "
                                            "bytes)", path=where)
                payload = check_chunk(raw, at) if L.has_crc else raw
                if src.codec is not None:
                    size = memoryview(src.codec.decode(payload)).nbytes
                    if size != L.chunk_bytes:
                        raise ValueError(f"{size} bytes, expected {L.chunk_bytes}")
            except CorruptStoreError as exc:
                bad.append((i, str(exc)))
            except Exception as exc:  # noqa: BLE001 - a codec's own error type
                bad.append((i, f"{at}: cannot decode ({exc})"))
        return bad

    for w in range(0, len(regions), _WINDOW):  # a window of requests at a time
        for bad in client.map(fetch, regions[w: w + _WINDOW]):
            for i, message in bad:
                report.add(where, i, message)
    return int(present.size)


def _check_rest(client: ObjectClient, attrs: dict, report: VerifyReport) -> None:
    """Every object but the row arrays, downloaded and checked as a local table's."""
    root = download_key_arrays(client, None)  # a temporary folder
    try:
        start = len(report.damaged)
        names = sorted(p.name for p in root.iterdir() if (p / "zarr.json").is_file()
                       and p.name not in ("vectors", *SIDE_ARRAYS))
        deep = "keys" in names and all(n in names for n in INDEX_ARRAYS)
        if attrs.get("has_keys") and "keys" not in names:
            report.add(client.where("keys"), None, f"{client.where('keys')}: missing (the "
                       "table has_keys)")
        import zarr

        for name in names:
            if deep and name in INDEX_ARRAYS:
                continue
            try:
                arr = zarr.open_array(str(root / name), mode="r")
            except Exception as exc:  # noqa: BLE001 - any zarr failure is damage to report
                report.add(client.where(name), None, f"{client.where(name)}: zarr cannot "
                           f"open the array ({type(exc).__name__}: {exc})")
                continue
            _read_all(arr, name, report)
            if not checksummed(_json((root / name / "zarr.json").read_bytes()) or {}):
                report.unchecked_arrays.append(name)
        if deep and report.vocab_size is not None:
            _deep_check_keys(root, report)
            _check_sidecars(client, root, report)
        # messages name the objects, not the temporary folder
        for j in range(start, len(report.damaged)):
            d = report.damaged[j]
            report.damaged[j] = type(d)(d.file.replace(str(root), client.url), d.chunk,
                                        d.message.replace(str(root), client.url))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check_sidecars(client: ObjectClient, root: Path, report: VerifyReport) -> None:
    """Each block sidecar equals the one made from its chunk file (none: an older upload)."""
    if not any((root / name / "blocks").is_dir() for name in INDEX_ARRAYS):
        return  # (an upload from before the sidecars)
    for name in INDEX_ARRAYS:
        for f in sorted((root / name / "c").iterdir()) if (root / name / "c").is_dir() else []:
            rel = sidecar_name(name, int(f.name))
            side = root / rel
            if not side.is_file() or side.read_bytes() != block_sidecar(
                    f.read_bytes(), fences=name == "key_hash"):
                report.add(client.where(rel), None, f"{client.where(rel)}: block sidecar "
                           f"{'missing' if not side.is_file() else 'damaged'} (it must "
                           f"match {name}/c/{f.name}; copy the table again to rewrite it)")

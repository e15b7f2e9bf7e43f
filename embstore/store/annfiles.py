"""The approximate index's files in a table (docs/FORMAT.md §10): names, layout, and the
checks made before the index is trusted.

The index (:mod:`embstore.search.ann`, :mod:`embstore.search.ivf`) is four files in
``vectors/.embstore/ann/``; ``meta.json`` records (``checksums``) the size and crc32c of
``index.faiss``, ``lists.ivfdata`` and ``lists.crc32c`` (the crc32c of each list, ``nlist``
little-endian uint32), and its own crc32c (``meta_crc32c``, over its other fields as
canonical JSON).  What is checked when:

- **open** (cheap: ``index.faiss`` is read anyway, a few MB): ``meta.json``'s crc32c;
  ``index.faiss``'s size and crc32c; its layout parsed field by field (:func:`parse_header`,
  before FAISS sees a byte) and compared with ``meta.json`` (dim, metric, nlist, rows) and
  with itself (every list inside the data file); ``lists.ivfdata``'s size against the
  header (a shorter file mapped would raise SIGBUS in the search touching the missing
  pages); ``lists.crc32c``'s size and crc32c.
- **first touch**: a search finds the lists it probes itself, checks each one not checked
  yet against its crc32c, then has FAISS scan exactly those (``search_preassigned``), as
  the table's shards are checked chunk by chunk on first touch.
- **verify**: all of the above, the crc32c of the whole ``lists.ivfdata`` (on a mismatch,
  the lists that fail), and every row id in the lists against the row count.

An index built before the checksums (no ``meta_crc32c``) still opens and searches: its
layout, sizes and returned ids are checked, its bytes cannot be; ``verify`` calls it
*unverified*.  Every id a search returns is bounds-checked by :mod:`embstore.search.ann`.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CorruptStoreError, EmbstoreError
from ..fs.files import map_file, open_regular, read_small
from ..fs import atomic
from ..fs.checksum import crc32c
from .meta import read_table_meta, table_id as _table_id
from .versions.snapshot import newest

__all__ = ["META_CRC", "SUMS", "LIST_SUMS", "INDEX_FILE", "DATA_FILE", "Header", "damaged", "meta_crc",
           "check_meta", "parse_header", "check_header", "check_data_size", "list_sums",
           "read_list_sums", "bad_lists", "bad_ids", "whole_sum", "file_sum", "make_sums", "verify_index",
           "foreign", "index_identity", "retarget"]

META_CRC, SUMS, LIST_SUMS = "meta_crc32c", "checksums", "lists.crc32c"
INDEX_FILE, DATA_FILE = "index.faiss", "lists.ivfdata"
_IVF, _FLAT = b"IwFl", (b"IxFI", b"IxF2")  # IndexIVFFlat; its IndexFlatIP / IndexFlatL2
_HEAD = struct.Struct("<iqqqBiQQ")  # d, ntotal, 2 dummies, is_trained, metric, nlist, nprobe
_QHEAD = struct.Struct("<iqqqBi")
_U64 = struct.Struct("<Q")
METRIC_CODES = {"cos": 0, "ip": 0, "l2": 1}  # FAISS METRIC_INNER_PRODUCT, METRIC_L2
_MAX_NLIST, _MAX_DIM = 1 << 20, 1 << 16
_BLOCK = 16 << 20


def damaged(path, what: str) -> CorruptStoreError:
    """The error of a damaged index file (``path``), saying what is wrong and what to do."""
    return CorruptStoreError(f"{path}: {what} (the approximate index is damaged: rebuild it "
                             "with `embstore index --overwrite`)", path=str(path))


def meta_crc(meta: dict) -> int:
    """The crc32c of ``meta.json``'s fields but its own (canonical JSON: sorted keys, no
    spaces; ``stale`` and ``foreign`` are computed, never stored)."""
    body = {k: v for k, v in meta.items() if k not in (META_CRC, "stale", "foreign")}
    return crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _u32(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32


def check_meta(meta: dict, path: Path) -> dict | None:
    """The recorded checksums of the index whose ``meta.json`` (at ``path``) is ``meta``:
    ``{file: {"bytes", "crc32c"}}``, or None for an index built without them.  Raises
    when ``meta.json`` fails its own crc32c or its checksums are malformed."""
    want = meta.get(META_CRC)
    if want is None:
        return None
    got = meta_crc(meta)
    if got != want:
        raise damaged(path, f"its content has crc32c {got:#010x}, it records "
                            f"{want if not _u32(want) else f'{want:#010x}'}")
    sums = meta.get(SUMS)
    if not (isinstance(sums, dict) and all(
            isinstance(sums.get(name), dict) and _u32(sums[name].get("crc32c"))
            and isinstance(sums[name].get("bytes"), int) and sums[name]["bytes"] >= 0
            for name in ("index.faiss", "lists.ivfdata", LIST_SUMS))):
        raise damaged(path, f"expected checksums of index.faiss, lists.ivfdata and "
                            f"{LIST_SUMS}, got {str(sums)[:200]}")
    return sums


def file_sum(data, name: str, sums: dict | None, path: Path) -> None:
    """``data`` (bytes, or a uint8 array) against its recorded size and crc32c."""
    if sums is None:
        return
    want = sums[name]
    if len(data) != want["bytes"]:
        raise damaged(path, f"{len(data)} bytes, meta.json records {want['bytes']}")
    got = crc32c(data.data if isinstance(data, np.ndarray) else data)
    if got != want["crc32c"]:
        raise damaged(path, f"crc32c {got:#010x}, meta.json records {want['crc32c']:#010x}")


@dataclass
class Header:
    """What ``index.faiss`` says of the index and its lists (``(size, offset)`` per list:
    the list's vectors are at ``offset``, its int64 ids follow, ``code`` bytes a vector)."""

    dim: int
    ntotal: int
    metric: int
    nlist: int
    code: int
    totsize: int
    sizes: np.ndarray
    offsets: np.ndarray
    tail: int  # bytes at the end of the file: the data file's name (length, bytes), totsize

    def span(self, j: int) -> tuple[int, int]:
        """The bytes ``[start, end)`` of list ``j`` in the data file."""
        a = int(self.offsets[j])
        return a, a + int(self.sizes[j]) * (self.code + 8)


def parse_header(raw: bytes, path: Path, data_name: str) -> Header:
    """``index.faiss`` as embstore writes it (an ``IndexIVFFlat`` over a flat quantizer,
    lists ``OnDiskInvertedLists`` in ``data_name``), every field checked before FAISS reads
    the bytes: a hostile file is refused, never allocated from or mapped past its end."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise damaged(path, f"not an index as embstore writes it: {what}")

    need(len(raw) >= 98 and raw[:4] == _IVF, f"expected a FAISS IndexIVFFlat (fourcc "
                                             f"{_IVF.decode()}), got {raw[:4]!r}")
    d, ntotal, _, _, _, metric, nlist, _ = _HEAD.unpack_from(raw, 4)
    need(0 < d <= _MAX_DIM and 0 < nlist <= _MAX_NLIST and ntotal >= 0 and metric in (0, 1),
         f"dim {d}, nlist {nlist}, {ntotal} rows, metric {metric}")
    need(raw[53:57] in _FLAT, f"expected a flat quantizer, got {raw[53:57]!r}")
    qd, qn, _, _, _, qmetric = _QHEAD.unpack_from(raw, 57)
    need((qd, qn, qmetric) == (d, nlist, metric), f"a quantizer of dim {qd} with {qn} "
                                                  f"centroids, metric {qmetric}")
    name = data_name.encode()
    at = 98 + 4 * nlist * d  # the centroids end; the direct map, then the lists
    size = at + 9 + 20 + 8 + 24 * nlist + 8 + 8 + len(name) + 8
    need(len(raw) == size, f"{len(raw)} bytes, expected {size} for {nlist} lists of dim {d}")
    need(_U64.unpack_from(raw, 90)[0] == nlist * d, "the centroids' count")
    need(raw[at:at + 9] == bytes(9), "a direct map (embstore builds none)")
    at += 9
    code = 4 * d
    need(raw[at:at + 4] == b"ilod" and struct.unpack_from("<QQQ", raw, at + 4) ==
         (nlist, code, nlist), "the on-disk lists' header")
    table = np.frombuffer(raw, "<u8", 3 * nlist, at + 28).reshape(nlist, 3)
    at += 28 + 24 * nlist
    need(_U64.unpack_from(raw, at)[0] == 0, "free slots in the lists (embstore leaves none)")
    need(raw[at + 8:at + 16 + len(name)] == _U64.pack(len(name)) + name,
         f"the lists' file name (expected {data_name})")
    totsize = _U64.unpack_from(raw, len(raw) - 8)[0]
    sizes, caps, offsets = table[:, 0], table[:, 1], table[:, 2]
    unit = np.uint64(code + 8)
    ok = (sizes == caps) & (caps <= np.uint64(totsize) // unit) & (offsets <= totsize)
    ok &= offsets <= np.uint64(totsize) - caps * unit  # (no overflow: both <= totsize)
    need(bool(ok.all()), f"list {int(np.argmin(ok))} lies outside the {totsize} bytes "
                         f"of {data_name}")
    need(int(sizes.sum(dtype=np.uint64)) == ntotal, f"the lists hold {int(sizes.sum())} "
                                                    f"rows, the header says {ntotal}")
    return Header(d, ntotal, metric, nlist, code, totsize, sizes.astype(np.int64),
                  offsets.astype(np.int64), 8 + len(name) + 8)


def check_header(h: Header, meta: dict | None, path: Path) -> None:
    """The header against ``meta.json``: dim, metric, nlist, rows."""
    if meta is None:
        return
    want = {"dim": meta.get("dim"), "metric": METRIC_CODES.get(str(meta.get("metric"))),
            "nlist": meta.get("nlist", h.nlist), "rows": meta.get("indexed_rows", h.ntotal)}
    got = {"dim": h.dim, "metric": h.metric, "nlist": h.nlist, "rows": h.ntotal}
    wrong = [f"{k} {got[k]} (meta.json says {want[k]})" for k in got if got[k] != want[k]]
    if wrong:
        raise damaged(path, f"an index of another build: {', '.join(wrong)}")


def check_data_size(h: Header, size: int, path: Path) -> None:
    """``lists.ivfdata`` must hold exactly the bytes the header maps (fewer: a truncated
    file, whose missing pages would raise SIGBUS in a search)."""
    if size != h.totsize:
        what = "truncated" if size < h.totsize else "longer than its index says"
        raise damaged(path, f"{size} bytes, index.faiss says {h.totsize}: {what}")


def list_sums(h: Header, data: np.ndarray) -> np.ndarray:
    """The crc32c of each list's bytes (``data``: the mapped data file; a loop per list)."""
    out = np.zeros(h.nlist, np.uint32)
    for j in range(h.nlist):
        a, b = h.span(j)
        out[j] = crc32c(data[a:b].data)
    return out


def read_list_sums(fd: int, h: Header, sums: dict, path: Path) -> np.ndarray:
    """The per-list crc32c file, checked against ``meta.json``."""
    raw = os.pread(fd, 4 * h.nlist + 1, 0)
    file_sum(raw, LIST_SUMS, sums, path)
    if len(raw) != 4 * h.nlist:
        raise damaged(path, f"{len(raw)} bytes, expected 4 per list ({h.nlist} lists)")
    return np.frombuffer(raw, "<u4").copy()


def bad_lists(h: Header, data: np.ndarray, want: np.ndarray, lists: np.ndarray) -> list[int]:
    """Those of ``lists`` whose bytes fail their crc32c (a loop per list given)."""
    out = []
    for j in lists.tolist():
        a, b = h.span(j)
        if crc32c(data[a:b].data) != int(want[j]):
            out.append(j)
    return out


def bad_ids(h: Header, data: np.ndarray, rows: int) -> list[int]:
    """Lists holding a row id outside ``0 <= id < rows`` (a loop per list)."""
    out = []
    for j in range(h.nlist):
        a, b = h.span(j)
        n = int(h.sizes[j])
        if n:
            ids = data[a + n * h.code:b].view("<i8")
            if int(ids.min()) < 0 or int(ids.max()) >= rows:
                out.append(j)
    return out


def whole_sum(data: np.ndarray) -> int:
    """The crc32c of a mapped file, in pieces of 16 MiB."""
    crc = 0
    for a in range(0, len(data), _BLOCK):  # a loop per 16 MiB
        crc = crc32c(data[a:a + _BLOCK].data, crc)
    return crc


def make_sums(dest: Path, index_name: str = INDEX_FILE, data_name: str = DATA_FILE) -> dict:
    """Write ``lists.crc32c`` of the index just built in ``dest`` and return the
    ``checksums`` of ``meta.json`` (each file's size and crc32c)."""
    raw = (dest / index_name).read_bytes()
    h = parse_header(raw, dest / index_name, data_name)
    fd = os.open(dest / data_name, os.O_RDONLY)
    try:
        data = map_file(fd, os.fstat(fd).st_size, dest / data_name)
    finally:
        os.close(fd)
    per_list = list_sums(h, data).astype("<u4").tobytes()
    with open(dest / LIST_SUMS, "xb") as f:
        f.write(per_list)
    return {name: {"bytes": len(b), "crc32c": c} for name, b, c in (
        (index_name, raw, crc32c(raw)), (data_name, data, whole_sum(data)),
        (LIST_SUMS, per_list, crc32c(per_list)))}


def _read_meta(path: Path) -> dict:
    fd = open_regular(path, nofollow=True)
    try:
        meta = json.loads(read_small(fd, path, 1 << 20))
    finally:
        os.close(fd)
    if not (isinstance(meta, dict) and meta.get("embstore_ann") == 1 and
            meta.get("metric") in METRIC_CODES and isinstance(meta.get("dim"), int) and
            meta.get("library", "usearch") in ("faiss", "usearch")):
        raise damaged(path, f"expected embstore index metadata, got {str(meta)[:200]}")
    return meta


def foreign(meta: dict, table_id: str | None) -> str:
    """Why the index of ``meta`` is not the table's (whose id is ``table_id``), "" if it is:
    an index records the id of the table it was built on (a copied ``ann/`` of another
    table of the same shape is refused, never searched)."""
    got = meta.get("table_id")
    if got == table_id:
        return ""
    if got is None:
        return f"it records no table id, the table's is {table_id}"
    return f"built on table {str(got)[:40]}, this table is {table_id or 'one without an id'}"


def retarget(home: Path, *, rows: int, commit: str | None, table_id: str,
             version: int) -> None:
    """Make the index in ``home`` (a copy carried into a rewritten table: same rows, a new
    id and version) the new table's, if it was up to date on the old one (its ``rows`` and
    last ``commit``); else it stays stale.  ``meta.json`` is rewritten with its crc32c."""
    path = home / "meta.json"
    try:
        meta = _read_meta(path)
        check_meta(meta, path)
    except (CorruptStoreError, OSError, ValueError, RecursionError):
        return  # (damaged: verify reports it in the new table as in the old)
    if meta.get("table_rows") != rows or meta.get("table_commit") != commit:
        return
    meta.update(table_id=table_id, table_version=version, table_commit=None)
    meta.pop("stale", None)
    if META_CRC in meta:
        meta[META_CRC] = meta_crc(meta)
    with atomic.write_beside(path, overwrite=True) as tmp:
        Path(tmp).write_text(json.dumps(meta, indent=2), encoding="utf-8")


def index_identity(root: Path) -> dict:
    """What an index of the table at ``root`` must record: its ``table_id`` and newest
    ``version`` (the keyword arguments of :func:`verify_index`)."""
    try:
        tid = _table_id(read_table_meta(Path(root))[0])
    except (EmbstoreError, OSError):
        tid = None  # (the table's own damage is reported by verify)
    return {"table_id": tid, "version": newest(Path(root)) or None}


def verify_index(home: Path, rows: int | None, commit: str | None, *,
                 table_id: str | None = None, version: int | None = None
                 ) -> tuple[str, list[tuple[str, str]]]:
    """``(note, problems)``: every check of the index in ``home`` (the module doc) for
    ``verify``, against the table's ``rows``, last ``commit``, id and newest ``version``.
    ``("", [])`` when the table has no index.  An index that cannot be checked (no
    checksums, or an HNSW index of embstore <= 0.4) is a problem: *not verified*."""
    index_name, data_name = INDEX_FILE, DATA_FILE
    path = home / "meta.json"
    try:
        meta = _read_meta(path)
    except FileNotFoundError:
        return "", []
    except (CorruptStoreError, OSError, ValueError, RecursionError) as exc:
        why = str(exc) if isinstance(exc, CorruptStoreError) else \
            str(damaged(path, f"unreadable index metadata ({exc})"))
        return "damaged", [(str(path), why)]
    stale = (meta.get("table_commit") != commit or meta.get("table_rows") != rows
             or meta.get("table_version") != version)
    note = (f"{meta.get('indexed_rows')} rows, {meta['metric']}, "
            f"{'stale (the table changed since it was built)' if stale else 'up to date'}")
    other = foreign(meta, table_id)
    if other:
        return "damaged", [(str(path), str(damaged(path, f"not this table's index: {other}")))]
    if meta.get("library", "usearch") != "faiss":
        return note + "; not verified", [(str(home), _unverified_hnsw(home))]
    try:
        sums = check_meta(meta, path)
        raw = (home / index_name).read_bytes()
        file_sum(raw, index_name, sums, home / index_name)
        h = parse_header(raw, home / index_name, data_name)
        check_header(h, meta, home / index_name)
        fd = open_regular(home / data_name, nofollow=True)
        try:
            data = map_file(fd, os.fstat(fd).st_size, home / data_name)
        finally:
            os.close(fd)
        check_data_size(h, len(data), home / data_name)
        if sums is not None:
            lfd = open_regular(home / LIST_SUMS, nofollow=True)
            try:
                want = read_list_sums(lfd, h, sums, home / LIST_SUMS)
            finally:
                os.close(lfd)
            if whole_sum(data) != sums[data_name]["crc32c"]:
                bad = bad_lists(h, data, want, np.arange(h.nlist))
                raise damaged(home / data_name, f"crc32c differs from meta.json's; lists "
                              f"{', '.join(map(str, bad[:10]))}{' ...' if len(bad) > 10 else ''}"
                              f" ({len(bad)} of {h.nlist}) fail their crc32c")
        limit = meta.get("table_rows")
        wrong = bad_ids(h, data, limit if isinstance(limit, int) else 0)
        if wrong:
            raise damaged(home / data_name, f"lists {', '.join(map(str, wrong[:10]))} hold row "
                                            f"ids outside 0..{limit - 1 if isinstance(limit, int) else limit} "
                                            "(the rows indexed)")
    except CorruptStoreError as exc:
        return "damaged", [(str(exc.path), str(exc))]
    except OSError as exc:
        return "damaged", [(str(home), str(damaged(home, f"unreadable ({exc})")))]
    if sums is None:
        return note + "; not verified", [(str(path), (
            f"{path}: not verified: built without checksums, its bytes cannot be checked "
            "(rebuild it with `embstore index --overwrite`)"))]
    return note, []


def _unverified_hnsw(home: Path) -> str:
    """Why an HNSW index of embstore <= 0.4 is not verified (it has no checksums; without
    usearch it cannot even be opened)."""
    try:
        import usearch.index  # noqa: F401  (only whether it is there)
        have = True
    except ImportError:
        have = False
    why = ("usearch is not installed: the index can be neither opened nor checked (pip "
           "install 'embstore[ann]')" if not have else
           "an HNSW index of embstore <= 0.4 has no checksums")
    return f"{home / 'index.usearch'}: not verified: {why}; rebuild it with `embstore index --overwrite`"

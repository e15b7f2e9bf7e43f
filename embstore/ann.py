"""An approximate nearest-neighbour index kept inside a table (docs/FORMAT.md §5).

``build_index(table)`` streams the table's rows in blocks into a usearch HNSW graph and
saves it at ``<table>/vectors/.embstore/ann/`` (``index.usearch`` + ``meta.json``):
written beside, fsynced and renamed into place, in the table's private area where Zarr
readers never look.  Searches open it memory-mapped (``Index.restore(view=True)``: the
file is not read in; pages come in as the graph walk touches them), so the index is out of
core like the table.

usearch (not hnswlib, not FAISS): it maps a saved index instead of loading it (hnswlib and
FAISS HNSW read the whole file into RAM), is maintained, ships wheels, takes rows in
batches (bounded memory on our side: one block of rows at a time), and supports cosine,
inner product and L2.  Measured in benchmarks/scenarios/search.py.

The metadata records the table's last commit (:func:`embstore.store.commit.last_commit`)
and row count when the index was built: after a ``write`` or ``append`` the index is
*stale*; searches then warn (:class:`StaleIndexWarning`) and answer exactly instead.
Zero rows are left out of a cosine index (their cosine is undefined: they never rank).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
import warnings
from pathlib import Path

import numpy as np

from . import atomic
from ._types import PathLike
from ._version import __version__
from .errors import DestinationExistsError, IndexNotFoundError, ShapeMismatchError
from .ids import one_of, positive_int
from .optional import require
from .store.commit import area_of, last_commit
from .store.scan import scan_blocks
from .store.meta import read_table_meta
from .store.table import ZarrTable
from .store.table import open as open_table
from .table import Table

__all__ = ["build_index", "open_index", "index_info", "AnnIndex", "StaleIndexWarning",
           "METRICS", "index_path"]

METRICS = ("cos", "ip", "l2")
_USEARCH_METRIC = {"cos": "cos", "ip": "ip", "l2": "l2sq"}
_DTYPES = ("f32", "f16", "i8")
INDEX_FILE, META_FILE = "index.usearch", "meta.json"
_BUILD_BLOCK_ROWS = 16384  # rows handed to usearch per call (a few MiB)
_FEATURE = "an approximate nearest-neighbour index"


class StaleIndexWarning(UserWarning):
    """The table changed after its approximate index was built: the search ran exactly."""


def index_path(table: PathLike | ZarrTable) -> Path:
    """The directory of the approximate index of the table at ``table``."""
    root = table.path if isinstance(table, ZarrTable) else Path(os.fspath(table)).absolute()
    return area_of(root) / "ann"


def _fsync(path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _local(table) -> tuple[ZarrTable, bool]:
    if isinstance(table, ZarrTable):
        t, mine = table, False
    else:
        t, mine = open_table(table), True
    if getattr(t, "_remote", None) is not None:
        if mine:
            t.close()
        raise IndexNotFoundError(f"{t.path}: approximate indexes live in local tables only",
                                 path=str(t.path))
    return t, mine


def build_index(table: PathLike | ZarrTable, *, metric: str = "cos", connectivity: int = 16,
                expansion_add: int = 128, expansion_search: int = 512, dtype: str = "f32",
                overwrite: bool = False, threads: int = 0, progress=None) -> dict:
    """Build the approximate index of ``table`` (a path or an open local table) and store it
    in the table's directory; returns its metadata (see :func:`index_info`).

    ``metric``: ``"cos"`` (cosine), ``"ip"`` (inner product) or ``"l2"`` (Euclidean);
    ``connectivity`` (HNSW ``M``) and ``expansion_add`` (``ef_construction``) trade build
    time and size for recall; ``expansion_search`` is the default search effort;
    ``dtype`` how the index stores vectors (``f32``, ``f16``, ``i8``: smaller, less exact).
    Rows are streamed in blocks; an existing index is replaced only with ``overwrite``.
    ``progress(done, total)`` (rows) is called after each block.
    """
    usearch = require("usearch.index", extra="ann", feature=_FEATURE)
    one_of(metric, "metric", METRICS)
    one_of(dtype, "dtype", _DTYPES)
    for name, v in (("connectivity", connectivity), ("expansion_add", expansion_add),
                    ("expansion_search", expansion_search)):
        positive_int(v, name)
    t, mine = _local(table)
    try:
        dest = index_path(t)
        if dest.exists() and not overwrite:
            raise DestinationExistsError(f"{dest}: the table already has an approximate "
                                         "index (pass overwrite=True to rebuild it)")
        commit, rows = last_commit(t.path), t.vocab_size  # before reading: never newer
        index = usearch.Index(ndim=t.dim, metric=_USEARCH_METRIC[metric], dtype=dtype,
                              connectivity=int(connectivity), expansion_add=int(expansion_add),
                              expansion_search=int(expansion_search))
        t0, added = time.perf_counter(), 0
        for start, block, norms in scan_blocks(t, _BUILD_BLOCK_ROWS):  # a loop per block
            vec = np.ascontiguousarray(block, dtype=np.float32)
            keep = np.ones(vec.shape[0], bool)
            if metric == "cos":
                keep = (norms if norms is not None else np.einsum("ij,ij->i", vec, vec)) > 0
            ids = np.flatnonzero(keep).astype(np.uint64) + np.uint64(start)
            if ids.size:
                index.add(ids, vec if keep.all() else vec[keep], threads=int(threads))
                added += int(ids.size)
            if progress is not None:
                progress(start + vec.shape[0], rows)
        meta = {"embstore_ann": 1, "library": "usearch", "library_version":
                getattr(usearch, "__version__", None) or _usearch_version(),
                "metric": metric, "dtype": dtype, "connectivity": int(connectivity),
                "expansion_add": int(expansion_add), "expansion_search": int(expansion_search),
                "dim": t.dim, "table_rows": rows, "table_commit": commit, "indexed_rows": added,
                "build_seconds": round(time.perf_counter() - t0, 3),
                "created_by": f"embstore {__version__}"}
        _save(index, meta, dest, overwrite)
        return meta
    finally:
        if mine:
            t.close()


def _usearch_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("usearch")
    except Exception:  # noqa: BLE001 - only informative
        return None


def _save(index, meta: dict, dest: Path, overwrite: bool) -> None:
    """Write the index beside ``dest`` (fsynced) and rename it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f"ann.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        index.save(str(tmp / INDEX_FILE))
        with open(tmp / META_FILE, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
        for name in (INDEX_FILE, META_FILE):
            _fsync(tmp / name)
        _fsync(tmp, directory=True)
        if dest.exists() and not overwrite:
            raise DestinationExistsError(f"{dest}: another process built an index meanwhile")
        atomic.replace(tmp, dest)
        _fsync(dest.parent, directory=True)
    except BaseException:
        atomic.remove(tmp)
        raise


def index_info(table: PathLike | ZarrTable) -> dict | None:
    """The metadata of the table's approximate index (None if it has none), with ``stale``:
    whether the table changed since the index was built."""
    path = index_path(table) / META_FILE
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read(1 << 20))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise IndexNotFoundError(f"{path}: unreadable index metadata ({exc})",
                                 path=str(path)) from None
    if not (isinstance(meta, dict) and meta.get("embstore_ann") == 1 and
            meta.get("metric") in METRICS and isinstance(meta.get("dim"), int)):
        raise IndexNotFoundError(f"{path}: expected embstore index metadata, got "
                                 f"{str(meta)[:200]}", path=str(path))
    root = path.parent.parent.parent.parent
    rows = meta.get("table_rows")
    if isinstance(table, ZarrTable):
        now = table.vocab_size
    else:
        now = read_table_meta(root)[1]["shape"][0]
    meta["stale"] = meta.get("table_commit") != last_commit(root) or rows != now
    return meta


class AnnIndex:
    """An approximate index opened memory-mapped (read-only)."""

    def __init__(self, path: Path, meta: dict):
        usearch = require("usearch.index", extra="ann", feature=_FEATURE)
        self.path, self.meta = path, meta
        self.metric = meta["metric"]
        self.index = usearch.Index.restore(str(path / INDEX_FILE), view=True)
        if self.index is None or self.index.ndim != meta["dim"]:
            raise IndexNotFoundError(f"{path / INDEX_FILE}: not a usearch index of dim "
                                     f"{meta['dim']}", path=str(path))
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.index)

    def search(self, q: np.ndarray, count: int, ef: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)`` ``(n, count)`` best first; missing places: score -inf, id -1.
        Scores: cosine (``cos``), inner product (``ip``), minus the Euclidean distance
        (``l2``)."""
        n = q.shape[0]
        count = max(1, min(int(count), len(self.index)))
        with self.lock:  # the search effort is a property of the shared index
            self.index.expansion_search = max(count, int(ef or self.meta["expansion_search"]))
            m = self.index.search(np.ascontiguousarray(q, dtype=np.float32), count)
        keys = np.asarray(m.keys, dtype=np.int64).reshape(n, -1)
        dist = np.asarray(m.distances, dtype=np.float64).reshape(n, -1)
        counts = np.asarray(getattr(m, "counts", keys.shape[1])).reshape(-1)  # one: Matches
        valid = np.arange(keys.shape[1])[None, :] < counts[:, None]
        scores = -np.sqrt(np.maximum(dist, 0)) if self.metric == "l2" else 1.0 - dist
        return np.where(valid, scores, -np.inf), np.where(valid, keys, -1)


_opened: dict[tuple, AnnIndex] = {}
_opened_lock = threading.Lock()


def open_index(table: ZarrTable) -> AnnIndex:
    """The table's index, opened memory-mapped (kept open per index file version)."""
    path = index_path(table)
    meta = index_info(table)
    if meta is None:
        raise IndexNotFoundError(f"{table.path} has no approximate index (build it first: "
                                 "embstore.build_index, or the index command)", path=str(path))
    st = os.stat(path / INDEX_FILE)
    key = (str(path), st.st_ino, st.st_mtime_ns, st.st_size)
    with _opened_lock:
        found = _opened.get(key)
        if found is None:
            found = AnnIndex(path, meta)
            for old in [k for k in _opened if k[0] == key[0]]:
                del _opened[old]
            _opened[key] = found
    found.meta = meta  # stale or not: as of now
    return found


def approx_top_k(table: Table, q: np.ndarray, k: int, *, exclude: np.ndarray,
                 own: np.ndarray | None, ef: int | None):
    """``(scores, ids)`` from the index, or None when it is stale (a warning said so)."""
    if not isinstance(table, ZarrTable):
        raise IndexNotFoundError("approximate search needs an on-disk table with an index "
                                 f"(got {type(table).__name__})", path=None)
    index = open_index(table)
    if index.meta["stale"]:
        warnings.warn(StaleIndexWarning(
            f"{table.path}: the table changed after its approximate index was built; "
            "searching exactly (rebuild the index to search approximately again)"),
            stacklevel=4)
        return None
    if q.shape[1] != index.meta["dim"]:
        raise ShapeMismatchError(f"queries of dim {q.shape[1]}, index of dim "
                                 f"{index.meta['dim']}")
    extra = exclude.size + (1 if own is not None else 0)
    scores, ids = index.search(q, k + extra, ef)
    bad = np.isin(ids, exclude) | (ids < 0)
    if own is not None:
        bad |= ids == own[:, None]
    if ids.shape[1] < k:  # the graph walk found fewer than asked: empty places
        pad = ((0, 0), (0, k - ids.shape[1]))
        scores = np.pad(scores, pad, constant_values=-np.inf)
        ids, bad = np.pad(ids, pad, constant_values=-1), np.pad(bad, pad, constant_values=True)
    order = np.argsort(bad, axis=1, kind="stable")[:, :k]  # the valid ones first, in order
    scores = np.take_along_axis(np.where(bad, -np.inf, scores), order, axis=1)
    ids = np.take_along_axis(np.where(bad, -1, ids), order, axis=1)
    return scores, ids

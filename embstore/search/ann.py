"""An approximate nearest-neighbour index kept inside a table (docs/FORMAT.md §10).

``build_index(table)`` builds a FAISS inverted-file index (IVF, :mod:`embstore.search.ivf`)
by streaming the table's rows and saves it at ``<table>/vectors/.embstore/ann/``
(``index.faiss``, ``lists.ivfdata``, ``lists.crc32c``, ``meta.json``): written beside,
fsynced and renamed into place, in the table's private area where Zarr readers never
look.  Nothing of it is trusted blindly (:mod:`embstore.store.annfiles`): checksums, layout and
sizes are checked on open, each list on first touch, every returned id against the table.  Searches read
``index.faiss`` (the centroids: a few MB) and map ``lists.ivfdata``: the lists are not
read in; the pages of the lists a search probes come in as it scans them.

Why IVF (FAISS ``IndexIVFFlat`` with on-disk lists) and no longer a usearch HNSW graph,
measured on 1,000,000 x 256 clustered float32 (benchmarks/results/2026-11-30-search-ivf.md):
the HNSW graph (1.17 GB) opened in 166-200 ms (usearch's view walks every node; cold, it
faults the graph in) and was built in RAM in 880 s.  The IVF index (1.03 GB) opens in
15-24 ms cold, reading 1 MB (its centroids); is built in two streamed passes in 85-112 s
at load 5-13 with 148 MB of its own (anonymous) memory at peak (the rest of its RSS is
the table's pages the scan maps); a query scans a few lists exactly: recall@10 1.0 at
nprobe 2 of 1,000 lists, 2.2 ms a query, 254x the exact scan.  On MiniLM's word
embeddings (30,522 x 384, harder) recall@10 0.99 needs nprobe 96 of 175.  On 50,000 rows
it builds in 2.6 s against 46-49 s for usearch / FAISS HNSW and 7 s for Annoy.  An IVF
scalar quantizer (smaller lists, re-ranked from the table) was not needed: the lists are
mapped, not read, so their size costs disk, not memory or open time.  Its vectors are
float32, so the scores are exact for the rows it finds.

The search effort is ``nprobe``, the number of lists scanned (``ef`` of ``most_similar``,
``expansion_search`` of :func:`build_index`); its default is calibrated at build time on
128 of the table's rows against their exact top-10 (the smallest ``nprobe`` reaching
``recall``, 0.99 by default), so hard data (real embeddings) gets a larger default than
well-clustered data.  A search probes at least enough lists to hold about ``2 k`` rows.

The metadata records the table's last commit (:func:`embstore.store.versions.commit.last_commit`)
and row count when the index was built: after a ``write`` or ``append`` the index is
*stale*; searches then warn (:class:`StaleIndexWarning`) and answer exactly instead.
Zero rows are left out of a cosine index (their cosine is undefined: they never rank).
An index built by an older embstore (usearch HNSW, ``index.usearch``) still opens and
searches when usearch is installed; rebuild it with ``embstore index --overwrite``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..fs import atomic
from ..fs.beside import fsync_path as _fsync
from ..fs.beside import sweep_beside
from .._types import PathLike
from .._version import __version__
from ..store import annfiles as check
from .indexmeta import META_FILE, METRICS, index_info, index_path
from .ivf import DATA_FILE, FEATURE, INDEX_FILE, IvfIndex, build_ivf
from ..errors import (CorruptStoreError, DestinationExistsError, IndexNotFoundError,
                      ShapeMismatchError)
from ..fs.files import open_regular
from ..ids import one_of, positive_int
from ..optional import require
from ..store.versions.commit import AREA, LAST, last_commit
from ..store.meta import table_id
from ..store.table import ZarrTable
from ..store.table import open as open_table
from ..table import Table

__all__ = ["build_index", "open_index", "index_info", "AnnIndex", "StaleIndexWarning",
           "METRICS", "index_path"]

USEARCH_FILE = "index.usearch"  # an index built by embstore <= 0.4 (usearch HNSW)
_HNSW_ONLY = ("connectivity", "expansion_add")


class StaleIndexWarning(UserWarning):
    """The table changed after its approximate index was built: the search ran exactly."""


def _local(table) -> tuple[ZarrTable, bool]:
    if isinstance(table, ZarrTable):
        t, mine = table, False
    else:
        t, mine = open_table(table), True
    if t.is_remote:
        if mine:
            t.close()
        raise IndexNotFoundError(f"{t.path}: approximate indexes live in local tables only",
                                 path=str(t.path))
    return t, mine


def build_index(table: PathLike | ZarrTable, *, metric: str = "cos", nlist: int | None = None,
                nprobe: int | None = None, recall: float = 0.99,
                expansion_search: int | None = None, connectivity: int | None = None,
                expansion_add: int | None = None, dtype: str = "f32", overwrite: bool = False,
                threads: int = 0, progress=None) -> dict:
    """Build the approximate index of ``table`` (a path or an open local table) and store it
    in the table's directory; returns its metadata (see :func:`index_info`).

    ``metric``: ``"cos"`` (cosine), ``"ip"`` (inner product) or ``"l2"`` (Euclidean).
    ``nlist``: how many lists (k-means centroids; default about ``sqrt(rows)``).
    ``nprobe`` (or its older name ``expansion_search``): the default search effort, lists
    scanned per query; by default the smallest reaching ``recall`` (recall@10, in (0, 1])
    on a sample of the table's rows.  ``dtype``: ``"f32"`` (the lists hold float32 rows).
    ``connectivity`` and ``expansion_add`` tuned the HNSW graph of embstore <= 0.4: they
    are accepted and ignored, with a :class:`DeprecationWarning`.  ``threads``: FAISS
    threads while building (0: all cores).  Rows are streamed in blocks (twice); an
    existing index is replaced only with ``overwrite``.  ``progress(done, total)`` (rows)
    is called after each block.
    """
    require("faiss", extra="ann", feature=FEATURE)
    one_of(metric, "metric", METRICS)
    one_of(dtype, "dtype", ("f32",))
    given = {"connectivity": connectivity, "expansion_add": expansion_add}
    ignored = [name for name in _HNSW_ONLY if given[name] is not None]
    if ignored:
        warnings.warn(DeprecationWarning(
            f"{', '.join(ignored)}: HNSW settings, ignored (the index is an IVF index: "
            "nlist and nprobe)"), stacklevel=2)
    if expansion_search is not None:
        positive_int(expansion_search, "expansion_search")
        if nprobe is not None and int(nprobe) != int(expansion_search):
            raise ValueError(f"nprobe={nprobe} and expansion_search={expansion_search} "
                             "(the same setting): give one")
        nprobe = expansion_search
    for name, v in (("nlist", nlist), ("nprobe", nprobe)):
        if v is not None:
            positive_int(v, name)
    if not (isinstance(recall, (int, float)) and 0 < recall <= 1):
        raise ValueError(f"recall: expected a number in (0, 1], got {recall!r}")
    t, mine = _local(table)
    try:
        dest = index_path(t)
        if dest.exists() and not overwrite:
            raise DestinationExistsError(f"{dest}: the table already has an approximate "
                                         "index (pass overwrite=True to rebuild it)")
        commit, rows = last_commit(t.path), t.vocab_size  # before reading: never newer
        sweep_beside(dest)  # the staging of builds killed before (their process is gone)
        tmp = Path(atomic.temp_dir(dest))
        try:
            t0 = time.perf_counter()
            built = build_ivf(t, tmp, metric=metric, nlist=nlist, nprobe=nprobe,
                              recall=float(recall), threads=int(threads), progress=progress)
            meta = {"embstore_ann": 1, **built, "metric": metric, "dtype": dtype,
                    "expansion_search": built["nprobe"], "dim": t.dim, "table_rows": rows,
                    "table_commit": commit, "table_id": table_id(t._attrs),
                    "table_version": t._version or None,
                    "build_seconds": round(time.perf_counter() - t0, 3),
                    "created_by": f"embstore {__version__}",
                    check.SUMS: check.make_sums(tmp, INDEX_FILE, DATA_FILE)}
            meta[check.META_CRC] = check.meta_crc(meta)
            _save(meta, tmp, dest, overwrite)
        except BaseException:
            atomic.remove(tmp)
            raise
        return meta
    finally:
        if mine:
            t.close()


def _save(meta: dict, tmp: Path, dest: Path, overwrite: bool) -> None:
    """Write the metadata beside the index files in ``tmp``, fsync, rename to ``dest``."""
    with open(tmp / META_FILE, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    for name in (INDEX_FILE, DATA_FILE, check.LIST_SUMS, META_FILE):
        _fsync(tmp / name)
    _fsync(tmp, directory=True)
    if dest.exists() and not overwrite:
        raise DestinationExistsError(f"{dest}: another process built an index meanwhile")
    atomic.replace(tmp, dest)
    _fsync(dest.parent, directory=True)


class AnnIndex:
    """An approximate index opened read-only: FAISS IVF (lists mapped), or the usearch HNSW
    graph of an older embstore (mapped: ``Index.restore(view=True)``)."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.meta = path, meta
        self.metric = meta["metric"]
        self.ivf: IvfIndex | None = None
        self.hnsw: Any = None
        if meta.get("library", "usearch") == "faiss":
            self.ivf = IvfIndex(path, meta)
            size = len(self.ivf)
            if self.ivf.dim != meta["dim"]:
                raise IndexNotFoundError(f"{path / INDEX_FILE}: an index of dim "
                                         f"{self.ivf.dim}, expected {meta['dim']}",
                                         path=str(path))
        else:
            usearch = require("usearch.index", extra="ann", feature=(
                "an index built by embstore <= 0.4 (usearch HNSW; or rebuild it: "
                "embstore index --overwrite)"))
            os.close(open_regular(path / USEARCH_FILE))  # (a FIFO would block usearch)
            self.hnsw = usearch.Index.restore(str(path / USEARCH_FILE), view=True)
            if self.hnsw is None or self.hnsw.ndim != meta["dim"]:
                raise IndexNotFoundError(f"{path / USEARCH_FILE}: not a usearch index of dim "
                                         f"{meta['dim']}", path=str(path))
            size = len(self.hnsw)
        self.size = size
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.size

    def search(self, q: np.ndarray, count: int, ef: int | None = None, *,
               rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)`` ``(n, count)`` best first; missing places: score -inf, id -1.
        Scores: cosine (``cos``), inner product (``ip``), minus the Euclidean distance
        (``l2``).  ``ef``: the search effort (IVF: lists scanned).  Every id is checked
        against ``rows`` (the table's row count), cosines against [-1, 1]: an index that
        gives another answer is damaged (:class:`CorruptStoreError`), never a wrong row."""
        scores, ids = self._search(q, count, ef)
        limit = self.meta.get("table_rows") if rows is None else rows
        found = ids >= 0
        wrong = (ids < -1) | (ids >= limit) if isinstance(limit, int) else ids < -1
        where = self.path / (DATA_FILE if self.ivf is not None else USEARCH_FILE)
        if wrong.any():
            raise check.damaged(where, f"the index returned row id {int(ids[wrong][0])} "
                                       f"for a table of {limit} rows")
        if self.metric == "cos":
            q = np.asarray(q)
            s = scores[found & np.any(q != 0, axis=1)[:, None]]  # (a zero query's: nan)
            if s.size and not bool((np.abs(s) <= 1.001).all()):
                bad = s[~(np.abs(s) <= 1.001)][0]
                raise check.damaged(where, f"the index returned a cosine of {bad:.6g}")
        return scores, ids

    def _search(self, q: np.ndarray, count: int, ef: int | None
                ) -> tuple[np.ndarray, np.ndarray]:
        count = max(1, min(int(count), self.size))
        effort = int(ef or self.meta["expansion_search"])
        q = np.ascontiguousarray(q, dtype=np.float32)
        if self.ivf is None:
            return self._search_hnsw(q, count, effort)
        zero = np.zeros(q.shape[0], bool)
        if self.metric == "cos":
            norm = np.sqrt(np.einsum("ij,ij->i", q, q))
            zero = norm == 0
            q = q / np.where(zero, 1, norm)[:, None]
        # enough lists to hold about 2 * count rows (a large k needs more than the effort)
        need = math.ceil(2 * count * self.ivf.nlist / max(self.size, 1))
        dist, ids = self.ivf.search(q, count, max(effort, need))
        dist = dist.astype(np.float64)
        scores = -np.sqrt(np.maximum(dist, 0)) if self.metric == "l2" else dist
        scores[zero] = np.nan  # the cosine of a zero query is undefined
        return np.where(ids >= 0, scores, -np.inf), np.where(ids >= 0, ids, -1)

    def _search_hnsw(self, q: np.ndarray, count: int, ef: int):
        n = q.shape[0]
        with self.lock:  # the search effort is a property of the shared index
            self.hnsw.expansion_search = max(count, ef)
            m = self.hnsw.search(q, count)
        keys = np.asarray(m.keys, dtype=np.int64).reshape(n, -1)
        dist = np.asarray(m.distances, dtype=np.float64).reshape(n, -1)
        counts = np.asarray(getattr(m, "counts", keys.shape[1])).reshape(-1)  # one: Matches
        valid = np.arange(keys.shape[1])[None, :] < counts[:, None]
        scores = -np.sqrt(np.maximum(dist, 0)) if self.metric == "l2" else 1.0 - dist
        return np.where(valid, scores, -np.inf), np.where(valid, keys, -1)


def _sig(path: str):
    """What changes when ``path`` is replaced or rewritten (None: absent).  The change time
    too: a file copied in with its modification time kept (``cp -p``, ``copytree``) may
    reuse a removed file's inode and size."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


#: index dir -> (what the last look saw: meta.json, the table's last commit, its rows;
#: the index file's signature; the index opened; its metadata then)
_opened: dict[str, tuple] = {}
_opened_lock = threading.Lock()


def open_index(table: ZarrTable) -> AnnIndex:
    """The table's index, opened memory-mapped (kept open per index file version).

    A search asks for it every time: while neither the index's metadata nor the table's
    last commit changed (two ``stat`` calls), the index and the staleness found the last
    time are reused; otherwise the metadata is read again, and the index reopened only if
    its file changed."""
    area = os.path.join(os.fspath(table.path), "vectors", AREA[0])  # (area_of, as strings)
    home = os.path.join(area, "ann")
    seen = (_sig(os.path.join(home, META_FILE)), _sig(os.path.join(area, LAST)),
            table.vocab_size)
    hit = _opened.get(home)
    if hit is not None and hit[0] == seen and seen[0] is not None:
        hit[2].meta = hit[3]
        return hit[2]
    for attempt in range(3):  # a rebuild swapped in between meta.json and the index: again
        meta = index_info(table)
        if meta is None:
            raise IndexNotFoundError(f"{table.path} has no approximate index (build it first: "
                                     "embstore.build_index, or the index command)", path=home)
        name = INDEX_FILE if meta.get("library", "usearch") == "faiss" else USEARCH_FILE
        sig = _sig(os.path.join(home, name))
        if sig is None:
            raise IndexNotFoundError(f"{os.path.join(home, name)}: unreadable index", path=home)
        try:
            with _opened_lock:
                hit = _opened.get(home)
                found = hit[2] if hit is not None and hit[1] == sig else AnnIndex(Path(home),
                                                                                  meta)
                _opened[home] = (seen, sig, found, meta)
            break
        except CorruptStoreError:
            now = _sig(os.path.join(home, META_FILE))
            if attempt == 2 or now == seen[0]:
                raise  # the same index as read: damage, not a rebuild
            seen = (now, _sig(os.path.join(area, LAST)), table.vocab_size)
    found.meta = meta  # stale or not: as of now
    return found


def approx_top_k(table: Table, q: np.ndarray, k: int, *, exclude: np.ndarray,
                 own: np.ndarray | None, ef: int | None):
    """``(scores, ids)`` from the index, or None when it is stale (a warning said so)."""
    table._check_open()  # (the cached index answered after close())
    if not isinstance(table, ZarrTable):
        raise IndexNotFoundError("approximate search needs an on-disk table with an index "
                                 f"(got {type(table).__name__})", path=None)
    index = open_index(table)
    if index.meta["stale"]:
        why = (f"its approximate index is not this table's: {index.meta['foreign']}"
               if index.meta.get("foreign") else
               "the table changed after its approximate index was built")
        warnings.warn(StaleIndexWarning(
            f"{table.path}: {why}; searching exactly (rebuild the index to search "
            "approximately again)"), stacklevel=4)
        return None
    if q.shape[1] != index.meta["dim"]:
        raise ShapeMismatchError(f"queries of dim {q.shape[1]}, index of dim "
                                 f"{index.meta['dim']}")
    extra = exclude.size + (1 if own is not None else 0)
    scores, ids = index.search(q, k + extra, ef, rows=table.vocab_size)
    bad = ids < 0
    if not extra and ids.shape[1] == k and not bad.any():  # (the usual single query)
        return scores, ids
    if exclude.size:
        bad |= np.isin(ids, exclude)
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

"""The FAISS IVF index behind :mod:`embstore.search.ann`: built by streaming, opened mapped.

An inverted-file index (``IndexIVFFlat``): ``nlist`` centroids (k-means on a bounded
sample of rows) and, per centroid, the list of the rows nearest to it, stored as the
rows' float32 vectors and int64 ids.  A search compares the query with the centroids and
scans the rows of the ``nprobe`` nearest lists exactly.

Files (docs/FORMAT.md §10): ``index.faiss`` (``faiss.write_index``: the header, the
centroids and the lists' (size, offset) table: a few MB) and ``lists.ivfdata`` (the
lists, in FAISS's ``OnDiskInvertedLists`` layout: per list its vectors then its ids).

Build, with bounded memory (one block of rows, the sample, 4 bytes of list number per
row): pass 1 streams the rows and assigns each to its list; the list sizes give every
list's offset (``OnDiskInvertedLists.set_all_lists_sizes``); pass 2 streams the rows
again and writes each block's runs with ``os.pwrite`` at their lists' offsets (no
mapping: the written pages are the page cache's, not the process's RSS).  Pass 2 also
computes the exact top-10 of a sample of rows, with which the default search effort
(``nprobe``) is calibrated: the smallest one whose recall@10 reaches ``recall``.

Open: ``index.faiss`` is read (its stored data file name rewritten to the absolute path
of ``lists.ivfdata`` beside it, so the table directory can be moved) and
``lists.ivfdata`` is mapped read-only once its size was checked against the header:
nothing of the lists is read until a search touches them, and each list is checked
against its crc32c the first time a search probes it (:mod:`embstore.store.annfiles`).
(FAISS's ``IO_FLAG_ONDISK_SAME_DIR`` does the same but prints to stdout.)
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..store import annfiles as check
from ..store.annfiles import DATA_FILE, INDEX_FILE, LIST_SUMS
from ..errors import CorruptStoreError, IndexNotFoundError, TableChangedError
from ..fs.files import map_file, open_regular
from ..optional import require
from ..store.scan import scan_blocks
from ..store.table import ZarrTable

__all__ = ["build_ivf", "IvfIndex", "INDEX_FILE", "DATA_FILE", "default_nlist"]

FEATURE = "an approximate nearest-neighbour index"
_BLOCK_BYTES = 32 << 20  # rows per streamed block: about this many bytes of float32
_CALIBRATION_QUERIES = 128
_SAMPLE_BYTES = 256 << 20  # the k-means sample: at most this many bytes (or 4 rows a list)
_K = 10
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: the largest index.faiss read (its centroids: 65,536 lists of dim 4,096 are 1 GiB)
MAX_INDEX_BYTES = 1 << 30
_forked_hook = False


def faiss_module():
    """faiss, imported (the ``ann`` extra); in a forked child it runs single-threaded
    (GNU OpenMP's thread pool does not survive ``fork``)."""
    global _forked_hook
    faiss = require("faiss", extra="ann", feature=FEATURE)
    if not _forked_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: faiss.omp_set_num_threads(1))
        _forked_hook = True
    return faiss


def default_nlist(rows: int) -> int:
    """About ``sqrt(rows)`` lists (at least 1, at most 65,536)."""
    return int(min(65536, max(1, round(np.sqrt(max(rows, 1))))))


def _prepare(metric: str, block: np.ndarray, norms: np.ndarray | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """``(vectors, keep)``: float32 rows as the index stores them (unit rows for ``cos``,
    zero rows left out: ``keep`` marks the rows kept)."""
    vec = np.ascontiguousarray(block, dtype=np.float32)
    if metric != "cos":
        return vec, np.ones(vec.shape[0], bool)
    n = norms.astype(np.float32) if norms is not None else np.sqrt(
        np.einsum("ij,ij->i", vec, vec))
    keep = (n > 0) & np.isfinite(n)
    return np.ascontiguousarray(vec[keep] / n[keep, None]), keep


def _scores(metric: str, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Higher is nearer: dot product, or minus the squared distance for ``l2``."""
    s = q @ x.T
    if metric == "l2":
        s = 2 * s - np.einsum("ij,ij->i", x, x)[None, :] - np.einsum("ij,ij->i", q, q)[:, None]
    return s


class _Truth:
    """The exact top-10 of a few rows of the table (themselves left out), streamed."""

    def __init__(self, metric: str, ids: np.ndarray, vectors: np.ndarray):
        self.metric, self.ids, self.q = metric, ids, vectors
        self.best = np.full((len(ids), _K), -np.inf)
        self.best_ids = np.full((len(ids), _K), -1, np.int64)

    def add(self, x: np.ndarray, ids: np.ndarray) -> None:
        if not len(self.ids) or not len(ids):
            return
        s = _scores(self.metric, self.q, x).astype(np.float64)
        s[self.ids[:, None] == ids[None, :]] = -np.inf
        s = np.concatenate([self.best, s], axis=1)
        i = np.concatenate([self.best_ids, np.broadcast_to(ids, (len(self.ids), len(ids)))],
                           axis=1)
        top = np.argpartition(-s, min(_K, s.shape[1] - 1), axis=1)[:, :_K]
        self.best = np.take_along_axis(s, top, axis=1)
        self.best_ids = np.take_along_axis(i, top, axis=1)

    def recall(self, found: np.ndarray) -> float:
        want = np.where(np.isfinite(self.best), self.best_ids, -2)
        hit = (found[:, :, None] == want[:, None, :]).any(axis=2) & (found >= 0)
        total = np.isfinite(self.best).sum()
        return float(hit.sum() / total) if total else 1.0


def _sample(t: ZarrTable, metric: str, count: int, seed: int, block: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, vectors)`` of up to ``count`` random rows (prepared as the index stores),
    picked from the scan's blocks (the mapping the passes read: its pages count once)."""
    n = t.vocab_size
    ids = np.sort(np.random.default_rng(seed).choice(n, min(n, count), replace=False))
    out = np.empty((len(ids), t.dim), np.float32)
    for start, rows, _ in scan_blocks(t, block):  # a loop per block
        a, z = np.searchsorted(ids, [start, start + len(rows)])
        out[a:z] = rows[ids[a:z] - start]
    vec, keep = _prepare(metric, out, None)
    return ids[keep], vec


def build_ivf(t: ZarrTable, dest: Path, *, metric: str, nlist: int | None,
              nprobe: int | None, recall: float, threads: int,
              progress: Callable[[int, int], Any] | None) -> dict:
    """Write ``INDEX_FILE`` and ``DATA_FILE`` of ``t``'s index into the directory ``dest``;
    returns the build's part of the metadata."""
    faiss = faiss_module()
    rows, dim = t.vocab_size, t.dim
    nlist = min(int(nlist) if nlist else default_nlist(rows), max(rows, 1))
    before = faiss.omp_get_max_threads()
    if threads:
        faiss.omp_set_num_threads(int(threads))
    try:
        t0 = time.perf_counter()
        block = max(256, _BLOCK_BYTES // (4 * max(dim, 1)))
        train, truth = _training_rows(t, metric, nlist, block)
        nlist = min(nlist, len(train))
        index, quantizer = _trained(faiss, metric, dim, nlist, train)
        train_s = time.perf_counter() - t0
        labels = _assign(t, metric, quantizer, block, progress)
        sizes = np.bincount(labels[labels >= 0], minlength=nlist).astype(np.uint64)
        lists, offsets, total = _lay_out(faiss, nlist, dim, sizes)
        _write_lists(t, dest / DATA_FILE, metric, block, labels, sizes, offsets, total,
                     truth, progress)
        index.replace_invlists(lists, True)
        lists.this.disown()
        index.ntotal = int(sizes.sum())
        # (faiss.write_index only prints a failed close, a full disk say: written here, an
        # error raises)
        with open(dest / INDEX_FILE, "wb") as f:
            f.write(memoryview(faiss.serialize_index(index)))
        del index
        opened = IvfIndex(dest)
        chosen, reached = _calibrate(opened, truth, nlist, recall, nprobe)
        opened.close()
        return {"library": "faiss", "library_version": faiss.__version__,
                "kind": "IVFFlat", "nlist": nlist, "nprobe": chosen,
                "calibration": {"queries": int(len(truth.ids)), "recall_at_10": reached,
                                "target": recall},
                "indexed_rows": int(sizes.sum()), "train_rows": int(len(train)),
                "train_seconds": round(train_s, 3),
                "index_bytes": os.path.getsize(dest / INDEX_FILE) + max(total, 8)}
    finally:
        faiss.omp_set_num_threads(before)


def _training_rows(t: ZarrTable, metric: str, nlist: int, block: int
                   ) -> tuple[np.ndarray, _Truth]:
    """``(k-means training rows, calibration queries)``: a bounded sample of the rows (a
    zero row if there is none to index) and up to 128 of them, whose exact top-10 pass 2
    computes."""
    dim = t.dim
    cap = max(4 * nlist, _SAMPLE_BYTES // (4 * max(dim, 1)))
    s_ids, train = _sample(t, metric, min(40 * nlist, cap), seed=0, block=block)
    pick = np.sort(np.random.default_rng(2).permutation(len(s_ids))[:_CALIBRATION_QUERIES])
    q_ids, q_vec = s_ids[pick], train[pick]  # calibration queries: rows of the sample
    if len(train) == 0:  # no row to index (an empty table, or only zero rows)
        train = np.zeros((1, dim), np.float32)
    return train, _Truth(metric, q_ids, q_vec)


def _trained(faiss, metric: str, dim: int, nlist: int, train: np.ndarray) -> tuple[Any, Any]:
    """``(index, quantizer)``: an ``IndexIVFFlat`` of ``nlist`` centroids, k-means trained
    on ``train`` (its quantizer owned by the index)."""
    fmetric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    quantizer = faiss.IndexFlatL2(dim) if metric == "l2" else faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, fmetric)
    index.own_fields = True
    quantizer.this.disown()
    index.cp.niter = 10
    index.cp.spherical = metric == "cos"
    index.cp.seed = 1
    index.cp.max_points_per_centroid = 64  # the sample is the training set
    index.cp.min_points_per_centroid = 1  # a small table: fewer rows a list, no warning
    index.train(train)
    return index, quantizer


def _assign(t: ZarrTable, metric: str, quantizer, block: int,
            progress: Callable[[int, int], Any] | None) -> np.ndarray:
    """Pass 1: the list of every row (its nearest centroid; -1 for a row left out)."""
    rows = t.vocab_size
    labels = np.full(rows, -1, np.int32)
    for start, vec, norms in scan_blocks(t, block):  # pass 1: a loop per block
        x, keep = _prepare(metric, vec, norms)
        if len(x):
            labels[start:start + len(keep)][keep] = quantizer.search(x, 1)[1][:, 0]
        if progress is not None:
            progress((start + len(keep)) // 2, rows)
    return labels


def _lay_out(faiss, nlist: int, dim: int, sizes: np.ndarray) -> tuple[Any, np.ndarray, int]:
    """``(lists, offsets, total)``: FAISS's on-disk lists of these ``sizes``, each list's
    byte offset in ``DATA_FILE`` and the bytes of all of them."""
    code = 4 * dim
    lists = faiss.OnDiskInvertedLists(nlist, code, DATA_FILE)
    lists.set_all_lists_sizes(faiss.swig_ptr(sizes))
    total = int((sizes * np.uint64(code + 8)).sum())
    lists.totsize = max(total, 8)  # FAISS cannot map an empty file
    offsets = np.concatenate([[0], np.cumsum(sizes * np.uint64(code + 8))[:-1]])
    if nlist and int(lists.lists.at(nlist - 1).offset) != int(offsets[-1]):
        raise RuntimeError("faiss laid the lists out unexpectedly")  # a faiss change
    return lists, offsets, total


def _write_lists(t: ZarrTable, path: Path, metric: str, block: int, labels: np.ndarray,
                 sizes: np.ndarray, offsets: np.ndarray, total: int, truth: _Truth,
                 progress: Callable[[int, int], Any] | None) -> None:
    """Pass 2: every row's vector and id written at its list's place in the new file
    ``path`` (the calibration queries' exact top-10 computed on the way); a table whose
    rows changed since pass 1 is an error."""
    rows, code = t.vocab_size, 4 * t.dim
    fill = np.zeros(len(sizes), np.uint64)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, max(total, 8))
        for start, vec, norms in scan_blocks(t, block):  # pass 2: a loop per block
            x, keep = _prepare(metric, vec, norms)
            ids = np.flatnonzero(keep).astype(np.int64) + start
            lab = labels[start:start + len(keep)][keep]
            truth.add(x, ids)
            order = np.argsort(lab, kind="stable")
            x, ids, lab = x[order], ids[order], lab[order]
            first = np.flatnonzero(np.r_[True, lab[1:] != lab[:-1]]) if len(lab) else \
                np.empty(0, np.int64)
            for a, b in zip(first, np.r_[first[1:], len(lab)]):  # a loop per list run
                j = int(lab[a])
                at, size = int(offsets[j]), int(sizes[j])
                os.pwrite(fd, x[a:b].tobytes(), at + int(fill[j]) * code)
                os.pwrite(fd, ids[a:b].tobytes(), at + size * code + int(fill[j]) * 8)
                fill[j] += b - a
            if progress is not None:
                progress((rows + start + len(keep)) // 2, rows)
        os.fsync(fd)
    finally:
        os.close(fd)
    if not np.array_equal(fill, sizes):
        raise TableChangedError(f"{t.path}: the table changed while its index was built "
                                f"(rows kept in pass 1: {int(sizes.sum())}, in pass 2: "
                                f"{int(fill.sum())}); build it again", path=t.path)


def _calibrate(index: "IvfIndex", truth: _Truth, nlist: int, recall: float,
               nprobe: int | None) -> tuple[int, float | None]:
    """The default search effort: ``nprobe`` if given, else the smallest number of lists
    (1, 2, 4, ... then bisected) whose recall@10 on the sample reaches ``recall``."""
    if not len(truth.ids):
        return int(nprobe or 1), None

    def measure(p: int) -> float:
        _, found = index.search(truth.q, _K + 1, p)
        found = np.where(found == truth.ids[:, None], -1, found)  # the row itself is out
        keep = np.argsort(found < 0, axis=1, kind="stable")[:, :_K]
        return truth.recall(np.take_along_axis(found, keep, axis=1))

    if nprobe:
        return int(nprobe), measure(int(nprobe))
    lo, hi, got = 0, 1, measure(1)
    while got < recall and hi < nlist:
        lo, hi = hi, min(nlist, hi * 2)
        got = measure(hi)
    best = (hi, got)
    while hi - lo > max(1, lo // 8):  # bisect to within an eighth
        mid = (lo + hi) // 2
        r = measure(mid)
        if r >= recall:
            hi, best = mid, (mid, r)
        else:
            lo = mid
    return best[0], round(best[1], 4)


def _open_all(path: Path, sums: dict | None) -> tuple[bytes, int, int | None]:
    """The bytes of ``index.faiss`` and open descriptors of ``lists.ivfdata`` (and, with
    ``sums``, ``lists.crc32c``), all of one build: opened through one descriptor of the
    directory (tried again when a rebuild removed the directory between), never through a
    symbolic link, never a FIFO or a device."""
    for attempt in range(3):
        d = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_NOFOLLOW)
        fds: list[int] = []
        try:
            for name in (INDEX_FILE, DATA_FILE, LIST_SUMS)[:3 if sums is not None else 2]:
                fds.append(open_regular(name, dir_fd=d, shown=path / name, nofollow=True))
            with os.fdopen(fds.pop(0), "rb") as f:
                raw = f.read(MAX_INDEX_BYTES + 1)
            return raw, fds[0], fds[1] if len(fds) > 1 else None
        except FileNotFoundError:
            for fd in fds:
                os.close(fd)
            try:
                moved = os.stat(path).st_ino != os.fstat(d).st_ino  # a rebuild swapped in
            except OSError:
                moved = False
            if attempt == 2 or not moved:
                raise
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            os.close(d)
    raise AssertionError("unreachable")


class IvfIndex:
    """An IVF index opened read-only, its lists mapped, checked as :mod:`embstore.store.annfiles`
    says (``meta``: its ``meta.json``, None while building)."""

    def __init__(self, path: Path, meta: dict | None = None):
        faiss = faiss_module()
        self.path = path
        name = path / INDEX_FILE
        # all files opened at once through one descriptor of the directory: a rebuild
        # swaps a new directory in (and removes the old) at any moment, and the lists of one
        # build under the header of another are garbage.  FAISS maps the lists through the
        # descriptor kept open here (a file removed meanwhile stays readable).
        self._lists: int | None = None
        self.data: np.ndarray | None = None
        self.list_crcs: np.ndarray | None = None
        self.sums = None if meta is None else check.check_meta(meta, path / "meta.json")
        try:
            raw, self._lists, sum_fd = _open_all(path, self.sums)
        except OSError as exc:
            if isinstance(exc, CorruptStoreError):
                raise
            raise IndexNotFoundError(f"{name}: unreadable index ({exc})", path=str(name)) from None
        try:
            if len(raw) > MAX_INDEX_BYTES:
                raise check.damaged(name, f"more than {MAX_INDEX_BYTES} bytes")
            check.file_sum(raw, INDEX_FILE, self.sums, name)
            self.header = h = check.parse_header(raw, name, DATA_FILE)
            check.check_header(h, meta, name)
            size = os.fstat(self._lists).st_size
            check.check_data_size(h, size, path / DATA_FILE)
            if self.sums is not None:
                if size != self.sums[DATA_FILE]["bytes"]:
                    raise check.damaged(path / DATA_FILE, f"{size} bytes, meta.json records "
                                                          f"{self.sums[DATA_FILE]['bytes']}")
                assert sum_fd is not None
                self.list_crcs = check.read_list_sums(sum_fd, h, self.sums, path / LIST_SUMS)
                self.data = map_file(self._lists, size, path / DATA_FILE)  # size checked
        except BaseException:
            self.close()
            raise
        finally:
            if sum_fd is not None:
                os.close(sum_fd)
        self.checked = np.zeros(h.nlist, bool)  # lists whose crc32c was checked
        self.all_checked = False
        held = Path(f"/proc/self/fd/{self._lists}")  # (Linux)
        data = os.fsencode(held if held.exists() else path.absolute() / DATA_FILE)
        patched = raw[:-h.tail] + struct.pack("<Q", len(data)) + data + raw[-8:]
        try:
            self.index = faiss.deserialize_index(np.frombuffer(patched, np.uint8),
                                                 faiss.IO_FLAG_READ_ONLY)
        except RuntimeError as exc:
            self.close()
            raise check.damaged(name, f"not a readable FAISS index "
                                      f"({str(exc).splitlines()[0][:200]})") from None
        lists = faiss.downcast_InvertedLists(self.index.invlists)
        if isinstance(lists, faiss.OnDiskInvertedLists):
            # no prefetch threads: page faults bring the probed lists in; and its threads
            # and locks do not survive fork (a search in a forked child crashed)
            lists.prefetch_nthread = 0
        self.nlist = int(self.index.nlist)
        self.ntotal = int(self.index.ntotal)
        self.dim = int(self.index.d)
        self._params = faiss.SearchParametersIVF
        self._faiss = faiss
        self._made: dict[int, Any] = {}

    def __len__(self) -> int:
        return self.ntotal

    def search(self, q: np.ndarray, count: int, nprobe: int
               ) -> tuple[np.ndarray, np.ndarray]:
        """Raw FAISS ``(distances, ids)``: inner products, or squared L2 distances."""
        p = int(max(1, min(nprobe, self.nlist)))
        params = self._made.get(p)
        if params is None:  # (read-only during a search: shared by threads)
            params = self._made[p] = self._params(nprobe=p)
        q = np.ascontiguousarray(q, dtype=np.float32)
        if self.sums is None:  # (an index built without checksums: nothing to check)
            return self.index.search(q, int(count), params=params)
        near, probed = self.index.quantizer.search(q, p)  # the lists FAISS would scan
        self.check_lists(probed)
        n, k = q.shape[0], int(count)
        dist, ids = np.empty((n, k), np.float32), np.empty((n, k), np.int64)
        ptr = self._faiss.swig_ptr  # (the Python wrapper of search_preassigned takes no params)
        self.index.search_preassigned_c(n, ptr(q), k, ptr(np.ascontiguousarray(probed)),
                                        ptr(np.ascontiguousarray(near)), ptr(dist), ptr(ids),
                                        False, params)
        return dist, ids

    def check_lists(self, lists: np.ndarray) -> None:
        """Check each of ``lists`` not checked yet against its crc32c (first touch)."""
        if self.all_checked:
            return
        todo = np.unique(lists[lists >= 0])
        todo = todo[~self.checked[todo]]
        if not todo.size:
            return
        if self.data is None or self.list_crcs is None:
            raise ValueError("the index is closed")
        bad = check.bad_lists(self.header, self.data, self.list_crcs, todo)
        if bad:
            a, b = self.header.span(bad[0])
            raise check.damaged(self.path / DATA_FILE, f"list {bad[0]} (bytes {a}..{b - 1}) "
                                f"fails its crc32c")
        self.checked[todo] = True
        self.all_checked = bool(self.checked.all())

    def close(self) -> None:
        self.index = None
        self.data = None
        fd, self._lists = self._lists, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # (interpreter shutdown)
            pass

"""The exact cosine scan behind :func:`embstore.search.stream.most_similar`.

One pass over the table in blocks (:func:`embstore.store.scan.scan_unread`: zero-copy views
of the mapped shards or chunk files where the layout allows; 128 MiB of rows then, else 32
MiB), each block cut in parts that the calling thread and helpers on the shared pool take
as each comes free (:class:`_Shared`; BLAS held to one thread meanwhile).  Format-2 rows
this handle has not checked yet are read instead (``preadv``, their pages checked as read)
8 MiB at a time, each piece scored while it is in cache, so the first scan after open reads
the rows once.  Per part:

- one matrix product of the rows with the unit queries, ``(rows, queries)``: ``rows @ q``
  for one query (BLAS's matrix-vector product on one thread, straight from the view of
  the mapped files; ``einsum`` for rows BLAS cannot take), ``rows @ Q.T`` for a batch (a batch of queries shares one read of the table, and the
  scores come out in the layout the rest works on, no transpose);
- a division (in place) by the rows' stored norms (``norms``, docs/FORMAT.md §3d; computed
  per block for tables without them).  An undefined cosine (a zero row or query) scores
  the lowest finite number instead of NaN, so it ranks below every real neighbour without
  a pass to find NaNs; it is reported as NaN;
- one comparison with each query's running threshold (the ``k``-th best score so far):
  only the few rows above it are kept and merged into the running top-``k``.  A block with
  many rows above it (the first one, or rows in rising order) is reduced by
  ``argpartition`` first (:func:`_block_top`).

The parts join the running top-``k`` in id order, as soon as the parts before them are in
(while the others are still being computed).  Ties rank by the lower id: the
running top-``k`` holds lower ids than any later part, so a later row needs a strictly
larger score.
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
import threadpoolctl

from ..fs.forksafe import renew_after_fork
from ..store.codecs import pool
from ..store.scan import (prefetch_rows, read_checked, rows_in_place, rows_view, scan_blocks,
                          scan_unread)
from ..table import Table
from .topk import sort_desc, top_k_columns

__all__ = ["cosine_top_k", "SCAN_BLOCK_BYTES", "VIEW_BLOCK_BYTES", "scan_block_rows"]

#: bytes of rows per block: large enough that the per-block work (a few NumPy calls, a
#: merge) is small against the product (1M x 256 f32: 32 MiB blocks measured ~15% faster
#: than 8 MiB for 32 queries, ~30% for one), small enough that the scores of a block
#: (``4 * rows * queries`` bytes) stay in cache for the division and comparison after it
SCAN_BLOCK_BYTES = 32 << 20
#: bytes of rows per block when they are read in place (views of the mapped shards: nothing
#: copied), the scores of a block held to ``SCAN_BLOCK_BYTES``: fewer blocks, less work
#: between products.  1M x 256 f32 (shards of 131,072 rows: blocks never cross a shard),
#: idle machine: one query, 32 MiB blocks 90-96 ms, 64 MiB 86-88 ms, 128 MiB 80-84 ms;
#: 32 queries, 32 MiB 334 ms, 128 MiB 297 ms
VIEW_BLOCK_BYTES = 128 << 20
#: bytes of rows read at a time into a part's buffer on a first scan of format-2 rows
PIECE_BYTES = 8 << 20
_MIN_PART_ROWS = 4096  # a block is split between the cores in parts of at least this
_PARTS = min(4, os.cpu_count() or 1)  # threads a block is split between (one per core)
_SHARES = 4  # parts per thread a block in place is cut in (taken by whichever is free)


def scan_block_rows(table: Table, n_queries: int, *, in_place: bool = False) -> int:
    """Rows per block: about ``SCAN_BLOCK_BYTES`` of rows plus their scores; rows read
    ``in_place``: ``VIEW_BLOCK_BYTES`` of rows, at most ``SCAN_BLOCK_BYTES`` of scores."""
    row_bytes = table.dim * table.dtype.itemsize
    score_bytes = 4 * max(1, n_queries)
    if in_place:
        rows = min(VIEW_BLOCK_BYTES // row_bytes, SCAN_BLOCK_BYTES // score_bytes)
    else:
        rows = SCAN_BLOCK_BYTES // (row_bytes + score_bytes)
    return int(max(256, min(rows, max(1, table.vocab_size))))


class _OneBlasThread:
    """BLAS held to one thread while any scan of this process runs (a context; nested and
    concurrent scans share one limit, restored when the last one ends): the scan splits
    each block's rows between the cores itself.  Measured on this shared 2-core machine
    (load 3-4), 1M x 256 f32 against 32 queries: two halves of each block on two
    single-threaded calls 0.61 s, one call on OpenBLAS's two threads 0.72-0.88 s."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._limit = None
        self._ctl: threadpoolctl.ThreadpoolController | None = None
        renew_after_fork(self, "_lock")

    def _after_fork(self) -> None:
        """A child forked during a scan has none of its threads: BLAS back to its own."""
        if self._limit is not None:
            self._limit.restore_original_limits()
        self._users, self._limit = 0, None

    def __enter__(self):
        with self._lock:
            if self._users == 0:
                if self._ctl is None:
                    self._ctl = threadpoolctl.ThreadpoolController()
                self._limit = self._ctl.limit(limits=1, user_api="blas")
            self._users += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._limit is not None:
                self._limit.restore_original_limits()
                self._limit = None


_one_blas_thread = _OneBlasThread()


def _part(rows: np.ndarray, qt: np.ndarray, norms: np.ndarray, out: np.ndarray) -> None:
    """``out = (rows @ qt) / norms`` (a zero row: 0 / 0, overwritten by the caller).
    One query (``qt`` 1-D): BLAS's matrix-vector product where the rows are laid out for it
    (each row contiguous, rows at any stride: a view of mapped chunk files too), else
    ``einsum``.  Measured on 131,072 x 256 float32 in RAM, one thread: ``einsum`` 19.0-19.6
    ms, ``matmul`` (sgemv) 12.6-13.7 ms, NumPy's own ``E_n @ q`` being the latter."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if qt.ndim == 1 and not _blas_rows(rows):
            np.einsum("ij,j->i", rows, qt, out=out[:, 0])
        elif qt.ndim == 1:
            np.matmul(rows, qt, out=out[:, 0])
        else:
            np.matmul(rows, qt, out=out)
        out /= norms[:, None]


def _blas_rows(rows: np.ndarray) -> bool:
    """Whether NumPy hands ``rows @ q`` to BLAS: contiguous rows, aligned, at a stride that
    is a whole number of elements."""
    item = rows.dtype.itemsize
    return (rows.dtype.kind == "f" and rows.strides[1] == item and rows.strides[0] % item == 0
            and rows.strides[0] >= rows.shape[1] * item and rows.flags.aligned)


def _piece(pieces: dict[int, np.ndarray], step: int, table: Table) -> np.ndarray:
    """The calling thread's buffer of ``step`` rows (made on its first piece)."""
    me = threading.get_ident()
    got = pieces.get(me)
    if got is None:
        got = pieces[me] = np.empty((step, table.dim), table.dtype)
    return got


class _Shared:
    """Parts ``0..m-1`` of a block, each computed by whichever thread takes it first: the
    caller (:meth:`joined`) and helpers on the pool (:meth:`run`).  A core the machine's other
    work holds back then does fewer parts instead of holding up the block: on this shared
    2-core machine (load 4-5) one query over 1M x 256 in two fixed halves took 18 ms at best
    but 34 ms in the median (NumPy in RAM: 21 / 23 ms); in parts taken as threads come free,
    0.95x NumPy's median where the halves were 1.06x in the same conditions."""

    def __init__(self, m: int, fn):
        self.m, self.fn = m, fn
        self._next = iter(range(m)).__next__  # (atomic under the GIL)
        self.done = [threading.Event() for _ in range(m)]
        self.error: BaseException | None = None

    def _take(self) -> int:
        try:
            return self._next()
        except StopIteration:
            return -1

    def run(self) -> None:
        """(A helper) parts until none is left; a helper that starts late finds none."""
        while (j := self._take()) >= 0:
            try:
                self.fn(j)
            except BaseException as exc:  # noqa: BLE001 - raised by the caller
                self.error = exc
            finally:
                self.done[j].set()

    def joined(self, cuts: list[int]):
        """(The caller) parts until none is left, then ``(a, z)``: the rows of the parts
        finished in id order (consecutive finished parts at once), each once; the caller's
        own work goes on between them."""
        head = 0
        while True:
            j = self._take()
            if j >= 0:
                self.fn(j)
                self.done[j].set()
            elif head < self.m:
                self.done[head].wait()
            end = head
            while end < self.m and self.done[end].is_set():
                end += 1
            if self.error is not None:
                raise self.error
            if end > head:
                yield cuts[head], cuts[end]
                head = end
            if head == self.m:
                return


def _cuts(b: int, parts: int) -> list[int]:
    """Bounds of the ``parts`` ranges (of at least ``_MIN_PART_ROWS``) a block is split in."""
    parts = max(1, min(parts, b // _MIN_PART_ROWS))
    return [b * i // parts for i in range(parts + 1)]


def _odd_rows(rows: np.ndarray, q: np.ndarray, low) -> np.ndarray:
    """Cosines ``(r, n)`` of rows whose norm is 0, NaN or inf (stored as inf when it passes
    the largest float32): scaled by their largest element, in float64; ``low`` where
    undefined (a zero row)."""
    r = rows.astype(np.float64)
    top = np.abs(r).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        r /= top
        s = (r @ q.T.astype(np.float64)) / np.sqrt(np.einsum("ij,ij->i", r, r))[:, None]
    s[~np.isfinite(s)] = low
    return s.astype(q.dtype)


def _block_top(s: np.ndarray, k: int) -> np.ndarray:
    """Columns ``(n, min(k, b))``, ascending, of the ``k`` best rows of each column of the
    scores ``s`` (``(b, n)``; lowest rows among ties)."""
    b, n = s.shape
    st = s.T
    if b <= k:
        return np.broadcast_to(np.arange(b), (n, b))
    idx = np.argpartition(st, b - k, axis=1)[:, b - k:]
    kth = np.take_along_axis(st, idx, axis=1).min(axis=1)
    exact = np.count_nonzero(st >= kth[:, None], axis=1) == k
    if not exact.all():  # ties across the boundary (or -inf, excluded rows, among the best)
        bad = np.flatnonzero(~exact)
        idx[bad] = top_k_columns(st[bad], k)
    return np.sort(idx, axis=1)


class _Best:
    """The running top-``k`` of ``n`` queries: ``vals``/``ids`` ``(n, k)`` with ids
    ascending along each row (places not yet filled: -inf, id -1), and ``thr`` the k-th
    best score of each query (a later row must beat it)."""

    def __init__(self, n: int, k: int, dtype):
        self.k = k
        self.vals = np.full((n, k), -np.inf, dtype)
        self.ids = np.full((n, k), -1, np.int64)
        self.thr = np.full(n, -np.inf, dtype)
        self.empty = True  # nothing kept yet
        self.cap = 4 * n * k + 256  # more rows above the thresholds: partition the block

    def add(self, s: np.ndarray, start: int, head: bool = True) -> None:
        """Merge the scores ``s`` (``(b, n)``, C-contiguous) of rows ``start..``."""
        b, n = s.shape
        above: np.ndarray | None = None
        if n == 1:  # one query: the rows above its threshold, in one pass
            rows = np.flatnonzero(s[:, 0] > self.thr[0])
            if not rows.size:
                return
            if rows.size <= self.cap:
                self._merge(s[rows, 0][None, :], (rows + start)[None, :])
                return
            count = int(rows.size)  # (many: partitioned below)
        else:
            above = s > self.thr
            count = int(np.count_nonzero(above))
        if not count:
            return
        if count > self.cap:
            h = b // 4
            if head and h * n > 4 * self.cap:  # (the first block) thresholds from a quarter
                self.add(s[:h], start, False)
                self.add(s[h:], start + h, False)
                return
            cols = _block_top(s, self.k)
            self._merge(np.take_along_axis(s.T, cols, axis=1), cols + start)
            return
        assert above is not None  # (one query never gets here)
        flat = np.flatnonzero(above)  # by row, then query
        row, query = np.divmod(flat, n)
        order = np.argsort(query, kind="stable")  # by query, then row
        row, query, vals = row[order], query[order], s.reshape(-1)[flat[order]]
        per = np.bincount(query, minlength=n)
        place = np.arange(count) - np.repeat(np.cumsum(per) - per, per)
        width = int(per.max())
        v = np.full((n, width), -np.inf, s.dtype)
        i = np.full((n, width), -1, np.int64)
        v[query, place] = vals
        i[query, place] = row + start
        self._merge(v, i)

    def _merge(self, v: np.ndarray, i: np.ndarray) -> None:
        if self.empty and v.shape[1] == self.k:  # the first block's best: nothing to merge
            self.vals, self.ids, self.empty = v, np.ascontiguousarray(i), False
            self.thr = v.min(axis=1)
            return
        self.empty = False
        vals = np.concatenate([self.vals, v], axis=1)  # kept (lower ids) first
        ids = np.concatenate([self.ids, i], axis=1)
        cols = top_k_columns(vals, self.k)
        self.vals = np.take_along_axis(vals, cols, axis=1)
        self.ids = np.take_along_axis(ids, cols, axis=1)
        self.thr = self.vals.min(axis=1)


def cosine_top_k(table: Table, q: np.ndarray, k: int, *, exclude: np.ndarray,
                 own: np.ndarray | None, block_rows: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, ids)``, ``(n, k)`` sorted by descending cosine, of the unit queries ``q``
    (``(n, dim)``, the compute dtype; zero rows for zero queries) against every row.

    ``exclude`` (sorted ids) and each query's ``own`` id score ``-inf``: the caller turns
    places holding them (and places left empty: id -1) into id -1."""
    scan = _Scan(table, q, k, exclude=exclude, own=own, block_rows=block_rows)
    with (_one_blas_thread if _PARTS > 1 else contextlib.nullcontext()), \
            np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for start, stop, rows, norms in scan.blocks():
            if rows is None:  # format-2 rows this handle has not checked yet: read, scored
                assert norms is not None
                scan.read_and_score(start, stop, norms)
            else:
                scan.score(start, rows, norms)
    vals, ids = sort_desc(scan.best.vals, scan.best.ids)
    vals[vals == scan.low] = np.nan
    return vals, ids


class _Scan:
    """One pass of :func:`cosine_top_k` over ``table``: each block's scores computed in
    parts by whichever thread is free (:class:`_Shared`), fixed where a cosine is
    undefined or excluded, and kept in the running top-``k`` (:class:`_Best`)."""

    def __init__(self, table: Table, q: np.ndarray, k: int, *, exclude: np.ndarray,
                 own: np.ndarray | None, block_rows: int | None):
        n = q.shape[0]
        dtype = q.dtype
        self.table, self.q, self.exclude, self.own = table, q, exclude, own
        self.low = -np.finfo(dtype).max  # an undefined cosine (reported as NaN)
        self.bad_q = np.flatnonzero(~(np.isfinite(q).all(axis=1) & q.any(axis=1)))
        self.qt = q[0] if n == 1 else q.T
        self.best = _Best(n, k, dtype)
        self.buf: np.ndarray | None = None  # rows of another dtype, converted
        self.in_place = table.dtype == dtype and rows_in_place(table)
        self.rows_per = block_rows or scan_block_rows(table, n, in_place=self.in_place)
        self.sbuf = np.empty((self.rows_per, n), dtype)
        self.pieces: dict[int, np.ndarray] = {}  # a buffer per thread for rows read piece by piece
        self.step = 0  # rows of a piece

    def blocks(self):
        """``(start, stop, rows, norms)`` of every block; ``rows`` None: format-2 rows this
        handle has not checked yet (``norms`` given)."""
        table, rows_per = self.table, self.rows_per
        return scan_unread(table, rows_per, reuse=True) if self.in_place else (
            (a, a + r.shape[0], r, m) for a, r, m in scan_blocks(table, rows_per, reuse=True))

    def read_and_score(self, start: int, stop: int, norms: np.ndarray) -> None:
        """Rows ``start..stop`` read piece by piece (their pages checked as read), each
        piece scored while it is in cache."""
        table, qt, b = self.table, self.qt, stop - start
        if not self.step:
            self.step = 1 << max(0, (PIECE_BYTES // (table.dim * table.dtype.itemsize))
                                 .bit_length() - 1)
        step, pieces = self.step, self.pieces
        prefetch_rows(table, start, stop)  # (cold: its pages asked for at once)
        s = self.sbuf[:b]
        # pieces aligned to their length (never across a chunk file), each read and
        # scored by whichever thread takes it, into that thread's own buffer
        cuts = sorted({0, b, *range(step - start % step, b, step)})
        work = _Shared(len(cuts) - 1, lambda j, c=cuts, s=s, nm=norms, a0=start: _part(
            read_checked(table, a0 + c[j], a0 + c[j + 1], _piece(pieces, step, table)
                         [: c[j + 1] - c[j]]), qt, nm[c[j]:c[j + 1]], s[c[j]:c[j + 1]]))
        for _ in range(min(_PARTS, len(cuts) - 1) - 1):
            pool().submit(work.run)
        for a, z in work.joined(cuts):
            self._keep(start + a, rows_view(table, start + a, start + z), norms[a:z], s[a:z])

    def score(self, start: int, rows: np.ndarray, norms: np.ndarray | None) -> None:
        """The rows ``start..`` of a block in memory (converted to the queries' dtype into
        one reused buffer; norms computed if the table stores none) scored in parts."""
        b, dtype, qt = rows.shape[0], self.q.dtype, self.qt
        if rows.dtype != dtype:  # into one reused buffer
            if self.buf is None or self.buf.shape[0] < b:
                self.buf = np.empty((self.rows_per, self.q.shape[1]), dtype)
            np.copyto(self.buf[:b], rows, casting="unsafe")
            rows = self.buf[:b]
        if norms is None:
            norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        cuts = _cuts(b, _PARTS * _SHARES)
        s = self.sbuf[:b]  # (b, n), C-contiguous
        # the parts taken by whichever thread is free (the caller and the pool's helpers);
        # finished parts join the running top-k in id order (ties rank by the lower id)
        work = _Shared(len(cuts) - 1, lambda j, r=rows, c=cuts, s=s, nm=norms: _part(
            r[c[j]:c[j + 1]], qt, nm[c[j]:c[j + 1]], s[c[j]:c[j + 1]]))
        for _ in range(min(_PARTS, len(cuts) - 1) - 1):
            pool().submit(work.run)
        for a, z in work.joined(cuts):
            self._keep(start + a, rows[a:z], norms[a:z], s[a:z])

    def _keep(self, start: int, rows: np.ndarray, norms: np.ndarray, s: np.ndarray) -> None:
        """Fix the scores ``s`` of rows ``start..`` (odd rows, bad queries, excluded ids),
        then keep the best."""
        b, exclude, own = rows.shape[0], self.exclude, self.own
        odd = np.flatnonzero(~((norms > 0) & (norms < np.inf)))
        if odd.size:  # zero rows (0 / 0), rows whose norm overflows
            s[odd] = _odd_rows(rows[odd], self.q, self.low)
        if self.bad_q.size:
            s[:, self.bad_q] = self.low
        lo, hi = np.searchsorted(exclude, (start, start + b))
        if hi > lo:
            s[exclude[lo:hi] - start] = -np.inf
        if own is not None:
            mine = np.flatnonzero((own >= start) & (own < start + b))
            s[own[mine] - start, mine] = -np.inf
        self.best.add(s, start)

"""The trainer behind a trainable ``embstore.torch`` module (issue 40; docs/training.md).

:class:`Trainer` owns a table's training: the write-back row cache, the optimizer rule,
the prefetcher, persistent buffers and (for an on-disk table) the
:class:`~embstore.train.persist.TrainStore` with the optimizer state and checkpoints.

- :meth:`gather` (the forward): the batch's unique ids (one stable ``argsort``), their
  slots in the cache (missing rows read once), then one ``np.take`` of the rows into a
  reused output buffer; the result is a tensor over that buffer.
- :meth:`apply` (the backward): the gradient summed per unique row (over the sorted
  gradient, :func:`~.rules.segment_sum`, into persistent buffers), the optimizer
  applied to those rows of the cache in place, each marked dirty: each row is updated
  once a step.
- :meth:`checkpoint`: every dirty row (and its state) written back, then the checkpoint
  recorded; returns the rows' version.

Output buffers are reused once nothing refers to them any more (the tensor returned and
whatever autograd saved of it): a steady training loop cycles through two or three.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidOptionError, InvalidTypeError
from ..ids import parse_bytes
from ..memory import MemoryTable
from ..optional import require
from ..store.table import ZarrTable
from ..table import Table
from .cache import WriteBackCache
from .heap import bound_heap, trim_heap
from .persist import TrainStore
from .prefetch import Prefetcher
from .rules import make_rule, segment_sum

if TYPE_CHECKING:
    import torch
else:
    torch = require("torch", extra="torch", feature="embstore.torch training")

__all__ = ["Trainer", "AUTO_CACHE_BYTES"]

#: the row cache of ``row_cache_bytes="auto"``: the whole table (with its state) up to this
AUTO_CACHE_BYTES = 1 << 30
_MAX_BUFFERS = 6


class _Buffers:
    """Flat float32 buffers handed out again once nothing else refers to them."""

    def __init__(self) -> None:
        self._bufs: list[np.ndarray] = []

    def get(self, n: int) -> np.ndarray:
        for b in self._bufs:  # a loop per buffer (two or three)
            if b.size >= n and sys.getrefcount(b) <= 3:  # the list, `b`, the argument
                return b
        if len(self._bufs) >= _MAX_BUFFERS:  # drop a free one that is too small
            free = [i for i, b in enumerate(self._bufs) if sys.getrefcount(b) <= 3]
            if free:
                del self._bufs[free[0]]
        b = np.empty(max(1, n), np.float32)
        self._bufs.append(b)
        return b


class Trainer:
    """Training of ``table`` (float32, writable) with ``optimizer`` (see the module doc)."""

    def __init__(self, table: Table, optimizer: str, *, lr: float = 0.01, eps: float = 1e-8,
                 row_cache_bytes="auto", resume: int | None = None,
                 padding_idx: int | None = None):
        if table.dtype != np.float32 or table.storage_dtype != "float32":
            raise InvalidOptionError(f"training needs a float32 table, got "
                                     f"{table.storage_dtype}")
        if isinstance(table, ZarrTable) and table.mode != "r+":
            raise InvalidOptionError(f"{table.path}: training writes the table: open it with "
                                     "mode='r+'")
        if not isinstance(table, (ZarrTable, MemoryTable)):
            raise InvalidTypeError(f"training needs an on-disk table opened 'r+' or a "
                                   f"MemoryTable, got {type(table).__name__}")
        self.rule = make_rule(optimizer, lr, eps)
        self.table, self.padding_idx = table, padding_idx
        self.store: TrainStore | None = None
        state: Table | None = None
        if isinstance(table, ZarrTable):
            bound_heap()  # (the heap's growth would count against the row cache's bound)
            self.store = TrainStore(table, self.rule.name, self.rule.state_cols, resume)
            state, write_back, self.step = self.store.state, self.store.write_back, \
                self.store.step
        else:
            if self.rule.state_cols:
                state = MemoryTable(np.zeros((table.vocab_size, self.rule.state_cols),
                                             np.float32))
            write_back, self.step = self._write_memory, 0
        self._state_table = state
        row_bytes = 4 * (table.dim + self.rule.state_cols) + 17
        try:
            cap = (min(AUTO_CACHE_BYTES, row_bytes * table.vocab_size)
                   if row_cache_bytes == "auto" else parse_bytes(row_cache_bytes))
            self.cache = WriteBackCache(table, state, cap, write_back, flush_back=None if
                                        self.store is None else self.store.flush_back)
        except BaseException:
            if self.store is not None:  # (its lock and leases)
                self.store.close()
            raise
        self.prefetcher = Prefetcher(self.cache)
        self.cache.before_write = self.prefetcher.wait
        self._outs = _Buffers()
        self._scratch_n = -1
        self._bufs: tuple[np.ndarray, ...] = ()
        self.anchor = torch.zeros(0, requires_grad=True)  # makes autograd call the backward

    def _write_memory(self, ids: np.ndarray, rows: np.ndarray, state: np.ndarray) -> None:
        if self._state_table is not None:
            self._state_table.write(ids, state)
        self.table.write(ids, rows)

    # -- forward and backward ----------------------------------------------------------
    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, tuple]:
        """``(rows, batch)``: rows of the int64 ``ids`` (validated) as an
        ``(ids.size, dim)`` view of a reused buffer, and what :meth:`apply` needs of the
        batch: its unique ids and how the ids sort into them."""
        flat = ids.reshape(-1)
        n, d = flat.size, self.table.dim
        perm = np.argsort(flat, kind="stable")  # (stable: sums in the order of the batch)
        ordered = flat[perm]
        head = np.empty(n, bool)
        head[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=head[1:])
        starts = np.flatnonzero(head)
        uniq = ordered[starts]
        inv = np.empty(n, np.int64)
        inv[perm] = np.cumsum(head) - 1
        slots = self.cache.resolve(uniq, self.prefetcher.staged_for)
        out = self._outs.get(n * d)[: n * d].reshape(n, d)
        np.take(self.cache.rows, slots[inv], axis=0, out=out, mode="clip")
        return out, (uniq, perm, starts)

    def _scratch(self, n: int, u: int) -> tuple[np.ndarray, ...]:
        """Buffers for ``n`` gathered rows and ``u`` unique ones (sized for ``u == n``:
        a batch's unique count varies, its size mostly not)."""
        d = self.table.dim
        if self._scratch_n < n:  # grows to the largest batch, then stays
            self._scratch_n = n
            self._bufs = tuple(np.empty((n, d), np.float32) for _ in range(4))
        big, a, b, c = self._bufs
        return big[:n], a[:u], b[:n], c[:n]

    def apply(self, batch: tuple, grad: torch.Tensor) -> None:
        """The backward: the optimizer on the batch's rows given ``grad``, the gradient of
        the gathered rows: summed per unique row (in the order of the batch), applied to
        each row once."""
        uniq, perm, starts = batch
        d = self.table.dim
        g = grad.detach()
        if g.dtype != torch.float32 or g.device.type != "cpu":
            g = g.to(device="cpu", dtype=torch.float32)
        g_np = g.reshape(-1, d).numpy()
        ordered, gs, tmp, tmp2 = self._scratch(perm.size, uniq.size)
        np.take(g_np, perm, axis=0, out=ordered, mode="clip")
        segment_sum(ordered, starts, gs, (tmp, tmp2))
        if self.padding_idx is not None:  # as torch: the padding row gets no gradient
            at = int(np.searchsorted(uniq, self.padding_idx))
            if at < uniq.size and uniq[at] == self.padding_idx:
                gs[at] = 0
        slots = self.cache.resolve(uniq)  # (again: another forward may have moved them)
        self.rule.apply(self.cache.rows, self.cache.state, slots, gs, tmp[: uniq.size],
                        tmp2[: uniq.size])
        self.cache.dirty[slots] = True
        self.step += 1

    # -- the rest --------------------------------------------------------------------
    def prefetch(self, ids: np.ndarray) -> int:
        return self.prefetcher.start(ids)

    def flush(self) -> int:
        """Write every dirty row (and its state) to the table; returns how many."""
        return self.cache.flush()

    def checkpoint(self) -> int:
        self.prefetcher.wait()
        if self.store is None:
            self.cache.flush()
            return int(self.table.version)
        trim_heap()  # (the steps' freed temporaries, before the flush's blocks)
        return self.store.checkpoint(self.step, self.cache.flush)

    def state_of(self, ids) -> np.ndarray:
        """The optimizer state of rows ``ids`` (their newest values; (n, 0) for SGD)."""
        return self.cache.peek(np.asarray(ids, np.int64).reshape(-1), state=True)

    def close(self, *, checkpoint: bool = True) -> None:
        """Checkpoint (unless told not to) and let go of the state and the lock."""
        try:
            if checkpoint:
                self.checkpoint()
        finally:
            self.prefetcher.close()
            if self.store is not None:
                self.store.close()
                self.store = None

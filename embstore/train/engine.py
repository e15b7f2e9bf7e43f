"""The trainer behind a trainable ``embstore.torch`` module (issue 40; docs/training.md).

:class:`Trainer` owns a table's training: the write-back row cache, the optimizer rule,
the prefetcher, persistent buffers and (for an on-disk table) the
:class:`~embstore.train.persist.TrainStore` with the optimizer state and checkpoints.

- :meth:`gather` (the forward): the batch's unique ids (``np.unique``), their slots in
  the cache (missing rows read once), then one ``np.take`` of the rows into a reused
  output buffer; the result is a tensor over that buffer.
- :meth:`apply` (the backward): the gradient summed per unique row (one
  ``index_add_`` into a persistent buffer), the optimizer applied to those rows of the
  cache in place, each marked dirty: each row is updated once a step.
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
from .persist import TrainStore
from .prefetch import Prefetcher
from .rules import make_rule

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
        cap = (min(AUTO_CACHE_BYTES, row_bytes * table.vocab_size)
               if row_cache_bytes == "auto" else parse_bytes(row_cache_bytes))
        self.cache = WriteBackCache(table, state, cap, write_back)
        self.prefetcher = Prefetcher(self.cache)
        self.cache.before_write = self.prefetcher.wait
        self._rows_t = torch.from_numpy(self.cache.rows)
        self._state_t = torch.from_numpy(self.cache.state)
        self._outs = _Buffers()
        self._grad = torch.empty((0, table.dim), dtype=torch.float32)
        self._tmp = torch.empty((0, table.dim), dtype=torch.float32)
        self.anchor = torch.zeros(0, requires_grad=True)  # makes autograd call the backward

    def _write_memory(self, ids: np.ndarray, rows: np.ndarray, state: np.ndarray) -> None:
        if self._state_table is not None:
            self._state_table.write(ids, state)
        self.table.write(ids, rows)

    # -- forward and backward ----------------------------------------------------------
    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, uniq, inverse)``: rows of the int64 ``ids`` (validated) as an
        ``(ids.size, dim)`` view of a reused buffer."""
        flat = ids.reshape(-1)
        uniq, inv = np.unique(flat, return_inverse=True)
        slots = self.cache.resolve(uniq, self.prefetcher.staged_for)
        d = self.table.dim
        out = self._outs.get(flat.size * d)[: flat.size * d].reshape(flat.size, d)
        np.take(self.cache.rows, slots[inv.reshape(-1)], axis=0, out=out, mode="clip")
        return out, uniq, inv.reshape(-1)

    def apply(self, uniq: np.ndarray, inv: np.ndarray, grad: torch.Tensor) -> None:
        """The backward: the optimizer on the rows ``uniq`` with the gradient ``grad`` of
        the gathered rows (``inv``: each gathered row's place in ``uniq``)."""
        d = self.table.dim
        g = grad.detach().reshape(-1, d)
        if g.dtype != torch.float32 or g.device.type != "cpu":
            g = g.to(device="cpu", dtype=torch.float32)
        u = uniq.size
        if self._grad.shape[0] < u:  # grows to the largest batch, then stays
            self._grad = torch.empty((u, d), dtype=torch.float32)
            self._tmp = torch.empty((u, d), dtype=torch.float32)
        gs, tmp = self._grad[:u], self._tmp[:u]
        gs.zero_()
        gs.index_add_(0, torch.from_numpy(inv), g)
        if self.padding_idx is not None:  # as torch: the padding row gets no gradient
            at = int(np.searchsorted(uniq, self.padding_idx))
            if at < u and uniq[at] == self.padding_idx:
                gs[at] = 0
        slots = self.cache.resolve(uniq)  # (again: another forward may have moved them)
        self.rule.apply(self._rows_t, self._state_t, torch.from_numpy(slots), gs, tmp)
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
        self.cache.flush()
        if self.store is None:
            return int(self.table.version)
        return self.store.checkpoint(self.step)

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

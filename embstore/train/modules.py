"""The forwards of trainable ``embstore.torch.Embedding`` / ``EmbeddingBag`` (issue 40).

:class:`Gather` is the autograd function: its forward gathers rows through the
:class:`~embstore.train.engine.Trainer` (a reused buffer), its backward hands the rows'
gradient to :meth:`Trainer.apply`, which updates the table's rows in place (there is no
weight parameter and no gradient for a torch optimizer).  Bags pool the gathered rows
with torch operations (``index_add_``), so autograd carries the gradient back to each
entry's row, and to ``per_sample_weights`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidOptionError, ShapeMismatchError
from ..ids import as_ids
from ..optional import require
from ..pooling import bag_bounds
from ..table import Table
from .engine import Trainer

if TYPE_CHECKING:
    import torch
else:
    torch = require("torch", extra="torch", feature="embstore.torch training")

__all__ = ["Gather", "embedding_forward", "bag_forward", "Trainable", "prefetching"]


def prefetching(batches: Iterable, *modules: Trainable,
                ids: Callable[[Any], Any] = lambda batch: batch) -> Iterator:
    """The batches of ``batches`` (a DataLoader, any iterable), each yielded once every
    module has started reading the *next* batch's rows (``ids(batch)``: a batch's ids for
    the modules, by default the batch itself)."""
    it = iter(batches)
    for cur in it:  # (the first batch)
        for nxt in it:  # a loop per batch
            for m in modules:  # a loop per module (one or two)
                m.prefetch(ids(nxt))
            yield cur
            cur = nxt
        yield cur


def _ids(value, vocab_size: int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return as_ids(value, vocab_size)


class Trainable:
    """What a trainable module adds (``self._trainer``: a Trainer or None; issue 40)."""

    _trainer: Trainer | None
    _table: Table

    @property
    def trainer(self) -> Trainer | None:
        """What trains the table (None: a frozen module)."""
        return self._trainer

    def _training(self) -> Trainer:
        if self._trainer is None:
            raise InvalidOptionError("this module has no optimizer (pass optimizer='sgd' or "
                                     "'rowwise_adagrad' to train its table)")
        return self._trainer

    @property
    def step(self) -> int:
        """Backward passes applied to the table (resumed from a checkpoint)."""
        return self._training().step

    def checkpoint(self) -> int:
        """Write every updated row and its optimizer state to the table, commit, and record
        the checkpoint; returns the rows' version (``embstore.open(path, version=N)``)."""
        return self._training().checkpoint()

    def flush(self) -> int:
        """Write the updated rows back to the table (no checkpoint); returns how many."""
        return self._training().flush()

    def prefetch(self, input) -> int:  # noqa: A002 (torch's name)
        """Read the rows of the next batch's ids ahead (a background thread) that the row
        cache lacks; returns how many."""
        return self._training().prefetch(_ids(input, self._table.vocab_size))

    def optimizer_state(self, input) -> np.ndarray:  # noqa: A002
        """The optimizer state of rows ``input`` ((n, 1) float32 for row-wise Adagrad)."""
        return self._training().state_of(_ids(input, self._table.vocab_size))



class Gather(torch.autograd.Function):
    """``Gather.apply(anchor, trainer, ids)``: rows of ``ids`` (validated int64, 1-D),
    trained by the backward."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, trainer: Trainer,
                ids: np.ndarray) -> torch.Tensor:
        rows, batch = trainer.gather(ids)
        ctx.trainer, ctx.batch = trainer, batch
        return torch.from_numpy(rows)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        ctx.trainer.apply(ctx.batch, grad)
        return None, None, None


def _rows(trainer: Trainer, flat: np.ndarray) -> torch.Tensor:
    """Rows of the 1-D ids ``flat``: trained when autograd records, else a fresh copy of
    their newest values (evaluation)."""
    if torch.is_grad_enabled():
        return Gather.apply(trainer.anchor, trainer, flat)
    return torch.from_numpy(trainer.cache.peek(flat))


def embedding_forward(trainer: Trainer, ids: np.ndarray) -> torch.Tensor:
    out = _rows(trainer, ids.reshape(-1))
    return out.view(*ids.shape, trainer.table.dim)


def _bag_index(ids: np.ndarray, offsets, include_last_offset: bool
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """``(flat ids, bag of each entry, number of bags)``."""
    if ids.ndim == 2:
        if offsets is not None:
            raise ShapeMismatchError(f"offsets must be None when ids is 2-D (fixed-length "
                                     f"bags), got ids of shape {ids.shape} and offsets")
        nbags, length = ids.shape
        return ids.reshape(-1), np.repeat(np.arange(nbags, dtype=np.int64), length), nbags
    if ids.ndim != 1 or offsets is None:
        raise ShapeMismatchError(f"bag takes 2-D ids (fixed-length bags) or 1-D ids with "
                                 f"offsets, got shape {ids.shape}"
                                 + ("" if ids.ndim != 1 else " and no offsets"))
    starts, ends = bag_bounds(offsets, ids.size, include_last_offset)
    bag = np.repeat(np.arange(starts.size, dtype=np.int64), ends - starts)
    return ids, bag, int(starts.size)


def bag_forward(trainer: Trainer, ids: np.ndarray, offsets, weights: torch.Tensor | None,
                *, mode: str, include_last_offset: bool) -> torch.Tensor:
    """Bags of rows (``mode`` "sum" or "mean"), as :meth:`embstore.Embedding.bag`:
    padding entries left out (of a mean's count too), empty bags zero, a weighted mean
    ``sum(w*x) / sum(w)`` (zero where the weights sum to zero)."""
    if mode not in ("sum", "mean"):
        raise InvalidOptionError(f"a trained EmbeddingBag pools with 'sum' or 'mean', got "
                                 f"{mode!r}")
    flat, bag, nbags = _bag_index(ids, offsets, include_last_offset)
    d = trainer.table.dim
    if weights is not None and tuple(weights.shape) != tuple(ids.shape):
        raise ShapeMismatchError(f"per_sample_weights must have the shape of the ids "
                                 f"{tuple(ids.shape)}, got {tuple(weights.shape)}")
    w = None if weights is None else weights.reshape(-1).to(torch.float32)
    if trainer.padding_idx is not None:
        keep = torch.from_numpy(flat != trainer.padding_idx).to(torch.float32)
        w = keep if w is None else w * keep
    bag_t = torch.from_numpy(bag)
    if mode == "mean":
        ones = w if w is not None else torch.ones(flat.size)
        denom = torch.zeros(nbags).index_add_(0, bag_t, ones)[bag_t]
        safe = torch.where(denom == 0, torch.ones_like(denom), denom)
        w = torch.where(denom == 0, torch.zeros_like(denom), ones / safe)
    rows = _rows(trainer, flat)
    if w is not None:
        rows = rows * w.unsqueeze(1)
    return torch.zeros((nbags, d), dtype=torch.float32).index_add_(0, bag_t, rows)

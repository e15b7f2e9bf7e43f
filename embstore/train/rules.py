"""The sparse optimizers a trained table applies in the backward (issue 40).

Each rule updates the rows of a step's unique ids in place, given ``g``, each row's
gradient summed over its occurrences in the batch (FBGEMM's convention):

- ``"sgd"``: ``row -= lr * g`` (as ``torch.optim.SGD`` on a sparse gradient);
- ``"rowwise_adagrad"``: one float32 of state per row; ``state += mean(g**2)`` over the
  row's dims, then ``row -= lr * g / (sqrt(state) + eps)`` (FBGEMM's
  ``EXACT_ROWWISE_ADAGRAD``).

Rows and state are torch tensors over the row cache's arrays (no copy); ``tmp`` is a
persistent scratch buffer of ``g``'s shape, so a step allocates nothing of the batch's size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidOptionError
from ..optional import require

if TYPE_CHECKING:
    import torch
else:
    torch = require("torch", extra="torch", feature="embstore.torch training")

__all__ = ["Rule", "make_rule", "OPTIMIZERS"]


class Rule:
    """An optimizer of rows: ``state_cols`` float32 of state per row."""

    name = ""
    state_cols = 0

    def __init__(self, lr: float, eps: float):
        if not (isinstance(lr, (int, float)) and lr >= 0):
            raise InvalidOptionError(f"lr must be a number >= 0, got {lr!r}")
        if not (isinstance(eps, (int, float)) and eps >= 0):
            raise InvalidOptionError(f"eps must be a number >= 0, got {eps!r}")
        self.lr, self.eps = float(lr), float(eps)

    def apply(self, rows: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
              g: torch.Tensor, tmp: torch.Tensor) -> None:
        raise NotImplementedError

    def options(self) -> dict:
        return {"optimizer": self.name, "lr": self.lr, "eps": self.eps}


class SGD(Rule):
    name = "sgd"

    def apply(self, rows, state, slots, g, tmp) -> None:
        rows.index_add_(0, slots, g, alpha=-self.lr)


class RowwiseAdagrad(Rule):
    name = "rowwise_adagrad"
    state_cols = 1

    def apply(self, rows, state, slots, g, tmp) -> None:
        flat = state.view(-1)
        acc = flat.index_select(0, slots)
        torch.mul(g, g, out=tmp)
        acc += tmp.mean(dim=1)
        flat.index_copy_(0, slots, acc)
        acc.sqrt_().add_(self.eps)
        torch.div(g, acc.unsqueeze(1), out=tmp)
        rows.index_add_(0, slots, tmp, alpha=-self.lr)


OPTIMIZERS: dict[str, type[Rule]] = {"sgd": SGD, "rowwise_adagrad": RowwiseAdagrad}


def make_rule(optimizer: str, lr: float, eps: float) -> Rule:
    if optimizer not in OPTIMIZERS:
        raise InvalidOptionError(f"optimizer must be one of "
                                 f"{', '.join(map(repr, OPTIMIZERS))}, got {optimizer!r}")
    return OPTIMIZERS[optimizer](lr, eps)

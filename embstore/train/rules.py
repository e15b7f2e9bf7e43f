"""The sparse optimizers a trained table applies in the backward (issue 40).

Each rule updates the rows of a step's unique ids in place, given ``g``, each row's
gradient summed over its occurrences in the batch (FBGEMM's convention):

- ``"sgd"``: ``row -= lr * g`` (as ``torch.optim.SGD`` on a sparse gradient);
- ``"rowwise_adagrad"``: one float32 of state per row; ``state += mean(g**2)`` over the
  row's dims, then ``row -= lr * g / (sqrt(state) + eps)`` (FBGEMM's
  ``EXACT_ROWWISE_ADAGRAD``).

Rows and state are the row cache's arrays, updated in place with NumPy (single-threaded:
a trainer's work is gathers and scatters of a batch's rows, which torch's thread pool only
slows down on a busy machine); ``tmp`` and ``tmp2`` are persistent scratch buffers of
``g``'s shape, so a step allocates nothing of the batch's size.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidOptionError

__all__ = ["Rule", "make_rule", "OPTIMIZERS", "segment_sum"]


def segment_sum(ordered: np.ndarray, starts: np.ndarray, out: np.ndarray,
                scratch: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Sums of the runs of rows of ``ordered`` that begin at ``starts`` (a batch's
    gradient sorted by id: one run per unique id) into ``out``.  Vectorised without a
    loop per id: single rows are copied; longer runs are summed pairwise, halving them
    all at once (a pass per halving: log2 of the longest run), through ``ordered`` and
    the two ``scratch`` buffers (each as large as ``ordered``; ``ordered`` is
    overwritten): nothing of the rows' size is allocated.  ``np.add.reduceat`` does it in
    one call but runs 10-50x slower over many short runs."""
    n = ordered.shape[0]
    lens = np.diff(starts, append=n)
    np.take(ordered, starts, axis=0, out=out, mode="clip")
    todo = np.flatnonzero(lens > 1)
    if not todo.size:
        return out
    length = lens[todo]
    first = np.cumsum(length) - length
    m = int(length.sum())
    bufs = [scratch[0], scratch[1], ordered]
    cur = np.take(ordered, np.arange(m) - np.repeat(first - starts[todo], length), axis=0,
                  out=bufs[0][:m], mode="clip")
    while todo.size:  # a loop per halving
        first = np.cumsum(length) - length
        half = (length + 1) >> 1
        new_first = np.cumsum(half) - half
        seg = np.repeat(np.arange(todo.size), half)
        j = np.arange(int(half.sum())) - new_first[seg]
        left = first[seg] + 2 * j
        new = np.take(cur, left, axis=0, out=bufs[1][: left.size], mode="clip")
        right = np.take(cur, left + 1, axis=0, out=bufs[2][: left.size], mode="clip")
        np.add(new, right, out=new, where=(2 * j + 1 < length[seg])[:, None])
        done = half == 1
        if done.any():
            out[todo[done]] = np.take(new, new_first[done], axis=0,
                                      out=bufs[2][: int(done.sum())], mode="clip")
            keep = np.flatnonzero(np.repeat(~done, half))
            new = np.take(new, keep, axis=0, out=bufs[0][: keep.size], mode="clip")
            half, todo = half[~done], todo[~done]
            bufs = [bufs[0], bufs[1], bufs[2]]
        else:
            bufs = [bufs[1], bufs[0], bufs[2]]
        cur, length = new, half
    return out


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

    def apply(self, rows: np.ndarray, state: np.ndarray, slots: np.ndarray, g: np.ndarray,
              tmp: np.ndarray, tmp2: np.ndarray) -> None:
        """Update ``rows[slots]`` (and ``state[slots]``) with the summed gradient ``g``
        (``g`` may be overwritten)."""
        raise NotImplementedError

    def options(self) -> dict:
        return {"optimizer": self.name, "lr": self.lr, "eps": self.eps}


class SGD(Rule):
    name = "sgd"

    def apply(self, rows, state, slots, g, tmp, tmp2) -> None:
        np.take(rows, slots, axis=0, out=tmp, mode="clip")
        np.multiply(g, self.lr, out=g)
        np.subtract(tmp, g, out=tmp)
        rows[slots] = tmp


class RowwiseAdagrad(Rule):
    name = "rowwise_adagrad"
    state_cols = 1

    def apply(self, rows, state, slots, g, tmp, tmp2) -> None:
        np.multiply(g, g, out=tmp)
        acc = state[slots, 0] + tmp.mean(axis=1)
        state[slots, 0] = acc
        np.sqrt(acc, out=acc)
        acc += self.eps
        np.divide(g, acc[:, None], out=tmp)
        np.multiply(tmp, self.lr, out=tmp)
        np.take(rows, slots, axis=0, out=tmp2, mode="clip")
        np.subtract(tmp2, tmp, out=tmp2)
        rows[slots] = tmp2


OPTIMIZERS: dict[str, type[Rule]] = {"sgd": SGD, "rowwise_adagrad": RowwiseAdagrad}


def make_rule(optimizer: str, lr: float, eps: float) -> Rule:
    if optimizer not in OPTIMIZERS:
        raise InvalidOptionError(f"optimizer must be one of "
                                 f"{', '.join(map(repr, OPTIMIZERS))}, got {optimizer!r}")
    return OPTIMIZERS[optimizer](lr, eps)

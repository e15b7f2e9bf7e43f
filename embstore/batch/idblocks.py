"""What the id inputs of a batch job share: checking ids block by block (local ``.npy``
files in :mod:`embstore.batch.io`, ``.npy`` objects in :mod:`embstore.batch.remote`)."""

from __future__ import annotations

import abc

import numpy as np

from ..errors import InvalidIdError
from ..ids import position_of

__all__ = ["IdBlocks"]


class IdBlocks(abc.ABC):
    """Integer ids of any shape (``shape``) at ``path``, read by leading rows."""

    path: str
    shape: tuple  # (of ints)

    @abc.abstractmethod
    def _block(self, start: int, stop: int) -> np.ndarray:
        """Leading rows ``start:stop`` as stored (any integer dtype)."""

    def validate(self, vocab_size: int, starts) -> None:
        """One min/max pass per block; the first bad id is named with its position."""
        for a, b in zip(starts[:-1], starts[1:]):
            block = self._block(a, b)
            if block.size == 0 or (block.min() >= 0 and block.max() < vocab_size):
                continue
            flat = np.ascontiguousarray(block).reshape(-1)
            i = int(np.argmax((flat < 0) | (flat >= vocab_size)))
            local = position_of(i, block.shape)
            pos = () if not self.shape else (a + local[0],) + local[1:]
            v = flat[i].item()
            valid = f"valid ids: 0..{vocab_size - 1}" if vocab_size else "the table has no rows"
            raise InvalidIdError(
                f"{self.path}: id {v} at position {pos} is out of range for a table of "
                f"{vocab_size} rows ({valid})", id=v, position=pos, vocab_size=vocab_size)

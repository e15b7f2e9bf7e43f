"""fastText's ``.vec`` text output: the word2vec text format (``COUNT DIM`` header, values
followed by a trailing space).  Shares :mod:`.word2vec`'s parser and writer.
"""

from __future__ import annotations

import numpy as np

from .. import DEFAULT_BLOCK_ROWS
from ..word2vec import TextReader, write_text

__all__ = ["read", "write"]


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None,
         dtype=None) -> TextReader:
    """Stream a fastText ``.vec`` file."""
    return TextReader(path, header=True, format="fasttext", block_rows=block_rows, limit=limit,
                      unicode_errors=unicode_errors, dtype=dtype or np.float32)


def write(path, table, *, limit: int | None = None, block_rows: int = DEFAULT_BLOCK_ROWS,
          progress=None) -> int:
    """Write ``table`` as a ``.vec`` file (word2vec text)."""
    return write_text(path, table, header=True, fmt="fasttext", limit=limit,
                      block_rows=block_rows, progress=progress)

"""GloVe text format: ``key v1 ... vDIM`` lines, no header; the dimension comes from the
first line.  A key holding spaces (GloVe 840B has a few, e.g. ``". . ."``) is read as
everything before the last DIM numbers.  Shares :mod:`.word2vec`'s parser and writer.
"""

from __future__ import annotations

import numpy as np

from . import DEFAULT_BLOCK_ROWS
from .word2vec import TextReader, write_text

__all__ = ["read", "write"]


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None,
         dtype=None) -> TextReader:
    """Stream a GloVe text file."""
    return TextReader(path, header=False, format="glove", block_rows=block_rows, limit=limit,
                      unicode_errors=unicode_errors, dtype=dtype or np.float32)


def write(path, table, *, limit: int | None = None, block_rows: int = DEFAULT_BLOCK_ROWS,
          progress=None) -> int:
    """Write ``table`` as GloVe text (gensim ``load_word2vec_format(no_header=True)`` reads it)."""
    return write_text(path, table, header=False, fmt="glove", limit=limit,
                      block_rows=block_rows, progress=progress)

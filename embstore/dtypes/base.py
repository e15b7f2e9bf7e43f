"""The contract of a storage dtype: one :class:`StorageDtype` record says how rows of that
dtype are stored and handed back, and everything that writes, reads, checks or offers a
storage dtype asks the record (:data:`embstore.dtypes.DTYPES`), never its name.

A record has:

- ``name``: what users pass (``dtype="int8"``) and what ``vectors/zarr.json`` says
  (``data_type``);
- ``code``: the NumPy dtype of the stored values (little-endian), ``zarr_dtype`` the dtype
  zarr-python creates the array with (they differ where zarr-python lacks the dtype:
  bfloat16 is created as ``uint16`` and its ``data_type`` renamed after);
- ``logical``: the dtype lookups return (float32 for the compact dtypes);
- ``side``: an array of per-row values stored beside ``vectors`` (int8's ``row_scale``), or
  None;
- ``golden``: its golden store in ``tests/data`` (read back exactly, rewritten byte for byte);
- ``encode(rows) -> (codes, side_rows)``, ``decode(codes, side_rows, out) -> out``,
  ``finite(codes)`` (rows whose codes decode to infinity or NaN), ``raw(codes, side_rows)``
  (what :meth:`Table.raw` returns: codes, scales, offsets) and ``stored(rows)`` (the rows a
  table returns after storing ``rows``).

The float dtypes store their rows as they are (this base class); a compact dtype is one file
with a subclass and one line in the registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["StorageDtype", "SideArray", "blocks"]

_BLOCK_BYTES = 1 << 20  # output bytes per decoding block (fits in L2)


def blocks(n: int, dim: int) -> Iterator[tuple[int, int]]:
    """Row ranges of about 1 MiB of float32 output (measured: a 16,384 x 256 int8 decoding
    blocked so runs 2x faster than three whole-array passes, about a float32 row gather)."""
    step = max(1, _BLOCK_BYTES // max(1, 4 * dim))
    return ((a, min(n, a + step)) for a in range(0, n, step))


@dataclass(frozen=True)
class SideArray:
    """Per-row values a storage dtype keeps beside ``vectors``: ``(vocab_size, columns)``."""

    name: str                       # the array's name in the table's group
    columns: int
    dtype: str                      # NumPy dtype name of its values
    dimension_names: tuple[str, str]
    called: str                     # for messages: what the array is ("row scales")
    meaning: str                    # for messages: what its columns hold


class StorageDtype:
    """A float storage dtype: rows stored as they are."""

    side: SideArray | None = None

    def __init__(self, name: str, *, code: str | None = None, logical: str | None = None,
                 zarr_dtype: str | None = None, golden: str | None = None):
        self.name = name
        self.code = np.dtype(code or name).newbyteorder("<")
        self.logical = np.dtype(logical or name)
        self.zarr_dtype = zarr_dtype or name
        self.golden = golden or f"golden-v1-{name}"

    @property
    def compact(self) -> bool:
        """Stored as codes that lookups decode (bfloat16, int8), not as the rows themselves."""
        return self.code != self.logical

    def __repr__(self) -> str:
        return f"<storage dtype {self.name}>"

    def encode(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(codes, side rows or None)`` of ``rows`` (``logical`` dtype, checked finite)."""
        return rows, None

    def decode(self, codes: np.ndarray, side: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        """``out`` (``logical`` dtype, shape of ``codes``) filled with the rows ``codes`` hold."""
        np.copyto(out, codes, casting="unsafe")
        return out

    def finite(self, codes: np.ndarray) -> np.ndarray | None:
        """Per row: its codes decode to finite values; None when finite rows always do."""
        return None

    def raw(self, codes: np.ndarray, side: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(codes, scale, offset)`` as :meth:`embstore.Table.raw` returns them."""
        return codes, None, None

    def stored(self, rows: np.ndarray) -> np.ndarray:
        """The rows a table of this dtype returns after storing ``rows``."""
        if not self.compact:
            return rows
        codes, side = self.encode(rows)
        return self.decode(codes, side, np.empty(rows.shape, self.logical))

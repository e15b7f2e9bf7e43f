"""The geometry of a format-2 row array, read from (and written to) its ``zarr.json``.

A row array is a plain Zarr v3 array (no sharding) whose only codec is ``bytes`` (little
endian): chunk ``k`` is the file ``<array>/c/<k>/0`` holding rows ``k * chunk_rows`` ..
``(k + 1) * chunk_rows - 1`` back to back, the last one padded with zeros to its full size.
``chunk_rows`` makes a chunk a whole number of 4 KiB pages (:func:`choose_chunk_rows`), so the
chunk files mapped side by side are one ``(rows, dim)`` array.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from ...errors import CorruptStoreError
from ...fs.files import open_regular

from ...dtypes import DTYPES
from ..rowinit import array_init

__all__ = ["RowLayout", "PAGE", "CHUNK_TARGET", "choose_chunk_rows", "min_chunk_rows",
           "PAGE_CRC", "open_chunk", "crc_array"]

PAGE = 4096  # the unit of integrity: one crc32c per aligned 4 KiB page of a chunk file
CHUNK_TARGET = 64 << 20  # bytes per chunk: what other Zarr readers read (and dask chunks)
PAGE_CRC = "page_crc"  # the side array of vectors' page checksums


def crc_array(name: str) -> str:
    """The array of the page checksums of row array ``name``: ``page_crc`` for ``vectors``,
    ``<name>_page_crc`` for the others (``norms``, ``row_scale``)."""
    return PAGE_CRC if name == "vectors" else f"{name}_{PAGE_CRC}"


def _pow2_below(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1.0, x)))))


def min_chunk_rows(row_bytes: int) -> int:
    """The fewest rows (a power of two) whose chunk is a whole number of pages."""
    return PAGE // math.gcd(row_bytes, PAGE)


PAD_SHARE = 16  # a table of known rows: its last chunk's padding at most 1/16 of its rows
PAD_BYTES = 1 << 20  # ... or 1 MiB, whichever is more


def choose_chunk_rows(row_bytes: int, rows: int | None = None) -> int:
    """Rows per chunk: about 64 MiB (a power of two, at least a page's worth).  For a table
    of ``rows`` rows known in advance, the table cut into as few chunks as chunks of at
    most that size allow, of equal size (rounded up to whole pages): big chunks (what a
    request to object storage and another Zarr reader read best) whose last one pads less
    than a page's worth of rows per chunk; should that pad more than ``rows / PAD_SHARE``
    rows or ``PAD_BYTES`` (rows of an odd size), the largest power of two below whose
    padding stays within them (a file copied without its holes, ``cp --sparse=never`` or a
    plain upload, stays near its rows' size)."""
    low = min_chunk_rows(row_bytes)
    cr = max(low, _pow2_below(CHUNK_TARGET / row_bytes))
    if rows is None:
        return cr
    slack = max(rows // PAD_SHARE, PAD_BYTES // max(1, row_bytes))
    n = max(1, -(-rows // cr))  # as many chunks as chunks of at most ``cr`` rows need
    even = max(low, -(-(-(-rows // n)) // low) * low)
    if -rows % even <= slack:
        return even
    cr = min(cr, max(low, 1 << max(0, int(rows - 1).bit_length())))
    while cr > low and -rows % cr > slack:  # one halving per step: at most ~26 steps
        cr //= 2
    return cr


@dataclass(frozen=True)
class RowLayout:
    rows: int
    dim: int
    dtype: np.dtype      # the stored (code) dtype, little-endian
    chunk_rows: int
    separator: str = "/"
    #: the initialisation of the chunks never written (docs/FORMAT.md §3e), None: all stored
    init: dict | None = field(default=None, compare=False)

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_rows * self.row_bytes

    @property
    def pages_per_chunk(self) -> int:
        return -(-self.chunk_bytes // PAGE)

    @property
    def n_chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)

    def chunk_key(self, k: int) -> str:
        return f"c{self.separator}{k}{self.separator}0"

    def chunk_end(self, k: int) -> int:
        """Bytes of committed rows in chunk ``k`` (the rest of the file is padding)."""
        return (min(self.rows, (k + 1) * self.chunk_rows) - k * self.chunk_rows) * self.row_bytes

    @classmethod
    def from_metadata(cls, meta: dict, where: str = "a row array's zarr.json"
                      ) -> RowLayout | None:
        """The layout of a ``zarr.json`` written as a format-2 row array, else None (a
        malformed initialisation of chunks never written, §3e: ``CorruptStoreError``)."""
        try:
            shape = meta["shape"]
            record = DTYPES.get(meta["data_type"])
            grid = meta["chunk_grid"]
            cke = meta["chunk_key_encoding"]
            codecs = meta["codecs"]
            if (len(shape) != 2 or record is None or meta.get("storage_transformers")
                    or grid["name"] != "regular" or cke["name"] != "default"
                    or len(codecs) != 1 or codecs[0]["name"] != "bytes"
                    or codecs[0].get("configuration", {}).get("endian", "little") != "little"):
                return None
            chunk = grid["configuration"]["chunk_shape"]
            rows, dim = int(shape[0]), int(shape[1])
            if len(chunk) != 2 or chunk[1] != dim or dim < 1 or chunk[0] < 1 or \
                    (chunk[0] * dim * record.code.itemsize) % PAGE and rows > chunk[0]:
                return None  # several chunks must sit on whole pages to be mapped as one
            sep = cke.get("configuration", {}).get("separator", "/")
            if sep != "/" or float(meta.get("fill_value") or 0.0) != 0.0:
                return None  # ("." keys: the generic Zarr reader reads them)
        except (KeyError, TypeError, IndexError, ValueError, AttributeError):
            return None
        return cls(rows=rows, dim=dim, dtype=record.code, chunk_rows=int(chunk[0]),
                   separator=sep, init=array_init(meta, where))


def open_chunk(path: str, k: int, layout: RowLayout) -> tuple[int, int]:
    """``(descriptor, size)`` of chunk file ``k`` at ``path``: a regular file of exactly its
    layout's size, else :class:`CorruptStoreError` (missing, or short)."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: missing (chunk {k} of the table's rows; if the "
                                "table or this version was removed under this reader, "
                                "reopen it)", path=path) from None
    size = os.fstat(fd).st_size
    if size != layout.chunk_bytes:
        os.close(fd)
        raise CorruptStoreError(f"{path}: {size} bytes, expected {layout.chunk_bytes} "
                                f"({layout.chunk_rows} rows of {layout.row_bytes} bytes)",
                                path=path)
    return fd, size

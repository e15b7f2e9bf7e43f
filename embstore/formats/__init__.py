"""File formats embstore imports and exports: one module per format, the same two verbs in each.

Every format module provides::

    read(path, *, block_rows=65536, limit=None, unicode_errors="strict", tensor=None) -> Reader
    write(path, table, *, limit=None, block_rows=65536, progress=None) -> int   # rows written

A :class:`Reader` streams the source: iterating it yields ``(vectors, keys)``
blocks (``vectors`` a C-contiguous ``(n, dim)`` float array, ``keys`` a list of
``n`` str or ``None``), never more than ``block_rows`` rows at a time, so memory
does not grow with the file.  ``write`` streams a table to ``path`` block by
block (it writes ``path`` itself; :func:`embstore.formats.convert.export_table`
writes beside the destination and renames into place).

``FORMATS`` maps each format name to its module; :func:`detect` picks a name
from the extension and the first bytes of a file.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import struct
from collections.abc import Iterator
from typing import IO
from types import ModuleType

import numpy as np

from ..errors import FormatError

__all__ = ["FORMATS", "READ_FORMATS", "WRITE_FORMATS", "Reader", "detect", "get",
           "DEFAULT_BLOCK_ROWS", "open_output"]

DEFAULT_BLOCK_ROWS = 65536

# format name -> module name (imported on first use: torch and safetensors are heavy)
_MODULES = {
    "npy": "npy",
    "word2vec": "word2vec",
    "fasttext": "fasttext",
    "glove": "glove",
    "word2vec-binary": "word2vec_binary",
    "safetensors": "safetensors",
    "torch": "torch",
}
READ_FORMATS = tuple(_MODULES)
WRITE_FORMATS = ("npy", "word2vec", "word2vec-binary", "glove", "fasttext", "safetensors")


class _Registry(dict):
    """``FORMATS[name]`` -> the module that reads (and writes) ``name``, imported lazily."""

    def __missing__(self, name):
        if name not in _MODULES:
            raise KeyError(name)
        module = importlib.import_module(f".{_MODULES[name]}", __name__)
        self[name] = module
        return module

    def __contains__(self, name) -> bool:
        return name in _MODULES

    def __iter__(self):
        return iter(_MODULES)

    def __len__(self) -> int:
        return len(_MODULES)

    def keys(self):
        return _MODULES.keys()


FORMATS: dict[str, ModuleType] = _Registry()


def get(name: str) -> ModuleType:
    """The module of format ``name`` (a :class:`FormatError` listing the formats if unknown)."""
    if name not in _MODULES:
        raise FormatError(f"unknown format {name!r}; expected one of {', '.join(_MODULES)}")
    return FORMATS[name]


class Reader:
    """A streamed source of vectors.  Subclasses set the attributes and implement ``blocks``.

    ``dim``: row length; ``count``: rows the source holds when known up front
    (``None`` otherwise; a text header's count is only a claim, checked while
    reading); ``dtype``: dtype of the yielded blocks; ``native_dtype``: the source's
    own dtype when NumPy lacks it and the blocks widen it exactly (``"bfloat16"``, whose
    blocks arrive as float32), else None; ``has_keys``;
    ``progress_total``/``progress_done`` in ``progress_unit`` ("bytes" or "rows").
    """

    format: str = ""
    dim: int = 0
    count: int | None = None
    dtype: np.dtype = np.dtype(np.float32)
    native_dtype: str | None = None
    has_keys: bool = False
    progress_unit: str = "rows"
    progress_total: int | None = None
    progress_done: int = 0

    def __init__(self, path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None):
        if block_rows < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.path = os.fspath(path)
        self.name = os.path.basename(self.path)
        self.block_rows = int(block_rows)
        self.limit = limit

    def blocks(self) -> Iterator[tuple[np.ndarray, list[str] | None]]:  # pragma: no cover
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[np.ndarray, list[str] | None]]:
        return self.blocks()

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def error(self, message: str, line: int | None = None) -> FormatError:
        return FormatError(message, path=self.path, line=line)


@contextlib.contextmanager
def open_output(path_or_stream) -> Iterator[IO[bytes]]:
    """A binary file to write: ``path_or_stream`` opened ``"wb"``, or, if it is already a
    writable binary stream (standard output), that stream, flushed but left open."""
    if hasattr(path_or_stream, "write"):
        yield path_or_stream
        path_or_stream.flush()
        return
    with open(path_or_stream, "wb") as f:
        yield f


def check_finite(reader: Reader, block: np.ndarray, first_row: int) -> None:
    """Raise naming the first row (1-based, as in ``row N``) with a NaN or infinity."""
    finite = np.isfinite(block)
    if finite.all():
        return
    r, c = np.argwhere(~finite)[0]
    raise reader.error(f"row {first_row + int(r) + 1}, column {int(c) + 1}: expected a finite "
                       f"number, got {block[r, c]!r}")


_HEADER_RE = re.compile(rb"^[ \t]*(\d+)[ \t]+(\d+)[ \t]*\r?\n")


def detect(path) -> str:
    """The format name of ``path`` from its extension and first bytes.

    Magic bytes win over the extension (a ``.bin`` may be word2vec or PyTorch);
    text files with a ``count dim`` first line are word2vec (``.vec``: fasttext),
    otherwise glove.
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head:
        raise FormatError("the file is empty", path=path)
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80" and ext in (".pt", ".pth", ".bin", ".ckpt"):
        return "torch"
    if len(head) >= 9 and head[8:9] == b"{":
        (n,) = struct.unpack("<Q", head[:8])
        if 2 <= n <= os.path.getsize(path) - 8:
            return "safetensors"
    if ext == ".npy":
        return "npy"
    if ext == ".safetensors":
        return "safetensors"
    if ext in (".pt", ".pth", ".ckpt"):
        return "torch"
    m = _HEADER_RE.match(head)
    if m:
        if _binary_record(head[m.end():], int(m.group(2))):
            return "word2vec-binary"
        return "fasttext" if ext == ".vec" else "word2vec"
    if _looks_binary(head[:4096]):
        raise FormatError("cannot tell the format from the first bytes (not npy, safetensors, "
                          "PyTorch, or word2vec/GloVe text); pass --format", path=path)
    return "glove"


_NUMERIC = frozenset(b"0123456789.+-eEinfatyINFATY \t\r")


def _binary_record(rest: bytes, dim: int) -> bool:
    """Whether the first record after a ``COUNT DIM`` header holds raw bytes, not text."""
    rest = rest.lstrip(b"\n")
    sp = rest.find(b" ")
    if sp < 0:
        return _looks_binary(rest[:4096])
    end = rest.find(b"\n", sp)
    sample = rest[sp + 1:end if end >= 0 else len(rest)]
    if set(sample[:4096]) <= _NUMERIC:
        return False
    return _looks_binary(sample[:4096]) or len(sample.split()) != dim


def _looks_binary(data: bytes) -> bool:
    if b"\x00" in data:
        return True
    ctrl = sum(data.count(bytes([c])) for c in range(32) if c not in (9, 10, 13))
    if ctrl > len(data) // 64:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(data) - 4  # a cut multi-byte character at the end is text
    return False


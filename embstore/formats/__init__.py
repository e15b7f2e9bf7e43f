"""File formats embstore imports and exports: one module per format, the same two verbs in each.

Every format module provides::

    read(path, *, block_rows=65536, limit=None, unicode_errors="strict", tensor=None,
         dtype=None) -> Reader
    write(path, table, *, limit=None, block_rows=65536, progress=None) -> int   # rows written

A :class:`Reader` streams the source: iterating it yields ``(vectors, keys)``
blocks (``vectors`` a C-contiguous ``(n, dim)`` float array, ``keys`` a list of
``n`` str or ``None``), never more than ``block_rows`` rows at a time, so memory
does not grow with the file.  ``write`` streams a table to ``path`` block by
block (it writes ``path`` itself; :func:`embstore.convert.export_table` writes
beside the destination and renames into place).

``SPECS`` holds one :class:`FormatSpec` record per format: its name, module, file
extensions, magic bytes, whether it holds keys, takes a tensor name, can be written.
Everything else derives from it: ``FORMATS`` (name -> module, imported on first use),
``READ_FORMATS``/``WRITE_FORMATS``, :func:`detect`, the export extensions
(:func:`export_format_for`) and the command line's ``--format`` choices and help.

Adding a format
---------------
Write ``embstore/formats/<name>.py`` with ``read`` (returning a :class:`Reader`
subclass: set ``dim``, ``dtype``, ``count``, ``has_keys`` and the progress fields,
implement ``blocks()``; :class:`~embstore.formats._array.ArrayReader` does it all for
array-like sources) and, if it can be written, ``write``.  Then add one
:class:`FormatSpec` to ``SPECS`` below: with ``magic`` bytes (or a ``sniff``
function) :func:`detect` recognises it, its ``extensions`` name it on export, and
``embstore import``/``export`` offer it; ``streams=True`` says ``read`` also takes a
:class:`~.source.Source` (compressed data or a pipe, read once in order: see
:mod:`.source`), otherwise such input is first copied to a file.  Nothing outside this
folder changes.  A
format module imports only from this folder and the ground (errors, ids, dtypes):
never the store, the batch jobs or click.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO
from types import ModuleType

import numpy as np

from ..errors import FormatError
from ..ids import non_negative_int, positive_int
from .source import Source, open_source

__all__ = ["FormatSpec", "SPECS", "FORMATS", "READ_FORMATS", "WRITE_FORMATS", "Reader",
           "detect", "get", "spec", "export_format_for", "export_extensions",
           "DEFAULT_BLOCK_ROWS", "open_output", "detect_source", "Source", "open_source",
           "is_pickle", "PICKLE_MESSAGE"]

DEFAULT_BLOCK_ROWS = 65536


def _safetensors_header(head: bytes, ext: str, size: int) -> bool:
    """An 8-byte little-endian header length, then the JSON header's ``{``."""
    if len(head) < 9 or head[8:9] != b"{":
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= size - 8


def _torch_pickle(head: bytes, ext: str, size: int) -> bool:
    """A legacy (non-zip) PyTorch file: a pickle, told apart by its extension too."""
    return head[:1] == b"\x80" and ext in (".pt", ".pth", ".bin", ".ckpt")


def _fasttext_old(head: bytes, ext: str, size: int) -> bool:
    """A fastText ``.bin`` of the old format (no magic number): plausible arguments
    (``dim, ws, epoch, min_count, neg, word_ngrams, loss, model, bucket, minn, maxn, lr``),
    then a dictionary header ``size == nwords + nlabels``."""
    if ext not in (".bin", ".ftz") or len(head) < 68:
        return False
    a = struct.unpack_from("<12id", head)
    size_, nwords, nlabels = struct.unpack_from("<3i", head, 56)
    return (1 <= a[0] <= 1 << 16 and 1 <= a[1] <= 1 << 10 and 1 <= a[2] < 1 << 20
            and min(a[3], a[4], a[8], a[9], a[10], nwords, nlabels) >= 0
            and 1 <= a[5] <= 64 and 1 <= a[6] <= 4 and 1 <= a[7] <= 3 and 0.0 <= a[12] <= 1.0
            and nwords <= size_ == nwords + nlabels)


@dataclass(frozen=True)
class FormatSpec:
    """One file format: what the pipeline, detection and the command line know of it."""

    name: str                       # the --format value
    module: str                     # module in embstore.formats
    title: str                      # for help text
    extensions: tuple[str, ...] = ()   # lower case; an export to DEST.<ext> picks the first
    magic: tuple[bytes, ...] = ()   # leading bytes that identify the format
    sniff: Callable[[bytes, str, int], bool] | None = None  # (head, ext, size): more checks
    binary: bool = True             # False: a text format, told apart by its first line
    has_keys: bool = False          # the file holds a key per row
    takes_tensor: bool = False      # the file holds named tensors (tensor=)
    can_write: bool = False         # the module has write()
    streams: bool = False           # read() takes a Source: compressed data or a pipe, in order


SPECS: tuple[FormatSpec, ...] = (
    FormatSpec("npy", "npy", "npy", extensions=(".npy",), magic=(b"\x93NUMPY",),
               can_write=True, streams=True),
    FormatSpec("word2vec", "word2vec", "word2vec", extensions=(".txt", ".w2v"), binary=False,
               has_keys=True, can_write=True, streams=True),
    FormatSpec("fasttext", "fasttext", "fastText", extensions=(".vec",), binary=False,
               has_keys=True, can_write=True, streams=True),
    FormatSpec("glove", "glove", "GloVe", binary=False, has_keys=True, can_write=True,
               streams=True),
    FormatSpec("word2vec-binary", "word2vec.binary", "word2vec binary", extensions=(".bin",),
               binary=False, has_keys=True, can_write=True, streams=True),
    FormatSpec("safetensors", "safetensors", "safetensors", extensions=(".safetensors",),
               sniff=_safetensors_header, takes_tensor=True, can_write=True),
    FormatSpec("torch", "torch", "PyTorch", extensions=(".pt", ".pth", ".ckpt"),
               magic=(b"PK\x03\x04",), sniff=_torch_pickle, takes_tensor=True, can_write=True),
    # a folder (config.json, tokenizer, checkpoint): chosen for a directory, never by bytes
    FormatSpec("hf", "hf", "Hugging Face model folder", has_keys=True, takes_tensor=True),
    # a table of words and vectors (a string column, a float-list column); pyarrow reads it
    FormatSpec("parquet", "parquet", "Parquet", extensions=(".parquet", ".parq"),
               magic=(b"PAR1",), has_keys=True, takes_tensor=True),
    # fastText's native model (word vectors + subword n-grams); before 2017: no magic
    FormatSpec("fasttext-bin", "fasttext.bin", "fastText .bin model", magic=(b"\xba\x16\x4f\x2f",),
               sniff=_fasttext_old, has_keys=True),
)
_SPEC = {f.name: f for f in SPECS}
READ_FORMATS = tuple(_SPEC)
WRITE_FORMATS = tuple(f.name for f in SPECS if f.can_write)


def export_extensions() -> dict[str, str]:
    """``{".ext": format}``: the format an export to ``DEST.ext`` writes."""
    out: dict[str, str] = {}
    for f in SPECS:
        if f.can_write:
            for ext in f.extensions:
                out.setdefault(ext, f.name)
    return out


def spec(name: str) -> FormatSpec:
    """The record of format ``name`` (a :class:`FormatError` listing the formats if unknown)."""
    if name not in _SPEC:
        raise FormatError(f"unknown format {name!r}; expected one of {', '.join(_SPEC)}")
    return _SPEC[name]


class _Registry(Mapping[str, ModuleType]):
    """``FORMATS[name]`` -> the module that reads (and writes) ``name``, imported lazily
    (torch and safetensors are heavy)."""

    def __init__(self) -> None:
        self._loaded: dict[str, ModuleType] = {}

    def __getitem__(self, name: str) -> ModuleType:
        if name not in self._loaded:
            if name not in _SPEC:
                raise KeyError(name)
            self._loaded[name] = importlib.import_module(f".{_SPEC[name].module}", __name__)
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_SPEC)

    def __len__(self) -> int:
        return len(_SPEC)


FORMATS: Mapping[str, ModuleType] = _Registry()


def get(name: str) -> ModuleType:
    """The module of format ``name`` (a :class:`FormatError` listing the formats if unknown)."""
    return FORMATS[spec(name).name]


def export_format_for(dest: str | os.PathLike[str]) -> str:
    """The export format implied by DEST's extension (see :func:`export_extensions`)."""
    ext = os.path.splitext(os.fspath(dest))[1].lower()
    table = export_extensions()
    if ext not in table:
        raise FormatError(f"cannot tell the format from the extension {ext or '(none)'!r} of "
                          f"{os.fspath(dest)}; pass format= ({', '.join(WRITE_FORMATS)})")
    return table[ext]


class Reader:
    """A streamed source of vectors: everything :func:`embstore.import_file` uses.

    Subclasses set the attributes and implement ``blocks``:

    - ``format``: the format name; ``dim``: row length; ``dtype``: dtype of the yielded
      blocks; ``native_dtype``: the source's own dtype when NumPy lacks it and the blocks
      widen it exactly (``"bfloat16"``, whose blocks arrive as float32), else None;
      ``has_keys``: blocks come with one key per row;
    - ``count``: rows the source holds when known up front (``None`` otherwise; a text
      header's count is only a claim, checked while reading); ``size_hint()``: rows to
      expect, for sizing the table's layout (``None``: unknown);
    - ``progress_done``/``progress_total`` in ``progress_unit`` (``"bytes"`` or
      ``"rows"``), updated as blocks are yielded;
    - ``tensor``: the tensor read, for formats holding several (else ``None``);
    - iteration yields ``(vectors, keys)`` blocks; ``close()`` releases the file.
    """

    format: str = ""
    dim: int = 0
    count: int | None = None
    dtype: np.dtype = np.dtype(np.float32)
    native_dtype: str | None = None
    has_keys: bool = False
    tensor: str | None = None
    progress_unit: str = "rows"
    progress_total: int | None = None
    progress_done: int = 0

    def __init__(self, path: str | os.PathLike[str], *, block_rows: int = DEFAULT_BLOCK_ROWS,
                 limit: int | None = None):
        positive_int(block_rows, "block_rows")
        if limit is not None:
            non_negative_int(limit, "limit")
        self.path = path.path if isinstance(path, Source) else os.fspath(path)
        self.name = os.path.basename(self.path)
        self.block_rows = int(block_rows)
        self.limit = limit

    def size_hint(self) -> int | None:
        """Rows to expect (``count`` capped by ``limit``), or ``None`` when unknown."""
        if self.count is None:
            return None
        return self.count if self.limit is None else min(self.count, self.limit)

    def blocks(self) -> Iterator[tuple[np.ndarray, list[str] | None]]:  # pragma: no cover
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[np.ndarray, list[str] | None]]:
        return self.blocks()

    def close(self) -> None:
        pass

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
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
    """The format name of ``path`` (a path, or a :class:`~.source.Source`) from its first
    bytes and name (see ``SPECS``).

    A compressed file (gzip, bz2, xz, zstd, single-member zip: told by its magic bytes) is
    looked into: the inner format comes from the name without the compression extension
    (``cc.en.300.vec.gz`` -> ``.vec``) and the first decompressed bytes.
    Magic bytes win over the extension (a ``.bin`` may be word2vec or PyTorch); then a
    binary format's extension; text files with a ``count dim`` first line are word2vec
    (``.vec``: fasttext, raw bytes after the header: word2vec-binary), otherwise glove.
    """
    if isinstance(path, Source):
        return detect_source(path)
    with open_source(path) as src:
        return detect_source(src)


def detect_source(src: Source) -> str:
    """:func:`detect` of an opened source (its ``head`` and inner ``name``)."""
    if not src.head:
        what = "the file is empty" if src.compression is None else \
            f"the {src.compression}-compressed data is empty"
        raise FormatError(what, path=src.path)
    ext = os.path.splitext(src.name)[1].lower()
    if src.compression is None:
        return _detect_head(src.head, ext, src.size, src.path)
    try:
        return _detect_head(src.head, ext, None, src.path)
    except FormatError as exc:
        raise FormatError(f"{src.compression}-compressed, inner format unknown: {exc.reason}",
                          path=src.path) from None


def _detect_head(head: bytes, ext: str, size: int | None, path: str) -> str:
    size = size if size is not None else 1 << 62  # a stream: its size is not known
    # binary formats with fixed magic bytes first, then those with only a sniff function
    binary = sorted((s for s in SPECS if s.binary), key=lambda s: not s.magic)
    for s in binary:
        if s.magic and head.startswith(s.magic):
            return s.name
        if s.sniff is not None and s.sniff(head, ext, size):
            return s.name
    for s in binary:
        if ext in s.extensions:
            return s.name
    if head.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark: not part of the header
        head = head[3:]
    if is_pickle(head):
        raise FormatError(PICKLE_MESSAGE, path=path)
    m = _HEADER_RE.match(head)
    if m:
        if _binary_record(head[m.end():], int(m.group(2)), ext):
            return "word2vec-binary"
        return "fasttext" if ext in _SPEC["fasttext"].extensions else "word2vec"
    if _looks_binary(head[:4096]):
        raise FormatError("cannot tell the format from the first bytes (not npy, safetensors, "
                          "PyTorch, or word2vec/GloVe text); pass format=", path=path)
    return "glove"


PICKLE_MESSAGE = ("this is a Python pickle (gensim's native .save()); embstore never unpickles: "
                  "load it with gensim and call embstore.from_gensim")


def is_pickle(head: bytes) -> bool:
    """A pickle of protocol 2 to 5 (``PROTO`` opcode): gensim's ``.save()``, joblib, ..."""
    return len(head) > 2 and head[0] == 0x80 and 2 <= head[1] <= 5


_NUMERIC = frozenset(b"0123456789.+-eEinfatyINFATY \t\r")


def _text_record(line: bytes, dim: int) -> bool:
    """Whether ``line`` is a whole text record: a key, then ``dim`` numbers (a key may hold
    spaces, so the numbers are the last ``dim`` tokens)."""
    toks = line.split()
    return len(toks) > dim and all(set(t) <= _NUMERIC for t in toks[-dim:]) and \
        not _looks_binary(line)


def _binary_record(rest: bytes, dim: int, ext: str) -> bool:
    """Whether the first record after a ``COUNT DIM`` header holds raw bytes, not text.

    Text only when the first line is a whole text record (key, then ``dim`` numbers): raw
    float32 bytes can hold anything, a ``\n`` (0x0a) or digits included, so bytes that
    merely could be text prove nothing.  A ``.bin`` name counts toward binary; otherwise
    the ``4 * dim`` bytes after the key decide (control bytes, NUL, invalid UTF-8).
    """
    rest = rest.lstrip(b"\n")
    sp = rest.find(b" ")
    if sp < 0:
        return ext == ".bin" or _looks_binary(rest[:4096])
    nl = rest.find(b"\n", sp)
    if _text_record(rest[:nl if nl >= 0 else len(rest)], dim):
        return False
    if ext == ".bin":
        return True
    vec = rest[sp + 1:sp + 1 + 4 * dim]
    return _looks_binary(vec) or len(rest[sp + 1:nl if nl >= 0 else len(rest)].split()) != dim


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


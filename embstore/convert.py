"""Import a file into a table and export a table to a file, streamed block by block.

``import_file`` reads the source with its format's :class:`~embstore.formats.Reader`
and feeds :class:`embstore.store.writer.TableWriter`, which writes beside DEST and
renames into place on success (an error leaves no DEST behind).
``export_table`` writes beside DEST and renames into place when complete (both through
:mod:`embstore.atomic`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import IO, Literal

import numpy as np
from numpy.typing import DTypeLike

from ._types import PathLike
from .atomic import check_dest, remove, replace, temp_path
from .errors import DestinationExistsError, FormatError
from .formats import (DEFAULT_BLOCK_ROWS, SPECS, WRITE_FORMATS, detect_source, export_format_for,
                      get, open_source, spec)
from .formats.source import compression_for, inner_name, open_compressed_output
from .formats.tokens import MAX_TOKEN_BYTES, TokenKeys, load_tokens
from .formats._textparse import decode_keys
from .store.codecs import Compression
from .store.table import open as open_table
from .dtypes import QUANTISED, check_storage
from .progress import Progress, Tally
from .store.writer import TableWriter
from .subword_import import import_fasttext_bin
from .table import Table


SPOOL_BYTES = 8 << 20

__all__ = ["import_file", "export_table", "ImportResult", "ExportResult", "vocab_path_for",
           "export_format_for", "VocabReader"]


@dataclass(frozen=True)
class ImportResult:
    """What an import did: ``rows`` stored, ``duplicates`` dropped (first key wins)."""

    path: str
    format: str
    rows: int
    dim: int
    dtype: str
    duplicates: int
    tensor: str | None = None
    compression: str | None = None   # of the source: gzip, bz2, xz, zstd, zip (None: plain)
    notes: tuple[str, ...] = ()      # what the import decided (padding rows, a copied source)


class VocabReader:
    """Keys for formats without them: a UTF-8 text file, one key per line, read in blocks."""

    def __init__(self, path, *, unicode_errors: str = "strict", chunk_bytes: int = 4 << 20):
        self.path = os.fspath(path)
        self.unicode_errors = unicode_errors
        self._f = open(self.path, "rb")
        if self._f.read(3) != b"\xef\xbb\xbf":  # a UTF-8 byte order mark is no part of a key
            self._f.seek(0)
        self._chunk = chunk_bytes
        self._lines: list[bytes] = []
        self._i = 0
        self._carry = b""
        self._eof = False
        self.taken = 0

    def _fill(self, n: int) -> None:
        while len(self._lines) - self._i < n and not self._eof:
            data = self._carry + self._f.read(self._chunk)
            self._lines = self._lines[self._i:]
            self._i = 0
            if len(data) == len(self._carry):  # end of file
                self._eof = True
                self._carry = b""
                if data:
                    self._lines.append(data)
                while self._lines and not self._lines[-1].strip(b"\r"):  # trailing empty lines
                    self._lines.pop()
                return
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > MAX_TOKEN_BYTES:  # (a 10 GB file of one line: never read whole)
                    raise FormatError(f"expected a key a line, got a line of more than "
                                      f"{MAX_TOKEN_BYTES} bytes", path=self.path,
                                      line=self.taken + len(self._lines) - self._i + 1)
                self._carry = data
                continue
            self._carry = data[cut + 1:]
            self._lines += data[:cut].split(b"\n")

    def take(self, n: int, *, rows_of: str, expected: int | None) -> list[str]:
        """The next ``n`` keys; fewer in the file is an error naming the line."""
        self._fill(n)
        raw = self._lines[self._i:self._i + n]
        if any(b"\r" in r[:-1] for r in raw):  # before counting: CR-only ends make one line
            i = next(i for i, r in enumerate(raw) if b"\r" in r[:-1])
            raise FormatError("expected lines ending in \\n or \\r\\n, got a carriage return "
                              "inside a line (CR-only line ends are not supported)",
                              path=self.path, line=self.taken + 1 + i)
        if len(raw) < n:
            got = self.taken + len(raw)
            want = expected if expected is not None else f"at least {self.taken + n}"
            raise FormatError(f"expected {want} keys (one per row of {rows_of}), got {got}: the "
                              "file ends here", path=self.path, line=got + 1)
        self._i += n
        raw = [r[:-1] if r.endswith(b"\r") else r for r in raw]
        first = self.taken + 1
        if b"" in raw:
            i = raw.index(b"")
            raise FormatError("expected a key, got an empty line", path=self.path, line=first + i)
        self.taken += n
        return decode_keys(raw, path=self.path, first_line=first, unicode_errors=self.unicode_errors)

    def check_end(self, *, rows_of: str) -> None:
        """More keys than rows is an error too."""
        self._fill(1)
        if len(self._lines) - self._i > 0:
            raise FormatError(f"expected {self.taken} keys (one per row of {rows_of}), got more",
                              path=self.path, line=self.taken + 1)

    def close(self) -> None:
        self._f.close()


def import_file(src: PathLike | IO[bytes], dest: PathLike, *, format: str = "auto",
                tensor: str | None = None, vocab: PathLike | None = None,
                dtype: DTypeLike | None = None, limit: int | None = None,
                unicode_errors: Literal["strict", "replace"] = "strict",
                compression: Compression = "none", chunk_rows: int | None = None,
                shard_rows: int | None = None, overwrite: bool = False,
                block_rows: int = DEFAULT_BLOCK_ROWS, encoding: str | None = None,
                on_progress: Progress | None = None) -> ImportResult:
    """Import ``src`` (a file of ``format``) into a new table at ``dest``.

    ``src`` may be compressed (gzip, bz2, xz, zstd, a one-member zip: told by its magic
    bytes), an open binary stream (standard input: the text formats, word2vec-binary and
    npy stream; others are first copied beside ``dest``), or a Hugging Face model folder
    (format ``hf``: see :mod:`embstore.formats.hf`).  ``vocab`` gives keys to formats
    without them: a text file of one key per line (one per row, exactly), or a
    ``tokenizer.json``/``vocab.json`` (keys by token id; other counts are handled and
    reported in ``notes``).  ``on_progress(done, total)`` is called as the source is read
    (in the reader's units: stored bytes of text and compressed files, rows of array
    files; ``total`` may be None); a callback with a ``unit`` attribute has it set.
    ``encoding``: the text encoding of a fastText ``.bin`` model's words (default UTF-8;
    gensim's ``encoding=``); its n-gram matrix is stored beside the vectors
    (:mod:`.subword_import`).
    """
    dest = os.fspath(dest)
    if not hasattr(src, "read"):
        src = os.fspath(src)
        if os.path.isdir(src) and format in ("auto", "hf"):
            format = "hf"
        elif not os.path.isfile(src):
            raise FileNotFoundError(2, "No such file", src)
    check_dest(dest, overwrite)
    notes: list[str] = []
    source = None if format == "hf" else open_source(src)
    spooled = None
    try:
        fmt = format if source is None or format != "auto" else detect_source(source)
        module = get(fmt)
        if tensor is not None and not spec(fmt).takes_tensor:
            names = [f.name for f in SPECS if f.takes_tensor]
            named = ", ".join(names[:-1]) + " and " + names[-1]
            raise FormatError(f"tensor= applies to {named} files, got format {fmt}")
        storage = None if dtype is None else check_storage(dtype)
        where: object = src
        if source is not None and spec(fmt).streams:
            where = source
        elif source is not None and not source.is_file:  # random access needed: a file
            spooled = temp_path(dest)
            size = _spool(source, spooled)
            notes.append(f"{source.describe()} {fmt} needs random access: copied ({size} bytes) "
                         f"to a temporary file beside {os.path.basename(dest)}, removed after")
        if spooled is not None:
            where = spooled
        if encoding is not None and fmt != "fasttext-bin":
            raise FormatError(f"encoding= applies to fasttext-bin models, got format {fmt}")
        if fmt == "fasttext-bin":
            assert isinstance(where, str)  # not a streaming format: a path, spooled if need be
            done = _import_fasttext_bin(where, dest, vocab=vocab, block_rows=block_rows,
                                        limit=limit, unicode_errors=unicode_errors,
                                        encoding=encoding or "utf-8", storage=storage,
                                        compression=compression, chunk_rows=chunk_rows,
                                        shard_rows=shard_rows, overwrite=overwrite,
                                        on_progress=on_progress)
            return dataclasses.replace(
                done, compression=None if source is None else source.compression,
                notes=tuple(notes))
        extra = {"vocab": vocab} if fmt == "hf" else {}
        # quantised storage: the reader yields its float rows and the writer encodes them
        reader = module.read(where, block_rows=block_rows, limit=limit,
                             unicode_errors=unicode_errors, tensor=tensor,
                             dtype=None if storage in QUANTISED else storage, **extra)
        if fmt == "hf":
            vocab = None
        if on_progress is not None and hasattr(on_progress, "unit"):
            setattr(on_progress, "unit", reader.progress_unit)  # a progress.Display
        rows, duplicates, storage = _import_rows(reader, dest, fmt, vocab=vocab, storage=storage,
                                                 limit=limit, unicode_errors=unicode_errors,
                                                 compression=compression, chunk_rows=chunk_rows,
                                                 shard_rows=shard_rows, overwrite=overwrite,
                                                 on_progress=on_progress, notes=notes)
    finally:
        if source is not None:
            source.close()
        if spooled is not None:
            remove(spooled)
    return ImportResult(path=dest, format=fmt, rows=rows, dim=reader.dim,
                        dtype=storage, duplicates=duplicates, tensor=reader.tensor,
                        compression=None if source is None else source.compression,
                        notes=tuple(notes))


def _spool(source, path: str) -> int:
    """Copy the (decompressed) stream of ``source`` to a new file ``path``; its size."""
    n = 0
    with open(path, "xb") as f:
        while True:
            data = source.read(SPOOL_BYTES)
            if not data:
                return n
            f.write(data)
            n += len(data)


def _import_rows(reader, dest: str, fmt: str, *, vocab, storage, limit, unicode_errors,
                 compression, chunk_rows, shard_rows, overwrite, on_progress,
                 notes: list[str]) -> tuple[int, int, str]:
    """Feed ``reader``'s blocks (and keys from ``vocab``) to a TableWriter at ``dest``."""
    if storage is None:  # the source's own dtype, bfloat16 kept native
        storage = reader.native_dtype or np.dtype(reader.dtype).name
    keys_file: VocabReader | TokenKeys | None = None
    try:
        if vocab is not None:
            if reader.has_keys:
                raise FormatError(f"vocab= gives keys to formats without them; {fmt} files "
                                  "hold their own keys")
            if os.fspath(vocab).lower().endswith(".json"):
                keys_file = TokenKeys(load_tokens(vocab), path=os.fspath(vocab))
            else:
                keys_file = VocabReader(vocab, unicode_errors=unicode_errors)
        name = os.path.basename(reader.path)
        attrs = {"source": {"format": fmt, "file": name}}
        if reader.tensor:
            attrs["source"]["tensor"] = reader.tensor
        writer = TableWriter(dest, dim=reader.dim, dtype=storage,
                             has_keys=reader.has_keys or keys_file is not None,
                             chunk_rows=chunk_rows, shard_rows=shard_rows,
                             compression=compression, overwrite=overwrite,
                             expected_rows=reader.size_hint(), attrs=attrs)
        with writer:
            for block, keys in reader:
                if keys_file is not None:
                    keys = keys_file.take(len(block), rows_of=name, expected=reader.count)
                writer.add(block, keys)
                if on_progress is not None:
                    on_progress(reader.progress_done, reader.progress_total)
            if keys_file is not None and limit is None:
                keys_file.check_end(rows_of=name)
        notes += getattr(reader, "notes", [])
        if isinstance(keys_file, TokenKeys):
            notes += keys_file.notes
        return writer.rows, writer.duplicates, storage
    finally:
        reader.close()
        if keys_file is not None:
            keys_file.close()


def _import_fasttext_bin(src: str, dest: str, *, vocab, storage, encoding: str,
                        **options) -> ImportResult:
    """The fastText ``.bin`` branch of :func:`import_file` (vectors and n-gram matrix)."""
    if vocab is not None:
        raise FormatError("vocab= gives keys to formats without them; fasttext-bin models "
                          "hold their own words")
    layout = {k: options.pop(k) for k in ("compression", "chunk_rows", "shard_rows",
                                          "overwrite", "on_progress")}
    with get("fasttext-bin").read(src, encoding=encoding, **options) as reader:
        rows, duplicates, dtype = import_fasttext_bin(reader, dest, storage=storage, **layout)
    return ImportResult(path=dest, format="fasttext-bin", rows=rows, dim=reader.dim,
                        dtype=dtype, duplicates=duplicates)


@dataclass(frozen=True)
class ExportResult:
    """What an export did: ``rows`` written to ``path``; ``vocab_path``: where the keys went
    when the format cannot hold them (None: the format holds them, or no keys)."""

    path: str
    format: str
    rows: int
    vocab_path: str | None = None
    keys_dropped: bool = False


_KEYLESS_FORMATS = tuple(f.name for f in SPECS if f.can_write and not f.has_keys)


def vocab_path_for(dest) -> str:
    """Where the keys of an export to ``dest`` go by default: ``<dest stem>.vocab.txt``."""
    root, _ = os.path.splitext(os.fspath(dest))
    return root + ".vocab.txt"


def export_table(src: PathLike | Table, dest: PathLike, *, format: str | None = None,
                 limit: int | None = None, overwrite: bool = False,
                 block_rows: int = DEFAULT_BLOCK_ROWS, vocab_out: PathLike | bool | None = None,
                 tensor: str | None = None,
                 on_progress: Progress | None = None) -> ExportResult:
    """Write the table at ``src`` (a path or an open :class:`~embstore.Table`) to the file
    ``dest``.  ``on_progress(done, total)`` counts rows.

    Formats that cannot hold keys (``npy``, ``safetensors``) get the keys of a keyed table
    in a text file beside them, one key per line (the ``vocab=`` of :func:`import_file`):
    ``vocab_out=None`` writes ``<dest stem>.vocab.txt``, a path writes there, ``False``
    writes none (``keys_dropped`` says so).  ``tensor`` names the safetensors tensor
    (default ``weight``).
    """

    if hasattr(dest, "write"):  # a binary stream (standard output): written straight through
        return _export_to_stream(src, dest, format=format, limit=limit, block_rows=block_rows,
                                 vocab_out=vocab_out, tensor=tensor, on_progress=on_progress)
    dest = os.fspath(dest)
    packed = compression_for(dest)  # DEST.gz/.bz2/.xz/.zst: the format's bytes, compressed
    fmt = format or export_format_for(inner_name(dest) if packed else dest)
    if packed == "zip":
        raise FormatError(f"cannot write a zip archive ({dest}); expected a .gz, .bz2, .xz or "
                          ".zst destination, or an uncompressed one")
    if fmt not in WRITE_FORMATS:
        raise FormatError(f"cannot export to {fmt}; expected one of {', '.join(WRITE_FORMATS)}")
    check_dest(dest, overwrite)
    if os.path.isdir(dest):
        raise DestinationExistsError(f"{dest} is a directory; expected a file path to write")
    if tensor is not None and fmt != "safetensors":
        raise FormatError(f"a tensor name applies to safetensors exports, not {fmt}")
    table = open_table(src) if isinstance(src, (str, os.PathLike)) else src
    vocab = None
    if table.keys is not None and fmt in _KEYLESS_FORMATS and vocab_out is not False:
        vocab = vocab_path_for(inner_name(dest)) if vocab_out is None or vocab_out is True else \
            os.fspath(vocab_out)
        check_dest(vocab, overwrite)
    tmp = temp_path(dest)
    vocab_tmp = None if vocab is None else temp_path(vocab)
    n = table.vocab_size if limit is None else min(limit, table.vocab_size)
    keys_dropped = table.keys is not None and fmt in _KEYLESS_FORMATS and vocab is None
    advance = Tally(n, on_progress).update  # rows written so far, to on_progress
    try:
        if vocab_tmp is not None:
            _write_vocab(vocab_tmp, table, n, block_rows)
        extra = {} if tensor is None else {"tensor": tensor}
        with open(tmp, "xb") as raw:
            out = raw if packed is None else open_compressed_output(raw, packed)
            with out:
                rows = get(fmt).write(out, table, limit=limit, block_rows=block_rows,
                                      progress=advance, **extra)
        check_dest(dest, overwrite)
        if vocab_tmp is not None and vocab is not None:
            check_dest(vocab, overwrite)
            replace(vocab_tmp, vocab)
        replace(tmp, dest)
    except BaseException:
        for path in (tmp, vocab_tmp):
            if path is not None:
                remove(path)
        raise
    finally:
        if table is not src:
            table.close()
    return ExportResult(path=dest, format=fmt, rows=rows, vocab_path=vocab,
                        keys_dropped=keys_dropped)


def _export_to_stream(src, stream, *, format, limit, block_rows, vocab_out, tensor,
                      on_progress) -> ExportResult:
    """``export_table`` to an open binary stream: no temporary file, no rename (a pipe)."""
    if format not in WRITE_FORMATS:
        raise FormatError(f"an export to a stream needs format= one of {', '.join(WRITE_FORMATS)}"
                          f", got {format!r}")
    table = open_table(src) if isinstance(src, (str, os.PathLike)) else src
    try:
        n = table.vocab_size if limit is None else min(limit, table.vocab_size)
        keyless = table.keys is not None and format in _KEYLESS_FORMATS
        vocab = os.fspath(vocab_out) if keyless and vocab_out not in (None, True, False) else None
        if vocab is not None:
            _write_vocab(vocab, table, n, block_rows)
        advance = Tally(n, on_progress).update
        extra = {} if tensor is None else {"tensor": tensor}
        rows = get(format).write(stream, table, limit=limit, block_rows=block_rows,
                                 progress=advance, **extra)
    finally:
        if table is not src:
            table.close()
    return ExportResult(path="-", format=format, rows=rows, vocab_path=vocab,
                        keys_dropped=keyless and vocab is None)


def _write_vocab(path: str, table, n: int, block_rows: int) -> None:
    """The first ``n`` keys of ``table``, one a line (a key holding a line break cannot be
    written so: a :class:`FormatError` naming its row)."""
    with open(path, "wb") as f:
        for a in range(0, n, block_rows):
            keys = table.keys[a: min(n, a + block_rows)]
            text = "\n".join(keys)
            framed = "\n" + text + "\n"  # what VocabReader splits: b"\n", one "\r" stripped
            if text.count("\n") != len(keys) - 1 or "\n\n" in framed or "\r\n" in framed:
                for i, k in enumerate(keys):  # only to name the row
                    if k == "" or "\n" in k or k.endswith("\r"):
                        raise FormatError(f"key {k!r} at row {a + i} cannot be written to a "
                                          "one-key-per-line vocabulary file")
            f.write(text.encode("utf-8") + b"\n")

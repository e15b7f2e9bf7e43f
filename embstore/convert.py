"""Import a file into a table and export a table to a file, streamed block by block.

``import_file`` reads the source with its format's :class:`~embstore.formats.Reader`
and feeds :class:`embstore.store.writer.TableWriter`, which writes beside DEST and
renames into place on success (an error leaves no DEST behind).
``export_table`` writes beside DEST and renames into place when complete (both through
:mod:`embstore.fs.atomic`).
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
from dataclasses import dataclass
from typing import IO, Any, Literal

import numpy as np
from numpy.typing import DTypeLike

from ._types import PathLike
from .fs.atomic import check_dest, remove, replace, temp_path
from .fs.copytree import disk_usage
from .errors import DestinationExistsError, FormatError
from .formats import (DEFAULT_BLOCK_ROWS, SPECS, WRITE_FORMATS, detect_source, export_format_for,
                      get, open_source, spec)
from .formats.source import Source, compression_for, inner_name, open_compressed_output
from .formats.tokens import TokenKeys, load_tokens
from .formats.vocabfile import VocabReader, vocab_path_for, write_vocab
from .store.remote.fetch import is_source_url, open_url, url_name
from .store.codecs import Compression
from .store.table import open as open_table
from .dtypes import DTYPES, QUANTISED, check_storage
from .progress import Progress, Tally
from .store.writer import TableWriter
from .store.fasttext import import_fasttext_bin
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
    duplicate_keys: tuple[str, ...] = ()  # the first few of the dropped duplicates (up to 5)


def import_file(src: PathLike | IO[bytes], dest: PathLike, *, format: str = "auto",
                tensor: str | None = None, vocab: PathLike | Literal[False] | None = None,
                dtype: DTypeLike | None = None, limit: int | None = None,
                unicode_errors: Literal["strict", "replace"] = "strict",
                compression: Compression = "none", chunk_rows: int | None = None,
                shard_rows: int | None = None, overwrite: bool = False,
                block_rows: int = DEFAULT_BLOCK_ROWS, encoding: str | None = None,
                member: str | None = None, storage_options: dict | None = None,
                on_progress: Progress | None = None) -> ImportResult:
    """Import ``src`` (a file of ``format``) into a new table at ``dest``.

    ``src`` may be compressed (gzip, bz2, xz, zstd, a one-member zip: told by its magic
    bytes), an open binary stream (standard input: the text formats, word2vec-binary and
    npy stream; others are first copied beside ``dest``), or a Hugging Face model folder
    (format ``hf``: see :mod:`embstore.formats.hf`), or a URL: ``s3://bucket/vectors.vec``
    (object storage, ``storage_options`` as for tables) or ``https://...``, streamed (see
    :mod:`embstore.store.remote.fetch`).  ``member`` picks the member of a zip archive holding
    several (``glove.6B.zip`` holds four: ``member="glove.6B.50d.txt"``).  ``vocab`` gives keys to formats
    without them: a text file of one key per line (one per row, exactly), or a
    ``tokenizer.json``/``vocab.json`` (keys by token id; other counts are handled and
    reported in ``notes``).  Without ``vocab``, a keyless file gets the keys an export wrote
    beside it, ``<stem>.vocab.txt`` (``x.npy`` -> ``x.vocab.txt``; a note says so);
    ``vocab=False`` reads none.  ``on_progress(done, total)`` is called as the source is read
    (in the reader's units: stored bytes of text and compressed files, rows of array
    files; ``total`` may be None); a callback with a ``unit`` attribute has it set.
    ``encoding``: the text encoding of a fastText ``.bin`` model's words (default UTF-8;
    gensim's ``encoding=``); its n-gram matrix is stored beside the vectors
    (:mod:`.store.fasttext`).
    """
    dest = os.fspath(dest)
    options: dict[str, Any] = dict(
        format=format, tensor=tensor, vocab=vocab, dtype=dtype, limit=limit,
        unicode_errors=unicode_errors, compression=compression, chunk_rows=chunk_rows,
        shard_rows=shard_rows, overwrite=overwrite, block_rows=block_rows, encoding=encoding,
        member=member, on_progress=on_progress)
    if not is_source_url(src):
        return _import_local(src, dest, **options)
    url = str(src)
    check_dest(dest, overwrite)  # before a byte is fetched
    stream, size = open_url(url, storage_options=storage_options)
    if member is None and not url_name(url).lower().endswith(".zip"):
        # read as a pipe; random-access formats spooled
        return _import_local(stream, dest, stream_name=url, url_stream=stream, **options)
    with stream:  # a zip's directory is at its end: the archive is copied to a file first
        spooled = _spool_url(stream, url, temp_path(dest))
    try:
        return _import_local(spooled, dest, **options)
    finally:
        remove(spooled)


def _import_local(src, dest: str, *, format: str, member: str | None, overwrite: bool,
                  stream_name: str | None = None, url_stream: IO[bytes] | None = None,
                  **options) -> ImportResult:
    """:func:`import_file` of a local file or folder, or of an open stream (``url_stream``,
    the stream of a URL named ``stream_name``, is closed with it): the source opened, its
    format told, and closed again."""
    if not hasattr(src, "read"):
        src = os.fspath(src)
        if os.path.isdir(src) and format in ("auto", "hf"):
            format = "hf"
        elif not os.path.isfile(src):
            raise FileNotFoundError(2, "No such file", src)
    check_dest(dest, overwrite)
    try:
        source = None if format == "hf" else open_source(src, name=stream_name, member=member)
    except BaseException:
        if url_stream is not None:
            url_stream.close()
        raise
    try:
        fmt = format if source is None or format != "auto" else detect_source(source)
        return _import_source(src, source, dest, fmt, overwrite=overwrite, **options)
    finally:
        if source is not None:
            source.close()
        if url_stream is not None:
            url_stream.close()


def _import_source(src, source: Source | None, dest: str, fmt: str, *, tensor: str | None,
                   dtype: DTypeLike | None, encoding: str | None, vocab,
                   **options) -> ImportResult:
    """Import the opened ``source`` (None: the folder ``src``) of format ``fmt``: options
    checked against the format, the source copied to a file if the format needs random
    access, then read into ``dest`` (fastText ``.bin``: with its n-gram matrix)."""
    module = get(fmt)
    if tensor is not None and not spec(fmt).takes_tensor:
        names = [f.name for f in SPECS if f.takes_tensor]
        named = ", ".join(names[:-1]) + " and " + names[-1]
        raise FormatError(f"tensor= applies to {named} files, got format {fmt}")
    storage = None if dtype is None else check_storage(dtype)
    notes: list[str] = []
    spooled = None
    if source is not None and not spec(fmt).streams and not source.is_file:
        spooled = _spool_beside(source, fmt, dest, notes)  # random access needed: a file
    try:
        where = spooled or (source if source is not None and spec(fmt).streams else src)
        if encoding is not None and fmt != "fasttext-bin":
            raise FormatError(f"encoding= applies to fasttext-bin models, got format {fmt}")
        if fmt == "fasttext-bin":
            assert isinstance(where, str)  # not a streaming format: a path, spooled if need be
            done = _import_fasttext_bin(where, dest, vocab=vocab, encoding=encoding or "utf-8",
                                        storage=storage, **options)
        else:
            vocab = _vocab_beside(src, fmt, vocab, notes)
            done = _import_reader(module, where, dest, fmt, vocab=vocab, storage=storage,
                                  tensor=tensor, notes=notes, **options)
    finally:
        if spooled is not None:
            remove(spooled)
    return dataclasses.replace(done, compression=None if source is None else source.compression,
                               notes=tuple(notes))


def _spool_beside(source: Source, fmt: str, dest: str, notes: list[str]) -> str:
    """Copy ``source`` to a temporary file beside ``dest`` (a format that needs random
    access, read from a pipe or a compressed file); its path (removed again on failure)."""
    spooled = temp_path(dest)
    try:
        size = _spool(source, spooled)
    except BaseException:
        remove(spooled)
        raise
    notes.append(f"{source.describe()} {fmt} needs random access: copied ({size} bytes) "
                 f"to a temporary file beside {os.path.basename(dest)}, removed after")
    return spooled


def _import_reader(module, where, dest: str, fmt: str, *, vocab, storage, tensor: str | None,
                   block_rows: int, limit: int | None, unicode_errors, on_progress,
                   notes: list[str], **layout) -> ImportResult:
    """Read ``where`` (a path, a source or a spooled copy) with the reader of format
    ``fmt`` (its ``module``) and write its rows (keys from ``vocab`` if given) to ``dest``."""
    extra = {"vocab": vocab} if fmt == "hf" else {}
    # quantised storage: the reader yields its float rows and the writer encodes them
    reader = module.read(where, block_rows=block_rows, limit=limit,
                         unicode_errors=unicode_errors, tensor=tensor,
                         dtype=None if storage in QUANTISED else storage, **extra)
    if fmt == "hf":
        vocab = None
    if on_progress is not None and hasattr(on_progress, "unit"):
        setattr(on_progress, "unit", reader.progress_unit)  # a progress.Display
    rows, dups, storage = _import_rows(reader, dest, fmt, vocab=vocab, storage=storage,
                                       limit=limit, unicode_errors=unicode_errors,
                                       on_progress=on_progress, notes=notes, **layout)
    if layout.get("compression", "none") != "none":
        _note_incompressible(dest, layout["compression"], rows * reader.dim *
                             DTYPES[storage].code.itemsize, notes)
    return ImportResult(path=dest, format=fmt, rows=rows, dim=reader.dim, dtype=storage,
                        duplicates=dups[0], tensor=reader.tensor, duplicate_keys=dups[1])


def _note_incompressible(dest: str, compression: str, raw: int, notes: list[str]) -> None:
    """A note when compressed chunks of ``vectors`` take more than the ``raw`` bytes of the
    rows uncompressed (float32 vectors rarely compress; each small chunk adds a frame)."""
    stored = disk_usage(os.path.join(dest, "vectors"), skip=(".embstore",))
    if raw and stored > raw:
        notes.append(f"{compression} compression stored the rows in {stored} bytes, more than "
                     f"the {raw} they take uncompressed (these values do not compress): "
                     "without compression the table is smaller and faster to read")


def _vocab_beside(src, fmt: str, vocab, notes: list[str]):
    """``vocab``, or for a keyless format the keys file an export wrote beside ``src``
    (``x.npy`` -> ``x.vocab.txt``) when it exists; ``vocab=False``: no keys file at all."""
    if vocab is False:
        return None
    if vocab is not None or hasattr(src, "read") or spec(fmt).has_keys or fmt == "hf":
        return vocab
    beside = vocab_path_for(src)
    if not os.path.isfile(beside):
        return None
    notes.append(f"keys from {beside}, found beside {os.path.basename(src)} (pass vocab= to "
                 "name another keys file, or vocab=False for none)")
    return beside


def _spool_url(stream, url: str, path: str) -> str:
    """Copy ``stream`` (the bytes at ``url``) to a new file ``path`` named like the URL."""
    path = f"{path}-{url_name(url)}"
    try:
        _spool(stream, path)
    except BaseException:
        remove(path)
        raise
    return path


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
                 notes: list[str]) -> tuple[int, tuple[int, tuple[str, ...]], str]:
    """Feed ``reader``'s blocks (and keys from ``vocab``) to a TableWriter at ``dest``; returns
    the rows kept, (duplicates dropped, the first few of them) and the storage dtype."""
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
        blocks = iter(reader)  # (a reader that parses in a thread starts now, beside the setup)
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
            for block, keys in blocks:
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
        return writer.rows, (writer.duplicates, tuple(writer.duplicate_keys)), storage
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
    vocab_reused: bool = False   # ``vocab_path`` already held these keys: left as it was


_KEYLESS_FORMATS = tuple(f.name for f in SPECS if f.can_write and not f.has_keys)


def export_table(src: PathLike | Table, dest: PathLike, *, format: str | None = None,
                 limit: int | None = None, overwrite: bool = False,
                 block_rows: int = DEFAULT_BLOCK_ROWS, vocab_out: PathLike | bool | None = None,
                 tensor: str | None = None,
                 on_progress: Progress | None = None) -> ExportResult:
    """Write the table at ``src`` (a path or an open :class:`~embstore.Table`) to the file
    ``dest``.  ``on_progress(done, total)`` counts rows.

    Formats that cannot hold keys (``npy``, ``safetensors``) get the keys of a keyed table
    in a text file beside them, one key per line (the ``vocab=`` of :func:`import_file`,
    which picks it up by itself): ``vocab_out=None`` writes ``<dest stem>.vocab.txt``, a
    path writes there, ``False`` writes none (``keys_dropped`` says so).  Exports of one
    table to ``model.npy`` and ``model.safetensors`` share ``model.vocab.txt``: a keys file
    that already holds exactly these keys is left as it is (``vocab_reused``); one holding
    other keys is an error unless ``overwrite``.  ``tensor`` names the safetensors or
    PyTorch tensor (default ``weight``).
    """

    if hasattr(dest, "write"):  # a binary stream (standard output): written straight through
        return _export_to_stream(src, dest, format=format, limit=limit, block_rows=block_rows,
                                 vocab_out=vocab_out, tensor=tensor, on_progress=on_progress)
    dest = os.fspath(dest)
    fmt, packed = _export_format(dest, format, overwrite, tensor)
    table = open_table(src) if isinstance(src, (str, os.PathLike)) else src
    vocab = None
    if table.keys is not None and fmt in _KEYLESS_FORMATS and vocab_out is not False:
        vocab = vocab_path_for(dest) if vocab_out is None or vocab_out is True else \
            os.fspath(vocab_out)
    n = table.vocab_size if limit is None else min(limit, table.vocab_size)
    keys_dropped = table.keys is not None and fmt in _KEYLESS_FORMATS and vocab is None
    try:
        rows, reused = _write_export(table, dest, fmt, packed, vocab, n, limit=limit,
                                     overwrite=overwrite, block_rows=block_rows, tensor=tensor,
                                     on_progress=on_progress)
    finally:
        if table is not src:
            table.close()
    return ExportResult(path=dest, format=fmt, rows=rows, vocab_path=vocab,
                        keys_dropped=keys_dropped, vocab_reused=reused)


def _export_format(dest: str, format: str | None, overwrite: bool,
                   tensor: str | None) -> tuple[str, str | None]:
    """The format of an export to the file ``dest`` and the compression its name asks for,
    checked (and ``dest``: free to write, and not a directory)."""
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
    if tensor is not None and not spec(fmt).takes_tensor:
        raise FormatError(f"a tensor name applies to safetensors and torch exports, not {fmt}")
    return fmt, packed


def _write_export(table: Table, dest: str, fmt: str, packed: str | None, vocab: str | None,
                  n: int, *, limit: int | None, overwrite: bool, block_rows: int,
                  tensor: str | None, on_progress: Progress | None) -> tuple[int, bool]:
    """Write ``n`` rows of ``table`` beside ``dest`` (and its keys beside ``vocab``, if
    given), then rename them into place; ``(rows, whether the keys file there already
    held these keys)``.  A failure leaves neither file behind."""
    tmp = temp_path(dest)
    vocab_tmp = None if vocab is None else temp_path(vocab)
    advance = Tally(n, on_progress).update  # rows written so far, to on_progress
    reused = False
    try:
        if vocab_tmp is not None and vocab is not None:
            write_vocab(vocab_tmp, table, n, block_rows)
            reused = _same_keys_there(vocab_tmp, vocab, overwrite)
        extra = {} if tensor is None else {"tensor": tensor}
        with open(tmp, "xb") as raw:
            out = raw if packed is None else open_compressed_output(raw, packed)
            with out:
                rows = get(fmt).write(out, table, limit=limit, block_rows=block_rows,
                                      progress=advance, **extra)
        check_dest(dest, overwrite)
        if reused and vocab_tmp is not None:
            remove(vocab_tmp)
        elif vocab_tmp is not None and vocab is not None:
            if not _same_keys_there(vocab_tmp, vocab, overwrite):
                replace(vocab_tmp, vocab)
        replace(tmp, dest)
    except BaseException:
        for path in (tmp, vocab_tmp):
            if path is not None:
                remove(path)
        raise
    return rows, reused


def _same_keys_there(new: str, there: str, overwrite: bool) -> bool:
    """Whether the keys file ``there`` already holds exactly the keys written to ``new``
    (``model.npy`` then ``model.safetensors`` share ``model.vocab.txt``: kept as it is).
    Other content there is refused unless ``overwrite``."""
    if not os.path.lexists(there):
        return False
    if os.path.isfile(there) and os.path.getsize(there) == os.path.getsize(new) and \
            filecmp.cmp(new, there, shallow=False):
        return True
    if overwrite:
        return False
    raise DestinationExistsError(f"{there} exists and holds other keys than this export's; "
                                 "pass overwrite=True to replace it, or vocab_out= to write "
                                 "the keys elsewhere")


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
            write_vocab(vocab, table, n, block_rows)
        advance = Tally(n, on_progress).update
        extra = {} if tensor is None else {"tensor": tensor}
        rows = get(format).write(stream, table, limit=limit, block_rows=block_rows,
                                 progress=advance, **extra)
    finally:
        if table is not src:
            table.close()
    return ExportResult(path="-", format=format, rows=rows, vocab_path=vocab,
                        keys_dropped=keyless and vocab is None)

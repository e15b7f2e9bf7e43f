"""Where a format reader's bytes come from: a plain file, a compressed file, or a pipe.

:func:`open_source` turns a path (or an open binary stream such as standard input)
into a :class:`Source`: one decompressed, buffered byte stream, plus what detection
and progress need (the first bytes, the inner file name, compressed bytes consumed).

Compression is told from the magic bytes, never the extension alone: gzip
(``1f 8b``), bzip2 (``BZh``), xz (``fd 37 7a 58 5a 00``), zstd (``28 b5 2f fd``) and
zip (``PK\\x03\\x04``: its only member, or the one ``member=`` names, as in
``glove.6B.zip``'s four; a zip holding ``data.pkl`` is a PyTorch file, not a compressed one).  Concatenated members/streams/frames (pigz, pbzip2,
``zstd`` of several inputs) are read as one.  gzip decodes with ``isal`` when it is
installed (python-isal: 3.5x zlib's speed here), else with ``zlib``, in 1 MiB reads;
memory is bounded by the read size whatever the file size.
"""

from __future__ import annotations

import bz2
import io
import _compression
import lzma
import os
import zipfile
import zlib
from collections.abc import Callable
from typing import IO, Any

from ..errors import FormatError, MissingDependencyError
from ..optional import require

__all__ = ["Source", "open_source", "sniff_compression", "compression_for", "open_compressed_output",
           "inner_name", "stream_row_bound", "COMPRESSIONS", "EXTENSIONS"]

COMPRESSIONS = ("gzip", "bz2", "xz", "zstd", "zip")
EXTENSIONS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd",
              ".zstd": "zstd", ".zip": "zip"}
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"),
          (b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))
READ_BYTES = 1 << 20   # compressed bytes per read
HEAD_BYTES = 1 << 16   # decompressed bytes kept for detection
MAX_LZMA_MEMORY = 1 << 30  # an xz stream's decoder memory (xz -9: 65 MiB; 3.5 GiB: hostile)
_ERRORS = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError, zipfile.BadZipFile)


def sniff_compression(head: bytes) -> str | None:
    """The compression whose magic bytes start ``head`` (zip included), or ``None``."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


def compression_for(path: str | os.PathLike[str]) -> str | None:
    """The compression an output named ``path`` asks for (``x.vec.gz`` -> gzip), or None."""
    return EXTENSIONS.get(os.path.splitext(os.fspath(path))[1].lower())


def inner_name(name: str) -> str:
    """``name`` without its compression extension (``cc.en.300.vec.gz`` -> ``cc.en.300.vec``)."""
    root, ext = os.path.splitext(name)
    return root if ext.lower() in EXTENSIONS else name


def _gzip_module():
    """python-isal's zlib when installed (an accelerator: never required), else zlib."""
    try:
        return require("isal.isal_zlib", extra="fast-gzip", feature="fast gzip decoding")
    except MissingDependencyError:
        return zlib


GZIP_FAST_LEVEL = 2  # isal's default: 25x the stdlib's level 6 on text, 13% larger


def _isal_gzip():
    """python-isal's gzip writer when installed (an accelerator: never required), else None."""
    try:
        return require("isal.igzip", extra="fast-gzip", feature="fast gzip compression")
    except MissingDependencyError:
        return None


class _Raw(io.RawIOBase):
    """A readable raw stream over ``read_into``; counts the bytes it returned."""

    def __init__(self, read_into: Callable[[memoryview], int], head: bytes = b""):
        self._read_into = read_into
        self._head = head
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
        else:
            n = self._read_into(view)
        self.count += n
        return n


class _Gunzip:
    """gzip members one after the other, each bounded by the caller's buffer (max_length)."""

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._z = _gzip_module()
        self._d = self._z.decompressobj(31)
        self._pending = b""
        self._started = False  # input given to the current member

    def read_into(self, view: memoryview) -> int:
        while True:
            data = self._pending or self._raw.read(READ_BYTES)
            if not data:
                if self._started:
                    raise EOFError("the compressed stream ends inside a gzip member")
                return 0
            if not self._started and not data.strip(b"\x00"):  # zero padding after a member
                self._pending = b""
                continue
            self._started = True
            try:
                out = self._d.decompress(data, len(view))
            except self._z.error as exc:  # (isal's error is not zlib's)
                raise ValueError(f"not a valid gzip stream ({exc})") from None
            self._pending = self._d.unconsumed_tail
            if self._d.eof:  # all input left is unused_data (zlib repeats it in the tail)
                self._pending = self._d.unused_data
                self._d = self._z.decompressobj(31)
                self._started = False
            if out:
                view[:len(out)] = out
                return len(out)


class Source:
    """An opened input: ``stream`` (decompressed, buffered), and for detection and progress
    ``head`` (its first bytes), ``name`` (the inner file name: compression extension or
    zip member removed), ``compression`` (None for a plain file), ``size`` (bytes of the
    file as stored; None for a pipe), ``is_file`` (a plain regular file, readable by path
    with random access)."""

    def __init__(self, path: str, name: str, stream: IO[bytes], *, compression: str | None,
                 size: int | None, is_file: bool, counter: Callable[[], int],
                 closers: tuple = ()):
        self.path, self.name, self.stream = path, name, stream
        self.compression, self.size, self.is_file = compression, size, is_file
        self._counter = counter
        self._closers = closers
        self.head = b""

    def consumed(self, pending: int = 0) -> int:
        """Bytes of the stored file read so far (``pending``: bytes the reader holds unparsed;
        only subtracted for plain files, where positions are exact)."""
        return self._counter() - (pending if self.compression is None else 0)

    def read(self, n: int = -1) -> bytes:
        try:
            return self.stream.read(n)
        except _ERRORS as exc:
            raise self.damaged(exc) from None

    def readinto(self, b) -> int:
        """Fill ``b`` (a writable buffer) with the next bytes: fewer only at the end (``stream``
        is always a buffered reader)."""
        view, got = memoryview(b).cast("B"), 0
        try:
            while got < len(view):
                n = self.stream.readinto(view[got:])  # type: ignore[attr-defined]
                if not n:
                    break
                got += n
        except _ERRORS as exc:
            raise self.damaged(exc) from None
        return got

    def readline(self, limit: int = -1) -> bytes:
        try:
            return self.stream.readline(limit)
        except _ERRORS as exc:
            raise self.damaged(exc) from None

    def damaged(self, exc: BaseException) -> FormatError:
        what = f"{self.compression}-compressed data" if self.compression else "the input"
        if isinstance(exc, lzma.LZMAError) and "limit" in str(exc):
            return FormatError(f"cannot read {what}: its header asks for more than the "
                               f"{MAX_LZMA_MEMORY} bytes of memory (its dictionary) embstore "
                               "decompresses with (recompress it, e.g. xz -6)", path=self.path)
        return FormatError(f"cannot read {what}: {exc or type(exc).__name__}", path=self.path)

    def describe(self) -> str:
        """``gzip-compressed``, ``piped`` or ``plain`` (for messages)."""
        if self.compression:
            return f"{self.compression}-compressed"
        return "piped" if self.size is None else "plain"

    def close(self) -> None:
        for c in (self.stream, *self._closers):
            c.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream_row_bound(src: Source, row_bytes: int) -> int | None:
    """The most rows of at least ``row_bytes`` bytes ``src`` can hold, for sizing hints only:
    exact for a plain file, assuming at most 32:1 compression for a compressed one, None for
    a pipe."""
    if src.size is None:
        return None
    return src.size * (1 if src.compression is None else 32) // row_bytes + 1


def _zip_member(path: str, f: IO[bytes], member: str | None = None
                ) -> tuple[zipfile.ZipFile, zipfile.ZipInfo] | None:
    """The single member of a zip archive, or the one named ``member``; None for a PyTorch
    zip (``.../data.pkl``)."""
    try:
        z = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise FormatError(f"cannot read zip archive: {exc}", path=path) from None
    members = [i for i in z.infolist() if not i.is_dir()]
    if any(i.filename.endswith("data.pkl") or i.filename == "version" for i in members) or \
            any(i.filename.endswith("/version") for i in members):
        z.close()
        return None
    names = ", ".join(i.filename for i in members[:20]) + (", ..." if len(members) > 20 else "")
    if member is not None:
        chosen = [i for i in members if i.filename == member] or \
            [i for i in members if os.path.basename(i.filename) == member]
        if len(chosen) != 1:
            z.close()
            raise FormatError(f"expected a member named {member!r} in the zip archive, got "
                              f"{names or 'no members'}", path=path)
        return z, chosen[0]
    if len(members) != 1:
        z.close()
        raise FormatError(f"the zip archive holds {len(members)} members" +
                          (f" ({names}); choose one with member=" if members else
                           "; expected one"), path=path)
    return z, members[0]


def _decoder(kind: str, raw: IO[bytes]) -> Callable[[memoryview], int]:
    if kind == "gzip":
        return _Gunzip(raw).read_into
    if kind == "bz2":
        return bz2.BZ2File(raw).readinto
    if kind == "xz":  # with a memory limit: the stream's header sets the dictionary size
        return _compression.DecompressReader(raw, lzma.LZMADecompressor,
                                             trailing_error=lzma.LZMAError,
                                             memlimit=MAX_LZMA_MEMORY).readinto
    import zstandard  # a core dependency, heavy to import
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True,
                                                         closefd=False)
    return reader.readinto


def open_source(src, *, name: str | None = None, member: str | None = None) -> Source:
    """Open ``src`` (a path, an open binary stream, or a :class:`Source`, returned as is),
    decompressing it when its first bytes say so.  ``name``: the name of a stream;
    ``member``: the member of a zip archive to read."""
    if isinstance(src, Source):
        return src
    if hasattr(src, "read"):
        if member is not None:
            raise FormatError("member= picks a member of a zip archive, which cannot be read "
                              "from a stream; expected a file path", path=name or "<stdin>")
        return _open_stream(src, name or "<stdin>")
    path = os.fspath(src)
    f = open(path, "rb")
    try:
        return _open_file(path, f, member)
    except BaseException:
        f.close()
        raise


def _open_file(path: str, f: IO[bytes], member: str | None = None) -> Source:
    size = os.fstat(f.fileno()).st_size
    kind = sniff_compression(f.read(8))
    f.seek(0)
    base = os.path.basename(path)
    if member is not None and kind != "zip":
        raise FormatError(f"member= picks a member of a zip archive; expected one, got "
                          f"{'a ' + kind + '-compressed' if kind else 'an uncompressed'} file",
                          path=path)
    if kind == "zip":
        found = _zip_member(path, f, member)
        if found is None:  # a PyTorch file
            kind = None
        else:
            z, info = found
            try:
                if info.flag_bits & 0x1:
                    raise RuntimeError("it is encrypted (password-protected)")
                inner: Any = z.open(info)  # (an unknown compression method: refused too)
            except (RuntimeError, NotImplementedError, lzma.LZMAError, *_ERRORS) as exc:
                z.close()
                raise FormatError(f"zip member {info.filename!r}: cannot read it: {exc}; "
                                  "unzip it and import the file itself", path=path) from None
            return _decoded(path, os.path.basename(info.filename), inner.readinto, "zip",
                            size, f.tell, (inner, z, f))
    if kind is None:
        src = Source(path, base, f, compression=None, size=size, is_file=True, counter=f.tell,
                     closers=())
        src.head = f.read(HEAD_BYTES)
        f.seek(0)
        return src
    return _decoded(path, inner_name(base), _decoder(kind, f), kind, size, f.tell, (f,))


def _open_stream(stream, name: str) -> Source:
    """A pipe: its magic bytes read, then served again in front of the rest."""
    magic = stream.read(8) or b""
    raw = _Raw(stream.readinto, head=magic)
    kind = sniff_compression(magic)
    if kind == "zip":
        raise FormatError("a zip archive cannot be read from a stream (its directory is at the "
                          "end); expected a file path, or gzip/bz2/xz/zstd data", path=name)
    if kind is None:
        return _decoded(name, name, raw.readinto, None, None, lambda: raw.count, ())
    return _decoded(name, inner_name(name), _decoder(kind, io.BufferedReader(raw, READ_BYTES)),
                    kind, None, lambda: raw.count, ())


def _decoded(path: str, name: str, read_into: Callable[[memoryview], int], kind: str | None,
             size: int | None, counter: Callable[[], int], closers: tuple) -> Source:
    """A Source over ``read_into``, its first bytes read (for detection) and served again."""
    src = Source(path, name, io.BytesIO(), compression=kind, size=size, is_file=False,
                 counter=counter, closers=closers)
    buf = bytearray(HEAD_BYTES)
    got = 0
    try:
        while got < HEAD_BYTES:
            n = read_into(memoryview(buf)[got:])
            if not n:
                break
            got += n
    except _ERRORS as exc:
        src.close()
        raise src.damaged(exc) from None
    src.head = bytes(buf[:got])
    src.stream = io.BufferedReader(_Raw(read_into, head=src.head), READ_BYTES)
    return src


def open_compressed_output(f: IO[bytes], kind: str) -> Any:
    """A writable stream compressing into ``f`` (closing it finishes the data, not ``f``).

    gzip goes through python-isal (the ``fast-gzip`` extra) when installed, at its level 2:
    measured on a 175 MB word2vec text, 0.61 s and 104.5 MB against the stdlib's level 6,
    15.7 s and 92.6 MB (isal 1: 0.59 s, 105.1 MB; 3: 0.68 s, 102.8 MB; zlib 1: 1.9 s,
    109.5 MB); without it, the stdlib at level 6."""
    if kind == "gzip":
        fast = _isal_gzip()
        if fast is not None:
            return fast.IGzipFile(fileobj=f, mode="wb", compresslevel=GZIP_FAST_LEVEL, mtime=0)
        import gzip
        return gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6, mtime=0)
    if kind == "bz2":
        return bz2.BZ2File(f, "wb")
    if kind == "xz":
        return lzma.LZMAFile(f, "wb")
    if kind == "zstd":
        import zstandard
        return zstandard.ZstdCompressor(level=3).stream_writer(f, closefd=False)
    raise FormatError(f"cannot write {kind}-compressed output; expected one of gzip, bz2, xz, "
                      "zstd")

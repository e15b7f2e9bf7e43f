"""The original C word2vec tool's binary format.

A text header line ``COUNT DIM\\n``, then per row: the key's UTF-8 bytes, one
space, ``DIM`` little-endian float32 values, and (C tool: always; gensim: never)
a ``\\n``.  Quirks handled as the reference readers do: a ``\\n`` before a key is
skipped (gensim's ``lstrip``); in files with the ``\\n`` after each vector a key
holding spaces is read whole (the space before the vector is the one whose
vector is followed by ``\\n``), where gensim would cut it at its first space
(only text before a later space counts as a key: raw vector bytes before it mean the
first space ends the key, as in gensim's files without ``\\n``).  Export refuses such
keys (gensim and the C tool would read shifted vectors).
The header's count is checked against the file, and only used as a size hint.

Reading finds the records of a whole buffer at once (:mod:`.records`); the record-by-record
rule here (:meth:`BinaryReader._split`) decides every record the search leaves (keys holding
spaces, a ``\n`` before a key, the last record, errors), so both give the same rows, keys
and messages.  A thread parses one block ahead of the caller (:mod:`.ahead`).  Writing packs
each block's records into one array (:func:`.records.pack_rows`).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator

import numpy as np

from ...errors import FormatError
from .. import DEFAULT_BLOCK_ROWS, open_output, Reader, check_finite
from .._textparse import decode_keys
from ..source import open_source, stream_row_bound
from . import MAX_LINE_BYTES, _show, fasttext_bin_error, is_fasttext_bin
from .ahead import ReadAhead
from .records import find_rows, pack_rows, take_vectors

__all__ = ["read", "write", "BinaryReader"]

CHUNK_BYTES = 8 << 20
BLOCK_BYTES = 16 << 20  # vectors a block holds at most (several blocks are in flight)
MAX_KEY_BYTES = 1 << 16
SPAN_ROWS = 64  # the least records a vectorised search covers after one it could not take


_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def _text_key(key: bytes | bytearray) -> bool:
    """Whether ``key`` can be a key holding spaces: UTF-8 text without control bytes (the
    bytes of a vector misread as part of a key are neither)."""
    if _CONTROL.search(key) is not None:
        return False
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class BinaryReader(Reader):
    """Streams word2vec binary records from a path or a :class:`~.source.Source`."""

    count: int  # from the header
    format = "word2vec-binary"
    progress_unit = "bytes"

    def __init__(self, path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
                 unicode_errors: str = "strict", dtype=None, chunk_bytes: int = CHUNK_BYTES):
        super().__init__(path, block_rows=block_rows, limit=limit)
        self.unicode_errors = unicode_errors
        self.has_keys = True
        self.dtype = np.dtype(dtype or np.float32)
        self._src = self._f = open_source(path)
        self.progress_total = self._src.size  # stored bytes (compressed); None for a pipe
        try:
            kind = is_fasttext_bin(self._src)
            if kind is not False:
                raise fasttext_bin_error(self.path, self.format, old=kind is None)
            first = self._f.readline(4096)
            toks = first.split()
            if not first:
                raise self.error("the file is empty; expected a 'COUNT DIM' header")
            if len(toks) != 2 or not all(t.isdigit() for t in toks) or not first.endswith(b"\n"):
                raise self.error(f"expected a header 'COUNT DIM', got {_show(first)}", line=1)
            self.count, self.dim = int(toks[0]), int(toks[1])
            if self.dim < 1:
                raise self.error(f"expected a dimension >= 1 in the header, got {self.dim}", line=1)
            # a row holds 4 * dim bytes: refuse before sizing a read buffer by dim
            if self._src.size is not None and self._src.is_file:
                most = (self._src.size - len(first)) // 4 if self.count else 1 << 31
                room = f"{self.progress_total} bytes in the file"
            else:  # compressed or a pipe
                most, room = MAX_LINE_BYTES // 4, f"a row holds at most {MAX_LINE_BYTES} bytes"
            if self.dim > most:
                raise self.error(f"the header's dimension {self.dim} cannot fit: expected at "
                                 f"most {most} ({room})", line=1)
        except BaseException:
            self._src.close()
            raise
        self.progress_done = len(first)
        self._chunk = max(int(chunk_bytes), 4 * self.dim + MAX_KEY_BYTES + 2)
        self._newline: bool | None = None  # rows end with "\n" (C tool) or not (gensim)
        self._ahead: ReadAhead | None = None

    def size_hint(self) -> int | None:
        most = stream_row_bound(self._src, 4 * self.dim + 2)
        if most is None:
            return None
        n = min(self.count, most)
        return n if self.limit is None else min(n, self.limit)

    def _split(self, buf: bytearray, n: int, pos: int, eof: bool,
               row: int) -> tuple[int, int] | None:
        """``(space, end)`` of the record at ``pos``, or ``None`` if the bytes ``buf[:n]``
        hold only part of it."""
        vb = 4 * self.dim
        lim = min(n, pos + MAX_KEY_BYTES)
        sp = buf.find(b" ", pos, lim)
        if sp < 0:
            if not eof and n - pos < MAX_KEY_BYTES:
                return None
            raise self.error(f"row {row + 1}: expected a key and a space, got "
                             f"{_show(bytes(buf[pos:min(n, pos + 40)]))}")
        if self._newline is not False:
            # "\n"-terminated rows: the right space is the one whose vector ends in "\n";
            # a key holds no "\n", so candidates stop at the first one
            stop = buf.find(b"\n", pos, lim)
            stop = lim if stop < 0 else stop
            cand = sp
            while 0 <= cand < stop:
                if cand != sp and not _text_key(buf[pos:cand]):
                    break  # raw bytes before this space: the first space ends the key
                end = cand + 1 + vb
                if end >= n and not eof:
                    return None
                if end < n and buf[end] == 10:
                    self._newline = True
                    return cand, end + 1
                if end == n and (self._newline or cand == sp):  # the last row, without "\n"
                    return cand, end
                if end > n and cand == sp:
                    raise self.error(f"row {row + 1}: expected {vb} bytes of vector after the "
                                     f"key, got {n - sp - 1} (the file is truncated)")
                cand = buf.find(b" ", cand + 1, stop)
            if self._newline:
                raise self.error(f"row {row + 1}: expected a key, a space, {vb} bytes of vector "
                                 "and a newline; no such record starts here")
            self._newline = False
        end = sp + 1 + vb
        if end > n:
            if not eof:
                return None
            raise self.error(f"row {row + 1}: expected {vb} bytes of vector after the key, got "
                             f"{n - sp - 1} (the file is truncated)")
        return sp, end

    def blocks(self) -> Iterator[tuple[np.ndarray, list[str]]]:
        """The blocks, parsed one ahead by a thread of their own (:mod:`.ahead`), which
        starts at once."""
        self._ahead = ReadAhead(self._parse())
        return self._ahead

    def _parse(self) -> Generator[tuple[np.ndarray, list[str]], None, None]:
        # the bytes buf[:n] (read into the same buffer each time: no fresh pages per chunk)
        buf, n, pos, eof = bytearray(2 * self._chunk), 0, 0, False
        u8 = np.frombuffer(buf, np.uint8)[:0]
        vb = 4 * self.dim
        span = self._chunk  # bytes one vectorised search covers (shrinks where it fails)
        size = vb + 2  # the largest mean record size seen (to size a search for n rows)
        row = 0
        target = self.count if self.limit is None else min(self.count, self.limit)
        while row < target:
            want = min(self.block_rows, max(1, BLOCK_BYTES // vb), target - row)
            raw = np.empty((want, vb), np.uint8)
            keys: list[tuple[bytes, bool]] = []  # (keys each ending in "\n", from one record)
            got = 0
            while got < want:
                if self._newline is not None:  # whole runs of records at once
                    # (no further than the rows wanted need, at the record size seen so far)
                    stop = min(n, pos + span, pos + (want - got) * size + size // 2 + 64)
                    spaces, run = find_rows(u8, pos, stop, vb, self._newline, want - got,
                                            MAX_KEY_BYTES)
                    if len(spaces):
                        take_vectors(u8, spaces, vb, raw[got:got + len(spaces)])
                        keys.append((run, False))
                        got += len(spaces)
                        end = int(spaces[-1]) + 1 + vb + self._newline
                        size = max(size, -(-(end - pos) // len(spaces)))
                        pos = end
                        span = min(2 * span, self._chunk)
                        continue
                # one record by the rules in _split (a record the search left, or cut short)
                while pos < n and buf[pos] == 10:  # "\n" before a key (gensim lstrips)
                    pos += 1
                rec = self._split(buf, n, pos, eof, row + got) if pos < n else None
                if rec is None:
                    if eof:
                        raise self.error(f"the header promises {self.count} rows, the file "
                                         f"has {row + got}")
                    tail = n - pos  # the record cut short, moved to the front
                    if tail + self._chunk > len(buf):
                        buf = bytearray(buf[pos:n]) + bytearray(self._chunk)
                    else:
                        buf[:tail] = buf[pos:n]
                    more = self._src.readinto(memoryview(buf)[tail:tail + self._chunk])
                    eof, n, pos = not more, tail + more, 0
                    u8 = np.frombuffer(buf, np.uint8)[:n]
                    continue
                sp, end = rec
                keys.append((bytes(buf[pos:sp]), True))
                raw[got] = u8[sp + 1:sp + 1 + vb]
                got += 1
                pos = end
                span = max(span // 8, SPAN_ROWS * (vb + 64))
            block = raw.view("<f4")
            check_finite(self, block, row)
            out = block if block.dtype == self.dtype else block.astype(self.dtype)
            if self.dtype != np.float32:
                check_finite(self, out, row)
            names = self._decode(keys, row, want)
            row += want
            self.progress_done = self._src.consumed(n - pos)
            yield out, names
        if self.limit is None or self.limit > self.count:
            rest = bytes(buf[pos:n]) + self._src.read(1 << 16)
            if rest.strip():
                raise self.error(f"the header promises {self.count} rows, the file has more "
                                 f"(bytes after row {self.count})")

    def _decode(self, parts: list[tuple[bytes, bool]], row: int, n: int) -> list[str]:
        """The ``n`` keys of ``parts`` (runs of keys each ending in ``\\n``, or one key read
        record by record), decoded in one call; a bad key raises naming its row."""
        joined = b"".join(k + b"\n" if one else k for k, one in parts)
        if joined.count(b"\n") == n:
            try:
                names = joined.decode("utf-8", self.unicode_errors).split("\n")
            except UnicodeDecodeError:
                pass
            else:
                names.pop()
                return names
        raw = [x for k, one in parts for x in ([k] if one else k.split(b"\n")[:-1])]
        return decode_keys(raw, path=self.path, first_line=row + 1,
                           unicode_errors=self.unicode_errors, unit="row")

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()  # the parsing thread stops before its file closes
        self._src.close()


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None) -> BinaryReader:
    """Stream a word2vec binary file."""
    return BinaryReader(path, block_rows=block_rows, limit=limit, unicode_errors=unicode_errors,
                        dtype=dtype)


_KEY_BREAK = re.compile(r"[ \t\n\r\x0b\x0c]")  # where gensim and the C tool end a key


_BREAK_BYTES = np.zeros(256, bool)
_BREAK_BYTES[[0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20]] = True  # the bytes of _KEY_BREAK


def _key_bytes(keys, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """``(utf8, lengths)`` of keys ``start..stop-1`` (the table's bytes where it holds
    them, no ``str`` a key), checked on the bytes at once (a key empty or holding
    whitespace), then key by key for the message."""
    between = getattr(keys, "utf8_between", None)  # (``Table.keys``; a list of str has none)
    held = between(start, stop) if between is not None else None
    if held is None:  # keys held as str: one encode, each followed by a space, then split
        u8 = np.frombuffer((" ".join(keys[start:stop]) + " ").encode("utf-8"), np.uint8)
        space = u8 == 0x20
        ends = np.flatnonzero(space)
        held = u8[~space], np.diff(ends, prepend=-1) - 1  # (checked below, on the keys)
        if ends.size != stop - start:
            _check_keys(list(keys[start:stop]), start)
    utf8, lengths = held
    if (lengths > 0).all() and not _BREAK_BYTES[utf8].any():
        return utf8, lengths
    _check_keys(list(keys[start:stop]), start)
    return utf8, lengths


def _check_keys(keys: list[str], first_row: int) -> None:
    """Keys the readers would cut (whitespace) or lose (empty) raise naming the row."""
    if _KEY_BREAK.search("\x00".join(keys)) is None and "" not in keys:
        return
    for i, k in enumerate(keys):
        if not k or _KEY_BREAK.search(k):
            raise FormatError(f"row {first_row + i}: key {k!r} is empty or holds whitespace; "
                              "word2vec-binary cannot store it (gensim and the C tool end a "
                              "key at its first space and would read shifted vectors)")


def write(path, table, *, limit: int | None = None, block_rows: int = DEFAULT_BLOCK_ROWS,
          progress=None) -> int:
    """Write ``table`` as the C tool does (``\\n`` after each vector); gensim reads it back."""
    keys = table.keys
    if keys is None:
        raise FormatError("the table has no keys; word2vec-binary needs one key per row "
                          "(export to npy or safetensors instead)")
    n = table.vocab_size if limit is None else min(limit, table.vocab_size)
    dim = table.dim
    vb = 4 * dim
    buf = np.empty(0, np.uint8)  # the records of a block, reused (grown as keys need)
    with open_output(path) as f:
        f.write(f"{n} {dim}\n".encode())
        for start in range(0, n, block_rows):
            stop = min(n, start + block_rows)
            data = np.ascontiguousarray(table[start:stop], dtype="<f4").view(np.uint8)
            utf8, lengths = _key_bytes(keys, start, stop)
            if buf.size < len(utf8) + (stop - start) * (vb + 2):
                buf = np.empty(2 * len(utf8) + block_rows * (vb + 2), np.uint8)
            f.write(pack_rows(utf8, lengths, data.reshape(-1, vb), buf=buf).data)
            if progress is not None:
                progress(stop - start)
    return n

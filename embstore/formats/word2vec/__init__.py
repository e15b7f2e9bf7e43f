"""word2vec text format (also fastText's ``.vec``): a ``COUNT DIM`` header line, then
``key v1 ... vDIM`` per line.

What the real writers produce, all read here: gensim (no trailing space,
shortest float32 repr), the C tool (``%lf `` with a trailing space), fastText
(trailing space), Windows line ends (``\\r\\n``), a last line without newline.
The header's count is a claim: fewer or more rows than it says is an error, and
it is only used (capped by the file size) as a size hint, never to allocate.
:mod:`..glove` shares this code (no header; the dimension comes from the first line).

Writing gives each float32 value its shortest round-trip form (``0.418``, not
``0.418000013``: the digits of ``np.format_float_positional(x, unique=True)``), found
for a whole block at once by :func:`shortest_digits` and printed with ``%.*g``, one
C-level ``%`` per row; whole numbers as gensim writes them (``10.0``, ``-30.0``, ``1e+06``);
float64 uses ``repr`` (shortest for float64, ``10.0`` for whole numbers).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np

from ...errors import FormatError
from .. import DEFAULT_BLOCK_ROWS, open_output, Reader, _fasttext_old
from ..source import open_source, stream_row_bound
from .._textparse import _number, parse_block

__all__ = ["read", "write", "TextReader", "write_text", "fasttext_bin_error"]

BLOCK_BYTES = 8 << 20
BOM = b"\xef\xbb\xbf"
MAX_LINE_BYTES = 256 << 20
MAX_EMPTY_DIM = 1 << 31  # the largest dimension of a header with count 0
TEXT_VALUES = 1 << 19  # values formatted at once on export (a Python object each, and its
#                        digit count: 65,536 rows of 100 took 1.1 GB and ran slower)
FASTTEXT_BIN_MAGIC = b"\xba\x16\x4f\x2f"  # 0x2F4F16BA, little-endian int32 at offset 0
_WS = re.compile(r"[ \t\n\r\x0b\x0c]")
_P10 = 10.0 ** np.arange(0, 61)  # exact up to 1e22, which is all a float32's digits need


def shortest_digits(x: np.ndarray) -> np.ndarray:
    """For each float32 of ``x``: the fewest significant digits ``p`` (1..9) whose ``%.{p}g``
    reads back as exactly that float32 (9 always does).  Vectorised: one pass per digit count
    over the values still undecided, each value rounded to ``p`` digits in float64 (never
    multiplied by an inexact power of ten) and compared after a cast to float32; checked
    bit for bit against ``%.*g`` on 2M random float32 bit patterns (same digits as NumPy's
    ``unique=True``)."""
    x = np.asarray(x, dtype=np.float32)
    x64 = x.astype(np.float64)
    mag = np.abs(x64)
    todo = (mag > 0) & np.isfinite(mag)
    p = np.where(todo, 9, 1).astype(np.int8)
    exp = np.zeros(x.shape, np.int64)
    exp[todo] = np.floor(np.log10(mag[todo]))
    with np.errstate(over="ignore", invalid="ignore"):
        for digits in range(1, 9):
            at = np.flatnonzero(todo)
            if not at.size:
                break
            k = digits - 1 - exp.flat[at]
            up, down = _P10[np.clip(k, 0, 60)], _P10[np.clip(-k, 0, 60)]
            v = x64.flat[at]
            ok = (np.round(v * up / down) / up * down).astype(np.float32) == x.flat[at]
            p.flat[at[ok]] = digits
            todo.flat[at[ok]] = False
    return p


class TextReader(Reader):
    """Streams ``key v1 ... vdim`` lines, with (word2vec, fasttext) or without (glove) a header,
    from a path or a :class:`~.source.Source` (compressed data, a pipe)."""

    progress_unit = "bytes"

    def __init__(self, path, *, header: bool, format: str, block_rows: int = DEFAULT_BLOCK_ROWS,
                 limit: int | None = None, unicode_errors: str = "strict",
                 dtype=np.float32, block_bytes: int = BLOCK_BYTES):
        super().__init__(path, block_rows=block_rows, limit=limit)
        if unicode_errors not in ("strict", "replace"):
            raise ValueError(f"unicode_errors must be 'strict' or 'replace', got {unicode_errors!r}")
        self.format = format
        self.has_keys = True
        self.dtype = np.dtype(dtype)
        self.unicode_errors = unicode_errors
        self.block_bytes = int(block_bytes)
        self._src = self._f = open_source(path)
        self.progress_total = self._src.size  # stored bytes (compressed); None for a pipe
        self._first = b""
        self._line = 1  # number of the next line to read
        try:
            self._read_head(header)
        except BaseException:
            self._src.close()
            raise

    def _read_head(self, header: bool) -> None:
        kind = is_fasttext_bin(self._src)
        if kind is not False:
            raise fasttext_bin_error(self.path, "fastText .vec" if self.format == "fasttext"
                                     else self.format, old=kind is None)
        first = self._f.readline(MAX_LINE_BYTES)
        if first.startswith(BOM):  # a UTF-8 byte order mark is not part of the first key
            first = first[len(BOM):]
        if b"\r" in first.rstrip(b"\r\n"):
            _check_line_ends(self, first.rstrip(b"\r\n"), 1)
        if not first.strip():
            if not first:
                raise self.error("the file is empty; expected "
                                 + ("a 'COUNT DIM' header" if header else "'key v1 v2 ...' lines"))
            raise self.error("expected " + ("a 'COUNT DIM' header" if header else
                                            "'key v1 v2 ...'") + ", got an empty line", line=1)
        if header:
            toks = first.split()
            if len(toks) != 2 or not all(t.isdigit() for t in toks):
                hint = " (a file without header is format='glove')" if len(toks) > 2 else ""
                raise self.error(f"expected a header 'COUNT DIM', got {_show(first)}{hint}", line=1)
            count, dim = int(toks[0]), int(toks[1])
            if dim < 1:
                raise self.error(f"expected a dimension >= 1 in the header, got {dim}", line=1)
            # a row of dim values needs >= 2 * dim bytes: refuse before sizing anything by dim
            if self._src.size is not None and self._src.is_file:
                most = (self._src.size - len(first)) // 2 if count else MAX_EMPTY_DIM
                room = f"{self.progress_total} bytes in the file"
            else:  # compressed or a pipe: a row is one line
                most, room = MAX_LINE_BYTES // 2, f"a line holds at most {MAX_LINE_BYTES} bytes"
            if dim > most:
                raise self.error(f"the header's dimension {dim} cannot fit: expected at most "
                                 f"{most} ({room})", line=1)
            self.count, self.dim = count, dim
            self._line = 2
            self.progress_done = len(first)
        else:
            toks = first.split()
            if len(toks) < 2:
                raise self.error(f"expected a key and at least one value, got {_show(first)}", line=1)
            # the trailing numbers are the vector (a key may hold spaces, or be a number itself)
            numeric = 0
            for tok in reversed(toks):
                if _number(tok) is None:
                    break
                numeric += 1
            self.dim = min(numeric, len(toks) - 1)
            if self.dim < 1:
                raise self.error(f"expected a key and numbers, got {_show(first)}", line=1)
            self._first = first  # parsed with the first block
            self.count = None

    def size_hint(self) -> int | None:
        """Rows to expect: the header's count, capped by what the file size can hold."""
        if self.count is None:
            return None
        most = stream_row_bound(self._src, 2 * self.dim)
        if most is None:
            return None
        n = min(self.count, most)
        return n if self.limit is None else min(n, self.limit)

    def _line_limit(self) -> int:
        """The longest line a row of ``dim`` values may take: a key of at most 1 MiB and 64
        bytes a value (a 10 GB sparse file of zeros was read 256 MiB deep, 588 MB RSS)."""
        return min(MAX_LINE_BYTES, (1 << 20) + 64 * self.dim)

    def _line_blocks(self) -> Iterator[tuple[int, list[bytes]]]:
        """``(first line number, complete lines)`` blocks.  Blank lines are fine only at the
        end of the file: they are counted, not kept (a file ending in 32 MB of blank lines
        holds one block at a time), and are an error naming the first of them as soon as
        another line follows."""
        carry = self._first
        self._first = b""
        line = self._line  # the next line not yet yielded (the first blank one held back)
        blanks = 0  # blank lines held back since then
        while True:
            chunk = self._f.read(self.block_bytes)
            eof = not chunk
            data = carry + chunk
            if eof:
                carry, body = b"", data
            else:
                cut = data.rfind(b"\n")
                if cut < 0:
                    if len(data) > self._line_limit():
                        raise self.error(f"expected lines shorter than {self._line_limit()} "
                                         f"bytes (a key and {self.dim} values), got a longer "
                                         "one", line=line + blanks)
                    carry = data
                    continue
                carry, body = data[cut + 1:], data[:cut + 1]
            # body: whole lines, each ending in \n (at the end of the file the last may not)
            self.progress_done = self._src.consumed(len(carry))  # bytes read, up to body's end
            text = body.rstrip()
            if text:
                if blanks:
                    raise self.error("expected a key and its values, got an empty line",
                                     line=line)
                if b"\r" in text:
                    _check_line_ends(self, text, line)
                lines = text.split(b"\n")  # blank lines inside: parse_block names the first
                yield line, lines
                line += len(lines)
                blanks = body.count(b"\n", len(text)) - 1  # after the last line's own \n
            else:
                blanks += body.count(b"\n")
            if eof:
                return

    def blocks(self) -> Iterator[tuple[np.ndarray, list[str]]]:
        rows = 0
        limit = self.limit
        for first_line, lines in self._line_blocks():
            for s in range(0, len(lines), self.block_rows):
                part = lines[s:s + self.block_rows]
                if limit is not None and rows + len(part) > limit:
                    part = part[:limit - rows]
                if self.count is not None and rows + len(part) > self.count:
                    raise self.error(f"the header promises {self.count} rows, the file has more",
                                     line=first_line + s + self.count - rows)
                if part:
                    yield parse_block(part, dim=self.dim, path=self.path,
                                      first_line=first_line + s, unicode_errors=self.unicode_errors,
                                      dtype=self.dtype)
                rows += len(part)
                if limit is not None and rows >= limit:
                    return
        if self.count is not None and rows < self.count:
            raise self.error(f"the header promises {self.count} rows, the file has {rows}",
                             line=self._line + rows)

    def close(self) -> None:
        self._src.close()


def fasttext_bin_error(path: str, fmt: str, *, old: bool = False) -> FormatError:
    """A fastText binary model read as a text format: say what it is and what reads it
    (``old``: a model of the format before 2017, which has no magic number)."""
    what = "of the old format (.bin, no magic number)" if old else \
        "(.bin, magic number 0x2F4F16BA)"
    return FormatError(f"this is a fastText binary model {what}, not "
                       f"the {fmt} text format; read it with format 'fasttext-bin'", path=path)


def is_fasttext_bin(src) -> bool | None:
    """Whether the :class:`~.source.Source` ``src`` starts like a fastText ``.bin``:
    ``True`` (magic number), ``None`` (the old format: no magic, plausible arguments and
    a ``.bin``/``.ftz`` name), else ``False``."""
    if src.head.startswith(FASTTEXT_BIN_MAGIC):
        return True
    size = src.size if src.size is not None else 1 << 62
    return None if _fasttext_old(src.head, os.path.splitext(src.name)[1].lower(), size) \
        else False


def _check_line_ends(reader, text: bytes, first_line: int) -> None:
    """A carriage return not followed by a line feed: old Mac (CR-only) line ends, which
    would otherwise read as one giant line.  Raise naming the line."""
    bare = text.replace(b"\r\n", b"\n").find(b"\r")
    if bare >= 0:
        at = first_line + text.replace(b"\r\n", b"\n").count(b"\n", 0, bare)
        raise reader.error("expected lines ending in \\n or \\r\\n, got a carriage return "
                           "inside a line (CR-only line ends are not supported)", line=at)


def _show(line: bytes, n: int = 60) -> str:
    s = line.rstrip(b"\r\n").decode("utf-8", "replace")
    return repr(s if len(s) <= n else s[:n] + "...")


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None,
         dtype=None) -> TextReader:
    """Stream a word2vec text file (``COUNT DIM`` header, then ``key v1 ... vDIM`` lines)."""
    return TextReader(path, header=True, format="word2vec", block_rows=block_rows, limit=limit,
                      unicode_errors=unicode_errors, dtype=dtype or np.float32)


def check_text_keys(keys: list[str], first_row: int, *, fmt: str) -> None:
    """Keys that would break a text line (whitespace, empty) raise naming the row."""
    joined = "\x00".join(keys)
    if _WS.search(joined) is None and "" not in keys:
        return
    for i, k in enumerate(keys):
        if not k or _WS.search(k):
            raise FormatError(f"row {first_row + i}: key {k!r} is empty or holds whitespace; "
                              f"the {fmt} text format cannot store it")


def write_text(path, table, *, header: bool, fmt: str, limit: int | None = None,
               block_rows: int = DEFAULT_BLOCK_ROWS, progress=None) -> int:
    """Write ``key v1 ... vdim`` lines (with a ``COUNT DIM`` header when ``header``)."""
    keys = table.keys
    if keys is None:
        raise FormatError(f"the table has no keys; the {fmt} format needs one key per row "
                          "(export to npy or safetensors instead)")
    n = table.vocab_size if limit is None else min(limit, table.vocab_size)
    dim = table.dim
    dtype = np.dtype(table.dtype)
    wide = dtype == np.float64
    fmt_row = "%s " + " ".join(["%r" if wide else "%.*g"] * dim)
    step = min(block_rows, max(1, TEXT_VALUES // max(1, dim)))  # the rows formatted at once
    with open_output(path) as f:
        if header:
            f.write(f"{n} {dim}\n".encode())
        for start in range(0, n, step):
            stop = min(n, start + step)
            block = np.asarray(table[start:stop])
            ks = list(keys[start:stop])
            check_text_keys(ks, start, fmt=fmt)
            if wide:
                rows = [fmt_row % (k, *r) for k, r in zip(ks, block.tolist())]
            else:  # key, then (precision, value) pairs
                rows = _float32_rows(fmt_row, ks, block.astype(np.float32, copy=False))
            rows.append("")
            f.write("\n".join(rows).encode("utf-8"))
            if progress is not None:
                progress(stop - start)
    return n


_WHOLE_POSITIONAL = 1e6  # NumPy (and so gensim) writes float32 whole numbers below this as "10.0"
_TOKENS = np.frombuffer(b"%.*g %.*f %.*e ", dtype=np.uint8).reshape(3, 5)


def _float32_rows(fmt_row: str, keys: list[str], block: np.ndarray) -> list[str]:
    """One text line per row of the float32 ``block``: each value in its shortest round-trip
    form (``%.*g`` with :func:`shortest_digits`), except whole numbers, written as gensim's
    ``save_word2vec_format`` writes them (NumPy's float32 ``str``): ``10.0``, ``-30.0``,
    ``0.0`` below 1e6 (``%.1f``), ``1e+06``, ``1.234567e+06`` from there (``%.*e``).  Rows
    holding a whole number get their own format string, built for the block at once."""
    digits = shortest_digits(block)
    with np.errstate(invalid="ignore"):
        whole = np.isfinite(block) & (block == np.round(block))
    args = np.empty((len(keys), 1 + 2 * block.shape[1]), dtype=object)
    args[:, 0] = keys
    args[:, 2::2] = block
    if not whole.any():
        args[:, 1::2] = digits
        return [fmt_row % tuple(r) for r in args.tolist()]
    small = np.abs(block) < _WHOLE_POSITIONAL
    kind = np.where(whole, np.where(small, 1, 2), 0)  # 0 %g, 1 %f, 2 %e
    args[:, 1::2] = np.where(kind == 1, 1, np.where(kind == 2, digits - 1, digits))
    tokens = _TOKENS[kind].reshape(len(keys), -1)[:, :-1]  # "%.*g %.*f ..." without the last space
    fmts = np.ascontiguousarray(tokens).view(f"S{tokens.shape[1]}").ravel().tolist()
    return ["%s " % k + f.decode("ascii") % tuple(r[1:])
            for k, f, r in zip(keys, fmts, args.tolist())]


def write(path, table, *, limit: int | None = None, block_rows: int = DEFAULT_BLOCK_ROWS,
          progress=None) -> int:
    """Write ``table`` as word2vec text (gensim ``load_word2vec_format(binary=False)`` reads it)."""
    return write_text(path, table, header=True, fmt="word2vec", limit=limit,
                      block_rows=block_rows, progress=progress)

"""Keys files beside keyless formats (npy, safetensors, PyTorch): one UTF-8 key per line.

:class:`VocabReader` reads one in blocks (the keys of an import); :func:`write_vocab` writes
the keys of an export; :func:`vocab_path_for` is where an export puts them by default and
where an import looks for them (``model.npy`` -> ``model.vocab.txt``).
"""

from __future__ import annotations

import os

from ..errors import FormatError
from ._textparse import decode_keys
from .tokens import MAX_TOKEN_BYTES
from .source import inner_name

__all__ = ["VocabReader", "write_vocab", "vocab_path_for"]


def vocab_path_for(path) -> str:
    """The keys file of ``path``: its stem (compression extension and all) + ``.vocab.txt``
    (``model.npy`` and ``model.safetensors`` share ``model.vocab.txt``)."""
    root, _ = os.path.splitext(inner_name(os.fspath(path)))
    return root + ".vocab.txt"


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


def write_vocab(path: str, table, n: int, block_rows: int) -> None:
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

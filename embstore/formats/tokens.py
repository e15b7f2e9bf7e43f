"""Keys from a tokenizer: ``tokenizer.json`` (WordPiece, BPE, WordLevel, Unigram), ``vocab.json``
or ``vocab.txt``, as an id -> token list aligned with the rows of an embedding matrix.

The JSON is parsed here with :mod:`json` (nothing in it is executed).  A token's id is its
row: ``tokenizer.json``'s ``model.vocab`` (a ``{token: id}`` object, or for Unigram a
``[[token, score], ...]`` list whose index is the id), then its ``added_tokens``
(``{"id", "content"}``), which win over the model's vocabulary for their ids, as
``tokenizers.Tokenizer.id_to_token`` does; ``vocab.json`` is ``{token: id}``;
``vocab.txt`` is one token a line, the line number (from 0) its id.

:class:`TokenKeys` gives one key per row, with a row count that differs from the token
count handled, not refused (models pad their tables to a multiple of 64 or 128):

- a row with no token (padding rows past the last token, or an id the tokenizer skips)
  gets the synthetic key ``<row:N>`` (N its row number), so every row stays where the
  model's ids put it;
- a token whose text repeats an earlier id's token: the first id keeps the key (the
  contract's "first occurrence wins") and the later row gets ``<row:N>``;
- tokens with ids past the last row are left out.

Each case is counted and described in :attr:`TokenKeys.notes`.
"""

from __future__ import annotations

import os

from ..errors import FormatError
from ._json import parse_json

__all__ = ["load_tokens", "TokenKeys", "synthetic_key", "TOKEN_FILES"]

TOKEN_FILES = ("tokenizer.json", "vocab.json", "vocab.txt")  # a model folder's, best first
MAX_JSON_BYTES = 1 << 30
MAX_ID = 1 << 31
MAX_TOKEN_BYTES = 1 << 16  # the longest line of a vocab.txt
_CHUNK = 4 << 20


def synthetic_key(row: int) -> str:
    """The key of a row the tokenizer gives no (unique) token: ``<row:N>``."""
    return f"<row:{row}>"


def _read_json(path: str):
    size = os.path.getsize(path)
    if size > MAX_JSON_BYTES:
        raise FormatError(f"expected a JSON file of at most {MAX_JSON_BYTES} bytes, got {size}",
                          path=path)
    with open(path, "rb") as f:
        raw = f.read()
    return parse_json(raw, path)


def _check_id(token, i, path: str, where: str) -> int:
    if not isinstance(token, str) or type(i) is not int or not 0 <= i < MAX_ID:
        raise FormatError(f"{where}: expected a token string and an id in [0, {MAX_ID}), got "
                          f"{token!r}: {i!r}", path=path)
    return i


def _from_mapping(vocab, path: str, where: str) -> dict[int, str]:
    if not isinstance(vocab, dict):
        raise FormatError(f"{where}: expected an object of token: id, got "
                          f"{type(vocab).__name__}", path=path)
    out: dict[int, str] = {}
    for token, i in vocab.items():
        out.setdefault(_check_id(token, i, path, where), token)
    return out


def _from_tokenizer(doc, path: str) -> dict[int, str]:
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or "vocab" not in model:
        raise FormatError("expected a tokenizer.json with a model.vocab", path=path)
    vocab = model["vocab"]
    if isinstance(vocab, list):  # Unigram: [[token, score], ...], the index is the id
        out = {}
        for i, entry in enumerate(vocab):
            if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
                raise FormatError(f"model.vocab[{i}]: expected [token, score], got {entry!r}",
                                  path=path)
            out[i] = entry[0]
    else:  # WordPiece, BPE, WordLevel: {token: id}
        out = _from_mapping(vocab, path, "model.vocab")
    added = doc.get("added_tokens") or []
    if not isinstance(added, list):
        raise FormatError("added_tokens: expected a list", path=path)
    for k, tok in enumerate(added):
        if not isinstance(tok, dict):
            raise FormatError(f"added_tokens[{k}]: expected an object, got {tok!r}", path=path)
        out[_check_id(tok.get("content"), tok.get("id"), path, f"added_tokens[{k}]")] = \
            tok["content"]
    return out


def load_tokens(path, *, rows: int | None = None) -> dict[int, str]:
    """``{id: token}`` of a ``tokenizer.json``, a ``{token: id}`` ``.json`` or a one-token-a-line
    text file (told apart by the name, then by the JSON's shape).  A text file is streamed:
    with ``rows``, only the tokens of ids below it are kept (the others are counted, in
    the returned dict's :class:`Tokens` ``.past``)."""
    path = os.fspath(path)
    if not path.lower().endswith(".json"):
        return _text_tokens(path, rows)
    doc = _read_json(path)
    if isinstance(doc, dict) and isinstance(doc.get("model"), dict):
        return _from_tokenizer(doc, path)
    return _from_mapping(doc, path, "the vocabulary")


class Tokens(dict):
    """``{id: token}``; ``past``: lines of a text vocabulary past the rows asked for."""

    past = 0


def _text_tokens(path: str, rows: int | None) -> Tokens:
    """One token a line, read in blocks of ``_CHUNK`` bytes (never the whole file)."""
    out, carry, line = Tokens(), b"", 0
    with open(path, "rb") as f:
        head = f.read(3)
        start = 3 if head == b"\xef\xbb\xbf" else 0  # file offset of carry[0]
        carry = head[start:]
        while True:
            data = f.read(_CHUNK)
            block = carry + data
            cut = len(block) if not data else block.rfind(b"\n") + 1
            if cut == 0 and len(block) > MAX_TOKEN_BYTES:
                raise FormatError(f"expected a token a line, got a line of more than "
                                  f"{MAX_TOKEN_BYTES} bytes", path=path, line=line + 1)
            carry = block[cut:]
            lines = block[:cut].split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            keep = len(lines) if rows is None else max(0, min(len(lines), rows - line))
            try:
                text = b"\n".join(lines[:keep]).decode("utf-8").split("\n") if keep else []
            except UnicodeDecodeError as exc:
                raise FormatError(f"expected UTF-8 text, got an invalid byte at offset "
                                  f"{start + exc.start}", path=path) from None
            start += cut
            out.update((line + i, t[:-1] if t.endswith("\r") else t)
                       for i, t in enumerate(text))  # a loop per token: vocabularies are small
            out.past += len(lines) - keep
            line += len(lines)
            if not data:
                return out


class TokenKeys:
    """One key per row from ``{id: token}`` (see the module docstring for rows without a
    token, repeated tokens and ids past the rows).  ``take(n)`` gives the next ``n``
    rows' keys, as :class:`embstore.convert.VocabReader` does."""

    def __init__(self, tokens: dict[int, str], *, path: str):
        self.path = path
        self._tokens = tokens
        self._seen: dict[str, int] = {}
        self.taken = 0
        self.synthetic = 0       # rows keyed <row:N>: no token
        self.repeated: list[int] = []   # rows keyed <row:N>: the token repeats an earlier id's

    def take(self, n: int, *, rows_of: str = "", expected: int | None = None) -> list[str]:
        out = []
        get, seen = self._tokens.get, self._seen
        for row in range(self.taken, self.taken + n):  # per row: a tokenizer vocabulary is small
            tok = get(row)
            if tok is None:
                self.synthetic += 1
                out.append(synthetic_key(row))
            elif seen.setdefault(tok, row) != row:
                self.repeated.append(row)
                out.append(synthetic_key(row))
            else:
                out.append(tok)
        self.taken += n
        return out

    def check_end(self, *, rows_of: str = "") -> None:
        """Never an error: a count that differs from the rows is reported in :attr:`notes`."""

    def close(self) -> None:
        pass

    @property
    def notes(self) -> list[str]:
        name = os.path.basename(self.path)
        out = []
        n_tokens = len(self._tokens)
        past = sum(1 for i in self._tokens if i >= self.taken) + getattr(self._tokens,
                                                                           "past", 0)
        if self.synthetic:
            out.append(f"{self.synthetic} of {self.taken} rows have no token in {name} "
                       f"({n_tokens} tokens; padding rows): keyed <row:N>")
        if past:
            out.append(f"{past} token(s) of {name} have ids past the table's {self.taken} rows: "
                       "left out")
        if self.repeated:
            rows = ", ".join(map(str, self.repeated[:5])) + (", ..." if len(self.repeated) > 5
                                                               else "")
            out.append(f"{len(self.repeated)} token(s) of {name} repeat an earlier id's token "
                       f"(the first id keeps the key; rows {rows} keyed <row:N>)")
        return out

"""Files that say which rows are hot, for ``Table.warm`` (``embstore lookup --warm FILE``).

A hot file is one of:

- ``.npy`` of integer ids, any shape: a list of distinct ids hottest first, or a sample of
  traffic (ids with repeats): rows are ranked by how often they occur, ties in the order
  of their first occurrence (so a hottest-first list keeps its order);
- ``.npy`` of shape ``(n, 2)``, integers: ``(id, count)`` rows (counts of one id added up),
  ranked by count, ties in file order;
- text: one id a line, or ``id count`` a line (whitespace-separated integers, the same
  number on every line; blank lines are skipped), ranked as the ``.npy`` forms.

:func:`hot_ids` reads one and returns distinct int64 ids, hottest first.  Never unpickles.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import FormatError, InvalidIdError
from ..ids import as_ids

__all__ = ["hot_ids", "rank_ids"]

_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\n\r\x0b\x0c")] = True  # what bytes.split() splits on


def rank_ids(ids: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Distinct ``ids`` (1-D int64) ranked by their total count (``counts``, default one per
    occurrence), ties in the order of first occurrence."""
    uniq, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    weight = np.bincount(inv.reshape(-1), weights=counts, minlength=uniq.size)
    return uniq[np.lexsort((first, -weight))]


def hot_ids(path, vocab_size: int) -> np.ndarray:
    """The ids of a hot file (module docstring), distinct, hottest first; each checked
    against ``vocab_size``.  Malformed files raise :class:`~embstore.errors.FormatError`
    (path, and line for text), ids out of range :class:`~embstore.errors.InvalidIdError`."""
    name = os.fspath(path)
    if name.lower().endswith(".npy"):
        try:
            arr = np.load(name, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:  # not a .npy, or an object array (never unpickled)
            why = "it holds Python objects, never unpickled" if "object" in str(exc) else exc
            raise FormatError(f"not a readable .npy of integer ids ({why})", path=name) from None
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iu":
            what = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
            raise FormatError(f"expected integer ids (or (id, count) rows), got dtype {what}",
                              path=name)
        table = np.asarray(arr)
        pairs = table.ndim == 2 and table.shape[1] == 2
        line: np.ndarray | None = None
    else:
        table, pairs, line = _text(name)  # (line: each row's, for messages)
    if pairs and table.size and (table[:, 1] < 0).any():
        i = int(np.argmax(table[:, 1] < 0))
        raise FormatError(f"expected a count >= 0, got {int(table[i, 1])} for id "
                          f"{int(table[i, 0])}" + ("" if line is not None else f" (row {i})"),
                          path=name, line=None if line is None else int(line[i]))
    ids = table[:, 0] if pairs else table.reshape(-1)
    try:
        ids = as_ids(ids, vocab_size).reshape(-1)
    except InvalidIdError as exc:
        where = exc.position[0] if exc.position else 0
        at = f"line {int(line[where])}" if line is not None else f"position {where}"
        raise InvalidIdError(f"{name}, {at}: id {exc.id} is out of range for a table of "
                             f"{vocab_size} rows (valid ids: 0..{vocab_size - 1})",
                             id=exc.id, position=exc.position, vocab_size=vocab_size) from None
    return rank_ids(ids, table[:, 1].astype(np.float64) if pairs else None)


def _tokens(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start offset and 0-based line of every whitespace-separated token (vectorised)."""
    b = np.frombuffer(data, dtype=np.uint8)
    space = _SPACE[b]
    starts = np.flatnonzero(~space & np.concatenate([[True], space[:-1]]))
    return starts, np.searchsorted(np.flatnonzero(b == 10), starts)


def _text(name: str) -> tuple[np.ndarray, bool, np.ndarray]:
    """``(values (rows, 1 or 2), pairs, 1-based file line of each row)`` of a text file."""
    with open(name, "rb") as fh:
        data = fh.read()
    _, line = _tokens(data)
    lines, per = np.unique(line, return_counts=True)
    if not lines.size:
        raise FormatError("expected ids, one a line (or 'id count'), got an empty file",
                          path=name)
    bad = np.flatnonzero((per != per[0]) | (per > 2))
    if bad.size:
        i = int(bad[0])
        want = (f"{per[0]} field{'s' if per[0] > 1 else ''} as on line {int(lines[0]) + 1}"
                if per[0] <= 2 else "one id, or 'id count'")
        raise FormatError(f"expected {want}, got {int(per[i])} field{'s' if per[i] > 1 else ''}",
                          path=name,
                          line=int(lines[i]) + 1)
    tokens = data.split()
    try:
        values = np.array(tokens).astype(np.int64)
    except (ValueError, OverflowError):
        for k, tok in enumerate(tokens):  # (the error path only: find the bad token)
            try:
                ok = -(2**63) <= int(tok) < 2**63
            except ValueError:
                ok = False
            if not ok:
                raise FormatError(f"expected an integer id or count, got "
                                  f"{tok.decode(errors='replace')!r}", path=name,
                                  line=int(line[k]) + 1) from None
        raise
    return values.reshape(lines.size, int(per[0])), int(per[0]) == 2, lines + 1

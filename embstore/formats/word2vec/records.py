"""word2vec binary records found, cut out and packed a buffer at a time with NumPy.

A record is ``key b" " vector`` (``vb`` bytes) and, in the C tool's files, ``b"\\n"``.  The
vector's bytes may hold any byte, spaces and newlines included, so where record ``i + 1``
starts depends on where the key of record ``i`` ends: a chain.  :func:`find_rows` follows it
for a whole buffer at once.  Every space ``q`` whose record would fit in the buffer (and, in
the C tool's files, whose vector is followed by ``\\n``) is a candidate; ``succ[q]`` is the
first candidate at or after ``q + 1 + vb (+ 1)``, where the next key starts if ``q`` ends a
key.  The rows are the candidates reachable from the buffer's first one
(:func:`reachable`).  A row is accepted only where the reader's own record-by-record rule
would take the same space (:class:`~.binary.BinaryReader`): its key holds no space (files
with ``\\n``; a key holding spaces is read there), no ``\\n`` (a ``\\n`` before a key is
skipped there, one inside a key is an error) and is shorter than ``MAX_KEY_BYTES``.  The
first row not accepted, and a record cut by the end of the buffer, are left to that rule.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["find_rows", "reachable", "take_vectors", "pack_rows"]

SPACE, NEWLINE = 32, 10
MAX_STEPS = 64  # rounds of dropping unreachable candidates before walking the chain instead

_EMPTY = np.empty(0, np.int64)


def reachable(succ: np.ndarray) -> np.ndarray:
    """Indices reachable from 0 through ``succ`` (``succ[j] > j``; ``len(succ)`` ends the
    chain), in order.  Candidates that nothing reachable points at are dropped in rounds
    (those no candidate points at, then those only dropped ones pointed at, ...): a false
    candidate (a space inside a vector) starts a short chain that soon joins the true one,
    so a few rounds do.  Past ``MAX_STEPS`` rounds (a file built to defeat it), pointer
    doubling (:func:`_doubling`) finds the chain."""
    m = len(succ)
    indeg = np.bincount(succ, minlength=m + 1)
    indeg[0] += 1  # the start is reachable by definition
    alive = np.ones(m + 1, bool)
    gone = np.flatnonzero(indeg[:m] == 0)
    for _ in range(MAX_STEPS):
        if not gone.size:
            return np.flatnonzero(alive[:m])
        alive[gone] = False
        targets, counts = np.unique(succ[gone], return_counts=True)
        indeg[targets] -= counts
        gone = targets[(indeg[targets] == 0) & (targets < m)]
    return _doubling(succ)


def _doubling(succ: np.ndarray) -> np.ndarray:
    """The chain from 0 by pointer doubling: ``log2(m)`` whole-array steps, whatever the
    candidates (the fallback of :func:`reachable`)."""
    m = len(succ)
    jumps = [np.append(succ, m)]  # jumps[b][j]: 2**b steps from j (m stays m)
    while (1 << len(jumps)) <= m:
        jumps.append(jumps[-1][jumps[-1]])
    steps, j = 0, 0  # the most steps that stay inside the buffer
    for b in range(len(jumps) - 1, -1, -1):
        if jumps[b][j] < m:
            j, steps = int(jumps[b][j]), steps + (1 << b)
    k = np.arange(steps + 1)
    at = np.zeros(steps + 1, np.int64)
    for b, jump in enumerate(jumps):
        sel = ((k >> b) & 1).astype(bool)
        at[sel] = jump[at[sel]]
    return at


def find_rows(u8: np.ndarray, pos: int, stop: int, vb: int, newline: bool,
              max_rows: int, max_key: int) -> tuple[np.ndarray, bytes]:
    """``(spaces, keys)`` of the rows accepted from ``pos`` on (at most ``max_rows``, their
    spaces before ``stop``): where each key ends, and the keys, each followed by ``\\n``.
    The next row starts ``vb + 1`` (``+ 1`` with ``newline``) bytes after the last space."""
    n = len(u8)
    step = vb + 1 + bool(newline)
    spaces = np.flatnonzero(u8[pos:stop] == SPACE) + pos
    cand = spaces[spaces + (vb + 1) < n] if newline else spaces[spaces + (vb + 1) <= n]
    if newline:
        cand = cand[u8[cand + (vb + 1)] == NEWLINE]
    if not cand.size or max_rows < 1:
        return _EMPTY, b""
    sp = cand[reachable(np.searchsorted(cand, cand + step))][:max_rows]
    starts = np.empty_like(sp)
    starts[0] = pos
    starts[1:] = sp[:-1] + step
    lengths = sp - starts + 1  # the key and its space
    cut = np.flatnonzero(lengths > max_key)
    if cut.size:
        sp, starts, lengths = sp[:cut[0]], starts[:cut[0]], lengths[:cut[0]]
    keys = u8[_ragged(starts, lengths)]
    ends = np.cumsum(lengths) - 1
    keys[ends] = NEWLINE
    # a key holding "\n" (or, with newline, a space: the key's first space is another one)
    odd = (keys == NEWLINE) | (keys == SPACE) if newline else keys == NEWLINE
    odd[ends] = False
    bad = np.flatnonzero(odd)
    if bad.size:
        k = int(np.searchsorted(ends, bad[0]))
        sp, keys = sp[:k], keys[:ends[k - 1] + 1 if k else 0]
    return sp, keys.tobytes()


def _ragged(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices of the byte runs ``starts[i] : starts[i] + lengths[i]``, one after another."""
    first = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - first, lengths)


def _windows(u8: np.ndarray, width: int) -> np.ndarray:
    """Every ``width``-byte run of ``u8`` as a row of a 2-D view (no copy)."""
    return as_strided(u8, shape=(len(u8) - width + 1, width), strides=(1, 1),
                      writeable=u8.flags.writeable)


def take_vectors(u8: np.ndarray, spaces: np.ndarray, vb: int, out: np.ndarray) -> None:
    """Copy the ``vb`` bytes after each space into the rows of ``out`` (uint8, (n, vb))."""
    out[...] = _windows(u8, vb)[spaces + 1]  # (np.take would copy every window first)


def pack_rows(utf8: np.ndarray, lengths: np.ndarray, data: np.ndarray, newline: bool = True,
              buf: np.ndarray | None = None) -> np.ndarray:
    """The records of the keys ``utf8`` (their UTF-8 bytes back to back, uint8; key ``i`` is
    ``lengths[i]`` bytes, holding no whitespace) and the rows of ``data`` (uint8, (n, vb)):
    ``key b" " row`` (``b"\\n"``), as one uint8 array (the front of ``buf`` when it is large
    enough: a writer of many blocks reuses one, so its pages are faulted in once, not once
    a block).  Each row is one ``vb``-byte item of a void view (a copy of its bytes, not
    ``vb`` one-byte elements)."""
    n, vb = data.shape
    if len(lengths) != n:
        raise ValueError(f"expected {n} keys, got {len(lengths)}")
    if int(np.sum(lengths)) != len(utf8):
        raise ValueError(f"expected keys of {int(np.sum(lengths))} bytes in all, got "
                         f"{len(utf8)} bytes")
    tail = vb + bool(newline)
    size = len(utf8) + n * (1 + tail)
    out = buf[:size] if buf is not None and buf.size >= size else np.empty(size, np.uint8)
    shift = np.arange(n, dtype=np.int64) * (1 + tail)
    ends = np.cumsum(lengths)  # where each key ends in ``utf8``: its space here at + shift
    # byte j of key i lands at j + i * (1 + tail); the rows follow their key's space
    out[np.arange(len(utf8), dtype=np.int64) + np.repeat(shift, lengths)] = utf8
    at = ends + shift
    out[at] = SPACE
    row = np.dtype((np.void, vb))
    windows = np.ndarray(buffer=out, dtype=row, shape=(size - vb + 1,), strides=(1,))
    windows[at + 1] = data.view(row).reshape(-1)
    if newline:
        out[at + 1 + vb] = NEWLINE
    return out

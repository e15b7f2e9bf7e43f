"""fastText subword vectors: the character n-grams of words, their bucket ids, and vectors
composed from n-gram rows, exactly as fastText and gensim compute them.

A word ``w`` is wrapped as ``<w>`` and encoded as UTF-8; its n-grams are the runs of
``minn..maxn`` characters (UTF-8 continuation bytes never start or end one), except the
lone ``<`` and ``>``, listed by start character, then by length (gensim's
``compute_ngrams_bytes``).  An n-gram's bucket is its 32-bit FNV-1a hash modulo
``bucket``, where each byte is sign-extended before the XOR (fastText hashes ``char``,
signed on x86: gensim's ``ft_hash_bytes`` has the same quirk), so bytes >= 0x80 flip the
high bits too.

- A known word's vector (gensim ``load_facebook_vectors(...).vectors``) is the mean of its
  own input row and its n-gram rows: ``(row + ngram_1 + ... + ngram_k) / (k + 1)``, summed
  in that order in float32 (gensim's ``adjust_vectors``).
- An unknown word's vector is the mean of its n-gram rows (gensim's ``get_vector``), zeros
  when it has none (a word too short for ``minn``).

Everything is vectorised over a batch of words: the hashes advance one character at a time
for every start position of every word at once (``maxn`` steps of at most 4 bytes), never a
Python loop per n-gram.  Row gathers go through a ``take(ids) -> rows`` callable in pieces of
at most ``budget_rows`` rows, so memory stays bounded whatever the words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["FNV_OFFSET", "FNV_PRIME", "HASH_NAME", "ngram_hashes", "ngram_buckets",
           "compose", "BUDGET_ROWS"]

FNV_OFFSET = np.uint32(2166136261)
FNV_PRIME = np.uint32(16777619)
#: the name recorded in a table's attributes for this scheme (docs/FORMAT.md)
HASH_NAME = "fasttext-fnv1a32-signed-bytes"
#: n-gram rows gathered at once while composing vectors (64K rows: 75 MiB at dim 300)
BUDGET_ROWS = 1 << 16
#: (characters x n-gram lengths) of the work arrays of one group of words (~80 MiB of them)
_BLOCK_ELEMENTS = 1 << 22
#: n-grams of a word summed position by position with the others; a longer word alone
_STEPS = 64


def _wrapped(words: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``<w1><w2>...`` as uint8, and the byte length of each wrapped word."""
    enc = [w.encode("utf-8", "surrogatepass") for w in words]
    lens = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc)) + 2
    buf = np.frombuffer(b"<" + b"><".join(enc) + b">", dtype=np.uint8)
    return buf, lens


def ngram_hashes(words: Sequence[str], minn: int, maxn: int) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes, counts)``: the uint32 FNV-1a hashes of every word's n-grams, word after
    word in gensim's order, and the number of n-grams of each word (int64)."""
    n = len(words)
    counts = np.zeros(n, dtype=np.int64)
    lo, hi = max(1, int(minn)), int(maxn)
    if n == 0 or hi < lo:
        return np.zeros(0, dtype=np.uint32), counts
    buf, lens = _wrapped(words)
    if n > 1 and buf.size * min(hi - lo + 1, int(lens.max())) > _BLOCK_ELEMENTS:
        # the work arrays hold (characters x lengths): words in groups of bounded size
        cut = np.cumsum(lens) // max(1, _BLOCK_ELEMENTS // min(hi - lo + 1, int(lens.max())))
        edges = np.flatnonzero(np.diff(cut)) + 1
        if edges.size:
            parts = [ngram_hashes(words[a:b], minn, maxn)  # a loop per group of words
                     for a, b in zip([0, *edges.tolist()], [*edges.tolist(), n])]
            return (np.concatenate([p[0] for p in parts]),
                    np.concatenate([p[1] for p in parts]))
    sbuf = buf.view(np.int8).astype(np.uint32)  # sign-extended, as fastText's char
    starts = np.flatnonzero((buf & 0xC0) != 0x80)  # byte offset of each character
    nch = starts.size
    char_len = np.diff(np.append(starts, buf.size))
    word_of_byte = np.repeat(np.arange(n, dtype=np.int64), lens)
    word_of_char = word_of_byte[starts]
    wlen = np.bincount(word_of_char, minlength=n)  # characters of each wrapped word
    hi = min(hi, int(wlen.max()))  # no n-gram is longer than the longest word (not maxn)
    if hi < lo:
        return np.zeros(0, dtype=np.uint32), counts
    first = np.concatenate([[0], np.cumsum(wlen)[:-1]])
    ci = np.arange(nch, dtype=np.int64) - first[word_of_char]  # character index in the word
    left = wlen[word_of_char] - ci  # characters from this one to the word's end
    h = np.full(nch, FNV_OFFSET, dtype=np.uint32)
    width = hi - lo + 1
    out_h = np.zeros((nch, width), dtype=np.uint32)
    out_m = np.zeros((nch, width), dtype=bool)
    for k in range(1, hi + 1):  # a loop per n-gram length: every start position at once
        valid = left >= k
        cc = np.minimum(np.arange(nch) + (k - 1), nch - 1)  # the character added now
        pos, clen = starts[cc], char_len[cc]
        for b in range(4):  # at most 4 bytes per UTF-8 character
            m = valid & (clen > b)
            if not m.any():
                break
            byte = sbuf[np.minimum(pos + b, buf.size - 1)]
            h = np.where(m, (h ^ byte) * FNV_PRIME, h)
        if k >= lo:
            emit = valid
            if k == 1:  # the lone "<" and ">" are no n-grams
                emit = valid & (ci != 0) & (left != 1)
            out_h[:, k - lo] = h
            out_m[:, k - lo] = emit
    hashes = out_h[out_m]  # C order: by word, start character, then length (gensim's order)
    counts = np.bincount(word_of_char, weights=out_m.sum(axis=1), minlength=n).astype(np.int64)
    return hashes, counts


def ngram_buckets(words: Sequence[str], minn: int, maxn: int,
                  bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, counts)``: the n-gram rows (int64 bucket ids) of every word, and their counts."""
    hashes, counts = ngram_hashes(words, minn, maxn)
    if bucket <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros_like(counts)
    return (hashes % np.uint32(bucket)).astype(np.int64), counts


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def compose(ids: np.ndarray, counts: np.ndarray, take: Callable[[np.ndarray], np.ndarray],
            dim: int, *, base: np.ndarray | None = None,
            budget_rows: int = BUDGET_ROWS) -> np.ndarray:
    """Vectors of words from their n-gram rows (``ids``, ``counts`` of :func:`ngram_buckets`).

    With ``base`` (one row per word: the words' own input rows) each vector is
    ``(base + sum of its n-gram rows) / (count + 1)`` (a known word); without, the mean of
    its n-gram rows, zeros for a word with none (an unknown word).  Sums run in float32
    (float64 for float64 rows) in gensim's order.  ``take(ids)`` gives rows of the n-gram
    matrix, called with at most ``budget_rows`` ids at a time (a long word's n-grams in
    several calls, its running sum carried from one to the next).
    """
    n = counts.size
    acc = _acc_dtype(base.dtype if base is not None else np.dtype(np.float32))
    out = np.zeros((n, dim), dtype=acc)
    if n == 0:
        return out
    counts = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts)
    offs = ends - counts
    sums = base.astype(acc) if base is not None else np.zeros((n, dim), acc)
    step = max(1, int(budget_rows))
    for lo in range(0, int(ends[-1]), step):  # a loop per budget of n-gram rows
        hi = min(lo + step, int(ends[-1]))
        a = int(np.searchsorted(ends, lo, side="right"))  # first word ending after lo
        b = int(np.searchsorted(offs, hi, side="left"))  # words starting before hi
        seg = np.maximum(offs[a:b], lo) - lo
        cnt = np.minimum(ends[a:b], hi) - lo - seg
        rows = take(ids[lo:hi]).astype(acc, copy=False)
        if not (rows.flags.owndata and rows.flags.writeable and rows.flags.c_contiguous):
            rows = np.array(rows, dtype=acc, order="C")  # (changed in place below)
        _add_in_order(rows, seg, cnt, sums[a:b])
    if base is not None:
        out[:] = sums / (counts + 1).astype(acc)[:, None]
    else:
        some = counts > 0
        out[some] = sums[some] / counts[some].astype(acc)[:, None]
    return out


def _add_in_order(rows: np.ndarray, seg: np.ndarray, cnt: np.ndarray, sums: np.ndarray) -> None:
    """``sums[i] += rows[seg[i]]``, then ``rows[seg[i] + 1]``, ... (``cnt[i]`` rows), one
    addition after the other as gensim does (``np.add.reduceat`` and ``sum`` add in another
    order).  Words of at most :data:`_STEPS` rows: one step per n-gram position, every word
    at once; a longer word: its first row gets the running sum, then one ``np.add.reduce``
    down the rows (axis 0 of a C-ordered array of two or more columns: NumPy adds row after
    row into the running sum, pairwise summation is only along the contiguous axis; one
    column is padded to two), so a word's cost is linear in its n-grams whatever its
    length.  ``rows`` is changed in place."""
    short = cnt <= _STEPS
    for k in range(int(cnt[short].max()) if short.any() else 0):  # a loop per position
        w = np.flatnonzero(short & (cnt > k))
        sums[w] += rows[seg[w] + k]
    for i in np.flatnonzero(~short).tolist():  # a loop per long word (over _STEPS rows each)
        part = rows[seg[i]:seg[i] + cnt[i]]
        part[0] += sums[i]
        if part.shape[1] < 2:
            part = np.concatenate([part, np.zeros_like(part)], axis=1)
        sums[i] = np.add.reduce(part, axis=0)[:sums.shape[1]]

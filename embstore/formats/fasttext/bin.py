"""fastText's native ``.bin`` model (the files ``fasttext`` and gensim's ``save_facebook_model``
write), read as a stream: header and dictionary parsed front to back, the input matrix read
in blocks of rows, the output matrix skipped.  Nothing is unpickled or executed.

Layout (little-endian; see gensim's ``models/_fasttext_bin.py``, fastText's ``args.cc``,
``dictionary.cc``, ``densematrix.cc``):

- ``int32 magic 0x2F4F16BA, int32 version`` (files of fastText before 2017 start with the
  arguments directly: the *old* format, without magic, pruneidx or quantisation flags);
- arguments: ``int32 dim, ws, epoch, min_count, neg, word_ngrams, loss, model, bucket, minn,
  maxn, lr_update_rate, float64 t`` (old format: the same, its first two ints are
  ``dim, ws``);
- dictionary: ``int32 size, nwords, nlabels, int64 ntokens`` (new: ``int64 pruneidx_size``),
  then ``size`` entries ``word bytes, \\0, int64 count, int8 type`` (new: then
  ``pruneidx_size`` pairs of int32);
- input matrix: (new: ``bool quantised``) ``int64 rows, int64 dim`` and ``rows * dim``
  float32: the ``nwords`` word rows, then the ``bucket`` n-gram rows;
- output matrix: (new: ``bool quantised``) ``int64 rows, int64 dim`` and its floats.

A quantised model (``.ftz``), a supervised one (labels) and a pruned one are refused with a
message saying so.  Every short read names the byte offset where the file ends.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator

import numpy as np

from ...errors import FormatError
from ...oov import MAX_NGRAM_CHARS
from .. import DEFAULT_BLOCK_ROWS, Reader, check_finite

__all__ = ["read", "FastTextBinReader", "MAGIC"]

MAGIC = 793712314  # 0x2F4F16BA, little-endian bytes ba 16 4f 2f
MAX_VERSION = 12
_ARGS = ("dim", "ws", "epoch", "min_count", "neg", "word_ngrams", "loss", "model", "bucket",
         "minn", "maxn", "lr_update_rate")
_ARGS_FMT = "<12id"
MAX_WORD_BYTES = 1 << 16
#: n-gram rows gathered from the map between two drops of its pages: a fault maps a whole
#: page-cache folio (up to 2 MiB here, even with MADV_RANDOM: 100 random rows mapped 117 MiB),
#: so at most MAP_ROWS folios stay resident.  65,536 random rows of a 240 MiB matrix: peak
#: RSS +74 MiB with 32 (1.1 s), +170 MiB with 128, +220 MiB with 1,024; os.pread per row
#: instead: 1.0 s (measured under load 15 on 2 cores)
MAP_ROWS = 32
_CHUNK = 1 << 20


class FastTextBinReader(Reader):
    """The parsed front of a fastText ``.bin``; its matrix rows read on demand.

    After construction: ``args`` (the model's arguments: ``dim``, ``minn``, ``maxn``,
    ``bucket``, ...), ``version`` (None: old format), ``words`` (the dictionary, decoded
    with ``encoding``), ``counts`` (int64), ``nwords``, ``bucket``, ``minn``, ``maxn``.

    - :meth:`word_rows` gives the input-matrix rows of words ``a..b-1`` (before their
      n-grams are averaged in: fastText's word vector is composed by the caller);
    - :meth:`ngram_blocks` yields the ``bucket`` n-gram rows in blocks;
    - iterating yields ``(word rows, words)`` blocks (the raw input rows).
    """

    format = "fasttext-bin"
    has_keys = True
    progress_unit = "bytes"
    count: int

    def __init__(self, path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
                 unicode_errors: str = "strict", dtype=None, encoding: str = "utf-8"):
        super().__init__(path, block_rows=block_rows, limit=limit)
        self.dtype = np.dtype(np.float32)
        self.unicode_errors, self.encoding = unicode_errors, encoding
        self.progress_total = os.path.getsize(self.path)
        self._f = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        self._pos = 0
        self._map: mmap.mmap | None = None  # the n-gram rows, mapped on first use
        self._ngrams: np.ndarray | None = None
        try:
            self._parse_front()
        except BaseException:
            self._f.close()
            raise

    # -- reading with offsets ---------------------------------------------------------
    def _read(self, n: int, what: str) -> bytes:
        data = self._f.read(n)
        if len(data) != n:
            raise self.error(f"at byte offset {self._pos + len(data)}: the file ends (truncated):"
                             f" expected {n} bytes of {what} from offset {self._pos}, got "
                             f"{len(data)}")
        self._pos += n
        return data

    def _unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack(fmt, self._read(struct.calcsize(fmt), what))

    def _bad(self, at: int, message: str) -> FormatError:
        return self.error(f"at byte offset {at}: {message}")

    # -- header, dictionary, matrix header ------------------------------------------------
    def _parse_front(self) -> None:
        (first, second) = self._unpack("<2i", "the magic number and version")
        if first == MAGIC:
            self.version: int | None = second
            if not 0 < second <= MAX_VERSION:
                raise self._bad(4, f"expected a fastText version 1..{MAX_VERSION}, got {second}")
            vals = self._unpack(_ARGS_FMT, "the model's arguments")
        else:  # the old format: the arguments start at once
            self.version = None
            rest = self._unpack(_ARGS_FMT[:1] + "10id", "the model's arguments")
            vals = (first, second) + rest
        self.args = dict(zip(_ARGS, vals[:12]))
        self.args["t"] = vals[12]
        a = self.args
        self.dim, self.bucket = a["dim"], a["bucket"]
        self.minn, self.maxn = a["minn"], a["maxn"]
        if not 1 <= self.dim <= 1 << 20:
            raise self._bad(8 if self.version else 0, f"expected a dimension 1..{1 << 20}, "
                            f"got {self.dim} (not a fastText .bin, or a damaged one)")
        if self.bucket < 0 or self.minn < 0 or self.maxn < 0:
            raise self._bad(self._pos - 20, f"expected bucket, minn, maxn >= 0, got "
                            f"{self.bucket}, {self.minn}, {self.maxn}")
        if self.maxn > MAX_NGRAM_CHARS:  # (fastText's default is 6)
            raise self._bad(self._pos - 16, f"expected maxn (the longest n-gram) of at most "
                            f"{MAX_NGRAM_CHARS} characters, got {self.maxn}")
        if 4 * self.bucket * self.dim > self.progress_total:
            raise self._bad(self._pos - 20, f"bucket {self.bucket} x dim {self.dim}: "
                            f"{4 * self.bucket * self.dim} bytes of n-gram rows, more than "
                            f"the file's {self.progress_total} bytes")
        if a["model"] == 3:
            raise self.error("a supervised fastText model (a classifier): embstore imports "
                             "word-vector models (skipgram, cbow)")
        self._parse_dictionary()
        self._parse_matrix_header()

    def _parse_dictionary(self) -> None:
        at = self._pos
        size, nwords, nlabels = self._unpack("<3i", "the dictionary header")
        self.ntokens = self._unpack("<q", "the dictionary header")[0]
        prune = self._unpack("<q", "the dictionary header")[0] if self.version else -1
        if nlabels > 0:
            raise self._bad(at, f"a supervised fastText model ({nlabels} labels): embstore "
                            "imports word-vector models (skipgram, cbow)")
        if not 0 <= nwords == size:
            raise self._bad(at, f"expected a dictionary of nwords == size >= 0 entries, got "
                            f"size {size}, nwords {nwords}, nlabels {nlabels}")
        if prune > 0:
            raise self._bad(at, f"a pruned fastText model ({prune} n-gram buckets kept by "
                            "quantize -cutoff): not supported")
        # each entry takes >= 10 bytes, each word row 4 * dim: checked before allocating
        need = self._pos + nwords * (10 + 4 * self.dim) + 4 * self.bucket * self.dim
        if need > self.progress_total:
            raise self._bad(at, f"nwords {nwords}: the dictionary and input matrix need at "
                            f"least {need} bytes, more than the file's {self.progress_total}")
        self.nwords = nwords
        raw: list[bytes] = []
        counts = np.empty(nwords, dtype=np.int64)
        buf, p = b"", 0
        base = self._pos  # file offset of buf[0]
        while len(raw) < nwords:  # a loop per word: entries are variable-length
            z = buf.find(b"\0", p, p + MAX_WORD_BYTES)
            if z < 0 or z + 10 > len(buf):
                if z < 0 and len(buf) - p > MAX_WORD_BYTES:
                    raise self._bad(base + p, f"word {len(raw) + 1}: expected a word of at "
                                    f"most {MAX_WORD_BYTES} bytes ending in \\0")
                more = self._f.read(_CHUNK)
                if not more:
                    raise self._bad(base + len(buf), f"the file ends (truncated) in the "
                                    f"dictionary: expected {nwords} words, got {len(raw)}")
                base += p
                buf, p = buf[p:] + more, 0
                continue
            raw.append(buf[p:z])
            counts[len(raw) - 1] = int.from_bytes(buf[z + 1:z + 9], "little", signed=True)
            if buf[z + 9] != 0:
                raise self._bad(base + z + 9, f"word {len(raw)}: expected entry type 0 "
                                f"(a word), got {buf[z + 9]}")
            p = z + 10
        self._pos = base + p
        self._f.seek(self._pos)  # the bytes read ahead go back
        self.words = self._decode(raw, base)
        self.counts = counts

    def _decode(self, raw: list[bytes], at: int) -> list[str]:
        # "replace" as gensim's load_facebook_vectors: bytes that do not decode become
        # backslash escapes ("\\xff"), and the word's n-grams are those of that key
        errors = "backslashreplace" if self.unicode_errors == "replace" else self.unicode_errors
        try:
            words = b"\0".join(raw).decode(self.encoding, errors).split("\0")
            if len(words) == len(raw):
                return words
            return [w.decode(self.encoding, errors) for w in raw]  # UTF-16...
        except UnicodeDecodeError:
            for i, w in enumerate(raw):
                try:
                    w.decode(self.encoding)
                except UnicodeDecodeError as exc:
                    raise self.error(f"word {i + 1} ({w[:40]!r}): not {self.encoding} "
                                     f"({exc.reason} at byte {exc.start}); give the model's "
                                     "text encoding (encoding=, as in gensim) or "
                                     "unicode_errors='replace'") from None
            raise
        except LookupError as exc:
            raise FormatError(f"unknown text encoding {self.encoding!r} ({exc})") from None

    def _quant_flag(self, what: str) -> None:
        at = self._pos
        (flag,) = self._unpack("<B", f"the {what} matrix's quantisation flag")
        if flag == 1:
            raise self._bad(at, f"a quantised fastText model (.ftz, {what} matrix): its vectors "
                            "are compressed by product quantisation, which embstore does not "
                            "decode; import the unquantised .bin (or export a .vec with "
                            "fastText)")
        if flag != 0:
            raise self._bad(at, f"expected the {what} matrix's quantisation flag 0 or 1, got "
                            f"{flag}")

    def _parse_matrix_header(self) -> None:
        if self.version:
            self._quant_flag("input")
        at = self._pos
        rows, dim = self._unpack("<2q", "the input matrix's shape")
        want = self.nwords + self.bucket
        if rows != want or dim != self.dim:
            raise self._bad(at, f"expected an input matrix of {want} x {self.dim} (nwords "
                            f"{self.nwords} + bucket {self.bucket} rows), got {rows} x {dim}")
        self.vocab_offset = self._pos
        self.ngram_offset = self._pos + 4 * self.nwords * self.dim
        end = self.ngram_offset + 4 * self.bucket * self.dim
        self.count = self.nwords
        # the output matrix: its header and size checked, its rows never read
        self._f.seek(end)
        self._pos = end
        if self.version:
            if end + 1 > self.progress_total:
                self._read(1, "the output matrix (the input matrix ends early)")
            self._quant_flag("output")
        at = self._pos
        orows, odim = self._unpack("<2q", "the output matrix's shape")
        if orows < 0 or odim != self.dim:
            raise self._bad(at, f"expected an output matrix of n x {self.dim}, got {orows} x "
                            f"{odim}")
        total = self._pos + 4 * orows * odim
        if total != self.progress_total:
            how = "ends (truncated)" if total > self.progress_total else "has more bytes"
            raise self._bad(min(total, self.progress_total), f"the file {how}: expected "
                            f"{total} bytes in all, got {self.progress_total}")
        self.progress_done = self.vocab_offset

    # -- rows ---------------------------------------------------------------------------
    def _rows(self, offset: int, n: int, first_row: int, what: str) -> np.ndarray:
        self._f.seek(offset)
        self._pos = offset
        block = np.frombuffer(self._read(4 * n * self.dim, what), dtype="<f4")
        block = block.reshape(n, self.dim).astype(np.float32)  # writable, native order
        check_finite(self, block, first_row)
        return block

    def word_rows(self, start: int, stop: int) -> np.ndarray:
        """Input-matrix rows of words ``start..stop-1`` (float32)."""
        return self._rows(self.vocab_offset + 4 * start * self.dim, stop - start, start,
                          f"word rows {start}..{stop - 1}")

    def ngram_blocks(self, block_rows: int | None = None) -> Iterator[np.ndarray]:
        """The ``bucket`` n-gram rows, in blocks of ``block_rows`` (float32)."""
        step = block_rows or self.block_rows
        for a in range(0, self.bucket, step):
            b = min(self.bucket, a + step)
            yield self._rows(self.ngram_offset + 4 * a * self.dim, b - a, self.nwords + a,
                             f"n-gram rows {a}..{b - 1}")
            self.progress_done = self.ngram_offset + 4 * b * self.dim

    def ngram_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of the n-gram matrix (float32), gathered from a read-only map of the
        file whose pages are dropped again after each gather, so that the process's resident
        memory does not grow with the matrix (rows are checked by :meth:`ngram_blocks`)."""
        if self._ngrams is None:
            self._map = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_RANDOM"):
                self._map.madvise(mmap.MADV_RANDOM)  # a fault reads its page, no read-ahead
            # rows as raw bytes: the matrix starts at any offset, and NumPy copies a whole
            # unaligned float array before a gather (85 s and every page for 64K rows)
            rb = 4 * self.dim
            self._ngrams = np.frombuffer(self._map, dtype=np.uint8, count=self.bucket * rb,
                                         offset=self.ngram_offset).reshape(self.bucket, rb)
        rows = np.empty((ids.size, 4 * self.dim), dtype=np.uint8)
        drop = self._map if hasattr(mmap, "MADV_DONTNEED") else None
        for a in range(0, ids.size, MAP_ROWS):  # a loop per MAP_ROWS rows
            np.take(self._ngrams, ids[a:a + MAP_ROWS], axis=0, out=rows[a:a + MAP_ROWS],
                    mode="clip")  # ids < bucket (hashes mod bucket)
            if drop is not None:
                drop.madvise(mmap.MADV_DONTNEED)  # clean file pages: out of the process
        return rows.view("<f4").astype(np.float32, copy=False)

    def size_hint(self) -> int:
        return self.nwords if self.limit is None else min(self.nwords, self.limit)

    def blocks(self) -> Iterator[tuple[np.ndarray, list[str]]]:
        n = self.size_hint()
        for a in range(0, n, self.block_rows):
            b = min(n, a + self.block_rows)
            yield self.word_rows(a, b), self.words[a:b]

    def close(self) -> None:
        self._ngrams = None
        if self._map is not None:
            self._map.close()
            self._map = None
        self._f.close()


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None,
         encoding: str = "utf-8") -> FastTextBinReader:
    """Open a fastText ``.bin`` model (the front parsed, rows read on demand)."""
    return FastTextBinReader(path, block_rows=block_rows, limit=limit,
                             unicode_errors=unicode_errors, dtype=dtype, encoding=encoding)

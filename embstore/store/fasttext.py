"""Importing a fastText ``.bin`` model: word vectors and the subword n-gram matrix.

The file holds each word's own input row, then the ``bucket`` n-gram rows.  fastText's (and
gensim's ``load_facebook_vectors``) vector of a word is the mean of its own row and its
n-gram rows, so the import runs in two passes over the file, both streamed:

1. the n-gram rows go to the ``ngrams`` array of the new table (block by block);
2. the word rows are read in blocks, each word's n-gram rows gathered from the file (a
   read-only map whose pages are dropped after each gather, so resident memory stays
   bounded) and averaged in (:func:`embstore.store.subword.hashing.compose`), and the words' vectors and
   keys go to ``vectors``/``keys``.

Everything is written beside DEST and renamed into place as any import
(:class:`~embstore.store.writer.TableWriter`); an error leaves nothing behind.
"""

from __future__ import annotations

import os

from ..errors import FormatError
from ..formats.fasttext.bin import FastTextBinReader
from ..progress import Progress
from .subword.ngrams import NgramWriter, subword_attrs
from .writer import TableWriter
from .subword.hashing import compose, ngram_buckets

__all__ = ["import_fasttext_bin", "WORD_BLOCK_BYTES"]

#: word rows composed at once (their n-gram rows are gathered in bounded pieces)
WORD_BLOCK_BYTES = 4 << 20
_FLOATS = ("float16", "float32", "float64")


def import_fasttext_bin(reader: FastTextBinReader, dest: str, *, storage: str | None,
                        compression, chunk_rows, shard_rows, overwrite: bool,
                        on_progress: Progress | None = None) -> tuple[int, int, str]:
    """Write the model of ``reader`` as a new table at ``dest``; ``(rows, duplicates, dtype)``."""
    storage = storage or "float32"
    if storage not in _FLOATS:
        raise FormatError(f"a fastText model is stored as {', '.join(_FLOATS)} (its n-gram "
                          f"rows are averaged into vectors), got dtype {storage}")
    dim, bucket = reader.dim, reader.bucket
    sub = subword_attrs(minn=reader.minn, maxn=reader.maxn, bucket=bucket)
    a = reader.args
    attrs = {"source": {"format": "fasttext-bin", "file": os.path.basename(reader.path)},
             "subwords": sub,
             "fasttext": {"version": reader.version, "nwords": reader.nwords,
                          "ntokens": reader.ntokens, "encoding": reader.encoding,
                          **{k: a[k] for k in ("ws", "epoch", "min_count", "neg", "loss",
                                               "model", "word_ngrams", "t")}}}
    n = reader.size_hint()
    step = max(1, min(reader.block_rows, WORD_BLOCK_BYTES // (4 * dim)))
    row_bytes = 4 * dim
    total = reader.vocab_offset + row_bytes * (bucket + n)  # bytes read by both passes
    done = reader.vocab_offset

    def progress(rows: int) -> None:
        nonlocal done
        done += rows * row_bytes
        if on_progress is not None:
            on_progress(done, total)

    with TableWriter(dest, dim=dim, dtype=storage, has_keys=True, chunk_rows=chunk_rows,
                     shard_rows=shard_rows, compression=compression, overwrite=overwrite,
                     expected_rows=n, attrs=attrs) as writer:
        ngrams = NgramWriter(writer.staging, dim=dim, dtype=storage, rows=bucket,
                             compression=compression)
        try:
            for block in reader.ngram_blocks(step):
                ngrams.add(block)
                progress(block.shape[0])
            ngrams.finish()
        except BaseException:
            ngrams.abort()
            raise
        for a0 in range(0, n, step):
            b0 = min(n, a0 + step)
            words = reader.words[a0:b0]
            base = reader.word_rows(a0, b0)
            ids, counts = ngram_buckets(words, reader.minn, reader.maxn, bucket)
            vectors = compose(ids, counts, reader.ngram_rows, dim, base=base)
            writer.add(vectors, words)
            progress(b0 - a0)
    return writer.rows, writer.duplicates, storage

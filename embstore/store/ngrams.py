"""The subword n-gram matrix of a fastText table: the ``ngrams`` array beside ``vectors``.

A table imported from a fastText ``.bin`` holds, besides the word vectors, the model's
``bucket`` n-gram rows as a second sharded, checksummed array ``ngrams`` of shape
``(bucket, dim)`` (same codecs and chunk rule as ``vectors``), and the group attribute
``embstore.subwords`` (docs/FORMAT.md):
``{"array": "ngrams", "minn", "maxn", "bucket", "hash": HASH_NAME, "encoding": "utf-8"}``.

:class:`NgramWriter` streams the array into a table being written (a
:class:`~embstore.store.writer.TableWriter`'s staging directory, renamed into place with
the table); :class:`Subwords` reads it through the same shard reader as ``vectors``
(out of core, crc32c checked) and gives unknown words their vectors
(:mod:`embstore.subword`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptStoreError
from ..formats.fasttext_bin import MAX_NGRAM_CHARS
from ..subword import HASH_NAME, compose, ngram_buckets
from .codecs import Layout, make_codec
from .meta import check_vectors_meta, read_json
from .shardwrite import BackgroundSync, RowStream
from .source import RowSource, ShardSource, ZarrSource
from .writer import choose_layout, set_rows

__all__ = ["NGRAMS", "NgramWriter", "Subwords", "subword_attrs"]

NGRAMS = "ngrams"
MAX_BUCKET = (1 << 31) - 1  # fastText's bucket is an int32 (a 2**40 claim overflowed uint32)
_DTYPES = ("float16", "float32", "float64")


def subword_attrs(*, minn: int, maxn: int, bucket: int) -> dict:
    """The ``embstore.subwords`` group attribute of a table with an n-gram matrix."""
    return {"array": NGRAMS, "minn": int(minn), "maxn": int(maxn), "bucket": int(bucket),
            "hash": HASH_NAME, "encoding": "utf-8", "word_vectors": "composed"}


class NgramWriter:
    """Stream ``rows`` n-gram rows into the array ``ngrams`` of the group at ``staging``."""

    def __init__(self, staging: str | os.PathLike[str], *, dim: int, dtype: str, rows: int,
                 compression: str = "none"):
        import zarr
        from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec
        if dtype not in _DTYPES:
            raise ValueError(f"an n-gram matrix is stored as {', '.join(_DTYPES)}, got {dtype}")
        self.root = os.fspath(staging)
        self.dim, self.rows, self.dtype = int(dim), int(rows), np.dtype(dtype)
        cr, sr = choose_layout(self.dim, dtype, max(1, self.rows), compression=compression)
        by_name: dict[str, list[Any]] = {
            "none": [], "zstd": [ZstdCodec(level=0, checksum=False)],
            "blosc": [BloscCodec(cname="zstd", clevel=5, shuffle="shuffle",
                                 typesize=self.dtype.itemsize)]}
        comp = by_name[compression]
        group = zarr.open_group(self.root, mode="r+")
        arr = group.create_array(NGRAMS, shape=(0, self.dim), dtype=self.dtype,
                                 chunks=(cr, self.dim), shards=(sr, self.dim),
                                 serializer=BytesCodec(endian="little"),
                                 compressors=comp + [Crc32cCodec()], fill_value=0,
                                 dimension_names=("ngram_row", "dim"))
        layout = Layout.from_metadata(arr.metadata.to_dict())
        assert layout is not None and layout.has_crc
        self._sync = BackgroundSync()
        self._stream = RowStream(os.path.join(self.root, NGRAMS), layout,
                                 make_codec(compression, self.dtype.itemsize), self._sync)
        self.written = 0

    def add(self, block: np.ndarray) -> None:
        """The next rows (checked finite by the caller)."""
        self._stream.add(np.ascontiguousarray(block, dtype=self.dtype))
        self.written += block.shape[0]

    def finish(self) -> None:
        """Write the last chunk, wait for the files to be on disk, record the row count."""
        if self.written != self.rows:
            raise ValueError(f"expected {self.rows} n-gram rows, got {self.written}")
        self._stream.add(np.empty((0, self.dim), self.dtype), final=True)
        self._sync.wait()
        self._sync.close()
        set_rows(self.root, self.rows, NGRAMS)

    def abort(self) -> None:
        self._stream.abort()
        self._sync.close()


class Subwords:
    """Vectors of unknown words from the ``ngrams`` array of the table at ``root``."""

    def __init__(self, root: Path, attrs: dict, dim: int, mode: str = "r"):
        where = root / NGRAMS / "zarr.json"
        self._check_attrs(attrs, str(root))
        meta = read_json(where, f"{NGRAMS}/zarr.json (the table's subword n-grams)", root=root)
        layout = self._check_meta(meta, str(where), dim, str(root))
        self.source: RowSource = (ShardSource(root, layout, NGRAMS) if layout is not None
                                  else ZarrSource(root, mode, NGRAMS))

    @classmethod
    def over(cls, attrs: dict, dim: int, meta: dict, where: str,
             make_source: Callable[[Layout | None], RowSource]) -> Subwords:
        """The n-grams of a table read elsewhere (object storage): ``meta`` is the array's
        ``zarr.json`` (from ``where``), ``make_source(layout)`` its row source."""
        self = cls.__new__(cls)
        self._check_attrs(attrs, where)
        self.source = make_source(self._check_meta(meta, where, dim, where))
        return self

    def _check_attrs(self, attrs: dict, root: str) -> None:
        try:
            self.minn, self.maxn, self.bucket = (int(attrs[k]) for k in ("minn", "maxn",
                                                                           "bucket"))
            ok = attrs.get("hash") == HASH_NAME and attrs.get("array") == NGRAMS and min(
                self.minn, self.maxn, self.bucket) >= 0
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise CorruptStoreError(f"{root}/zarr.json: expected attributes embstore.subwords "
                                    f"with array {NGRAMS!r}, minn, maxn, bucket >= 0 and hash "
                                    f"{HASH_NAME!r}, got {attrs!r}", path=root)
        if self.bucket > MAX_BUCKET or self.maxn > MAX_NGRAM_CHARS:  # (hashes are 32-bit)
            raise CorruptStoreError(f"{root}/zarr.json: expected embstore.subwords bucket <= "
                                    f"{MAX_BUCKET} and maxn <= {MAX_NGRAM_CHARS}, got bucket "
                                    f"{self.bucket}, maxn {self.maxn}", path=root)

    def _check_meta(self, meta: dict, where: str, dim: int, root: str) -> Layout | None:
        check_vectors_meta(meta, where)
        if meta["shape"] != [self.bucket, dim] or meta["data_type"] not in _DTYPES:
            raise CorruptStoreError(f"{where}: expected {', '.join(_DTYPES)} of shape "
                                    f"[{self.bucket}, {dim}] (bucket x dim), got "
                                    f"{meta['data_type']} {meta['shape']}", path=root)
        self.dim = dim
        return Layout.from_metadata(meta)

    def vectors(self, words: Sequence[str]) -> np.ndarray:
        """``(len(words), dim)`` float vectors of words, each the mean of its n-gram rows
        (zeros for a word without n-grams), as fastText and gensim compute them."""
        ids, counts = ngram_buckets(list(words), self.minn, self.maxn, self.bucket)
        return compose(ids, counts, self._take, self.dim)

    def _take(self, ids: np.ndarray) -> np.ndarray:
        return self.source.take(np.ascontiguousarray(ids, dtype=np.int64))

    def blocks(self, rows: int):
        """The n-gram rows in order, ``rows`` at a time (checked reads)."""
        for start in range(0, self.bucket, rows):
            yield self._take(np.arange(start, min(self.bucket, start + rows)))

    def copy_into(self, staging: str | os.PathLike[str], dtype: str, compression: str,
                  block_bytes: int) -> None:
        """Stream the n-gram matrix into the table being written at ``staging`` (stored
        as ``dtype`` when it is a float an n-gram matrix takes, else as float32)."""
        writer = NgramWriter(staging, dim=self.dim, rows=self.bucket, compression=compression,
                             dtype=dtype if dtype in _DTYPES else "float32")
        try:
            for block in self.blocks(max(1, block_bytes // (8 * self.dim))):
                writer.add(block)
            writer.finish()
        except BaseException:
            writer.abort()
            raise

    def info(self) -> dict:
        return {"array": NGRAMS, "rows": self.bucket, "minn": self.minn, "maxn": self.maxn,
                "hash": HASH_NAME}

    def close(self) -> None:
        self.source.close()

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
(:mod:`embstore.store.subword.hashing`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptStoreError, FormatError, InvalidOptionError
from ...keys.hashing import MAX_KEY_BYTES
from ...oov import MAX_NGRAM_CHARS
from .hashing import HASH_NAME, compose, ngram_buckets
from ..codecs import Layout, make_codec
from ..meta import check_vectors_meta, read_json
from ..shard.write import BackgroundSync, RowStream
from ..base import RowSource
from ..place.local import LocalDir
from ..source import ShardSource
from ..codecs import choose_layout
from ..meta import set_rows

__all__ = ["NGRAMS", "NgramWriter", "Subwords", "subword_attrs", "check_subwords"]

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
        group = zarr.open_group(self.root, mode="r+", use_consolidated=False)
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
        self.where = str(root / NGRAMS)
        if not os.path.lexists(where):
            raise CorruptStoreError(f"{root / NGRAMS}: missing (the table's attribute "
                                    f"embstore.subwords names the array {NGRAMS!r} of its "
                                    "subword n-grams)", path=str(root / NGRAMS))
        meta = read_json(where, f"{NGRAMS}/zarr.json (the table's subword n-grams)", root=root)
        layout = self._check_meta(meta, str(where), dim, str(root))
        self.source: RowSource = ShardSource(LocalDir(root), layout, NGRAMS)

    @classmethod
    def over(cls, attrs: dict, dim: int, meta: dict, where: str,
             make_source: Callable[[Layout | None], RowSource]) -> Subwords:
        """The n-grams of a table read elsewhere (object storage): ``meta`` is the array's
        ``zarr.json`` (from ``where``), ``make_source(layout)`` its row source."""
        self = cls.__new__(cls)
        self._check_attrs(attrs, where)
        self.where = where
        self.source = make_source(self._check_meta(meta, where, dim, where))
        return self

    def _check_attrs(self, attrs: dict, root: str) -> None:
        def bad(field: str, expected: str, got) -> CorruptStoreError:
            return CorruptStoreError(f"{root}/zarr.json: attribute embstore.subwords{field}: "
                                     f"expected {expected}, got {repr(got)[:200]}", path=root)

        if not isinstance(attrs, dict):
            raise bad("", "an object", attrs)
        for k in ("minn", "maxn", "bucket"):
            v = attrs.get(k)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise bad(f".{k}", "an integer >= 0", v)
        self.minn, self.maxn, self.bucket = attrs["minn"], attrs["maxn"], attrs["bucket"]
        if attrs.get("hash") != HASH_NAME:
            raise bad(".hash", f"{HASH_NAME!r} (the only n-gram hash embstore knows)",
                      attrs.get("hash"))
        if attrs.get("array") != NGRAMS:
            raise bad(".array", repr(NGRAMS), attrs.get("array"))
        if self.bucket > MAX_BUCKET or self.maxn > MAX_NGRAM_CHARS:  # (hashes are 32-bit)
            raise CorruptStoreError(f"{root}/zarr.json: expected embstore.subwords bucket <= "
                                    f"{MAX_BUCKET} and maxn <= {MAX_NGRAM_CHARS}, got bucket "
                                    f"{self.bucket}, maxn {self.maxn}", path=root)

    def _check_meta(self, meta: dict, where: str, dim: int, root: str) -> Layout:
        check_vectors_meta(meta, where)
        if meta["shape"] != [self.bucket, dim] or meta["data_type"] not in _DTYPES:
            raise CorruptStoreError(f"{where}: expected {', '.join(_DTYPES)} of shape "
                                    f"[{self.bucket}, {dim}] (bucket x dim), got "
                                    f"{meta['data_type']} {meta['shape']}", path=root)
        self.dim = dim
        layout = Layout.from_metadata(meta)
        if layout is None or not (layout.has_crc and layout.index_crc):
            # every embstore writing n-grams checksummed them (docs/FORMAT.md section 5):
            # a layout without is damage, never a reason to read them unchecked
            raise CorruptStoreError(f"{where}: not a checksummed layout (sharded, a crc32c "
                                    "per chunk and per shard index), as the n-grams of an "
                                    "embstore table are: the store is damaged", path=root)
        return layout

    def vectors(self, words: Sequence[str]) -> np.ndarray:
        """``(len(words), dim)`` float vectors of words, each the mean of its n-gram rows
        (zeros for a word without n-grams), as fastText and gensim compute them.  A word
        longer than a stored key may be (``MAX_KEY_BYTES`` of UTF-8) is refused with
        :class:`InvalidOptionError`: a caller's key bounds the work (its n-gram rows)."""
        words = list(words)
        _check_lengths(words)
        ids, counts = ngram_buckets(words, self.minn, self.maxn, self.bucket)
        return compose(ids, counts, self._take, self.dim)

    def _take(self, ids: np.ndarray) -> np.ndarray:
        rows = self.source.take(np.ascontiguousarray(ids, dtype=np.int64))
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():  # stored so with valid checksums: still no vector to compose
            bad = np.asarray(ids).reshape(-1)[~finite]
            raise CorruptStoreError(f"{self.where}: n-gram row {int(bad[0])} holds NaN or "
                                    "infinite values (a model's n-gram rows are finite: the "
                                    "array is damaged)", path=self.where)
        return rows

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


def check_subwords(root: Path, attrs: dict, dim: int, block_bytes: int = 16 << 20
                   ) -> list[tuple[str, str]]:
    """``(file, message)`` for what makes the table's n-grams unusable (for ``verify``):
    the attribute ``embstore.subwords``, the array's presence, shape and dtype, and rows
    that are not finite (every row read, in blocks)."""
    if "subwords" not in attrs:
        return []
    try:
        sub = Subwords(root, attrs["subwords"], dim)
    except (CorruptStoreError, FormatError) as exc:
        return [(str(exc.path or root), str(exc))]
    try:
        rows = max(1, block_bytes // (8 * max(dim, 1)))
        for start in range(0, sub.bucket, rows):  # a loop per block
            block = sub.source.take(np.arange(start, min(sub.bucket, start + rows)))
            bad = np.flatnonzero(~np.isfinite(block).all(axis=1))
            if bad.size:
                return [(sub.where, f"{sub.where}: n-gram row {start + int(bad[0])} holds NaN "
                                    "or infinite values (a model's n-gram rows are finite)")]
    except CorruptStoreError as exc:
        return [(str(exc.path or sub.where), str(exc))]
    finally:
        sub.close()
    return []


def _check_lengths(words: list[str]) -> None:
    """Refuse a word of more than ``MAX_KEY_BYTES`` bytes of UTF-8 (the cap on stored keys)."""
    if not words or max(map(len, words)) * 4 <= MAX_KEY_BYTES:  # 4 bytes a character at most
        return
    for w in words:  # a loop per word only when one is long
        if len(w) * 4 > MAX_KEY_BYTES and len(w.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise InvalidOptionError(
                f"key {w[:40]!r}... is {len(w.encode('utf-8', 'surrogatepass')):,} bytes of "
                f"UTF-8, more than the {MAX_KEY_BYTES:,} a key may have; subword vectors are "
                "composed for keys a table could store (docs/FORMAT.md section 5)")

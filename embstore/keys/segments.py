"""Keys appended to a format-2 table since its key index was last written (docs/FORMAT.md
§6): each append's keys are one segment (a key delta file of the version that made it),
searched beside the key index until a compaction folds them into it.

A segment of ``m`` keys for rows ``first .. first + m - 1`` holds their hashes (under the
table's hash key) sorted, the row of each, their UTF-8 offsets and bytes: a key index of
its own, in memory (segments are bounded by compaction).  :class:`SegmentedVocab` is the
table's :class:`~embstore.keys.index.DiskVocab` (the rows before the first segment) and its
segments: a lookup probes the index, then each segment for the keys still missing (keys
are unique across them: an append refuses keys the table holds).
"""

from __future__ import annotations

import numpy as np

from ..errors import CorruptStoreError
from ..table import Vocab
from .hashing import (EncodedKeys, decode_keys, find_keys, hash_encoded, probe,
                      segment_index, word_view)
from .index import DiskVocab

__all__ = ["KeySegment", "SegmentedVocab"]


class KeySegment:
    """The keys of rows ``first .. first + n - 1`` (see the module doc), checked when built."""

    def __init__(self, first: int, hashes: np.ndarray, rows: np.ndarray,
                 offsets: np.ndarray, utf8: np.ndarray, where: str):
        self.first, self.n, self.where = int(first), len(hashes), where
        self.hashes, self.rows, self.offsets, self.utf8 = hashes, rows, offsets, utf8
        bad = None
        # (order by comparing neighbours: a difference of unsigned values wraps, never < 0)
        h = hashes.view(np.uint64)
        if len(rows) != self.n or len(offsets) != self.n + 1 or offsets[0] != 0 or \
                (offsets[1:] < offsets[:-1]).any() or int(offsets[-1]) + 8 > len(utf8):
            bad = "sizes or offsets do not fit"
        elif (h[1:] < h[:-1]).any():
            bad = "hashes not sorted"
        elif self.n and not np.array_equal(np.sort(rows), np.arange(
                self.first, self.first + self.n, dtype=np.int64)):
            bad = f"rows are not {self.first}..{self.first + self.n - 1}"
        if bad is not None:
            raise CorruptStoreError(f"{where}: {bad}: the key delta is damaged", path=where)
        self.nbytes = int(offsets[-1])
        self._words = word_view(utf8).__getitem__

    @property
    def stop(self) -> int:
        return self.first + self.n

    def find(self, enc: EncodedKeys, h: np.ndarray) -> np.ndarray:
        return probe(enc, h, size=self.n, search=self.hashes.searchsorted,
                     hash_at=self.hashes.__getitem__, row_at=self.rows.__getitem__,
                     offset_at=lambda r: self.offsets[r - self.first], word_at=self._words,
                     row_limit=self.stop, visible=self.stop, nbytes=self.nbytes)

    def key_at(self, ids: np.ndarray) -> list[str]:
        local = ids - self.first
        starts = self.offsets[local]
        lengths = self.offsets[local + 1] - starts
        return decode_keys(self.utf8[segment_index(starts, lengths)[0]], lengths)

    def keys_between(self, start: int, stop: int) -> list[str]:
        return decode_keys(*self.utf8_between(start, stop))

    def utf8_between(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        offs = self.offsets[start - self.first: stop - self.first + 1]
        return self.utf8[int(offs[0]): int(offs[-1])], np.diff(offs)

    def check_hashes(self, key: tuple[int, int] | None) -> None:
        """Each stored hash is the hash of its row's key (``verify``)."""
        local = self.rows - self.first
        starts, lengths = self.offsets[local], np.diff(self.offsets)[local]
        flat = self.utf8[segment_index(starts, lengths)[0]]
        enc = EncodedKeys(np.concatenate([flat, np.zeros(8, np.uint8)]),
                          np.cumsum(lengths) - lengths, lengths)
        if not np.array_equal(hash_encoded(enc, key), self.hashes):
            raise CorruptStoreError(f"{self.where}: hashes disagree with the keys: the key "
                                    "delta is damaged", path=self.where)


class SegmentedVocab(Vocab):
    """A table's key index (``base``) and the segments appended after it (in row order)."""

    def __init__(self, base: DiskVocab, segments: list[KeySegment]):
        self.base, self.segments = base, segments
        self.path = base.path
        self._starts = np.array([s.first for s in segments], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.base) + sum(s.n for s in self.segments)

    def find(self, keys: np.ndarray) -> np.ndarray:
        return find_keys(keys, self.probe_hashed,
                         lambda enc: hash_encoded(enc, self.base.hash_key))

    def probe_hashed(self, enc: EncodedKeys, h: np.ndarray) -> np.ndarray:
        """Rows of the keys ``enc`` (hashes ``h`` under the index's hash key), -1 where
        absent: the index, then each segment for the keys still missing."""
        found = self.base.probe_hashed(enc, h)
        for seg in self.segments:  # a loop per segment (a few: compaction folds them)
            miss = np.flatnonzero(found < 0)
            if not miss.size:
                break
            found[miss] = seg.find(enc.subset(miss), h[miss])
        return found

    def key_at(self, ids: np.ndarray) -> list[str]:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        which = np.searchsorted(self._starts, ids, side="right") - 1  # -1: the base
        out = np.empty(ids.size, dtype=object)
        for w in np.unique(which).tolist():  # a loop per segment touched
            idx = np.flatnonzero(which == w)
            got = self.base.key_at(ids[idx]) if w < 0 else self.segments[w].key_at(ids[idx])
            out[idx] = np.array(got, dtype=object)
        return out.tolist()

    def keys_between(self, start: int, stop: int) -> list[str]:
        out: list[str] = []
        n0 = len(self.base)
        if start < n0:
            out += self.base.keys_between(start, min(stop, n0))
        for seg in self.segments:  # a loop per segment
            a, b = max(start, seg.first), min(stop, seg.stop)
            if a < b:
                out += seg.keys_between(a, b)
        return out

    def utf8_between(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        n0 = len(self.base)
        parts = [self.base.utf8_between(start, min(stop, n0))] if start < n0 else []
        for seg in self.segments:  # a loop per segment
            a, b = max(start, seg.first), min(stop, seg.stop)
            if a < b:
                parts.append(seg.utf8_between(a, b))
        if not parts:
            return np.zeros(0, np.uint8), np.zeros(0, np.int64)
        return (np.concatenate([p[0] for p in parts]),
                np.concatenate([p[1] for p in parts]).astype(np.int64, copy=False))

    def close(self, *, final: bool = False) -> None:
        self.base.close(final=final)

    def verify(self) -> None:
        """The index (as :meth:`DiskVocab.verify`), each segment's hashes, and ``keys``
        equal to the segments' keys."""
        self.base.verify()
        import zarr  # (verify only)
        keys_arr = zarr.open_array(str(self.path / "keys"), mode="r")
        for seg in self.segments:  # a loop per segment
            seg.check_hashes(self.base.hash_key)
            stored = np.asarray(keys_arr[seg.first: seg.stop]).astype(object).tolist()
            if stored != seg.keys_between(seg.first, seg.stop):
                raise CorruptStoreError(f"{self.path}: 'keys' disagrees with the key delta "
                                        f"{seg.where} in rows {seg.first}..{seg.stop - 1}",
                                        path=str(self.path))

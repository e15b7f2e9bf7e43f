"""Format-2 rows on object storage: :class:`RemotePagedSource`.

The same layout as a local format-2 table (:mod:`embstore.store.rows`), read by ranges: for a
batch of ids it fetches, all at once, the ``page_crc`` chunk of each chunk of rows it touches
for the first time (one GET each, kept for the process), then the pages its rows lie on,
runs of pages closer than ``coalesce_bytes`` in one request; every page is checked against
its crc32c as it arrives, and the rows are copied out of the response buffers (vectorised per
request).  Nothing is read at open beyond the metadata: a row's place is arithmetic.
"""

from __future__ import annotations

import threading
import numpy as np

from ...errors import CorruptStoreError
from ..rows.layout import PAGE, RowLayout, crc_array
from ..rows.pages import crcs_at, decode_crc_file
from .chunkcache import ChunkCache
from .objstore import ObjectClient
from .source import RemoteShardSource

__all__ = ["RemotePagedSource", "PAGES_GAP_BYTES"]

#: pages of one chunk closer than this share a request: random rows fetch about their own
#: pages (format 1's 1 MiB gap makes a 16,384-id batch fetch most of a 1 GB table)
PAGES_GAP_BYTES = 64 << 10


class RemotePagedSource(RemoteShardSource):
    """Rows of a format-2 ``vectors`` array on object storage (read-only); the key index,
    refusals and closing are those of the format-1 remote source."""

    def __init__(self, client: ObjectClient, layout: RowLayout, *,
                 cache: ChunkCache | None = None, coalesce_bytes: int = PAGES_GAP_BYTES,
                 name: str = "vectors"):
        self.client, self.name, self.cache = client, name, cache
        self._rows = layout
        self.gap_pages = max(1, int(coalesce_bytes) // PAGE)
        self._crcs: dict[int, np.ndarray] = {}
        self._index: dict = {}
        self._keys_lock = threading.Lock()
        self._keys_dir = self._keys_tmp = None

    @property
    def _layout(self) -> RowLayout:  # type: ignore[override]
        return self._rows

    @property
    def layout(self) -> dict:
        L = self._rows
        return {"chunk_rows": L.chunk_rows, "shard_rows": L.chunk_rows, "compression": "none",
                "fast_path": False, "format": 2, "checksummed": True}

    def _object(self, name: str, k: int) -> str:
        return f"{name}/{self._rows.chunk_key(k)}"

    def _load_crcs(self, k: int) -> np.ndarray:
        obj = self._object(crc_array(self.name), k)
        data = self.client.get(obj)
        if data is None:
            raise CorruptStoreError(f"{self.client.where(obj)}: missing (the page checksums of "
                                    f"chunk {k})", path=self.client.where(obj))
        return decode_crc_file(bytes(data), self._rows.pages_per_chunk, self.client.where(obj))

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        if ids.size == 0:
            return
        L = self._rows
        rb, ppc = L.row_bytes, L.pages_per_chunk
        chunk = ids // L.chunk_rows
        at = (ids % L.chunk_rows) * rb  # byte offset of each row in its chunk
        first = chunk * ppc + at // PAGE  # global pages: a row covers first..last
        last = chunk * ppc + (at + rb - 1) // PAGE
        span = last - first + 1
        pages = np.repeat(first, span) + (np.arange(int(span.sum()))
                                          - np.repeat(np.cumsum(span) - span, span))
        pages = np.unique(pages)
        todo = [int(k) for k in np.unique(pages // ppc).tolist() if int(k) not in self._crcs]
        for k, crcs in zip(todo, self.client.map(self._load_crcs, todo)):
            self._crcs[k] = crcs
        # requests: runs of pages of one chunk, gaps up to gap_pages filled in
        new = np.ones(pages.size, dtype=bool)
        new[1:] = (pages[1:] - pages[:-1] > self.gap_pages) | (
            pages[1:] // ppc != pages[:-1] // ppc)
        heads = np.flatnonzero(new)
        starts, stops = pages[heads], pages[np.r_[heads[1:], pages.size] - 1] + 1
        region = np.searchsorted(starts, first, side="right") - 1  # each id's request
        order = np.argsort(region, kind="stable")
        cuts = np.searchsorted(region[order], np.arange(starts.size + 1)).tolist()
        jobs = [(int(starts[r]), int(stops[r]), order[cuts[r]: cuts[r + 1]])
                for r in range(starts.size)]
        view = out.view(np.dtype((np.void, rb))).reshape(-1)
        self.client.map(lambda job: self._fetch_pages(job[0], job[1], job[2], at, view), jobs)

    def _fetch_pages(self, p0: int, p1: int, pos: np.ndarray, at: np.ndarray,
                     view: np.ndarray) -> None:
        """One request: global pages ``p0..p1-1`` (one chunk), rows of the ids at ``pos``."""
        L = self._rows
        k, q0, q1 = p0 // L.pages_per_chunk, p0 % L.pages_per_chunk, p1 - p0 + p0 % L.pages_per_chunk
        end = L.chunk_end(k)
        lo, hi = q0 * PAGE, min(q1 * PAGE, end)
        obj = self._object(self.name, k)
        buf = np.frombuffer(self.client.get_range(obj, lo, hi), dtype=np.uint8)
        if buf.size != hi - lo:
            raise CorruptStoreError(f"{self.client.where(obj)}: got {buf.size} bytes for range "
                                    f"{lo}-{hi} (object truncated?)", path=self.client.where(obj))
        qs = np.arange(q0, -(-hi // PAGE))
        bad = np.flatnonzero(crcs_at(buf, qs * PAGE - lo, hi - lo) != self._crcs[k][qs])
        if bad.size:
            q = int(qs[bad[0]])
            raise CorruptStoreError(f"{self.client.where(obj)}: crc32c mismatch in page {q}: the "
                                    "stored rows are damaged", path=self.client.where(obj))
        rb = L.row_bytes
        rows = np.ndarray(shape=(buf.size - rb + 1,), dtype=np.dtype((np.void, rb)),
                          buffer=buf, strides=(1,))
        view[pos] = rows[at[pos] - lo]

    def refresh(self) -> None:
        self._crcs.clear()

    def close(self) -> None:
        self._crcs.clear()
        super().close()



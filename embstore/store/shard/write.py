"""Writing shard files (see docs/FORMAT.md §3b): streaming the rows of a new array, and the
copy-on-write rewrite of one shard used by ``write``/``append``.

:class:`RowStream` takes rows in blocks of any size and writes whole inner chunks as they
fill, one shard file at a time, so memory holds less than a chunk of rows beyond the block
being added.  :class:`~embstore.store.writer.TableWriter` keeps one for ``vectors`` and, for
int8 tables, one for ``row_scale``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from ...fs.checksum import crc32c

from ..codecs import ABSENT, Layout, encode_chunks
from .read import ShardReader
from .tag import chunk_crcs, make_tag, tagged

__all__ = ["RowStream", "ShardStream", "BackgroundSync", "rewrite_shard"]

STREAM_CHUNKS = 256  # inner chunks encoded per write while streaming a shard


class ShardStream:
    """One shard file being written: chunks appended as they come, the index at the end."""

    def __init__(self, path: str, layout: Layout, codec):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.f = open(path, "wb")
        self.layout, self.codec = layout, codec
        self.index = np.full((layout.n_inner, 2), ABSENT, dtype="<u8")
        self.crcs = np.zeros(layout.n_inner, dtype="<u4")  # (the shard tag's entries)
        self.pos = 0
        self.chunks = 0

    def write(self, rows: np.ndarray) -> None:
        """Rows for the next whole chunks (the last chunk of the table may be partial)."""
        parts = encode_chunks(rows, self.layout, self.codec)
        if tagged(self.layout):
            self.crcs[self.chunks: self.chunks + len(parts)] = chunk_crcs(parts)
        for part in parts:  # a loop per chunk
            self.f.write(part)
            self.index[self.chunks] = (self.pos, len(part))
            self.pos += len(part)
            self.chunks += 1

    def close(self, sync: BackgroundSync | None = None) -> None:
        """Write the shard tag and the index and close; the file is fsynced (by ``sync``'s
        thread if given)."""
        _write_tail(self.f, self.index, self.crcs, self.layout)
        self.f.flush()
        if sync is not None:
            sync.submit(self.f)
        else:
            _sync_close(self.f)


def _write_tail(f, index: np.ndarray, crcs: np.ndarray, layout: Layout) -> None:
    """The end of a shard file: its tag (checksummed layouts, :mod:`.tag`), its index and
    the index's crc32c."""
    body = index.tobytes()
    if tagged(layout):
        f.write(make_tag(body, crcs))
    f.write(body)
    if layout.index_crc:
        f.write(crc32c(body).to_bytes(4, "little"))


def _sync_close(f) -> None:
    try:
        os.fsync(f.fileno())
    finally:
        f.close()


class BackgroundSync:
    """fsync (then close) finished files in one background thread, so the disk writes one
    shard out while the next is encoded (an fsync at the end would wait for all of them);
    :meth:`wait` before the files take their final names."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list = []

    def submit(self, f) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="embstore-fsync")
        self._pending.append(self._pool.submit(_sync_close, f))

    def wait(self) -> None:
        """Every file submitted is on disk (raises the first error, a full disk say)."""
        pending, self._pending = self._pending, []
        try:
            for fut in pending:
                fut.result()
        finally:
            self.close()

    def close(self) -> None:
        """Wait for the thread, ignoring errors (cleanup after a failure)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._pending = []


class AsyncWrites:
    """One thread that writes a block of rows to its streams while the caller prepares the
    next (file writes release the GIL): at most one block in flight; :meth:`wait` raises
    what the last one raised (a full disk)."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._fut = None

    def submit(self, fn) -> None:
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="embstore-writer")
        self._fut = self._pool.submit(fn)

    def wait(self) -> None:
        fut, self._fut = self._fut, None
        if fut is not None:
            fut.result()

    def close(self) -> None:
        """Wait for the thread, ignoring errors (cleanup after a failure)."""
        try:
            self.wait()
        except BaseException:  # noqa: BLE001 - the failure being cleaned up is raised already
            pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class RowStream:
    """The shard files of the array at ``root`` (a directory), written front to back."""

    def __init__(self, root: str, layout: Layout, codec, sync: BackgroundSync | None = None):
        self.root, self.layout, self.codec, self.sync = root, layout, codec, sync
        self.shards_done = 0
        self._rest = np.empty((0, layout.dim), dtype=layout.dtype)
        self._stream: ShardStream | None = None

    def _path(self, k: int) -> str:
        L = self.layout
        return os.path.join(self.root, *L.shard_key(k).split(L.separator))

    def add(self, rows: np.ndarray, *, final: bool = False) -> None:
        """Write every whole chunk of the rows given so far (all of them when ``final``)."""
        block = np.concatenate([self._rest, rows]) if self._rest.shape[0] else rows
        cr = self.layout.chunk_rows
        whole = block.shape[0] if final else block.shape[0] // cr * cr
        start = 0
        while start < whole:  # a loop per STREAM_CHUNKS chunks
            if self._stream is None:
                self._stream = ShardStream(self._path(self.shards_done), self.layout,
                                           self.codec)
            room = (self.layout.n_inner - self._stream.chunks) * cr
            take = min(whole - start, room, STREAM_CHUNKS * cr)
            self._stream.write(block[start: start + take])
            start += take
            if self._stream.chunks == self.layout.n_inner:
                self._close_shard()
        self._rest = block[whole:].copy() if whole < block.shape[0] else self._rest[:0]
        if final and self._stream is not None:
            self._close_shard()

    def _close_shard(self) -> None:
        assert self._stream is not None
        self._stream.close(self.sync)
        self._stream = None
        self.shards_done += 1

    def skip_to(self, rows: int) -> None:
        """Leave the shards of ``rows`` rows absent (they read as the fill value)."""
        self.shards_done = -(-rows // self.layout.shard_rows)

    def abort(self) -> None:
        """Close the open shard file; never raises (on a full disk the close fails too)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.f.close()
            except OSError:
                pass


def _kept_crcs(old, n_valid: int, L: Layout) -> np.ndarray:
    """The tag entries of the chunks a rewrite copies from shard ``old`` (0 where absent, or
    past ``n_valid``): its tag's where it has one (a chunk of another shard in its place
    stays damage in the new file), else the crc32c each stored chunk ends in (read from the
    map: those pages are copied anyway)."""
    crcs = np.zeros(L.n_inner, dtype="<u4")
    if not tagged(L) or old.mm is None:
        return crcs
    if old.expect is not None:
        crcs[:n_valid] = old.expect[:n_valid]
        return crcs
    off, nb = old.offsets[:n_valid], old.nbytes[:n_valid]
    at = np.flatnonzero(off >= 0)
    if at.size:
        u4 = np.ndarray(shape=(max(0, old.mm.size - 3),), dtype="<u4", buffer=old.mm,
                        strides=(1,))
        crcs[at] = u4[off[at] + nb[at] - 4]
    return crcs


def rewrite_shard(reader: ShardReader, k: int, local: np.ndarray, values: np.ndarray,
                  valid_rows: int, dest) -> None:
    """Write shard ``k`` with rows ``local`` (shard-relative, distinct) set to ``values`` to
    the new file ``dest`` (fsynced); the live shard is not touched.

    ``valid_rows`` rows of the shard are inside the array after the change.  Untouched chunks
    are copied as stored; touched ones are decoded, patched and encoded again.  The caller's
    transaction (:mod:`embstore.store.versions.commit`) renames ``dest`` over the shard at commit.
    """
    L = reader.layout
    cr = L.chunk_rows
    old = reader.shard(k)
    n_valid = -(-valid_rows // cr)
    touched = np.unique(local // cr)
    dec = reader.decode_chunks(k * L.n_inner + touched)
    slot = np.searchsorted(touched, local // cr)
    dec.reshape(-1, L.dim)[slot * cr + local % cr] = values
    fresh = encode_chunks(dec.reshape(-1, L.dim), L, reader.codec)
    # segments of the new file: each touched chunk alone, and runs of untouched chunks that
    # lie back to back in the old file (copied with one write each, not chunk by chunk)
    offs, nbs = old.offsets[:n_valid], old.nbytes[:n_valid]
    is_t = np.zeros(n_valid, dtype=bool)
    is_t[touched] = True
    present = offs >= 0
    joined = np.zeros(n_valid, dtype=bool)
    joined[1:] = ((offs[1:] == offs[:-1] + nbs[:-1]) & present[1:] & present[:-1]
                  & ~is_t[1:] & ~is_t[:-1])
    starts = np.flatnonzero(~joined).tolist() + [n_valid]
    slot_of = {int(c): j for j, c in enumerate(touched.tolist())}
    index = np.full((L.n_inner, 2), ABSENT, dtype="<u8")
    crcs = _kept_crcs(old, n_valid, L)
    if tagged(L):
        crcs[touched] = chunk_crcs(fresh)
    with open(dest, "wb") as f:
        pos = 0
        for a, b in zip(starts[:-1], starts[1:]):  # a loop per segment
            if is_t[a]:
                piece = fresh[slot_of[a]]
                f.write(piece)
                index[a] = (pos, len(piece))
                pos += len(piece)
            elif present[a]:
                lo, hi = int(offs[a]), int(offs[b - 1] + nbs[b - 1])
                old.willneed(lo, hi)  # the map reads no ahead (MADV_RANDOM)
                f.write(old.buf[lo:hi])
                index[a:b, 0] = pos + (offs[a:b] - lo)
                index[a:b, 1] = nbs[a:b]
                pos += hi - lo
        _write_tail(f, index, crcs, L)
        f.flush()
        os.fsync(f.fileno())

"""Writing a format-2 row array front to back: chunk files of whole rows, their page
checksums computed from the bytes as they are written (crc32c continued across blocks, no
copy), the last chunk padded to its size (a sparse tail: no bytes written for it)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...fs.checksum import crc32c
from ..codecs import pool
from ..shard.write import BackgroundSync
from .layout import PAGE, RowLayout, crc_array
from .pages import MARKER, encode_crc_file

__all__ = ["PagedStream", "write_file", "create_row_arrays", "create_paged_array"]

_OVERLAP_BYTES = 1 << 20  # blocks from this size have their checksums computed while written


def write_file(path: str, data: bytes, sync: BackgroundSync | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    f = open(path, "wb")  # noqa: SIM115 - closed by the sync (or below)
    try:
        f.write(data)
    except BaseException:
        f.close()
        raise
    _finish(f, sync)


def _finish(f, sync: BackgroundSync | None) -> None:
    if sync is not None:
        sync.submit(f)
    else:
        try:
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()


class PagedStream:
    """The chunk files of the row array at ``root`` and of its page checksums at
    ``crc_root``, written front to back (the interface of
    :class:`~embstore.store.shard.write.RowStream`)."""

    def __init__(self, root: str, crc_root: str, layout: RowLayout,
                 sync: BackgroundSync | None = None):
        self.root, self.crc_root, self.layout, self.sync = root, crc_root, layout, sync
        self.chunks_done = 0
        self._f: Any = None
        self._in_chunk = 0  # bytes written to the open chunk file
        self._crcs = np.zeros(layout.pages_per_chunk, dtype="<u4")
        self._page = 0       # pages of the open chunk whose checksum is complete
        self._cur = 0        # crc32c of the partial page so far
        self._cur_len = 0

    def _path(self, root: str, k: int) -> str:
        return os.path.join(root, *self.layout.chunk_key(k).split(self.layout.separator))

    def _open(self) -> None:
        path = self._path(self.root, self.chunks_done)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._f = open(path, "wb")  # noqa: SIM115 - closed in _close
        self._in_chunk = self._page = self._cur = self._cur_len = 0
        self._crcs[:] = 0

    def _feed(self, mv: np.ndarray) -> None:
        """Continue the page checksums over ``mv`` (the next bytes of the open chunk)."""
        i, n = 0, len(mv)
        if self._cur_len:
            take = min(PAGE - self._cur_len, n)
            self._cur = crc32c(mv[:take], self._cur)
            self._cur_len += take
            i = take
            if self._cur_len == PAGE:
                self._crcs[self._page] = self._cur
                self._page += 1
                self._cur = self._cur_len = 0
        while n - i >= PAGE:  # a call per page
            self._crcs[self._page] = crc32c(mv[i: i + PAGE])
            self._page += 1
            i += PAGE
        if i < n:
            self._cur = crc32c(mv[i:])
            self._cur_len = n - i

    def add(self, rows: np.ndarray, *, final: bool = False) -> None:
        """Write ``rows`` (codes, ``(n, dim)``); with ``final`` close the last chunk."""
        L = self.layout
        data = np.ascontiguousarray(rows, dtype=L.dtype).reshape(-1).view(np.uint8)
        i = 0
        while i < len(data):  # a loop per chunk file
            if self._f is None:
                self._open()
            take = min(len(data) - i, L.chunk_bytes - self._in_chunk)
            part = data[i: i + take]
            sums = pool().submit(self._feed, part) if take >= _OVERLAP_BYTES else None
            self._f.write(part.data)  # (the checksums meanwhile: both release the GIL)
            if sums is None:
                self._feed(part)
            else:
                sums.result()
            self._in_chunk += take
            i += take
            if self._in_chunk == L.chunk_bytes:
                self._close()
        if final and self._f is not None:
            self._close()

    def _close(self) -> None:
        f, self._f = self._f, None
        assert f is not None
        if self._cur_len:  # the last page of the committed rows: its bytes only
            self._crcs[self._page] = self._cur
        try:
            if self._in_chunk < self.layout.chunk_bytes:
                f.truncate(self.layout.chunk_bytes)  # zeros to the chunk's size, sparse
        except BaseException:
            f.close()
            raise
        _finish(f, self.sync)
        write_file(self._path(self.crc_root, self.chunks_done), encode_crc_file(self._crcs),
                   self.sync)
        self.chunks_done += 1

    def skip_to(self, rows: int, *, never_written: bool = False) -> None:
        """Rows up to ``rows`` are zeros: whole chunk files of zeros (sparse), checksummed;
        ``never_written``: holes marked never written instead (docs/FORMAT.md §3e: readers
        generate their rows), each file fsynced with the table's tree when it commits."""
        L = self.layout
        zero_page = crc32c(bytes(PAGE))
        while self.chunks_done * L.chunk_rows < rows:  # a loop per chunk file
            k = self.chunks_done
            if never_written:
                path = self._path(self.root, k)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.truncate(L.chunk_bytes)
                crc = self._path(self.crc_root, k)
                os.makedirs(os.path.dirname(crc), exist_ok=True)
                with open(crc, "wb") as f:
                    f.write(MARKER)
                self.chunks_done += 1
                continue
            end = (min(rows, (k + 1) * L.chunk_rows) - k * L.chunk_rows) * L.row_bytes
            crcs = np.zeros(L.pages_per_chunk, dtype="<u4")
            full = end // PAGE
            crcs[:full] = zero_page
            if end % PAGE:
                crcs[full] = crc32c(bytes(end % PAGE))
            path = self._path(self.root, k)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.truncate(L.chunk_bytes)
                f.flush()
                os.fsync(f.fileno())
            write_file(self._path(self.crc_root, k), encode_crc_file(crcs), self.sync)
            self.chunks_done += 1

    def abort(self) -> None:
        """Close the open chunk file; never raises (on a full disk the close fails too)."""
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass


def create_row_arrays(group, root: str, record, dim: int, chunk_rows: int,
                      sync: BackgroundSync | None, set_data_type) -> tuple[PagedStream, RowLayout]:
    """Create the empty format-2 ``vectors`` and ``page_crc`` arrays in the zarr ``group``
    (at ``root``) and return the stream their rows are written with.  ``set_data_type``
    renames the stored data type in ``vectors/zarr.json`` where zarr-python lacks it."""
    stream = create_paged_array(group, root, "vectors", record.zarr_dtype, record.code, dim,
                                chunk_rows, sync, ("row", "dim"))
    if record.zarr_dtype != record.name:  # zarr-python 3.1 has no bfloat16: uint16 first
        set_data_type(os.path.join(root, "vectors", "zarr.json"), record.name)
    return stream, stream.layout


def create_paged_array(group, root: str, name: str, zarr_dtype, code, dim: int,
                       chunk_rows: int, sync: BackgroundSync | None,
                       dimension_names: tuple[str, str]) -> PagedStream:
    """Create the empty format-2 row array ``name`` (``vectors``, ``norms``, ``row_scale``)
    and its page checksums (``crc_array(name)``) in the zarr ``group`` at ``root``; return
    the stream its rows are written with."""
    from zarr.codecs import BytesCodec, Crc32cCodec
    layout = RowLayout(rows=0, dim=dim, dtype=np.dtype(code), chunk_rows=chunk_rows)
    group.create_array(name, shape=(0, dim), dtype=zarr_dtype, chunks=(chunk_rows, dim),
                       serializer=BytesCodec(endian="little"), compressors=None, filters=None,
                       fill_value=0, dimension_names=dimension_names)
    ppc, crc = layout.pages_per_chunk, crc_array(name)
    dims = ("chunk", "page") if name == "vectors" else (f"{name}_chunk", f"{name}_page")
    group.create_array(crc, shape=(0, ppc), dtype="uint32", chunks=(1, ppc),
                       serializer=BytesCodec(endian="little"), compressors=[Crc32cCodec()],
                       fill_value=0, dimension_names=dims)  # (xarray: one size per name)
    return PagedStream(os.path.join(root, name), os.path.join(root, crc), layout, sync)

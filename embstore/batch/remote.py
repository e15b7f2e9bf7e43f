"""Batch job inputs and outputs on object storage (``s3://...``), for workers that share no disk.

- :class:`RemoteNpyIds`: a ``.npy`` of ids read by ranges: its header once, then each
  block's leading rows with one ranged GET.
- :class:`RemoteZarrSink`: a Zarr v3 array written object by object: each block is one
  chunk object (raw little-endian bytes, the ``bytes`` codec), a marker object records it
  as done, and the array's ``zarr.json`` is written last, after the markers are deleted.
  Until then the output does not open as an array (object stores have no rename); a
  killed job re-run with ``resume=True`` finds its markers and its ``job.json``.
"""

from __future__ import annotations

import io
import json

import numpy as np

from ..errors import DestinationExistsError, EmbstoreError, FormatError, InvalidIdError
from ..store.place.objstore import ObjectClient, is_url
from .idblocks import IdBlocks

__all__ = ["RemoteNpyIds", "RemoteZarrSink", "is_url", "remote_stamp"]

_MARKERS = ".embstore-lookup"
_HEAD = 4096  # bytes fetched for a .npy header (longer headers: one more request)


def _object_client(url: str) -> ObjectClient:
    return ObjectClient(url, concurrency=4)


def remote_stamp(url: str, what: str = "") -> tuple:
    """``(size, etag)`` of an object (or of a table's group ``zarr.json``), for resume checks."""
    client = _object_client(url)
    try:
        meta = client.head(what)
    finally:
        client.close()
    if meta is None:
        raise FormatError("no such object", path=client.where(what))
    return (int(meta["size"]), str(meta.get("e_tag") or ""))


class RemoteNpyIds(IdBlocks):
    """Integer ids of any shape in a ``.npy`` object, read block by block with ranged GETs."""

    def __init__(self, url: str):
        self.path = url
        self.client = _object_client(url)
        head = self.client.get_range("", 0, _HEAD) if self._size() else b""
        head = bytes(head)
        if head[:6] != b"\x93NUMPY":
            raise FormatError(f"not a .npy file of ids (it starts with {head[:6]!r})", path=url)
        f = io.BytesIO(head)
        try:
            version = np.lib.format.read_magic(f)
            hlen = int.from_bytes(head[8:10] if version[0] == 1 else head[8:12], "little")
            need = (10 if version[0] == 1 else 12) + hlen
            if need > len(head):
                f = io.BytesIO(bytes(self.client.get_range("", 0, need)))
                np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read(f)
        except (ValueError, EOFError) as exc:
            raise FormatError(f"not a readable .npy file ({exc})", path=url) from None
        if dtype.kind not in "iu" or dtype.hasobject:
            raise InvalidIdError(f"{url}: ids must be integers, got an array of {dtype}",
                                 id=None, position=None)
        if fortran and len(shape) > 1:
            raise FormatError("a Fortran-ordered .npy cannot be read by ranges; save it in "
                              "C order", path=url)
        self.offset, self.dtype, self.shape = f.tell(), dtype, tuple(shape)
        self.row_items = int(np.prod(self.shape[1:], dtype=np.int64)) if self.shape else 1
        want = self.offset + int(np.prod(self.shape, dtype=np.int64)) * dtype.itemsize
        if self._size() < want:
            raise FormatError(f"truncated: {self._size()} bytes, the header says {want}",
                              path=url)

    def _size(self) -> int:
        if not hasattr(self, "_nbytes"):
            meta = self.client.head("")
            if meta is None:
                raise FormatError("no such object", path=self.path)
            self._nbytes = int(meta["size"])
        return self._nbytes

    def read(self, start: int, stop: int) -> np.ndarray:
        """Leading rows ``start:stop`` as a C-contiguous int64 array (one ranged GET)."""
        lead = self.shape[0] if self.shape else 1
        start, stop = max(0, start), min(stop, lead)
        n = max(0, stop - start) * self.row_items
        if n == 0:
            return np.zeros((0,) + self.shape[1:], dtype=np.int64)
        isz = self.dtype.itemsize
        a = self.offset + start * self.row_items * isz
        buf = self.client.get_range("", a, a + n * isz)
        arr = np.frombuffer(buf, dtype=self.dtype, count=n)
        return arr.astype(np.int64).reshape((stop - start,) + self.shape[1:])

    def _block(self, start: int, stop: int) -> np.ndarray:
        return self.read(start, stop)


class RemoteZarrSink:
    """A Zarr v3 array on object storage, one chunk object per block (see the module doc)."""

    def __init__(self, job):
        self.job = job
        self.client = _object_client(job.tmp)

    @staticmethod
    def check_dest(url: str, overwrite: bool) -> None:
        client = _object_client(url)
        try:
            exists = client.head("zarr.json") is not None
        finally:
            client.close()
        if exists and not overwrite:
            raise DestinationExistsError(f"{url} already exists (pass overwrite=True to "
                                         "replace it)")

    @staticmethod
    def _chunks(job) -> list[int]:
        shape = job.shape + (job.dim,)
        rows = max(1, max((b - a for a, b in zip(job.starts[:-1], job.starts[1:])), default=1))
        if job.shape:
            return [rows] + [max(1, s) for s in shape[1:]]
        return [max(1, job.dim)]

    @staticmethod
    def metadata(job) -> dict:
        return {"zarr_format": 3, "node_type": "array",
                "shape": [int(s) for s in job.shape + (job.dim,)],
                "data_type": np.dtype(job.dtype).name,
                "chunk_grid": {"name": "regular",
                               "configuration": {"chunk_shape": RemoteZarrSink._chunks(job)}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": 0.0, "codecs": [{"name": "bytes",
                                               "configuration": {"endian": "little"}}],
                "attributes": {}}

    @staticmethod
    def create(job) -> None:
        """Start over: delete the array's ``zarr.json`` first, then everything else."""
        client = _object_client(job.tmp)
        try:
            existing = [rel for rel, _ in client.list()]
            if "zarr.json" in existing:
                client.delete(["zarr.json"])
            client.delete([r for r in existing if r != "zarr.json"])
            client.put(f"{_MARKERS}/job.json", json.dumps(job.identity()).encode())
        finally:
            client.close()

    @staticmethod
    def resumable(job) -> bool:
        client = _object_client(job.tmp)
        try:
            raw = client.get(f"{_MARKERS}/job.json")
        finally:
            client.close()
        try:
            return raw is not None and json.loads(raw) == json.loads(json.dumps(job.identity()))
        except (ValueError, RecursionError):
            return False

    def done(self) -> set[int]:
        names = [rel.rsplit("/", 1)[-1] for rel, _ in self.client.list(f"{_MARKERS}/done")]
        return {int(n) for n in names if n.isdigit()}

    def write(self, i: int, block: np.ndarray) -> None:
        job = self.job
        chunks = self._chunks(job)
        full = np.zeros(chunks, dtype=np.dtype(job.dtype).newbyteorder("<"))
        if job.shape:
            full[: block.shape[0]] = block
            key = "c/" + "/".join([str(i)] + ["0"] * (len(chunks) - 1))
        else:
            full[:] = block.reshape(job.dim)
            key = "c/0"
        self.client.put(key, full.tobytes())
        self.client.put(f"{_MARKERS}/done/{i}", b"")  # after the chunk is complete

    def close(self) -> None:
        self.client.close()

    @staticmethod
    def finish(job) -> None:
        """Markers away, then the array's ``zarr.json``: only now does the output open."""
        client = _object_client(job.tmp)
        try:
            client.delete([rel for rel, _ in client.list(_MARKERS)])
            client.put("zarr.json", json.dumps(RemoteZarrSink.metadata(job), indent=2).encode())
        finally:
            client.close()


def check_remote_output(url: str, kind: str) -> None:
    if kind != "zarr":
        raise EmbstoreError(f"{url}: outputs on object storage are Zarr arrays (.zarr); a "
                            ".npy output needs a local path")

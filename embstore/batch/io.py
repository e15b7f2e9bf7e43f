"""Inputs and outputs of batch lookup jobs (see :mod:`embstore.batch`).

A job is described by a small, picklable :class:`Job`: the paths, the output
geometry and the block boundaries along the leading axis.  Everything here can
be rebuilt from a ``Job`` in another process (a Dask worker), so every block
can be read, looked up and written by whoever runs it:

- :class:`NpyIds` reads ``.npy`` ids memory-mapped, one block of leading rows
  at a time; :class:`KeyLines` reads a text file of whitespace-separated keys,
  one sequence a line, starting at a block's byte offset.
- :class:`NpySink` writes blocks at their byte offset in a pre-sized ``.npy``
  file; :class:`ZarrSink` writes them as whole chunks of a Zarr v3 array and
  records each finished block, so that an interrupted job can resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from itertools import islice
from typing import BinaryIO

import numpy as np

from ..errors import EmbstoreError, FormatError, InvalidIdError, KeyNotFoundError
from ..memory import MemoryTable
from ..oov import map_oov, subword_rows
from ..store import table as store_table
from ..table import Table
from .idblocks import IdBlocks
from .remote import RemoteNpyIds, RemoteZarrSink, is_url

__all__ = ["open_table", "Job", "NpyIds", "KeyLines", "NpySink", "ZarrSink", "open_source", "open_sink",
           "read_block", "lookup_into", "output_kind", "FilledIds"]

_MARKERS = ".embstore-lookup"
#: Tokens of a key line: runs of anything but ASCII whitespace, as the importers split
#: (``bytes.split``), so keys holding U+00A0 or U+3000 come back whole
_tokens = re.compile(r"[^ \t\n\r\x0b\x0c]+").findall
_BOM = b"\xef\xbb\xbf"


@dataclasses.dataclass(frozen=True)
class Job:
    """Everything a process needs to run any block of a lookup job."""

    table: str                    # path of the table (a store directory or a 2-D .npy)
    cache_bytes: int | str        # row cache of each process that opens the table
    input: str                    # .npy ids or, with keys=True, a text file
    keys: bool
    oov: str                      # unknown keys, out-of-range ids: "error", "zero" or "unk"
    unk_id: int | None
    shape: tuple[int, ...]        # ids shape (keys: (lines, longest line)); output adds dim
    dim: int
    dtype: str
    vocab_size: int
    starts: tuple[int, ...]       # block i covers leading rows starts[i]:starts[i + 1]
    offsets: tuple[int, ...]      # keys only: byte offset of each block's first line
    out_kind: str                 # "npy" or "zarr"
    tmp: str                      # the output being written (renamed when complete)
    header_len: int = 0           # npy only
    stamp: tuple = ()             # sizes and mtimes of the input and the table (for resume)

    @property
    def n_blocks(self) -> int:
        return len(self.starts) - 1

    @property
    def pads(self) -> bool:
        """Whether id -1 (a zero row) can occur: key padding, or ``oov="zero"``."""
        return self.keys or self.oov == "zero"

    @property
    def rows(self) -> int:
        """Leading rows (1 for 0-d ids)."""
        return self.shape[0] if self.shape else 1

    @property
    def inner(self) -> tuple[int, ...]:
        return self.shape[1:]

    def block(self, i: int) -> tuple[int, int]:
        return self.starts[i], self.starts[i + 1]

    def identity(self) -> dict:
        """The fields that must match for a partial output to be resumed."""
        d = dataclasses.asdict(self)
        for k in ("tmp", "cache_bytes", "header_len"):
            d.pop(k)
        for k in ("shape", "starts", "offsets", "stamp"):
            d[k] = list(d[k])
        return d


def output_kind(path: str) -> str:
    name = os.fspath(path).rstrip("/\\").lower()
    if name.endswith(".zarr"):
        return "zarr"
    if name.endswith(".npy"):
        return "npy"
    raise FormatError("the output must be a .npy file or a .zarr directory", path=path)


# -- inputs ------------------------------------------------------------------------------
class NpyIds(IdBlocks):
    """Integer ids of any shape in a ``.npy`` file, read memory-mapped block by block."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":
            looks_like_text = bool(magic) and all(32 <= c < 127 or c in b"\t\r\n" for c in magic)
            raise FormatError("not a .npy file of ids" + (
                " (it looks like text: a text file of keys is read with keys=True)"
                if looks_like_text else f" (it starts with {magic!r})"), path=path)
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
                raise
            raise FormatError(f"not a readable .npy file ({exc})", path=path) from None
        if not isinstance(arr, np.ndarray):
            raise FormatError("expected one array in a .npy file", path=path)
        if arr.dtype.kind not in "iu":
            raise InvalidIdError(f"{path}: ids must be integers, got an array of {arr.dtype}",
                                 id=None, position=None)
        self.array = arr
        self.shape = tuple(arr.shape)
        self._lead = arr.reshape(1) if arr.ndim == 0 else arr

    def read(self, start: int, stop: int) -> np.ndarray:
        """Leading rows ``start:stop`` as a C-contiguous int64 array."""
        return np.ascontiguousarray(self._lead[start:stop], dtype=np.int64)

    def _block(self, start: int, stop: int) -> np.ndarray:
        return self._lead[start:stop]


class KeyLines:
    """A text file of keys: one whitespace-tokenised sequence a line, padded to the longest."""

    def __init__(self, path: str):
        self.path = path

    def _decode(self, lines: list[bytes], first_line: int) -> list[str]:
        if first_line == 0 and lines and lines[0].startswith(_BOM):  # not part of a key
            lines[0] = lines[0][len(_BOM):]
        if any(b"\r" in line for line in lines):
            for j, line in enumerate(lines):
                if b"\r" in line.rstrip(b"\r\n"):
                    raise FormatError("expected lines ending in \\n or \\r\\n, got a carriage "
                                      "return inside a line (CR-only line ends are not "
                                      "supported)", path=self.path, line=first_line + j + 1)
        try:
            return [line.decode("utf-8") for line in lines]
        except UnicodeDecodeError:
            for j, line in enumerate(lines):  # error path: find the line
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise FormatError(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                                      path=self.path, line=first_line + j + 1) from None
            raise

    def scan(self, block_lines: int = 65536) -> tuple[np.ndarray, np.ndarray]:
        """First pass, streamed: tokens and bytes of every line (two int64 arrays)."""
        tokens, sizes, n = [], [], 0
        with open(self.path, "rb") as f:
            while True:
                lines = list(islice(f, block_lines))
                if not lines:
                    break
                sizes.append(np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)))
                tokens.append(np.fromiter(map(len, map(_tokens, self._decode(lines, n))),
                                          dtype=np.int64, count=len(lines)))
                n += len(lines)
        if not tokens:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(tokens), np.concatenate(sizes)

    def read(self, offset: int, n_lines: int, width: int, first_line: int, table, oov: str,
             unk_id: int | None) -> np.ndarray | FilledIds:
        """Ids of ``n_lines`` lines from byte ``offset``, shape ``(n_lines, width)`` (-1: zero)."""
        with open(self.path, "rb") as f:
            f.seek(offset)
            lines = self._decode(list(islice(f, n_lines)), first_line)
        if len(lines) != n_lines:
            raise EmbstoreError(f"{self.path} changed while the job was running")
        tokens = [_tokens(line) for line in lines]
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=n_lines)
        if lengths.size and lengths.max() > width:
            raise EmbstoreError(f"{self.path} changed while the job was running")
        flat = np.empty(int(lengths.sum()), dtype=object)
        flat[:] = [t for line in tokens for t in line]
        ids = table.ids_of(flat, missing=-1)
        unknown = ids < 0
        if unknown.any():
            if oov == "error":
                i = int(np.argmax(unknown))
                ends = np.cumsum(lengths)
                row = int(np.searchsorted(ends, i, side="right"))
                col = i - (int(ends[row - 1]) if row else 0)
                raise KeyNotFoundError(
                    f"{self.path}, line {first_line + row + 1}: key {flat[i]!r} (token "
                    f"{col + 1}) is not in the table (use oov='zero' or oov='unk')",
                    key=flat[i], position=(first_line + row, col))
            if oov == "unk":
                ids = map_oov(ids, unknown, "unk", unk_id=unk_id)
        out = np.full((n_lines, width), -1, dtype=np.int64)
        valid = np.arange(width) < lengths[:, None]
        out[valid] = ids
        if oov == "subword":  # unknown keys: -1 here, their composed vectors alongside
            return FilledIds(out, np.flatnonzero(valid)[unknown],
                             subword_rows(table, flat[unknown]))
        return out


class FilledIds:
    """The ids of a block of keys (-1: a zero row) and the vectors that go at some of those
    positions instead (``oov="subword"``: unknown keys composed from their n-grams)."""

    def __init__(self, ids: np.ndarray, at: np.ndarray, rows: np.ndarray):
        self.ids, self.at, self.rows = ids, at, rows  # at: flat positions in ids
        self.shape: tuple[int, ...] = ids.shape
        self.size = int(ids.size)


def open_source(job: Job):
    if is_url(job.input):
        if job.keys:
            raise EmbstoreError(f"{job.input}: key files on object storage are not supported "
                                "yet (.npy ids are)")
        return RemoteNpyIds(job.input)
    return KeyLines(job.input) if job.keys else NpyIds(job.input)


def read_block(job: Job, source, i: int, table) -> np.ndarray | FilledIds:
    a, b = job.block(i)
    if job.keys:
        return source.read(job.offsets[i], b - a, job.inner[0], a, table, job.oov, job.unk_id)
    ids = source.read(a, b)  # may be a read-only view of the memory-mapped input
    if job.oov != "error":  # out-of-range ids become zero rows (-1) or the unk row: a new array
        bad = (ids < 0) | (ids >= job.vocab_size)
        if bad.any():
            ids = map_oov(ids, bad, job.oov, unk_id=job.unk_id, zero_id=-1)
    return ids


def lookup_into(table, ids: np.ndarray | FilledIds, out: np.ndarray, *, pads: bool) -> None:
    """Fill ``out`` with the rows of ``ids``; with ``pads``, id -1 gives a zero row."""
    if isinstance(ids, FilledIds):
        lookup_into(table, ids.ids, out, pads=True)
        out.reshape(-1, out.shape[-1])[ids.at] = ids.rows
        return
    if pads and ids.size:
        valid = ids >= 0
        if not valid.all():
            out[~valid] = 0
            if valid.any():
                out[valid] = table.lookup(ids[valid])
            return
    table.lookup(ids, out=out)


# -- outputs -----------------------------------------------------------------------------
class NpySink:
    """A ``.npy`` file pre-sized to its full length; blocks go to their byte offset."""

    def __init__(self, job: Job):
        self.job = job
        self.row_bytes = int(np.prod(job.inner, dtype=np.int64)) * job.dim * np.dtype(
            job.dtype).itemsize
        self._f: BinaryIO | None = None

    @staticmethod
    def create(tmp: str, shape: tuple[int, ...], dtype) -> int:
        """Write the header and size the (sparse) file; returns the header length."""
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                  "fortran_order": False, "shape": tuple(int(s) for s in shape)}
        with open(tmp, "wb") as f:
            np.lib.format.write_array_header_1_0(f, header)
            header_len = f.tell()
            f.truncate(header_len + int(np.prod(shape, dtype=np.int64)) * np.dtype(
                dtype).itemsize)
        return header_len

    def done(self) -> set[int]:
        return set()

    def write(self, i: int, block: np.ndarray) -> None:
        if block.size == 0:
            return
        if self._f is None:
            self._f = open(self.job.tmp, "r+b")  # noqa: SIM115 - closed in close()
        self._f.seek(self.job.header_len + self.job.starts[i] * self.row_bytes)
        data = memoryview(np.ascontiguousarray(block).reshape(-1))  # type: ignore[arg-type]
        self._f.write(data.cast("B"))

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class ZarrSink:
    """A Zarr v3 array chunked by block along the leading axis, with a record of done blocks."""

    def __init__(self, job: Job):
        import zarr

        self.job = job
        self.array = zarr.open_array(job.tmp, mode="r+")
        self._done_dir = os.path.join(job.tmp, _MARKERS, "done")

    @staticmethod
    def create(job: Job) -> None:
        import zarr

        shape = job.shape + (job.dim,)
        rows = max(1, max((b - a for a, b in zip(job.starts[:-1], job.starts[1:])), default=1))
        if job.shape:
            chunks = (rows,) + tuple(max(1, s) for s in shape[1:])
        else:  # 0-d ids: one vector
            chunks = (max(1, job.dim),)
        zarr.create_array(store=job.tmp, shape=shape, dtype=job.dtype, chunks=chunks,
                          compressors=None, fill_value=0, zarr_format=3, overwrite=True)
        os.makedirs(os.path.join(job.tmp, _MARKERS, "done"))
        with open(os.path.join(job.tmp, _MARKERS, "job.json"), "w") as f:
            json.dump(job.identity(), f)

    @staticmethod
    def resumable(job: Job) -> bool:
        """Whether ``job.tmp`` holds a partial output of this very job."""
        try:
            with open(os.path.join(job.tmp, _MARKERS, "job.json")) as f:
                saved = json.load(f)
        except (OSError, ValueError, RecursionError):
            return False
        return saved == json.loads(json.dumps(job.identity()))

    def done(self) -> set[int]:
        return {int(n) for n in os.listdir(self._done_dir) if n.isdigit()}

    def write(self, i: int, block: np.ndarray) -> None:
        a, b = self.job.block(i)
        if self.job.shape:
            self.array[a:b] = block
        else:
            self.array[...] = block.reshape(self.job.dim)
        open(os.path.join(self._done_dir, str(i)), "wb").close()  # after the chunk is complete

    def close(self) -> None:
        pass

    @staticmethod
    def finish(tmp: str) -> None:
        shutil.rmtree(os.path.join(tmp, _MARKERS))


def open_sink(job: Job):
    if is_url(job.tmp):
        return RemoteZarrSink(job)
    return ZarrSink(job) if job.out_kind == "zarr" else NpySink(job)


DEFAULT_CACHE_BYTES = "auto"    # row cache of the table opened for a job (see open_table)
COMPRESSED_CACHE_BYTES = "64MiB"


def table_location(table) -> str:
    """Where a job (and its workers) open the table given by path: a URL as it is, a local
    path made absolute (the ``.npy`` and the Parquet jobs share this)."""
    return table if is_url(table) else os.path.abspath(os.fspath(table))


def open_table(path, *, cache_bytes=DEFAULT_CACHE_BYTES) -> Table:
    """A table by path: a store directory (``embstore.open``) or a 2-D ``.npy`` (memory-mapped).

    ``cache_bytes="auto"`` gives no row cache to an uncompressed store (its rows
    are gathered straight from the memory-mapped shards, about as fast as a
    cache hit: measured on 1M x 64 float32, a 64 MiB cache made 1M lookups 3x
    slower for uniform ids and 1.4x slower for Zipf ids) and 64 MiB to a
    compressed one.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and path.lower().endswith(".npy"):
        return MemoryTable(np.load(path, mmap_mode="r", allow_pickle=False))
    if cache_bytes != "auto":
        return store_table.open(path, mode="r", cache_bytes=cache_bytes)
    table = store_table.open(path, mode="r", cache_bytes=0)
    layout = table.layout
    if layout.get("compression") == "none" and layout.get("fast_path", True):
        return table
    table.close()
    return store_table.open(path, mode="r", cache_bytes=COMPRESSED_CACHE_BYTES)

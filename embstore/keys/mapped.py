"""Uncompressed 1-D Zarr arrays that are read through ``np.memmap`` of their chunk files.

The key index (:mod:`embstore.keys.index`) keeps four such arrays.  zarr-python
writes them (codecs ``bytes`` little-endian + ``crc32c``, default chunk key
encoding ``c/<i>``), so any Zarr v3 reader can read and checksum them; this
module maps the raw chunk files instead, so opening costs one small JSON read
per array and a lookup touches only the pages it needs.

A chunk file is ``chunk * itemsize`` data bytes followed by a 4-byte crc32c;
the last chunk is padded to full size by zarr.  Chunks hold at most
``CHUNK_BYTES`` bytes; arrays are always rewritten whole (never resized), so a
small array is one exact-size chunk.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from ..fs.checksum import crc32c
from .vlen import plain_keys_codecs, write_keys_chunks

from ..errors import ClosedTableError, CorruptStoreError, ResourceLimitError
from ..fs.atomic import replace
from ..fs.files import RESOURCE_ERRNOS, map_file, open_regular, read_small, resource_error

if TYPE_CHECKING:  # zarr is imported only to write or verify: reading needs no zarr
    import zarr

__all__ = ["MappedArray", "Head", "write_mapped", "concat_reader", "CHUNK_BYTES", "CHUNKS_ATTR",
           "parse_array_meta", "stage_keys_array", "chunk_pins"]

CHUNK_BYTES = 64 << 20  # tests lower it to exercise several chunks
#: an array's attribute listing the crc32c each of its chunk files ends in (docs/FORMAT.md
#: section 4): a chunk of another array, version or table in its place is damage, although
#: its own crc32c holds
CHUNKS_ATTR = "embstore_chunk_crc32c"


def chunk_length(n: int, itemsize: int) -> int:
    """Elements per chunk: one chunk up to CHUNK_BYTES, else balanced chunks (little padding)."""
    cap = max(1, CHUNK_BYTES // itemsize)
    if n <= cap:
        return max(n, 1)
    nchunks = -(-n // cap)
    return -(-n // nchunks)


# xarray needs a name for each axis; a dimension named like its array would make xarray
# load the array whole as an index, so the names differ from the array names
_DIMENSION = {"key_utf8": "key_byte", "key_offsets": "key_bound", "key_hash": "key_slot",
              "key_order": "key_slot"}


def write_mapped(group: zarr.Group, name: str, n: int, dtype,
                 read: Callable[[int, int], np.ndarray], *, attrs: dict | None = None,
                 path: Path | None = None) -> None:
    """Write a 1-D array ``name`` of ``n`` elements, chunk by chunk, from ``read(start, stop)``.

    Into a group nobody reads yet (a new table, or a transaction's staging directory: a
    table's ``append`` replaces the live arrays through the store's commit protocol).  With
    ``path`` (the group's directory) the array is written under a temporary name and
    renamed into place (a key index built for keys another tool wrote).
    """
    from zarr.codecs import Crc32cCodec

    dtype = np.dtype(dtype)
    c = chunk_length(n, dtype.itemsize)
    target = name if path is None else f"{name}.__tmp__"
    arr = group.create_array(target, shape=(n,), chunks=(c,), dtype=dtype, fill_value=0,
                             compressors=[Crc32cCodec()], filters=None, overwrite=True,
                             attributes=attrs or {}, config={"write_empty_chunks": True},
                             dimension_names=(_DIMENSION.get(name, f"{name}_i"),))
    sums = []
    for start in range(0, n, c):  # a loop per chunk (64 MiB)
        stop = min(n, start + c)
        block = np.ascontiguousarray(read(start, stop), dtype=dtype)
        arr[start:stop] = block
        sums.append(_chunk_crc(block, c))
    arr.update_attributes({CHUNKS_ATTR: sums})  # (each chunk pinned to its array)
    if path is not None:
        path = Path(path)
        old = path / f"{name}.__old__"  # the set-aside where the system cannot exchange
        if old.exists():
            shutil.rmtree(old)
        replace(path / target, path / name, aside=old)


def _chunk_crc(block: np.ndarray, c: int) -> int:
    """The crc32c a chunk file of ``c`` elements holding ``block`` ends in (zero-padded)."""
    padded = block
    if block.size != c:
        padded = np.zeros(c, dtype=block.dtype)
        padded[: block.size] = block
    return crc32c(padded.view(np.uint8).data)


def concat_reader(*parts) -> Callable[[int, int], np.ndarray]:
    """``read(a, b)`` over consecutive parts: ndarrays, or objects with ``len`` and
    ``read(a, b)`` (a :class:`MappedArray`, :class:`Head`)."""
    bounds = np.cumsum([0] + [len(p) for p in parts]).tolist()

    def read(a: int, b: int) -> np.ndarray:
        out = []
        for part, lo, hi in zip(parts, bounds[:-1], bounds[1:]):
            s, e = max(a, lo) - lo, min(b, hi) - lo
            if e > s:
                out.append(part[s:e] if isinstance(part, np.ndarray) else part.read(s, e))
        return out[0] if len(out) == 1 else np.concatenate(out)

    return read


class Head:
    """The first ``n`` elements of a :class:`MappedArray`, as a part for :func:`concat_reader`."""

    def __init__(self, arr: MappedArray, n: int):
        self.arr, self.n = arr, n

    def __len__(self) -> int:
        return self.n

    def read(self, a: int, b: int) -> np.ndarray:
        return self.arr.read(a, min(b, self.n))


def read_array_meta(path: Path, name: str, *, dir_fd: int | None = None) -> dict:
    """The ``zarr.json`` of array ``name`` in the group directory ``path`` (or of the array
    directory open as ``dir_fd``).  Not a regular file, a symlink out of the table, or
    larger than ``MAX_JSON_BYTES``: :class:`CorruptStoreError`, without blocking."""
    file = Path(path) / name / "zarr.json"
    try:
        fd = open_regular("zarr.json" if dir_fd is not None else file, dir_fd=dir_fd,
                          root=path, shown=file)
        try:
            meta = json.loads(read_small(fd, file).decode("utf-8"))
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise CorruptStoreError(f"{path}: the key index array {name!r} is missing",
                                path=path) from None
    except (CorruptStoreError, ResourceLimitError):
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptStoreError(f"{file}: unreadable array metadata ({exc})", path=path) from None
    if not isinstance(meta, dict):
        raise CorruptStoreError(f"{file}: expected a JSON object", path=path)
    return meta


def parse_array_meta(meta: dict, where: str, path) -> tuple[int, int, np.dtype, dict]:
    """``(length, chunk length, dtype, attributes)`` of a key index array's ``zarr.json``
    (uncompressed little-endian with a crc32c, chunk keys ``c/<i>``), else CorruptStoreError."""
    try:
        (n,) = meta["shape"]
        (chunk,) = meta["chunk_grid"]["configuration"]["chunk_shape"]
        dtype = np.dtype(meta["data_type"]).newbyteorder("<")
        codecs = [c["name"] for c in meta["codecs"]]
        enc = meta["chunk_key_encoding"]
        sep = enc.get("configuration", {}).get("separator", "/")
        attrs = meta.get("attributes", {})
        n, chunk = int(n), int(chunk)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptStoreError(f"{where}: unexpected array metadata ({exc!r})",
                                path=path) from None
    if (codecs != ["bytes", "crc32c"] or enc.get("name") != "default" or sep != "/"
            or meta["codecs"][0].get("configuration", {}).get("endian", "little") != "little"
            or n < 0 or chunk <= 0):
        raise CorruptStoreError(
            f"{where}: expected an uncompressed little-endian array with codecs "
            f"['bytes', 'crc32c'] and chunk keys 'c/<i>', got codecs {codecs} and "
            f"chunk key encoding {enc}", path=path)
    return n, chunk, dtype, attrs if isinstance(attrs, dict) else {}


def chunk_pins(attrs: dict, nchunks: int, where: Path | str, path) -> list[int] | None:
    """The crc32c each chunk file must end in (:data:`CHUNKS_ATTR`), or None for an array
    written before the attribute (its chunks' own crc32c only)."""
    if CHUNKS_ATTR not in attrs:
        return None
    pins = attrs[CHUNKS_ATTR]
    if not (isinstance(pins, list) and len(pins) == nchunks and
            all(type(x) is int and 0 <= x < 1 << 32 for x in pins)):
        raise CorruptStoreError(f"{where}/zarr.json: {CHUNKS_ATTR} must list the crc32c of "
                                f"each of its {nchunks} chunks, got {str(pins)[:80]}",
                                path=path)
    return pins


class MappedArray:
    """Read-only view of one of our 1-D arrays through memory maps of its chunk files.

    The metadata and every chunk are opened through one directory descriptor, so
    the view is of one version of the array even if a writer renames a new
    version into place meanwhile (the maps keep the old files alive).
    """

    def __init__(self, path: Path, name: str):
        self.dir = Path(path) / name
        self.root = Path(path)
        try:
            fd = os.open(self.dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                         | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise CorruptStoreError(f"{path}: the key index array {name!r} is missing",
                                    path=path) from None
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:
                raise resource_error(exc, self.dir) from None
            raise CorruptStoreError(f"{self.dir}: cannot open ({exc.strerror or exc})",
                                    path=path) from None
        try:
            self._init(path, name, read_array_meta(path, name, dir_fd=fd))
            for i in range(self.nchunks):
                self._maps[i], self._raws[i] = self._map_chunk(i, fd)
        finally:
            os.close(fd)

    def _init(self, path: Path, name: str, meta: dict) -> None:
        self.n, self.chunk, self.dtype, self.attrs = parse_array_meta(meta, f"{self.dir}", path)
        self.nchunks = -(-self.n // self.chunk) if self.n else 0
        self._maps: list[np.ndarray | None] = [None] * self.nchunks
        self._raws: list[np.ndarray | None] = [None] * self.nchunks
        self._ok = np.zeros(self.nchunks, dtype=bool)  # crc32c checked (once, on first use)
        self._fences: np.ndarray | None = None
        self._final = False
        self._pins = chunk_pins(self.attrs, self.nchunks, self.dir, path)

    def _map_chunk(self, i: int, dir_fd: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(valid elements, whole file as bytes)`` of chunk ``i``, from one open file."""
        valid = min(self.chunk, self.n - i * self.chunk)
        file = self.dir / "c" / str(i)
        want = self.chunk * self.dtype.itemsize + 4
        try:
            cfd = open_regular(f"c/{i}" if dir_fd is not None else file, dir_fd=dir_fd,
                               root=self.root, shown=file)
        except FileNotFoundError:
            raise CorruptStoreError(f"{file}: chunk file is missing", path=file) from None
        except (CorruptStoreError, ResourceLimitError):
            raise
        except OSError as exc:
            raise CorruptStoreError(f"{file}: cannot open ({exc.strerror or exc})",
                                    path=file) from None
        try:  # the map keeps no descriptor: 4 arrays of a key index cost none while open
            size = os.fstat(cfd).st_size
            if size != want:
                raise CorruptStoreError(
                    f"{file}: expected {want} bytes ({self.chunk} x {self.dtype} + crc32c), "
                    f"got {size}", path=file)
            raw = map_file(cfd, want, file)
        finally:
            os.close(cfd)
        return raw[: valid * self.dtype.itemsize].view(self.dtype), raw

    def __len__(self) -> int:
        return self.n

    def chunk_data(self, i: int, *, check: bool = True) -> np.ndarray:
        """Chunk ``i``'s valid elements (a read-only memory map); its crc32c is checked the
        first time it is used (``check=False``: not yet, for a peek such as a fence)."""
        m = self._maps[i]
        if m is None:  # only after close()
            if self._final:
                raise ClosedTableError(f"the table of {self.dir} is closed (open it again to "
                                       "use it)")
            m, self._raws[i] = self._map_chunk(i)
            self._maps[i] = m
        if check and not self._ok[i]:
            raw = self._raws[i]
            assert raw is not None
            body = memoryview(raw[:-4])  # type: ignore[arg-type]  # an ndarray is a buffer
            stored = int.from_bytes(bytes(raw[-4:]), "little")
            if crc32c(body) != stored:
                raise CorruptStoreError(f"{self.dir / 'c' / str(i)}: crc32c mismatch (the key "
                                        "index is damaged; run embstore verify)",
                                        path=self.dir)
            if self._pins is not None and self._pins[i] != stored:
                raise CorruptStoreError(
                    f"{self.dir / 'c' / str(i)}: ends in crc32c {stored:#010x}, its array's "
                    f"zarr.json records {self._pins[i]:#010x} (a chunk file of another array, "
                    "version or table in its place; run embstore verify)", path=self.dir)
            self._ok[i] = True
        return m

    def close(self, *, final: bool = False) -> None:
        """Drop the memory maps: they are made again if read later, unless ``final`` (the
        table was closed), after which reads raise ClosedTableError."""
        self._final = final
        self._maps = [None] * self.nchunks
        self._raws = [None] * self.nchunks
        self._fences = None

    def take(self, idx: np.ndarray) -> np.ndarray:
        """Elements at ``idx`` (int64, within ``0..n-1``)."""
        if self.nchunks == 1:
            return self.chunk_data(0)[idx]
        out = np.empty(idx.shape, dtype=self.dtype)
        if idx.size == 0:
            return out
        ci = idx // self.chunk
        for c in np.unique(ci).tolist():
            sel = ci == c
            out[sel] = self.chunk_data(c)[idx[sel] - c * self.chunk]
        return out

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements ``start..stop-1`` as a new array."""
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        first, last = start // self.chunk, (stop - 1) // self.chunk
        parts = [self.chunk_data(c)[max(start - c * self.chunk, 0): stop - c * self.chunk]
                 for c in range(first, last + 1)]
        return np.array(parts[0]) if len(parts) == 1 else np.concatenate(parts)

    def searchsorted(self, values: np.ndarray) -> np.ndarray:
        """Leftmost insertion points of ``values`` in this (sorted) array."""
        if self.nchunks <= 1:
            if self.n == 0:
                return np.zeros(values.shape, dtype=np.int64)
            return np.searchsorted(self.chunk_data(0), values, side="left").astype(np.int64)
        if self._fences is None:
            self._fences = np.array([self.chunk_data(c, check=False)[0]
                                     for c in range(self.nchunks)],
                                    dtype=self.dtype)
        fences = self._fences
        # the answer lies in the last chunk whose first element is < value (or at its end)
        ci = np.maximum(np.searchsorted(fences, values, side="left") - 1, 0)
        out = np.empty(values.shape, dtype=np.int64)
        for c in np.unique(ci).tolist():
            sel = ci == c
            out[sel] = np.searchsorted(self.chunk_data(c), values[sel], side="left") \
                + c * self.chunk
        return out

    def verify(self, group: zarr.Group, name: str) -> None:
        """Read every chunk through zarr-python, which checks its crc32c."""
        try:
            arr: zarr.Array = group[name]  # type: ignore[assignment]  # an array
        except Exception as exc:  # noqa: BLE001 - zarr refuses damaged metadata in many ways
            raise CorruptStoreError(f"{self.dir}: zarr cannot open the array "
                                    f"({type(exc).__name__}: {exc})", path=self.dir) from None
        for start in range(0, self.n, self.chunk):
            stop = min(self.n, start + self.chunk)
            try:
                data = arr[start:stop]
            except Exception as exc:  # noqa: BLE001 - each codec fails with its own type
                raise CorruptStoreError(f"{self.dir}: chunk {start // self.chunk}: {exc}",
                                        path=self.dir) from None
            if not np.array_equal(data, self.read(start, stop)):
                raise CorruptStoreError(f"{self.dir}: memory map disagrees with zarr",
                                        path=self.dir)


def stage_keys_array(path: Path, stage: Path, start: int,
                     keys_between: Callable[[int, int], list[str]],
                     keys: list[str]) -> list[tuple[str, str]]:
    """Write ``keys`` (the contract's string array) grown by ``keys`` from row ``start`` into
    ``stage``: its metadata with the new length, and its chunks from the one holding row
    ``start`` on (that chunk's keys before ``start`` from ``keys_between``; older chunks
    stay).  Returns ``(staged, live)`` file pairs, the chunks before ``zarr.json``."""
    import zarr

    meta = read_array_meta(path, "keys")
    (chunk,) = meta["chunk_grid"]["configuration"]["chunk_shape"]
    c0 = start // chunk * chunk
    tail = keys_between(c0, start)
    meta["shape"] = [start + len(keys)]
    (stage / "keys").mkdir(parents=True)
    with open(stage / "keys" / "zarr.json", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    if plain_keys_codecs(meta):  # embstore's own codecs: the chunks written directly
        chunks = write_keys_chunks(stage / "keys", chunk, c0 // chunk, tail + list(keys))
    else:
        arr = zarr.open_array(str(stage / "keys"), mode="r+",
                              config={"write_empty_chunks": True})
        arr[c0:start + len(keys)] = np.array(tail + list(keys), dtype=object)
        chunks = sorted(os.listdir(stage / "keys" / "c"), key=int) if (
            stage / "keys" / "c").is_dir() else []
    return [(f"keys/c/{c}", f"keys/c/{c}") for c in chunks] + [("keys/zarr.json",
                                                                "keys/zarr.json")]

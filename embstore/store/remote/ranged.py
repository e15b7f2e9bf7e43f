"""The key index read by byte ranges (a table on object storage), checked block by block.

The same :class:`~embstore.keys.index.DiskVocab` code runs over :class:`RangedArray` s
instead of memory maps: a lookup fetches only the blocks of ``key_hash``, ``key_order``,
``key_offsets`` and ``key_utf8`` it touches, never the whole key set.

A chunk file of the four arrays is one crc32c over up to 64 MiB, which a ranged read
cannot check.  So a table on object storage carries, for each chunk file ``<array>/c/<i>``,
a *block sidecar* object ``<array>/blocks/<i>`` (docs/FORMAT.md section 11): the
crc32c of every ``BLOCK``-byte block of the chunk file, and for ``key_hash`` the first
hash of every block (the fences that place a query in one block, so a search costs one
block, not a binary search by requests).  Every block is checked against its crc32c as
it arrives (or leaves the on-disk chunk cache); the sidecar has a crc32c of its own.

Binary layout of a sidecar (little-endian)::

    b"EMBKBLK1"  u32 block_bytes  u32 nblocks  u64 file_bytes  u32 fence_bytes (0 or 8)
    u32 0        nblocks x u32 crc32c   [nblocks x u64 fences]   u32 crc32c of all before

The reader (:class:`RangeReader`) is the store's business: the remote source implements it
over the object-store client (coalesced, concurrent ranged GETs, the on-disk cache).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import numpy as np
from ...fs.checksum import crc32c

from ...errors import CorruptStoreError
from ...keys.hashing import words_from_bytes
from ...keys.index import DiskVocab
from ...keys.mapped import chunk_pins, parse_array_meta
from ...keys.writer import INDEX_ARRAYS
from .pins import check_chunk_pins

__all__ = ["BLOCK", "RangeReader", "RangedArray", "RangedVocab", "block_sidecar",
           "sidecar_name", "is_sidecar"]

BLOCK = 1024  # bytes per checked block: a lookup of one key reads a few KiB
GAP_BYTES = 4 * BLOCK  # blocks closer than this share a request
MAX_REQUEST = 8 << 20
MEMORY_BYTES = 32 << 20  # fetched blocks kept per array (least recently used dropped)
_MAGIC = b"EMBKBLK1"
_HEAD = 32


def _mv(a: np.ndarray) -> memoryview:
    return memoryview(a)  # type: ignore[arg-type]  # an ndarray is a buffer


def sidecar_name(array: str, chunk: int) -> str:
    return f"{array}/blocks/{chunk}"  # inside the array's folder: not a Zarr node


def is_sidecar(rel: str) -> bool:
    """Whether the relative object name ``rel`` is a block sidecar."""
    parts = rel.split("/")
    return len(parts) == 3 and parts[0] in INDEX_ARRAYS and parts[1] == "blocks"


def block_sidecar(data, *, fences: bool, block: int = BLOCK) -> bytes:
    """The sidecar of one chunk file's bytes ``data`` (fences: its uint64 elements)."""
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    nblocks = -(-buf.size // block)
    crcs = np.array([crc32c(_mv(buf[k * block:(k + 1) * block])) for k in range(nblocks)],
                    dtype="<u4")  # a loop per block (write time only)
    parts = [_MAGIC, np.array([block, nblocks], "<u4").tobytes(),
             np.array([buf.size], "<u8").tobytes(),
             np.array([8 if fences else 0, 0], "<u4").tobytes(), crcs.tobytes()]
    if fences:
        data_end = (buf.size - 4) // 8 * 8  # elements, not the chunk's own crc32c
        at = np.arange(nblocks, dtype=np.int64) * block
        ok = at + 8 <= data_end
        f = np.zeros(nblocks, dtype="<u8")
        f[ok] = buf[:data_end].view("<u8")[at[ok] // 8]
        parts.append(f.tobytes())
    body = b"".join(parts)
    return body + crc32c(body).to_bytes(4, "little")


def _parse_sidecar(raw, file_bytes: int, fences: bool, where: str):
    """``(block, crcs, fences or None)`` of a sidecar, checked."""
    buf = bytes(raw)
    bad = len(buf) < _HEAD + 4 or buf[:8] != _MAGIC or crc32c(buf[:-4]) != int.from_bytes(
        buf[-4:], "little")
    if not bad:
        block, nblocks = np.frombuffer(buf, "<u4", 2, 8).tolist()
        size = int(np.frombuffer(buf, "<u8", 1, 16)[0])
        fb = int(np.frombuffer(buf, "<u4", 1, 24)[0])
        bad = (size != file_bytes or block <= 0 or block % 8 or nblocks != -(-size // block)
               or fb != (8 if fences else 0) or len(buf) != _HEAD + nblocks * (4 + fb) + 4)
    if bad:
        raise CorruptStoreError(f"{where}: block sidecar damaged or not of this chunk file "
                                f"({file_bytes} bytes)", path=where)
    crcs = np.frombuffer(buf, "<u4", nblocks, _HEAD)
    fence = np.frombuffer(buf, "<u8", nblocks, _HEAD + 4 * nblocks) if fences else None
    return block, crcs, fence


class RangeReader(Protocol):
    """Byte ranges of a table's objects (relative names such as ``key_hash/c/0``)."""

    def where(self, rel: str) -> str: ...

    def get_objects(self, rels: list[str]) -> list[bytes | None]: ...

    def get_ranges(self, requests: list[tuple[str, int, int]]) -> list: ...

    def cached(self, rel: str, name: str) -> bytes | None: ...

    def keep(self, rel: str, name: str, data) -> None: ...


class RangedArray:
    """A key index array read by checked blocks: ``take``, ``read``, ``searchsorted`` as
    :class:`~embstore.keys.mapped.MappedArray`."""

    def __init__(self, reader: RangeReader, name: str, meta: dict):
        self.reader, self.name = reader, name
        self.dir = reader.where(name)
        self.n, self.chunk, self.dtype, self.attrs = parse_array_meta(meta, self.dir, self.dir)
        self.nchunks = -(-self.n // self.chunk) if self.n else 0
        self.itemsize = self.dtype.itemsize
        self.file_bytes = self.chunk * self.itemsize + 4
        self._fenced = name == "key_hash"
        self._ahead = name == "key_offsets"  # a key's end is the next key's start
        self._side: dict[int, tuple] = {}
        self._block = 0
        self._lru: OrderedDict[int, np.ndarray] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        #: an array of the same grid whose blocks a search fetches too (key_order for key_hash)
        self.companion: RangedArray | None = None
        #: the crc32c each chunk file ends in, as the array's zarr.json records (None: an
        #: array written before the pins), checked before a chunk's sidecar is used
        self._pins = chunk_pins(self.attrs, self.nchunks, self.dir, self.dir)

    def prefetch(self, keys: np.ndarray) -> None:
        """Fetch blocks ``keys`` into memory, quietly (a later read raises what fails)."""
        try:
            self._sidecars(np.unique(keys // self._per_chunk).tolist() if self._block
                           else range(self.nchunks))
            self._blocks(keys)
        except Exception:  # noqa: BLE001 - the read that needs the blocks reports it
            pass

    def __len__(self) -> int:
        return self.n

    def close(self, *, final: bool = False) -> None:
        self._lru.clear()
        self._held = 0

    # -- blocks -------------------------------------------------------------------------------
    def _sidecars(self, chunks) -> None:
        todo = [c for c in chunks if c not in self._side]
        if not todo:
            return
        rels = [sidecar_name(self.name, c) for c in todo]
        sides: dict[int, tuple] = {}
        for c, rel, raw in zip(todo, rels, self.reader.get_objects(rels)):
            where = self.reader.where(rel)
            if raw is None:
                raise CorruptStoreError(f"{where}: the key index block sidecar is missing",
                                        path=where)
            side = _parse_sidecar(raw, self.file_bytes, self._fenced, where)
            if self._block and side[0] != self._block:
                raise CorruptStoreError(f"{where}: block size {side[0]}, expected "
                                        f"{self._block}", path=where)
            self._block = side[0]
            sides[c] = side
        check_chunk_pins(self.reader, self.name, self._pins, self.file_bytes, todo, self.dir)
        self._side.update(sides)  # (a chunk is usable once both its sidecar and pin hold)

    @property
    def _per_chunk(self) -> int:
        return -(-self.file_bytes // self._block)

    def _valid(self, c: int) -> int:
        return min(self.chunk, self.n - c * self.chunk)

    def _keys_of(self, idx: np.ndarray) -> np.ndarray:
        """Block keys (``chunk * blocks per chunk + block``) of elements ``idx``."""
        c = idx // self.chunk
        return c * self._per_chunk + (idx - c * self.chunk) * self.itemsize // self._block

    def _check(self, key: int, raw: np.ndarray) -> bool:
        c, k = divmod(key, self._per_chunk)
        return crc32c(_mv(raw)) == int(self._side[c][1][k])

    def _blocks(self, keys: np.ndarray) -> dict[int, np.ndarray]:
        """The raw bytes of blocks ``keys`` (sorted, unique): memory, disk cache, requests."""
        out: dict[int, np.ndarray] = {}
        missing = []
        with self._lock:
            for key in keys.tolist():  # a loop per block
                hit = self._lru.get(key)
                if hit is not None:
                    self._lru.move_to_end(key)
                    out[key] = hit
                else:
                    missing.append(key)
        todo = []
        for key in missing:
            c, k = divmod(key, self._per_chunk)
            raw = self.reader.cached(f"{self.name}/c/{c}", f"kb{self._block}-{k}")
            if raw is not None and self._check(key, np.frombuffer(raw, np.uint8)):
                out[key] = np.frombuffer(raw, np.uint8)
            else:
                todo.append(key)
        if todo:
            out.update(self._fetch(np.array(todo, dtype=np.int64)))
        with self._lock:
            for key in missing:
                if key in out and self._held < MEMORY_BYTES:
                    self._lru[key] = out[key]
                    self._held += out[key].size
            while self._held > MEMORY_BYTES and self._lru:
                self._held -= self._lru.popitem(last=False)[1].size
        return out

    def _fetch(self, keys: np.ndarray) -> dict[int, np.ndarray]:
        """Coalesced, concurrent ranged reads of blocks ``keys``, each checked."""
        B, per = self._block, self._per_chunk
        gap, cap = GAP_BYTES // B, max(1, MAX_REQUEST // B)
        cut = np.ones(keys.size, dtype=bool)
        cut[1:] = (keys[1:] // per != keys[:-1] // per) | (keys[1:] - keys[:-1] > gap + 1)
        starts = np.flatnonzero(cut).tolist() + [keys.size]
        runs = []
        for a, b in zip(starts[:-1], starts[1:]):  # a loop per request
            lo = int(keys[a])
            while lo <= int(keys[b - 1]):
                hi = min(int(keys[b - 1]), lo + cap - 1)
                runs.append((lo, hi))
                lo = hi + 1
        reqs = []
        for lo, hi in runs:
            c, k0 = divmod(lo, per)
            reqs.append((f"{self.name}/c/{c}", k0 * B, min(((hi % per) + 1) * B,
                                                         self.file_bytes)))
        out: dict[int, np.ndarray] = {}
        for (lo, hi), (rel, a, b), data in zip(runs, reqs, self.reader.get_ranges(reqs)):
            buf = np.frombuffer(data, dtype=np.uint8)
            if buf.size != b - a:
                raise CorruptStoreError(f"{self.reader.where(rel)}: got {buf.size} bytes for "
                                        f"range {a}-{b} (truncated?)", path=self.dir)
            for key in range(lo, hi + 1):  # a loop per block: its crc32c
                raw = buf[(key - lo) * B: (key - lo + 1) * B]
                if not self._check(key, raw):
                    s = a + (key - lo) * B
                    raise CorruptStoreError(
                        f"{self.reader.where(rel)}: bytes {s}..{s + raw.size - 1} fail their "
                        "crc32c (the key index is damaged; run embstore verify)",
                        path=self.dir)
                out[key] = raw
                self.reader.keep(rel, f"kb{B}-{key % per}", raw.tobytes())
        return out

    def _elements(self, keys: np.ndarray):
        """``(values, first element of each key's values, global index of that element)``
        for blocks ``keys`` (sorted, unique): their valid elements, back to back."""
        blocks = self._blocks(keys)
        per, E = self._per_chunk, self._block // self.itemsize
        parts, base, first, at = [], [], [], 0
        for key in keys.tolist():  # a loop per block
            c, k = divmod(key, per)
            lo = k * E
            m = max(0, min(E, self._valid(c) - lo))
            parts.append(blocks[key][: m * self.itemsize])
            base.append(at)
            first.append(c * self.chunk + lo)
            at += m
        values = np.concatenate(parts).view(self.dtype) if parts else np.empty(0, self.dtype)
        return values, np.array(base, np.int64), np.array(first, np.int64)

    # -- the MappedArray interface --------------------------------------------------------------
    def take(self, idx: np.ndarray) -> np.ndarray:
        """Elements at ``idx`` (int64, within ``0..n-1``); for ``key_offsets`` the block of
        ``idx + 1`` comes along (a key's end: no second round of requests)."""
        idx = np.asarray(idx, dtype=np.int64)
        flat = idx.reshape(-1)
        if flat.size == 0:
            return np.empty(idx.shape, dtype=self.dtype)
        self._sidecars(np.unique(flat // self.chunk).tolist())
        want = self._keys_of(flat)
        keys = np.unique(want)
        if self._ahead:
            ahead = np.minimum(flat + 1, self.n - 1)
            self._sidecars(np.unique(ahead // self.chunk).tolist())
            keys = np.unique(np.concatenate([want, self._keys_of(ahead)]))
        values, base, first = self._elements(keys)
        pos = np.searchsorted(keys, want)
        return values[base[pos] + flat - first[pos]].reshape(idx.shape)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements ``start..stop-1`` as a new array."""
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        self._sidecars(range(start // self.chunk, (stop - 1) // self.chunk + 1))
        lo, hi = self._keys_of(np.array([start, stop - 1], dtype=np.int64)).tolist()
        per = self._per_chunk
        keys = np.arange(lo, hi + 1, dtype=np.int64)
        keys = keys[(keys % per) * self._block < self.chunk * self.itemsize]
        values, base, first = self._elements(keys)
        return values[start - int(first[0]): stop - int(first[0])].copy()

    def searchsorted(self, values: np.ndarray) -> np.ndarray:
        """Leftmost insertion points of ``values`` (this array is sorted): the fences pick
        one block per value, then one search over the fetched blocks."""
        values = np.asarray(values)
        if self.n == 0 or values.size == 0:
            return np.zeros(values.shape, dtype=np.int64)
        self._sidecars(range(self.nchunks))
        per, E = self._per_chunk, self._block // self.itemsize
        fkeys, fences = [], []
        for c in range(self.nchunks):  # a loop per chunk
            nb = -(-self._valid(c) // E)
            fkeys.append(c * per + np.arange(nb, dtype=np.int64))
            fences.append(self._side[c][2][:nb])
        all_keys, all_fences = np.concatenate(fkeys), np.concatenate(fences)
        # block g: the last whose fence is <= the value (a value found in the table lies in
        # it); when the fence equals the value, equal hashes may start in the block before,
        # fetched too and searched from
        g = np.maximum(np.searchsorted(all_fences, values, side="right") - 1, 0)
        back = (g > 0) & (all_fences[g] == values)
        anchor = g - back
        keys, inv = np.unique(np.concatenate([all_keys[anchor], all_keys[g]]),
                              return_inverse=True)
        inv = inv[: values.size]
        helper = None
        if self.companion is not None:  # key_order's blocks at the same places, meanwhile
            helper = threading.Thread(target=self.companion.prefetch, args=(keys,),
                                      daemon=True)
            helper.start()
        try:
            vals, base, first = self._elements(keys)
        finally:
            if helper is not None:
                helper.join()
        pos = np.searchsorted(vals, values, side="left")
        return first[inv] + pos - base[inv]

    def verify(self, group=None, name: str | None = None) -> None:
        """Every chunk file read whole by ranges (memory: one request), its crc32c and
        every block's against the sidecar."""
        self._sidecars(range(self.nchunks))
        step = MAX_REQUEST // self._block * self._block
        for c in range(self.nchunks):  # a loop per chunk file, then per request
            rel, running = f"{self.name}/c/{c}", 0
            for a in range(0, self.file_bytes, step):
                b = min(self.file_bytes, a + step)
                (data,) = self.reader.get_ranges([(rel, a, b)])
                buf = np.frombuffer(data, np.uint8)
                first = c * self._per_chunk + a // self._block
                for j in range(0, buf.size, self._block):  # a loop per block
                    if not self._check(first + j // self._block, buf[j: j + self._block]):
                        raise CorruptStoreError(f"{self.reader.where(rel)}: bytes {a + j}.."
                                                f"{min(b, a + j + self._block) - 1} fail "
                                                "their crc32c", path=self.dir)
                body = buf[: max(0, min(b, self.file_bytes - 4) - a)]
                running = crc32c(_mv(body), running)
                if b == self.file_bytes and running != int.from_bytes(buf[-4:].tobytes(),
                                                                      "little"):
                    raise CorruptStoreError(f"{self.reader.where(rel)}: crc32c mismatch",
                                            path=self.dir)


class RangedVocab(DiskVocab):
    """The key index of a remote table: :class:`DiskVocab` over :class:`RangedArray` s."""

    def __init__(self, reader: RangeReader, metas: dict[str, dict], n: int, group=None):
        self._reader, self._metas = reader, metas
        self._group = group  # a zarr group over the object store (verify reads ``keys``)
        self.path = reader.where("")  # type: ignore[assignment]  # a URL, for messages
        self._n = n
        self._settle = None
        self._map_once()

    def _array(self, name: str) -> RangedArray:  # type: ignore[override]
        arr = RangedArray(self._reader, name, self._metas[name])
        if name == "key_order":  # opened after key_hash (DiskVocab._map_once)
            hashes = getattr(self, "_pending_hash", None)
            if hashes is not None and (hashes.n, hashes.chunk) == (arr.n, arr.chunk):
                hashes.companion = arr
        elif name == "key_hash":
            self._pending_hash = arr
        return arr

    def _word_reader(self, utf8) -> Callable:
        return words_from_bytes(utf8.take, len(utf8))

    @staticmethod
    def arrays() -> tuple[str, ...]:
        return ("keys", *INDEX_ARRAYS)

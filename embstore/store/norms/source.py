"""The stored row norms of a table (``norms``, docs/FORMAT.md §3d) at read and write time.

- :class:`NormsSource` wraps the row source of a table that has ``norms``: reads go to the
  rows; ``write``/``append`` also rewrite the norms of the changed rows *in the same
  transaction* (so the journal moves norms and vectors together: all or nothing);
- :func:`store_norms` adds (or rebuilds) the ``norms`` of a table written without them
  (older tables, other Zarr tools): one transaction under the writer lock;
- :func:`check_norms` (for ``verify``) recomputes every norm and compares.

Tables without ``norms`` still search: their norms are computed on the fly per block.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..._types import PathLike
from ...errors import CorruptStoreError, FormatError
from ..codecs import Layout
from ..versions.commit import Transaction, recover
from ..lock import writer_lock
from ..meta import read_json, read_table_meta
from .calc import NORMS_ARRAY, norms_dtype, norms_layout, row_norms, stored_rows
from ..shard.write import RowStream
from ..base import RowSource
from ..rows.layout import RowLayout, choose_chunk_rows, crc_array
from ..rows.stream import PagedStream, create_paged_array
from ..rows.source import PagedSource
from ..source import ShardSource, keeps_versions, open_source, same_array
from ..versions.delta import Overlays
from ..versions.snapshot import newest, read_manifest, snapshot_root
from ..meta import set_rows

__all__ = ["NormsSource", "attach_norms", "store_norms", "check_norms", "has_norms",
           "norms_in_one_pass", "compare_norms"]

_BLOCK_BYTES = 32 << 20  # rows read at a time when norms are computed from the table


class NormsSource(RowSource):
    """The rows of ``rows`` and their stored norms (``norms``: a ``(V, 1)`` source)."""

    def __init__(self, rows: RowSource, norms: RowSource):
        self.rows, self.norms = rows, norms
        self.cheap_reads = rows.cheap_reads

    def __getattr__(self, name: str):
        """Anything else is the rows' (``reader`` of a shard source, ...): the wrapper stays
        transparent to code written against the rows' source."""
        if name in ("rows", "norms"):
            raise AttributeError(name)
        return getattr(self.rows, name)

    shape = property(lambda self: self.rows.shape)
    layout = property(lambda self: self.rows.layout)
    dtype = property(lambda self: self.rows.dtype)
    storage_dtype = property(lambda self: self.rows.storage_dtype)

    def raw(self, ids):
        return self.rows.raw(ids)

    def reads_cold(self) -> bool:
        return self.rows.reads_cold()

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        self.rows.gather(ids, out)

    def take(self, ids: np.ndarray) -> np.ndarray:
        return self.rows.take(ids)

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.rows.read(start, stop)

    def row_norms(self, start: int, stop: int) -> np.ndarray:
        """Stored norms of rows ``start..stop-1`` (1-D)."""
        return self.norms.read(start, stop)[:, 0]

    def _norms_of(self, values: np.ndarray) -> np.ndarray:
        return row_norms(stored_rows(self.storage_dtype, values), self.norms.dtype)

    def write(self, ids: np.ndarray, values: np.ndarray, txn: Transaction) -> None:
        self.norms.write(ids, self._norms_of(values), txn)
        self.rows.write(ids, values, txn)

    def append(self, values: np.ndarray, txn: Transaction) -> None:
        self.norms.append(self._norms_of(values), txn)
        self.rows.append(values, txn)

    def publish_rows(self, rows: int, txn: Transaction) -> None:
        self.norms.publish_rows(rows, txn)  # readers take the row count from vectors: last
        self.rows.publish_rows(rows, txn)

    def refresh(self) -> None:
        self.norms.refresh()
        self.rows.refresh()

    def close(self) -> None:
        self.norms.close()
        self.rows.close()


def _norms_meta(root: Path) -> dict | None:
    where = root / NORMS_ARRAY / "zarr.json"
    if not where.is_file():
        return None
    return read_json(where, f"{NORMS_ARRAY}/zarr.json", root=root)


#: norms past the table's rows that are tolerated (left by a write that dropped rows)
EXTRA_NORMS = 1 << 20


def has_norms(root: PathLike) -> bool:
    return (Path(os.fspath(root)) / NORMS_ARRAY / "zarr.json").is_file()


def _mismatch(root: Path, rows: RowSource) -> tuple[str, Layout | RowLayout | None]:
    """Why the ``norms`` of the table at ``root`` cannot serve ``rows`` ("" if they can),
    and their layout: a format-2 row array (with ``norms_page_crc``) or format 1's shards."""
    try:
        meta = _norms_meta(root)
    except (CorruptStoreError, FormatError) as exc:
        return str(exc), None
    if meta is None:
        return "", None
    paged = RowLayout.from_metadata(meta)
    if paged is not None and not (root / crc_array(NORMS_ARRAY) / "zarr.json").is_file():
        # a row array is checksummed by its page checksums: without them, damage (never
        # read unchecked as a layout without checksums, never silently set aside)
        raise CorruptStoreError(
            f"{root / crc_array(NORMS_ARRAY)}/zarr.json: missing; {NORMS_ARRAY} is a row array, "
            f"whose page checksums live there (store the norms again: store_norms)",
            path=str(root / crc_array(NORMS_ARRAY)))
    layout: Layout | RowLayout | None = paged if paged is not None else \
        Layout.from_metadata(meta)
    want = norms_dtype(rows.storage_dtype)
    n = rows.shape[0]
    if layout is None or layout.dim != 1 or layout.dtype != want or \
            not n <= layout.rows <= n + EXTRA_NORMS:  # (2**40 norms: a hostile size)
        return (f"{root / NORMS_ARRAY}/zarr.json: expected {want.name} of shape [>= "
                f"{n}, 1] (at most {n + EXTRA_NORMS} rows) in one of embstore's layouts (one "
                f"norm per row), got "
                f"{meta.get('data_type')} {meta.get('shape')}; store them again "
                "(store_norms)"), None
    return "", layout


def _format1_norms(root: Path) -> Layout | None:
    """The layout of ``norms`` at ``root`` when they are format 1's shards (None: none there,
    or a format-2 row array)."""
    meta = _norms_meta(root)
    return None if meta is None else Layout.from_metadata(meta)


def _paged_norms_rows(root: Path, rows: int, dt: np.dtype) -> int:
    """Chunk rows for new format-2 norms: those of the norms there (their chunk files are
    replaced one for one: rows only grow), else about 64 MiB or fitted to ``rows``."""
    meta = _norms_meta(root)
    old = None if meta is None else RowLayout.from_metadata(meta)
    return old.chunk_rows if old is not None else choose_chunk_rows(dt.itemsize, rows)


def _norms_source(root: Path, layout: Layout | RowLayout) -> RowSource:
    if isinstance(layout, RowLayout):
        return PagedSource(root, layout, NORMS_ARRAY, crc_array(NORMS_ARRAY))
    return ShardSource(root, layout, NORMS_ARRAY)


def _newest(root: Path):
    """The directory the newest version of the table at ``root`` is read from (``root``
    itself for a table without versions) and the hook that puts its deltas on top."""
    n = newest(root)
    if n is None:
        return root, same_array
    here = snapshot_root(root, n)
    return here, Overlays(here, read_manifest(here), writable=False).wrap


def attach_norms(root: Path, rows: RowSource,
                 wrap: Callable[[str, RowSource], RowSource] = same_array) -> RowSource:
    """``rows`` with their stored norms when the table at ``root`` has a usable ``norms``
    array.  Norms that do not fit the rows (another tool appended rows) are left aside:
    they only save work, searches compute norms instead, and ``verify`` reports them."""
    why, layout = _mismatch(root, rows)
    if layout is None:
        return rows
    return NormsSource(rows, wrap(NORMS_ARRAY, _norms_source(root, layout)))


def _table_blocks(source: RowSource):
    """``(start, rows)`` of the whole table, about ``_BLOCK_BYTES`` at a time."""
    n, dim = source.shape
    step = max(1, _BLOCK_BYTES // max(1, dim * source.dtype.itemsize))
    for a in range(0, n, step):  # a loop per block
        yield a, source.read(a, min(n, a + step))


def store_norms(path: PathLike, *, lock_timeout: float | None = None) -> int:
    """Compute the norms of every row of the table at ``path`` and store them (``norms``),
    replacing any there: one transaction under the writer lock.  Returns the row count."""
    import zarr
    from zarr.codecs import BytesCodec, Crc32cCodec

    root = Path(os.fspath(path)).absolute()
    with writer_lock(root, lock_timeout):
        recover(root)
        here, wrap = _newest(root)  # format 2: the newest version's rows, deltas on top
        _, meta = read_table_meta(here)
        source = open_source(here, meta, "r", wrap)
        txn = Transaction(root, versioned=keeps_versions(source))
        txn.change = {"kind": "norms"}
        try:
            rows, _ = source.shape
            layout = source.layout
            dt = norms_dtype(source.storage_dtype)
            stream: RowStream | PagedStream
            if layout.get("format") == 2 and _format1_norms(here) is None:
                tree = txn.tree("norms-v2")  # rows at a fixed stride, page checksums (V2)
                stream = create_paged_array(
                    zarr.open_group(str(tree), mode="a", use_consolidated=False), str(tree),
                    NORMS_ARRAY, dt, dt, 1, _paged_norms_rows(here, rows, dt), None, ("row", "norm"))
                names = [NORMS_ARRAY, crc_array(NORMS_ARRAY)]
            else:
                cr = layout["chunk_rows"] or 1
                ncr, nsr = norms_layout(layout["shard_rows"] or cr, cr)
                tree = txn.tree("norms-v1")
                arr = zarr.create_array(
                    str(tree / NORMS_ARRAY), shape=(0, 1), dtype=dt, chunks=(ncr, 1),
                    shards=(nsr, 1), serializer=BytesCodec(endian="little"),
                    compressors=[Crc32cCodec()], fill_value=0, dimension_names=("row", "norm"))
                nlayout = Layout.from_metadata(arr.metadata.to_dict())
                assert nlayout is not None
                stream = RowStream(str(tree / NORMS_ARRAY), nlayout, None)
                names = [NORMS_ARRAY]
            for _, block in _table_blocks(source):
                stream.add(row_norms(block, dt))
            stream.add(np.empty((0, 1), dt), final=True)
            set_rows(str(tree), rows, NORMS_ARRAY)
            if len(names) > 1:
                set_rows(str(tree), -(-rows // stream.layout.chunk_rows), names[1])
            for name in names:  # a loop per array
                files = sorted(p for p in (tree / name).rglob("*") if p.is_file())
                for p in sorted(files, key=lambda p: p.name == "zarr.json"):  # zarr.json last
                    txn.adopt(p, f"{name}/{p.relative_to(tree / name).as_posix()}")
            txn.commit()
        finally:
            txn.abort()
            source.close()
    return rows


def check_norms(root: Path, damage) -> int:
    """Recompute the norm of every row of the table at ``root`` and compare with the stored
    ones; ``damage(file, message)`` for each block with a wrong norm.  Returns rows checked
    (0 when the table has no ``norms``)."""
    here, wrap = _newest(root)  # format 2: the newest version as its readers read it
    if _norms_meta(here) is None:
        return 0
    _, meta = read_table_meta(here)
    rows_source = open_source(here, meta, "r", wrap)
    try:
        source = attach_norms(here, rows_source, wrap)
    except CorruptStoreError as exc:
        rows_source.close()
        damage(str(exc.path), str(exc))
        return 0
    try:
        if not isinstance(source, NormsSource):
            damage(str(root / NORMS_ARRAY), _mismatch(here, source)[0])
            return 0
        dt = source.norms.dtype
        for a, block in _table_blocks(source.rows):
            compare_norms(root, a, block, source.row_norms(a, a + block.shape[0]), dt, damage)
        return int(source.shape[0])
    finally:
        source.close()


def compare_norms(root: Path, a: int, block: np.ndarray, stored: np.ndarray, dt, damage) -> None:
    """``damage(file, message)`` if the stored norms ``stored`` of rows ``a..`` (``block``,
    as stored) are not their rows' norms."""
    tol = 8 * np.finfo(dt).eps  # the sum's order may differ by a few units
    want = row_norms(block, dt)[:, 0].astype(np.float64)  # past float32 max: inf
    got = stored.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf: equal, caught by ==
        near = np.abs(got - want) <= tol * np.maximum(want, np.finfo(dt).tiny)
    bad = ~((got == want) | near)  # NaN is never right
    if bad.any():
        i = int(np.argmax(bad))
        damage(str(root / NORMS_ARRAY),
               f"{root / NORMS_ARRAY}: row {a + i} has stored norm "
               f"{float(got[i])!r}, its row's norm is {float(want[i])!r} "
               f"({int(bad.sum())} wrong in rows {a}..{a + block.shape[0] - 1})")


_WINDOW = 1 << 18  # rows of stored norms verify reads at a time (1 MiB of float32)


def norms_in_one_pass(root: Path, rows: RowSource, damage):
    """For ``verify`` of a format-2 table of float rows whose newest version has no deltas:
    ``on_rows(start, block)``, comparing the stored norms of each block of rows as it is
    read for its page checks (one read of the rows for both), or None (no usable norms,
    deltas, compact codes: ``check_norms`` then)."""
    n = newest(root)
    if (n is not None and read_manifest(snapshot_root(root, n))["deltas"]) or \
            rows.storage_dtype not in ("float16", "float32", "float64"):
        return None
    why, layout = _mismatch(root, rows)
    if layout is None or why:
        return None
    norms = _norms_source(root, layout)
    dt = norms.dtype
    total = int(norms.shape[0])
    windows: dict[int, np.ndarray | None] = {}  # stored norms read _WINDOW rows at a time
    lock = threading.Lock()

    def stored_of(a: int, b: int) -> np.ndarray | None:
        w = a // _WINDOW
        if b > (w + 1) * _WINDOW:  # (a block across two windows: read as it is)
            return norms.read(a, b)[:, 0]
        if w not in windows:
            try:  # one read a window (its pages asked for at once): no fault per page, cold
                got = norms.read(w * _WINDOW, min(total, (w + 1) * _WINDOW))[:, 0]
            except CorruptStoreError:
                got = None  # the norms' own damage: verify's check of the array reports it
            with lock:
                windows[w] = got
                for old in [x for x in windows if x < w - 4]:
                    del windows[old]
        got = windows.get(w)
        return None if got is None else got[a - w * _WINDOW: b - w * _WINDOW]

    def on_rows(a: int, block: np.ndarray) -> None:
        try:
            stored = stored_of(a, a + block.shape[0])
        except CorruptStoreError:
            return  # the norms' own damage: verify's check of the array reports it
        if stored is not None:
            compare_norms(root, a, block, stored, dt, damage)
    return on_rows

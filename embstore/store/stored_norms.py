"""The norms of a whole table: stored (:func:`store_norms`: added or rebuilt for a table
written without them, one transaction under the writer lock) and checked (for ``verify``:
:func:`check_norms` recomputes every norm from its row; :func:`norms_in_one_pass` compares
them as the rows are read for their page checks).  The norms as rows are read and written:
:mod:`embstore.store.norms.source`."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from .._types import PathLike
from ..errors import CorruptStoreError
from .base import RowSource
from .place.lock import writer_lock
from .meta import read_table_meta, set_rows
from .codecs import Layout
from .norms.calc import NORMS_ARRAY, norms_layout
from .rows.norms import norms_dtype, row_norms
from .norms.source import NormsSource, attach_norms, mismatch as _mismatch
from .norms.source import format1_norms as _format1_norms, norms_meta as _norms_meta
from .norms.source import norms_source as _norms_source
from .rows.layout import RowLayout, choose_chunk_rows, crc_array
from .rows.stream import PagedStream, create_paged_array
from .shard.write import RowStream
from .source import keeps_versions, open_source, same_array
from .versions.commit import Transaction, recover
from .versions.delta import Overlays
from .versions.snapshot import MANIFEST, newest, read_manifest, snapshot_root

__all__ = ["store_norms", "check_norms", "norms_in_one_pass", "compare_norms"]

_BLOCK_BYTES = 32 << 20  # rows read at a time when norms are computed from the table


def _paged_norms_rows(root: Path, rows: int, dt: np.dtype) -> int:
    """Chunk rows for new format-2 norms: those of the norms there (their chunk files are
    replaced one for one: rows only grow), else about 64 MiB or fitted to ``rows``."""
    meta = _norms_meta(root)
    old = None if meta is None else RowLayout.from_metadata(meta)
    return old.chunk_rows if old is not None else choose_chunk_rows(dt.itemsize, rows)


def _newest(root: Path):
    """The directory the newest version of the table at ``root`` is read from (``root``
    itself for a table without versions) and the hook that puts its deltas on top."""
    here = _snapshot(root)
    if here is None:
        return root, same_array
    return here, Overlays(here, read_manifest(here), writable=False).wrap


def _snapshot(root: Path) -> Path | None:
    """The snapshot directory the table at ``root`` is read from: its newest version's, or
    ``root`` itself when it is a version's (verify checks older versions as tables)."""
    if (Path(root) / MANIFEST).is_file():
        return Path(root)
    n = newest(root)
    return None if n is None else snapshot_root(root, n)


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
    snap = _snapshot(root)
    if (snap is not None and read_manifest(snap)["deltas"]) or \
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

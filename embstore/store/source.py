"""Where rows leave (and enter) the store: the row-source interface of :class:`ZarrTable`.

A :class:`~embstore.store.base.RowSource` reads and writes the ``vectors`` array of one
table.  There is one source per array layout, each over a place
(:mod:`embstore.store.place`: a local directory or object storage):

- :class:`~embstore.store.rows.source.PagedSource`: rows at a fixed stride, a crc32c per
  page;
- :class:`ShardSource`: sharded chunks with a codec and a crc32c per chunk, read through
  their indexes (memory-mapped gathers where the place maps its files, ranged reads
  elsewhere) and rewritten copy-on-write;
- :class:`ZarrSource`, any other Zarr v3 layout (other codecs, no sharding) of a local
  table, read and written by zarr-python.

:class:`CodedSource` wraps the source of the stored codes (and of a side array such as
int8's ``row_scale``) of a compact storage dtype and decodes rows through the dtype's
record (:mod:`embstore.dtypes`) as they leave the store, so :class:`ZarrTable` and its row
cache only ever see float rows.

Ids given to a source are validated 1-D int64 arrays; rows are ``(n, dim)`` arrays of the
table's dtype.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import CorruptStoreError, FormatError, ReadOnlyError, ShapeMismatchError
from .codecs import Layout
from .meta import check_vectors_meta, set_rows
from ..dtypes import DTYPES, StorageDtype
from .base import LayoutSource, RowSource
from .place.base import Place
from .place.local import LocalDir
from .base import Transaction
from .rows.layout import RowLayout, crc_array
from .rows.source import PagedSource
from .shard.ranged import RangedShards
from .shard.read import ShardReader
from .shard.write import rewrite_shard

__all__ = ["ShardSource", "ZarrSource", "CodedSource",
           "check_side_meta", "open_source", "keeps_versions"]


class ShardSource(LayoutSource):
    """A sharded array (``name``, default ``vectors``) of the table at ``place``: shard
    files mapped where the place maps its files (:mod:`embstore.store.shard.read`), else
    chunks read by ranges (:mod:`embstore.store.shard.ranged`)."""

    def __init__(self, place: Place, layout: Layout, name: str = "vectors"):
        self.place, self.name = place, name
        self.fast_path = place.maps_files
        if place.maps_files:
            self.root = Path(place.url)
            self.reader = ShardReader(place.path(name), layout)
            self.cheap_reads = layout.compression == "none"
        else:
            self.ranged = RangedShards(place, layout, name)

    @property
    def _layout(self) -> Layout:
        return self.reader.layout if self.fast_path else self.ranged.layout

    @property
    def layout(self) -> dict:
        return {**super().layout, "checksummed": self._layout.has_crc}

    def reads_cold(self) -> bool:
        return self.fast_path and self.reader.cold_hint

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        if self.fast_path:
            self.reader.gather(ids, out)
        else:
            self.ranged.gather(ids, out)

    def take(self, ids: np.ndarray) -> np.ndarray:
        if self.fast_path:
            return self.reader.take(ids)
        return super().take(ids)

    def pin_shards(self, pins: dict[int, int]) -> None:
        """Check each shard ``k`` in ``pins`` against the tag crc32c given (the manifest of
        the version whose files this source reads pins it, docs/FORMAT.md §3b) before any
        of its rows is read.  Called once, at open: the pins and the files they pin come
        from one snapshot."""
        if self.fast_path:
            self.reader.pins = dict(pins)

    def _rewrite(self, txn: Transaction, k: int, local, values, valid_rows: int) -> None:
        L = self._layout
        dest = txn.file("/".join([self.name, *L.shard_key(k).split(L.separator)]))
        rewrite_shard(self.reader, k, local, values, valid_rows, dest)

    def _local(self) -> None:
        if not self.fast_path:
            raise ReadOnlyError(f"{self.place.url}: tables on object storage are read-only "
                                "(write a local table and upload it with embstore.copy)")

    def write(self, ids: np.ndarray, values: np.ndarray, txn: Transaction) -> None:
        self._local()
        L = self._layout
        sr = L.shard_rows
        sh = ids // sr
        cuts = np.flatnonzero(sh[1:] != sh[:-1]) + 1
        starts = np.r_[0, cuts].tolist()
        for a, b in zip(starts, np.r_[cuts, ids.size].tolist()):  # per shard
            k = int(sh[a])
            self._rewrite(txn, k, ids[a:b] - k * sr, values[a:b], min(sr, L.rows - k * sr))
        touched: list[int] = sh[starts].tolist()
        txn.after(lambda: self.reader.forget(touched))

    def append(self, values: np.ndarray, txn: Transaction) -> None:
        self._local()
        L = self._layout
        sr = L.shard_rows
        n0 = L.rows
        n1 = n0 + values.shape[0]
        ks = range(n0 // sr, (n1 - 1) // sr + 1)
        for k in ks:  # a loop per shard
            a, b = max(n0, k * sr), min(n1, (k + 1) * sr)
            self._rewrite(txn, k, np.arange(a, b) - k * sr, values[a - n0: b - n0], b - k * sr)
        txn.after(lambda: self.reader.forget(ks))

    def publish_rows(self, rows: int, txn: Transaction) -> None:
        self._local()
        set_rows(str(self.root), rows, self.name, txn)

        def publish():
            self.reader.layout = replace(self._layout, rows=rows)
        txn.after(publish)

    def refresh(self) -> None:
        (self.reader if self.fast_path else self.ranged).forget()

    def close(self) -> None:
        (self.reader if self.fast_path else self.ranged).forget()  # (unmaps once no thread
        # is reading)


class ZarrSource(RowSource):
    """Any other Zarr v3 layout of ``vectors``, through zarr-python (which writes chunks in
    place: such a table has no versions)."""

    writes_in_place = True

    def __init__(self, root: Path, mode: str, name: str = "vectors"):
        import zarr

        try:
            self.array = zarr.open_array(str(root / name), mode=mode)
        except Exception as exc:  # noqa: BLE001 - zarr refuses bad metadata in many ways
            raise CorruptStoreError(f"{root / name}: zarr cannot open the array "
                                    f"({type(exc).__name__}: {exc})", path=str(root)) from None
        if self.array.ndim != 2:
            raise FormatError(f"{name} must be 2-D, got shape {self.array.shape}",
                              path=str(root))
        self.root, self.name = root, name

    @property
    def shape(self) -> tuple[int, int]:
        rows, dim = (int(s) for s in self.array.shape)
        return rows, dim

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    @property
    def layout(self) -> dict:
        shards = getattr(self.array, "shards", None)
        return {"chunk_rows": int(self.array.chunks[0]),
                "shard_rows": int(shards[0]) if shards else None, "compression": None,
                "fast_path": False}

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        uniq, inv = np.unique(ids, return_inverse=True)
        try:
            rows = self.array.get_orthogonal_selection((uniq, slice(None)))
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - each codec fails with its own type
            raise CorruptStoreError(f"{self.root}/{self.name}: cannot read rows ({exc})",
                                    path=str(self.root)) from None
        out[:] = np.asarray(rows)[inv]

    # Layouts of other tools are written in place by zarr-python: under the writer lock,
    # but not all-or-nothing (docs/FORMAT.md).
    def write(self, ids: np.ndarray, values: np.ndarray, txn: Transaction) -> None:
        """Rows ``ids`` (distinct, ascending) set.  zarr-python 3.1 refuses an orthogonal
        selection of two rows in one inner chunk of a sharded array (``ValueError: shape
        mismatch``, zarr-python #2834): there each touched inner chunk's rows are read,
        patched and written back as one slice (a loop per chunk)."""
        if getattr(self.array, "shards", None) is None:  # (zarr < 3.1 has no shards)
            self.array.set_orthogonal_selection((ids, slice(None)), values)
            return
        cr, rows = int(self.array.chunks[0]), int(self.shape[0])
        ks = ids // cr
        cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, ids.size].tolist()):  # per chunk
            lo = int(ks[a]) * cr
            hi = min(rows, lo + cr)
            block = np.array(self.array[lo:hi])
            block[ids[a:b] - lo] = values[a:b]
            self.array[lo:hi] = block

    def append(self, values: np.ndarray, txn: Transaction) -> None:
        n0, dim = self.shape
        n1 = n0 + values.shape[0]
        self.array.resize((n1, dim))
        self.array[n0:n1] = values

    def publish_rows(self, rows: int, txn: Transaction) -> None:
        pass  # zarr-python wrote the new shape with the rows


class CodedSource(RowSource):
    """Rows of a compact storage dtype (``record``): codes from ``inner`` (and per-row values
    from ``side``, the record's side array), decoded to float32 on the way out and encoded
    by the record on the way in."""

    def __init__(self, inner: RowSource, record: StorageDtype, side: RowSource | None = None):
        self.inner = inner
        self.record = record
        self.side = side
        self.cheap_reads = inner.cheap_reads

    shape = property(lambda self: self.inner.shape)
    layout = property(lambda self: self.inner.layout)
    dtype = property(lambda self: self.record.logical)
    storage_dtype = property(lambda self: self.record.name)

    def reads_cold(self) -> bool:
        return self.inner.reads_cold()

    def _side(self, ids: np.ndarray) -> np.ndarray | None:
        return None if self.side is None else self.side.take(ids)

    def gather(self, ids: np.ndarray, out: np.ndarray) -> None:
        side = self._side(ids)
        self.record.decode(self.inner.take(ids), side, out)

    def raw(self, ids: np.ndarray):
        side = self._side(ids)
        return self.record.raw(self.inner.take(ids), side)

    def _encode(self, values: np.ndarray, rows: np.ndarray, what: str):
        """``(codes, side rows)`` of ``values`` (finite: checked by the table), the rows
        ``rows`` of the table; a row whose codes are not finite (bfloat16: a value past its
        range rounds to infinity) is refused, naming the rows, before anything is written
        (docs/FORMAT.md §3c; as on object storage)."""
        codes, side = self.record.encode(values)
        ok = self.record.finite(codes)
        if ok is not None and not ok.all():
            bad = rows[np.flatnonzero(~ok)]
            shown = ", ".join(str(int(r)) for r in bad[:8]) + (", ..." if bad.size > 8 else "")
            err = ShapeMismatchError(
                f"{what}: row{'s' if bad.size > 1 else ''} {shown} ({bad.size} in all) "
                f"hold{'' if bad.size > 1 else 's'} values past the range of "
                f"{self.record.name} (it rounds to infinity): nothing was written")
            err.rows = bad  # type: ignore[attr-defined]
            raise err
        return codes, side

    def write(self, ids: np.ndarray, values: np.ndarray, txn: Transaction) -> None:
        codes, side = self._encode(values, ids, "write")
        if self.side is not None:
            assert side is not None  # a record with a side array encodes its rows too
            self.side.write(ids, side, txn)
        self.inner.write(ids, codes, txn)

    def append(self, values: np.ndarray, txn: Transaction) -> None:
        n0 = self.inner.shape[0]
        codes, side = self._encode(values, np.arange(n0, n0 + values.shape[0]), "append")
        if self.side is not None:
            assert side is not None
            self.side.append(side, txn)
        self.inner.append(codes, txn)

    def publish_rows(self, rows: int, txn: Transaction) -> None:
        if self.side is not None:  # readers take the row count from vectors: last
            self.side.publish_rows(rows, txn)
        self.inner.publish_rows(rows, txn)

    def refresh(self) -> None:
        if self.side is not None:
            self.side.refresh()
        self.inner.refresh()

    def close(self) -> None:
        if self.side is not None:
            self.side.close()
        self.inner.close()


def check_side_meta(record: StorageDtype, side_meta: dict, meta: dict, where, path: str) -> None:
    """Refuse a side array (``record.side``, metadata ``side_meta``) that does not fit the
    ``vectors`` array of metadata ``meta``."""
    side = record.side
    assert side is not None
    check_vectors_meta(side_meta, where)
    if side_meta["data_type"] != side.dtype or side_meta["shape"][1] != side.columns or \
            side_meta["shape"][0] < meta["shape"][0]:
        raise CorruptStoreError(
            f"{where}: expected {side.dtype} of shape [>= {meta['shape'][0]}, {side.columns}] "
            f"({side.meaning}), got {side_meta['data_type']} {side_meta['shape']}", path=path)


def _open_array(place: Place, meta: dict, mode: str, name: str, checked: bool) -> RowSource:
    """The source of the layout of the array (``meta``) embstore knows, else zarr-python's
    (local tables only).  ``checked`` (the group says format 2): the array is one of
    embstore's layouts with its checksums, or damage (a missing ``page_crc`` never means
    "read unchecked")."""
    rows = RowLayout.from_metadata(meta)
    crc = crc_array(name)
    root = place.url
    there = place.present(f"{crc}/zarr.json")  # (None: a request to know; format 2 says)
    if rows is not None and (there or (there is None and checked)):  # rows at a fixed stride
        return PagedSource(place, rows, name, crc)
    layout = Layout.from_metadata(meta)
    if checked and (layout is None or not (layout.has_crc and layout.index_crc)):
        what = (f"{crc}/zarr.json: missing (the page checksums of {name})" if rows is not None
                else f"{name}/zarr.json: not a checksummed layout (a crc32c per chunk and "
                "per shard index)")
        raise CorruptStoreError(f"{root}/{what}: the table says format 2, whose every row "
                                "array is checksummed; the store is damaged", path=str(root))
    if layout is None and not place.maps_files:
        raise FormatError(f"{name} is not stored in a layout of embstore's (rows at a fixed "
                          "stride, or crc32c-checked chunks in shards), which reads from "
                          "object storage need; copy the table to a local folder to read it",
                          path=root)
    if layout is None:
        return ZarrSource(Path(root), mode, name)
    return ShardSource(place, layout, name)


def keeps_versions(src: RowSource) -> bool:
    """Whether commits through ``src`` can make versions: no row array under it (the rows,
    a side array, the norms) is written in place."""
    todo, seen = [src], 0
    while todo and seen < 64:  # a loop per wrapped source (a few)
        obj, seen = todo.pop(), seen + 1
        if obj.writes_in_place:
            return False
        todo.extend(v for v in vars(obj).values() if isinstance(v, RowSource))
    return True


def same_array(name: str, src: RowSource) -> RowSource:
    """The ``wrap`` hook of a table read as it is (no deltas on top)."""
    return src


def open_source(where: Place | Path, meta: dict, mode: str,
                wrap: Callable[[str, RowSource], RowSource] = same_array, *,
                checked: bool = False, settle: Callable[[], None] | None = None) -> RowSource:
    """The row source of the table at ``where`` (a place, or a local folder) whose
    ``vectors/zarr.json`` is ``meta``;
    ``wrap(name, source)`` is given each row array as it is opened (a version's deltas go
    on top there: :class:`~embstore.store.versions.delta.Overlays`); ``checked``: every row
    array must carry its checksums (a format-2 table); ``settle`` waits until no commit of
    the table is half applied (a local folder's readers call it when a page they read
    changed under them)."""
    place = where if isinstance(where, Place) else LocalDir(where, settle)
    codes = wrap("vectors", _open_array(place, meta, mode, "vectors", checked))
    record = DTYPES.get(meta.get("data_type"))  # type: ignore[arg-type]
    if record is None or not record.compact:
        return codes
    if record.side is None:
        return CodedSource(codes, record)
    name = record.side.name
    smeta = place.get_json(f"{name}/zarr.json", f"{name}/zarr.json ({record.name} vectors "
                           f"need their {record.side.called})")
    check_side_meta(record, smeta, meta, place.where(f"{name}/zarr.json"), place.url)
    # the side array (int8's scales) is checksummed wherever its rows are: scales without
    # their checksums beside checksummed codes are damage, never read unchecked
    side_checked = checked or _checksummed(meta)
    return CodedSource(codes, record, wrap(name, _open_array(place, smeta, mode, name,
                                                             side_checked)))


def _checksummed(meta: dict) -> bool:
    """Whether the row array of ``meta`` is sharded with a crc32c per chunk and per index
    (a row array's checksums are another array's: format 2 requires them, ``checked``)."""
    layout = Layout.from_metadata(meta)
    return layout is not None and layout.has_crc and layout.index_crc

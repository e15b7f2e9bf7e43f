"""``embstore.verify(path)``: check every stored byte of a table.

Checks the metadata, every shard index and every chunk of ``vectors`` (crc32c, and a
decode for compressed chunks), then reads every other array of the group (``keys`` and
the key index) through zarr-python, whose crc32c codec detects damage, and runs the deep
check of the key index (sorted hashes, permutation, hashes recomputed from the key bytes,
``keys`` equal to the stored bytes), streamed by blocks.

A table written by another Zarr tool may carry no checksums: its chunks are read (a
decode error is still damage) but cannot be verified.  Chunks of ``vectors`` without a
checksum make the report not ``ok`` ("no damage" is only said of rows that were checked);
other arrays without one (a foreign ``keys``) are read and listed as not checksummed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._types import PathLike
from ..errors import CorruptStoreError, FormatError, LockTimeoutError, NotATableError
from ..progress import plural
from ..keys.index import INDEX_ARRAYS, DiskVocab, has_key_index
from ..keys.mapped import read_array_meta
from ..keys.segments import SegmentedVocab
from .codecs import Layout
from .rows.layout import PAGE_CRC, RowLayout, crc_array
from .rows.verify import verify_rows
from .shard.verify import verify_shards
from .place.base import Place
from .place.local import LocalDir
from .place.objects import ObjectStore
from .place.objstore import ObjectClient, is_url
from .objects.check import check_versions
from .remote.open import read_remote_meta
from .remote.verify import downloaded
from .annfiles import index_identity, verify_index
from ..fs.files import real_dir
from .versions.commit import AREA, last_commit, settle
from .versions.delta import check_delta
from .versions.keydelta import KEYS, check_key_delta, open_vocab
from .versions.snapshot import (DELTAS, MANIFEST, list_versions, newest, read_manifest, version_pins,
                                snapshot_root)
from .meta import read_json, read_table_meta, unsafe_files
from .subword.ngrams import NGRAMS, check_subwords
from ..dtypes import SIDE_ARRAYS
from .norms.calc import NORMS_ARRAY
from .stored_norms import check_norms, norms_in_one_pass
from .source import open_source

__all__ = ["Damage", "VerifyReport", "verify", "checksummed", "checksum_status"]

_BLOCK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class Damage:
    """One problem: the file (or array) it is in, the inner chunk if known, a message."""

    file: str
    chunk: int | None
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class VerifyReport:
    """The result of :func:`verify`: ``ok`` is true when every chunk of ``vectors`` was
    checked against its checksum and nothing is damaged.

    ``shards`` and ``chunks`` count the shard files and stored chunks of ``vectors`` whose
    checksums were checked; ``unchecked`` the chunks of ``vectors`` that carry no checksum
    (read, but not verifiable: the report is then not ``ok``); ``arrays`` the other arrays
    read whole, of which ``unchecked_arrays`` carry no checksum (read, so undecodable
    bytes are found, but a flipped bit in raw bytes is not); ``damaged`` lists the problems.
    """

    path: str
    ok: bool = True
    vocab_size: int | None = None
    shards: int = 0
    chunks: int = 0
    unchecked: int = 0
    arrays: list[str] = field(default_factory=list)
    unchecked_arrays: list[str] = field(default_factory=list)
    damaged: list[Damage] = field(default_factory=list)
    #: the approximate index, if any: "<n> rows, up to date" or "... stale" (not checked)
    index: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @property
    def checksummed(self) -> bool:
        """Whether every chunk of ``vectors`` carries a checksum (so could be checked)."""
        return not self.unchecked

    def add(self, file: str, chunk: int | None, message: str) -> None:
        self.damaged.append(Damage(str(file), chunk, message))
        self.ok = False

    def _what(self) -> str:
        return (f"{plural(self.shards, 'shard')}, {plural(self.chunks, 'chunk')} of vectors"
                + (f", {'array' if len(self.arrays) == 1 else 'arrays'} "
                   f"{', '.join(self.arrays)}" if self.arrays else ""))

    def unchecked_line(self) -> str:
        """One line naming what could not be checked ("" when everything was)."""
        parts = []
        if self.unchecked:
            parts.append(f"{plural(self.unchecked, 'chunk')} of vectors")
        if self.unchecked_arrays:
            parts.append(f"{'array' if len(self.unchecked_arrays) == 1 else 'arrays'} "
                         f"{', '.join(self.unchecked_arrays)}")
        if not parts:
            return ""
        one = len(parts) == 1 and (self.unchecked == 1 or (not self.unchecked and len(
            self.unchecked_arrays) == 1))
        return (f"{' and '.join(parts)} {'carries' if one else 'carry'} no checksum (written without the crc32c "
                "codec): read, but they cannot be verified")

    def __str__(self) -> str:
        note = self.unchecked_line()
        if self.damaged:
            lines = [f"DAMAGED {self.path}: {plural(len(self.damaged), 'problem')}; checked "
                     f"{self._what()}"]
            lines += [f"  {d.message}" for d in self.damaged]
            return "\n".join(lines + ([f"  {note}"] if note else []))
        if not self.checksummed:
            return (f"UNVERIFIED {self.path}: {self.vocab_size} rows; checked {self._what()}; "
                    f"{note}")
        return (f"OK {self.path}: {self.vocab_size} rows; checked {self._what()}; no damage"
                + (f"; {note}" if note else "")
                + (f"; approximate index: {self.index}" if self.index else ""))


def _codec_names(meta: dict) -> list[str]:
    """Names of the codecs applied to each chunk's bytes (inside a sharding codec too)."""
    codecs = meta.get("codecs")
    if not isinstance(codecs, (list, tuple)):
        return []
    names = []
    for c in codecs:
        if not isinstance(c, dict):
            continue
        if c.get("name") == "sharding_indexed":
            inner = c.get("configuration", {})
            names += _codec_names(inner if isinstance(inner, dict) else {})
        elif isinstance(c.get("name"), str):
            names.append(c["name"])
    return names


def checksummed(meta: dict) -> bool:
    """Whether the chunks of the array described by ``meta`` (its zarr.json) carry a crc32c."""
    return "crc32c" in _codec_names(meta)


def checksum_status(path) -> dict[str, bool]:
    """``{array name: checksummed}`` for every array of the table's group at ``path``."""
    root = Path(os.fspath(path))
    out = {}
    for entry in sorted(os.listdir(root)):
        if (root / entry / "zarr.json").is_file():
            try:
                meta = read_array_meta(root, entry)
            except CorruptStoreError:
                out[entry] = False
                continue
            if meta.get("node_type") == "array":
                out[entry] = checksummed(meta)
    for name in list(out):  # format 2: a row array's checksums live in its page_crc
        if out.get(crc_array(name)):
            out[name] = True
    return out


_KEYS_SLACK = 1 << 20  # keys or norms beyond the rows a reader tolerates (it caps them)


def _n_chunks(meta: dict) -> int:
    """Chunks (inner chunks, if sharded) in the grid of the array of ``meta``."""
    shape = meta["shape"]
    chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
    for c in meta["codecs"]:
        if c.get("name") == "sharding_indexed":
            chunks = c["configuration"]["chunk_shape"]
    return math.prod(-(-s // c) for s, c in zip(shape, chunks))


def verify(path: PathLike, *, storage_options: dict | None = None) -> VerifyReport:
    """Check every stored byte of the table at ``path`` (a folder, or a URL such as
    ``s3://bucket/t.emb`` with ``storage_options``); never raises for damage, reports it.

    One pass for every place (:mod:`embstore.store.place`): the row arrays are read through
    it by their layout's check (:mod:`embstore.store.rows.verify`,
    :mod:`embstore.store.shard.verify`); the other arrays, the key index, the norms, the
    versions and the approximate index are checked on a local folder (a table on object
    storage: those objects downloaded first).

    A path that is no table at all raises :class:`~embstore.errors.NotATableError`."""
    place = _place(path, storage_options)
    try:
        report = VerifyReport(place.url)
        with _tree(place, report) as root:
            opened = _open_table(place, report)
            if opened is None:
                return report
            attrs, meta = opened
            _verify_all(place, root, attrs, meta, report)
        if isinstance(place, ObjectStore):
            _verify_object_versions(place, storage_options, report)
    finally:
        place.close()
    if report.unchecked:
        report.ok = False
    return report


def _verify_object_versions(place: ObjectStore, storage_options: dict | None,
                            report: VerifyReport) -> None:
    """A table on object storage: every retained version's manifest and deltas, and the
    compacted bases they read, each verified as a table (docs/FORMAT.md §11a)."""
    versions, bases = check_versions(place.client, report.add)
    report.arrays += [f"manifest {n}" for n in versions]  # (and their deltas)
    for prefix in sorted(bases):  # a loop per compacted base: a table of its own
        sub = verify(f"{place.url}/{prefix}", storage_options=storage_options)
        report.damaged += sub.damaged
        report.shards, report.chunks = report.shards + sub.shards, report.chunks + sub.chunks
        report.unchecked += sub.unchecked
        report.ok = report.ok and sub.ok


def _place(path: PathLike, storage_options: dict | None) -> Place:
    if is_url(path):
        return ObjectStore(ObjectClient(str(path).rstrip("/"), storage_options))
    if storage_options:
        raise TypeError("storage_options: an option of tables on object storage, got the "
                        f"local path {os.fspath(path)!r}")
    return LocalDir(Path(os.fspath(path)).absolute())


@contextmanager
def _tree(place: Place, report: VerifyReport) -> Iterator[Path]:
    """The folder the checks of local files run on: the table's own, or the objects of a
    table on object storage (all but its row arrays) downloaded."""
    if isinstance(place, LocalDir):
        yield place.root
        return
    assert isinstance(place, ObjectStore)
    if place.get("zarr.json") is None:  # (a GET: a HEAD cannot tell a missing bucket)
        raise NotATableError("not an embstore table: the group's zarr.json is missing",
                             path=place.url)
    with downloaded(place, report) as root:
        yield root


def _verify_all(place: Place, root: Path, attrs: dict, meta: dict,
                report: VerifyReport) -> None:
    fast: set[str] = set()  # arrays checked by their own checksums, not read through zarr
    one_pass, norm_problems = _verify_paged(place, root, meta, report, fast)
    _verify_sharded(place, meta, report, fast)
    if not any(d.file.startswith(str(root / NGRAMS)) for d in report.damaged):
        for file, message in check_subwords(root, attrs, int(meta["shape"][1])):
            report.add(file, None, message)  # n-grams the checksums pass but nobody can use
    names, deep = _read_other_arrays(root, meta, report, fast)
    _check_keys(root, attrs, names, deep, report)
    if isinstance(place, LocalDir):  # (the norms recomputed from rows read locally)
        _check_stored_norms(root, report, one_pass, norm_problems)
    elif one_pass is not None:
        for file, msg in norm_problems:
            report.add(file, None, msg)
    _check_versions(root, report)
    report.index = _index_note(root, report)


def _open_table(place: Place, report: VerifyReport) -> tuple[dict, dict] | None:
    """The table's attributes and the metadata of ``vectors``, as a reader opens them (a
    committed write finished first); None, with the problem reported, if they cannot be
    read safely."""
    if isinstance(place, ObjectStore):
        try:
            attrs, meta, _ = read_remote_meta(place.client)
            return attrs, meta
        except (FormatError, CorruptStoreError) as exc:
            report.add(place.url, None, str(exc))
            return None
    root = Path(place.url)
    unsafe = unsafe_files(root) if root.is_dir() else []
    for file, message in unsafe:  # reading on would block on a FIFO or read another table
        report.add(file, None, message)
    if unsafe:
        return None
    try:
        if root.is_dir():
            settle(root)  # as a reader opening it: a committed write is finished first
        return read_table_meta(root)
    except NotATableError:
        raise  # nothing to verify: not damage
    except (FormatError, CorruptStoreError, LockTimeoutError) as exc:
        report.add(str(root), None, str(exc))
        return None


def _place_meta(place: Place, name: str) -> dict | None:
    """The zarr.json of array ``name`` as the place holds it (None: no such array)."""
    try:
        meta = place.get_json(f"{name}/zarr.json", f"{name}/zarr.json")
    except (FormatError, CorruptStoreError):
        return None
    return meta if meta.get("node_type") == "array" else None


def _verify_paged(place: Place, root: Path, meta: dict, report: VerifyReport,
                  fast: set[str]) -> tuple[Callable | None, list]:
    """Row arrays: the rows of ``vectors`` and of the per-row side arrays checked against
    their pages' crcs; returns the norms' one-pass check (None if the norms were not
    compared with the rows) and the problems it found."""
    one_pass = None  # the norms checked with the rows' pages
    norm_problems: list = []
    rows = RowLayout.from_metadata(meta)
    if rows is None or _place_meta(place, PAGE_CRC) is None:  # the sharded layout
        return one_pass, norm_problems
    fast.update(("vectors", PAGE_CRC))
    try:  # the norms compared as the rows are read for their pages: one pass
        one_pass = norms_in_one_pass(root, open_source(place, meta, "r"),
                                     lambda file, msg: norm_problems.append((file, msg)))
    except (CorruptStoreError, FormatError):
        one_pass = None
    for file, chunk, message in verify_rows(place, rows, on_rows=one_pass):
        report.add(file, chunk, message)
    report.vocab_size, report.shards, report.chunks = rows.rows, rows.n_chunks, rows.n_chunks
    for name in (*SIDE_ARRAYS, NORMS_ARRAY):  # int8's scales, the norms: as the rows
        m, crc = _place_meta(place, name), crc_array(name)
        side = None if m is None else RowLayout.from_metadata(m)
        if side is None or _place_meta(place, crc) is None or side.rows != rows.rows:
            continue  # (the sharded layout, or rows that do not fit: below)
        fast.update((name, crc))
        report.arrays.append(name)
        for file, chunk, message in verify_rows(place, side, name):
            report.add(file, chunk, message)
    return one_pass, norm_problems


def _verify_sharded(place: Place, meta: dict, report: VerifyReport, fast: set[str]) -> None:
    """The sharded layout: every shard index and chunk of ``vectors``, int8 tables' scales
    and fastText n-grams not checked above (crc32c, and a decode for compressed chunks)."""
    for name in ("vectors", *SIDE_ARRAYS, NGRAMS):  # int8 tables' scales, fastText n-grams
        if name in fast:
            continue
        m = meta if name == "vectors" else _place_meta(place, name)
        layout = None if m is None else Layout.from_metadata(m)
        if layout is None:
            if m is not None and name in ("vectors", *SIDE_ARRAYS) and \
                    isinstance(place, ObjectStore):
                report.add(place.where(name), None, f"{place.where(name)}: not in a layout "
                           "of embstore's; copy the table to a local folder to verify it")
                fast.add(name)
            continue
        fast.add(name)
        counted: list[int] = []
        for file, chunk, message in verify_shards(place, layout, name, counted):
            report.add(file, chunk, message)
        checked = counted[0] if counted else 0
        if name == "vectors":
            report.vocab_size = layout.rows
            report.shards = layout.n_shards
            if layout.has_crc:
                report.chunks = checked
            else:  # read and decoded, but a flipped bit in raw bytes would go unnoticed
                report.unchecked = checked
        else:
            report.arrays.append(name)
            if not layout.has_crc:
                report.unchecked_arrays.append(name)


def _read_other_arrays(root: Path, meta: dict, report: VerifyReport,
                       fast: set[str]) -> tuple[list[str], bool]:
    """Every other array of the group read whole through zarr-python (whose crc32c codec
    detects damage); returns the arrays' names and whether the key index gets its deep
    check (its arrays are skipped here)."""
    import zarr
    # arrays listed from the directory: zarr-python cannot open a group holding bfloat16
    # (not arrays an older embstore left half written beside the live ones: not the table)
    names = sorted(p.name for p in root.iterdir() if _array_meta(root, p.name) is not None
                   and not p.name.endswith((".__tmp__", ".__old__")) and ".tmp-" not in p.name)
    deep = "keys" in names and has_key_index(root)
    for name in names:
        if name in fast or (deep and name in INDEX_ARRAYS):
            continue  # (the key index: read and checked by the deep check below)
        if _too_long(root, name, report):
            continue
        try:
            arr = zarr.open_array(str(root / name), mode="r")
        except Exception as exc:  # noqa: BLE001 - any zarr failure is damage to report
            report.add(f"{root}/{name}", None, f"{root}/{name}: zarr cannot open the array "
                       f"({type(exc).__name__}: {exc})")
            continue
        _read_all(arr, name, report)
        sums = checksummed(_array_meta(root, name) or {})
        if name == "vectors":
            report.vocab_size = int(arr.shape[0])
            if sums:
                report.chunks = _n_chunks(meta)
            else:
                report.unchecked = _n_chunks(meta)
        elif not sums:
            report.unchecked_arrays.append(name)
    return names, deep


def _check_keys(root: Path, attrs: dict, names: list[str], deep: bool,
                report: VerifyReport) -> None:
    """``keys`` present if the table has keys, one per row, and the key index's deep check."""
    if attrs.get("has_keys") and "keys" not in names:
        report.add(f"{root}/keys", None, f"{root}/keys: missing (the table has_keys)")
    nkeys = (_array_meta(root, "keys") or {}).get("shape", [None])[0]
    if "keys" in names and report.vocab_size is not None and not (
            isinstance(nkeys, int) and nkeys >= report.vocab_size):  # more: capped, as read
        report.add(f"{root}/keys", None, f"{root}/keys: {nkeys} keys, expected "
                   f"one per row ({report.vocab_size} rows)")
    elif deep and report.vocab_size is not None:
        _deep_check_keys(root, report)


def _check_stored_norms(root: Path, report: VerifyReport, one_pass: Callable | None,
                 norm_problems: list) -> None:
    """The stored norms against their rows, once nothing else is damaged: the problems the
    one pass with the rows' pages found, else every norm recomputed from its row."""
    if report.ok and NORMS_ARRAY in report.arrays and one_pass is not None:
        for file, msg in norm_problems:  # (checked with the rows' pages above)
            report.add(file, None, msg)
    elif report.ok and NORMS_ARRAY in report.arrays:  # every norm recomputed from its row
        try:
            check_norms(root, lambda file, msg: report.add(file, None, msg))
        except (CorruptStoreError, FormatError) as exc:
            report.add(str(root / NORMS_ARRAY), None, str(exc))


def _check_versions(root: Path, report: VerifyReport) -> None:
    """Every retained version's manifest and delta files (docs/FORMAT.md §6); the
    files they share with the live table were checked above."""
    for v in list_versions(root):  # a loop per version
        snap = snapshot_root(root, v)
        try:
            manifest = read_manifest(snap)
        except CorruptStoreError as exc:
            report.add(str(snap / MANIFEST), None, str(exc))
            continue
        for e in manifest["deltas"]:  # a loop per delta file
            try:
                (check_key_delta if e["array"] == KEYS else check_delta)(
                    snap / DELTAS / e["name"])
            except CorruptStoreError as exc:
                report.add(str(snap / DELTAS / e["name"]), None, str(exc))
        for file, message in version_pins(root, v, snap, manifest):
            report.add(file, None, message)


def _too_long(root: Path, name: str, report: VerifyReport) -> bool:
    """Whether the per-row array ``name`` claims more rows than the table can have (reported:
    a ``norms/zarr.json`` claiming 2**40 rows had verify read zeros for hours)."""
    rows = report.vocab_size
    if name not in (NORMS_ARRAY, "keys") or rows is None:
        return False
    shape = (_array_meta(root, name) or {}).get("shape") or [0]
    limit = rows + _KEYS_SLACK  # (keys of an append in flight, norms of dropped rows)
    if isinstance(shape[0], int) and shape[0] <= limit:
        return False
    report.add(f"{root}/{name}", None, f"{root}/{name}/zarr.json: {shape[0]} rows, more than "
               f"the {limit} the table's {rows} rows allow (one per row); not read")
    return True


def _index_note(root: Path, report: VerifyReport) -> str:
    """What the approximate index (embstore/search/ann.py) is: checked
    (embstore/store/annfiles.py), its damage reported ("" if there is none)."""
    try:
        home = real_dir(root, ("vectors", AREA[0], "ann"))
        note, problems = verify_index(home, report.vocab_size, last_commit(root),
                                      **index_identity(root))
    except CorruptStoreError as exc:
        note, problems = "damaged", [(str(exc.path), str(exc))]
    for file, message in problems:
        report.add(file, None, f"approximate index: {message}")
    return note


def _array_meta(root: Path, name: str) -> dict | None:
    """The zarr.json of the array ``name`` in the group (None if it is not an array)."""
    try:
        meta = read_json(root / name / "zarr.json", f"{name}/zarr.json", root=root)
    except (FormatError, CorruptStoreError):
        return None
    return meta if meta.get("node_type") == "array" else None


def _deep_check_keys(root: Path, report: VerifyReport) -> None:
    """The key index's own check (streamed): damage that checksums cannot see."""
    vocab = None
    try:
        n = newest(root)  # format 2: the live files are the newest version's; its key deltas
        snap = None if n is None else snapshot_root(root, n)
        entries = [] if snap is None else [e for e in read_manifest(snap)["deltas"]
                                           if e["array"] == KEYS]
        vocab = (open_vocab(snap, int(report.vocab_size or 0), entries)
                 if snap is not None and entries else
                 DiskVocab.open(None, root, rows=report.vocab_size))
        if isinstance(vocab, (DiskVocab, SegmentedVocab)):
            vocab.verify()
            report.arrays.extend(INDEX_ARRAYS)
    except CorruptStoreError as exc:
        report.add(str(root), None, f"key index: {exc}")
    finally:
        if vocab is not None:
            vocab.close()


def _read_all(arr, name: str, report: VerifyReport) -> None:
    """Read ``arr`` in blocks along its first axis; report blocks that fail."""
    report.arrays.append(name)
    blocks: list[tuple[int, int] | None]
    if arr.ndim == 0:
        blocks = [None]
    else:
        per_row = int(np.prod(arr.shape[1:], dtype=np.int64)) or 1
        step = max(int(arr.chunks[0]), _BLOCK_ELEMENTS // per_row // arr.chunks[0] * arr.chunks[0])
        blocks = [(a, min(arr.shape[0], a + step)) for a in range(0, arr.shape[0], step)]
    for blk in blocks:
        try:
            arr[...] if blk is None else arr[blk[0]: blk[1]]
        except Exception as exc:  # noqa: BLE001 - zarr raises various types on bad bytes
            where = "" if blk is None else f", elements {blk[0]}..{blk[1] - 1}"
            report.add(f"{report.path}/{name}", None,
                       f"array {name}{where}: cannot read ({type(exc).__name__}: {exc})")

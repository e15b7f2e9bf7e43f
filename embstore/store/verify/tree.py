"""The checks of ``verify`` that run on a table's folder (a local table's own, or the objects
of a table on object storage downloaded): every other array read through zarr-python, the
key index's deep check, the stored norms, every version's manifest and deltas, the
approximate index."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError, FormatError
from ...keys.index import INDEX_ARRAYS, DiskVocab, has_key_index
from ...keys.segments import SegmentedVocab
from ..annfiles import index_identity, verify_index
from ...fs.files import real_dir
from ..versions.commit import AREA, last_commit
from ..versions.delta import check_delta
from ..versions.keydelta import KEYS, check_key_delta, open_vocab
from ..versions.snapshot import (DELTAS, MANIFEST, list_versions, live_pins, newest,
                                 read_manifest, snapshot_root, version_pins)
from ..meta import read_json
from ..norms.calc import NORMS_ARRAY
from ..stored_norms import check_norms

from .report import VerifyReport, _KEYS_SLACK, _n_chunks, checksummed

_BLOCK_ELEMENTS = 1 << 20

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
        seen = _inodes(d.file for d in report.damaged)
        for file, message in version_pins(root, v, snap, manifest):
            if not _inodes([file]) & seen:  # (a file reported already, by another name)
                report.add(file, None, message)
    n = newest(root)
    if n is not None:  # the live names are the newest version's files
        for file, message in live_pins(root, n, snapshot_root(root, n)):
            report.add(file, None, message)


def _inodes(files) -> set:
    """``(device, inode)`` of each of ``files`` that exists."""
    out = set()
    for f in files:  # a loop per damaged file (a few)
        try:
            st = os.stat(f)
        except (OSError, ValueError):
            continue
        out.add((st.st_dev, st.st_ino))
    return out


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
        if (root / MANIFEST).is_file():  # (an older version verified as a table: its own)
            snap = root
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

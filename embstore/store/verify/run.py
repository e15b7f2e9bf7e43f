"""``embstore.verify(path)``: check every stored byte of a table (the walk; the package
``embstore.store.verify`` names it lazily).

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

from collections.abc import Callable
from pathlib import Path

from ..._types import PathLike
from ...errors import CorruptStoreError, FormatError
from ..codecs import Layout
from ..rows.layout import PAGE_CRC, RowLayout, crc_array
from ..rows.verify import verify_rows
from ..shard.verify import verify_shards
from ..place.base import Place
from ..place.where import place_at
from ..subword.ngrams import NGRAMS, check_subwords
from ...dtypes import SIDE_ARRAYS
from ..norms.calc import NORMS_ARRAY
from ..stored_norms import norms_in_one_pass
from ..source import open_source

from .media import Checks, checks_for
from .report import VerifyReport
from .tree import (_check_keys, _check_stored_norms, _check_versions, _index_note,
                   _read_other_arrays)

__all__ = ["verify"]


def verify(path: PathLike, *, storage_options: dict | None = None) -> VerifyReport:
    """Check every stored byte of the table at ``path`` (a folder, or a URL such as
    ``s3://bucket/t.emb`` with ``storage_options``); never raises for damage, reports it.

    One pass for every place (:mod:`embstore.store.place`): the row arrays are read through
    it by their layout's check (:mod:`embstore.store.rows.verify`,
    :mod:`embstore.store.shard.verify`); the other arrays, the key index, the norms, the
    versions and the approximate index are checked on a local folder (a table on object
    storage: those objects downloaded first).  What differs by medium is one class each
    (:mod:`.media`).

    A path that is no table at all raises :class:`~embstore.errors.NotATableError`."""
    place = place_at(path, storage_options)
    try:
        checks = checks_for(place)
        report = VerifyReport(place.url)
        with checks.tree(report) as root:
            opened = checks.open_table(report)
            if opened is None:
                return report
            attrs, meta = opened
            _verify_all(checks, root, attrs, meta, report)
        checks.manifests(report, lambda url: verify(url, storage_options=storage_options))
    finally:
        place.close()
    if report.unchecked:
        report.ok = False
    return report


def _verify_all(checks: Checks, root: Path, attrs: dict, meta: dict,
                report: VerifyReport) -> None:
    place = checks.place
    fast: set[str] = set()  # arrays checked by their own checksums, not read through zarr
    one_pass, norm_problems = _verify_paged(place, root, meta, report, fast)
    _verify_sharded(checks, meta, report, fast)
    if not any(d.file.startswith(str(root / NGRAMS)) for d in report.damaged):
        for file, message in check_subwords(root, attrs, int(meta["shape"][1])):
            report.add(file, None, message)  # n-grams the checksums pass but nobody can use
    names, deep = _read_other_arrays(root, meta, report, fast)
    _check_keys(root, attrs, names, deep, report)
    if checks.recomputes_norms:  # (the norms recomputed from rows read locally)
        _check_stored_norms(root, report, one_pass, norm_problems)
    elif one_pass is not None:
        for file, msg in norm_problems:
            report.add(file, None, msg)
    _check_versions(root, report)
    checks.older_versions(root, report, _verify_all)
    report.index = _index_note(root, report)


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
    try:
        rows = RowLayout.from_metadata(meta)
    except CorruptStoreError as exc:  # (a malformed initialisation: FORMAT.md §3e)
        report.add(place.where("vectors/zarr.json"), None, str(exc))
        return one_pass, norm_problems
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
        try:
            side = None if m is None else RowLayout.from_metadata(m)
        except CorruptStoreError as exc:
            report.add(place.where(f"{name}/zarr.json"), None, str(exc))
            continue
        if side is None or _place_meta(place, crc) is None or side.rows != rows.rows:
            continue  # (the sharded layout, or rows that do not fit: below)
        fast.update((name, crc))
        report.arrays.append(name)
        for file, chunk, message in verify_rows(place, side, name):
            report.add(file, chunk, message)
    return one_pass, norm_problems


def _verify_sharded(checks: Checks, meta: dict, report: VerifyReport, fast: set[str]) -> None:
    """The sharded layout: every shard index and chunk of ``vectors``, int8 tables' scales
    and fastText n-grams not checked above (crc32c, and a decode for compressed chunks)."""
    place = checks.place
    for name in ("vectors", *SIDE_ARRAYS, NGRAMS):  # int8 tables' scales, fastText n-grams
        if name in fast:
            continue
        m = meta if name == "vectors" else _place_meta(place, name)
        layout = None if m is None else Layout.from_metadata(m)
        if layout is None:
            if m is not None and name in ("vectors", *SIDE_ARRAYS) and \
                    checks.refuses_foreign_layouts:
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

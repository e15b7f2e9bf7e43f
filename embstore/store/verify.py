"""``embstore.verify(path)``: check every stored byte of a table.

Checks the metadata, every shard index and every chunk of ``vectors`` (crc32c, and a
decode for compressed chunks), then reads every other array of the group (``keys`` and
the key index) through zarr-python, whose crc32c codec detects damage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CorruptStoreError, FormatError, NotATableError
from .codecs import Layout
from .meta import read_json, read_table_meta
from .quant import SCALE_ARRAY
from .shardread import ShardReader

__all__ = ["Damage", "VerifyReport", "verify"]

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
    """The result of :func:`verify`: ``ok`` is true when nothing is damaged.

    ``shards`` and ``chunks`` count the shard files and stored chunks of ``vectors`` that
    were checked; ``arrays`` the other arrays read whole; ``damaged`` lists the problems.
    """

    path: str
    ok: bool = True
    vocab_size: int | None = None
    shards: int = 0
    chunks: int = 0
    arrays: list[str] = field(default_factory=list)
    damaged: list[Damage] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def add(self, file: str, chunk: int | None, message: str) -> None:
        self.damaged.append(Damage(str(file), chunk, message))
        self.ok = False

    def __str__(self) -> str:
        what = (f"{self.shards} shard(s), {self.chunks} chunk(s) of vectors"
                + (f", arrays {', '.join(self.arrays)}" if self.arrays else ""))
        if self.ok:
            return f"OK {self.path}: {self.vocab_size} rows; checked {what}; no damage"
        lines = [f"DAMAGED {self.path}: {len(self.damaged)} problem(s); checked {what}"]
        lines += [f"  {d.message}" for d in self.damaged]
        return "\n".join(lines)


def verify(path) -> VerifyReport:
    """Check every chunk of the table at ``path``; never raises for damage, reports it.

    A path that is no table at all raises :class:`~embstore.errors.NotATableError`."""
    root = Path(os.fspath(path)).absolute()
    report = VerifyReport(str(root))
    try:
        attrs, meta = read_table_meta(root)
    except NotATableError:
        raise  # nothing to verify: not damage
    except (FormatError, CorruptStoreError) as exc:
        report.add(str(root), None, str(exc))
        return report
    fast = set()
    for name in ("vectors", SCALE_ARRAY):  # row_scale: the int8 tables' scales
        m = meta if name == "vectors" else _array_meta(root, name)
        layout = None if m is None else Layout.from_metadata(m)
        if layout is None:
            continue
        fast.add(name)
        reader = ShardReader(str(root / name), layout)
        for file, chunk, message in reader.verify_all():
            report.add(file, chunk, message)
        if name == "vectors":
            report.vocab_size = layout.rows
            report.shards = layout.n_shards
            report.chunks = reader.checked_chunks
        else:
            report.arrays.append(name)
    import zarr
    # arrays listed from the directory: zarr-python cannot open a group holding bfloat16
    names = sorted(p.name for p in root.iterdir() if _array_meta(root, p.name) is not None)
    for name in names:
        if name in fast:
            continue
        try:
            arr = zarr.open_array(str(root / name), mode="r")
        except Exception as exc:  # noqa: BLE001 - any zarr failure is damage to report
            report.add(f"{root}/{name}", None, f"{root}/{name}: zarr cannot open the array "
                       f"({type(exc).__name__}: {exc})")
            continue
        _read_all(arr, name, report)
        if name == "vectors":
            report.vocab_size = int(arr.shape[0])
    if attrs.get("has_keys") and "keys" not in names:
        report.add(f"{root}/keys", None, f"{root}/keys: missing (the table has_keys)")
    nkeys = (_array_meta(root, "keys") or {}).get("shape", [None])[0]
    if "keys" in names and report.vocab_size is not None and nkeys != report.vocab_size:
        report.add(f"{root}/keys", None, f"{root}/keys: {nkeys} keys, expected "
                   f"one per row ({report.vocab_size} rows)")
    return report


def _array_meta(root: Path, name: str) -> dict | None:
    """The zarr.json of the array ``name`` in the group (None if it is not an array)."""
    try:
        meta = read_json(root / name / "zarr.json", f"{name}/zarr.json")
    except (FormatError, CorruptStoreError):
        return None
    return meta if meta.get("node_type") == "array" else None


def _read_all(arr, name: str, report: VerifyReport) -> None:
    """Read ``arr`` in blocks along its first axis; report blocks that fail."""
    report.arrays.append(name)
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

"""What ``verify`` says: :class:`VerifyReport` (one per table: the arrays checked, the
damage found, what could not be checked) and :class:`Damage`; which arrays carry checksums
(:func:`checksummed`, :func:`checksum_status`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CorruptStoreError
from ...progress import plural
from ...keys.mapped import read_array_meta
from ..rows.layout import crc_array

__all__ = ["Damage", "VerifyReport", "checksummed", "checksum_status"]

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

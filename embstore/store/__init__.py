"""The on-disk backend, format v1 (docs/FORMAT.md): sharded Zarr v3 ``vectors``.

- ``meta``: read and check ``zarr.json``; ``codecs``: the layout, chunk codecs and checksums
- ``shardread``: shard indexes and memory-mapped gathers; ``arena``: shards side by side
- ``writer``: :class:`TableWriter` and copy-on-write shard rewrites
- ``lock``, ``commit``: one writer at a time; all-or-nothing writes, recovery (``repair``)
- ``beside``: temporary tables beside a destination; ``shardwrite``: shard files
- ``table``: :class:`ZarrTable` and ``open``/``create``/``save``; ``verify``: every byte checked
"""

from __future__ import annotations

from .commit import repair
from .build import create, save
from .table import ZarrTable, open  # noqa: A004
from .verify import Damage, VerifyReport
from .remote_verify import verify
from .writer import TableWriter

__all__ = ["ZarrTable", "TableWriter", "create", "save", "open", "verify", "VerifyReport",
           "Damage", "repair"]

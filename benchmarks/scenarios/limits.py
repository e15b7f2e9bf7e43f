"""limits: what this machine can do at best, to read the other figures against.

Memory copy bandwidth (``np.copyto`` of a large array, bytes copied per
second); sequential read of a data file from disk (its page-cache pages dropped
first with ``posix_fadvise(DONTNEED)``) and from the page cache; ``np.load`` of
the same file with the page cache warm.
"""

from __future__ import annotations

import os

import numpy as np

from .. import data
from ..common import Method, absolute, drop_page_cache, interleave, read_through

NAME = "limits"
TITLE = "Physical limits of this machine"

COPY = "memory copy (np.copyto)"
DISK = "sequential read, disk (page cache dropped)"
CACHE = "sequential read, page cache"
LOAD = "np.load, page cache warm"


def run(ctx, res) -> None:
    cfg = ctx.cfg["limits"]
    nbytes, reps = cfg["copy_bytes"], cfg["reps"]
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch of dst, untimed
    path = data.table_npy(ctx.data_dir, cfg["file_rows"], cfg["file_dim"])
    size = os.path.getsize(path)
    res.params = {"copy_bytes": nbytes, "file_bytes": size, "reps": reps}

    def to_gbps(found, name, nb):
        m = found.get(name)
        if m is None:
            return None
        m.unit, m.values = "GB/s", [nb / (v / 1e3) / 1e9 for v in m.values]
        return m

    found = interleave(res, "memory", [Method(COPY, "limit", lambda: np.copyto(dst, src))],
                       reps=reps)
    copy = to_gbps(found, COPY, nbytes)
    del src, dst
    read_through([path])
    found = interleave(res, f"{size / 1e9:.2f} GB file", [
        Method(DISK, "limit", lambda: read_through([path]), before=lambda: drop_page_cache([path]),
               warmup=lambda: None),
        Method(CACHE, "limit", lambda: read_through([path]), before=lambda: read_through([path])),
        Method(LOAD, "limit", lambda: np.load(path, allow_pickle=False),
               before=lambda: read_through([path])),
    ], reps=reps)
    disk, cache = to_gbps(found, DISK, size), to_gbps(found, CACHE, size)
    load = to_gbps(found, LOAD, size)
    if disk is not None and cache is not None and disk.median > 0.8 * cache.median:
        res.notes.append("the disk read is about as fast as the page cache: the kernel may not "
                         "have dropped the file's pages (or the disk is RAM-backed)")
    absolute(res, "limit: memory copy bandwidth", copy)
    absolute(res, "limit: sequential disk read", disk)
    absolute(res, "limit: page-cache read / np.load", cache)
    absolute(res, "limit: np.load of a table, page cache warm", load)

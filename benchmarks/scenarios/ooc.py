"""ooc: out of core. Batches of ids with the table's pages evicted before each batch.

Before every cold batch the pages of the store files (and of the peers' files) are taken
out of memory (``benchmarks.common.evict``: this process's mappings unmapped, then
``posix_fadvise(DONTNEED)``), as a table larger than the page cache would be; the bytes
really read come from ``read_bytes`` in ``/proc/self/io``.  Methods: embstore (default
layout, no row cache), ``np.load(mmap_mode="r")[ids]``, tensorstore and zarr-python (first
table only: it takes up to a minute a call) on the same store; each cold and warm; tables
of growing size show the cold cost per batch stays flat.  Zipf(1.1) traffic with and
without a row cache (filled by traffic, or warmed) is the ``ooc-zipf`` scenario.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

import embstore

from .. import data
from ..common import Measurement, Skip, absolute, compare, evict, fmt, log, read_bytes
from . import ooc_zstd, peers
from .devlimit import DeviceReader

NAME = "ooc"
TITLE = "Out of core: cold batches (pages evicted), bytes read"

EMB = "embstore on-disk, no row cache"
MMAP = "np.load(mmap_mode='r')[ids]"
TS = "tensorstore"
ZARR = "zarr-python oindex"
DEV = "the device's limit: the same pages, O_DIRECT, 64 threads (C)"


def run(ctx, res) -> None:
    cfg = ctx.cfg["ooc"]
    if read_bytes() is None:
        res.notes.append("/proc/self/io is not readable here: bytes read are not reported")
    res.params = {k: v for k, v in cfg.items()}
    es = embstore
    for n, (rows, dim) in enumerate(cfg["tables"]):
        npy = data.table_npy(ctx.data_dir, rows, dim)
        store = data.store(ctx.data_dir, npy)
        load0 = _load()
        _table(ctx, res, cfg, es, npy, store, rows, dim, first=n == 0)
        res.notes.append(f"{rows:,} x {dim}: load average (1 min) {load0} before, {_load()} "
                         "after (2 cores, shared: cold times swing with it)")
    if cfg.get("zstd_table"):
        ooc_zstd.run(ctx, res, cfg, lambda *a, **k: _add(res, *a, **k), _cold)


def _first_after_open(res, es, store, files, ids, tag, n, rb) -> None:
    """The first batch of a handle opened with every page evicted (open included): nothing
    proportional to the table may be read before its rows."""
    evict(files)
    b0, t0 = read_bytes(), time.perf_counter()
    with es.open(store, cache_bytes=0) as t:
        t.lookup(ids)
    ms = (time.perf_counter() - t0) * 1e3
    b1 = read_bytes()
    mib = (b1 - b0) / 2**20 if b0 is not None and b1 is not None else float("nan")
    _add(res, f"cold uniform, {tag}, first batch after open", EMB, "embstore", "ms", [ms],
         mib_read=[mib])
    m = _add(res, f"cold uniform, {tag}, first batch after open, MiB read", EMB, "embstore",
             "MiB", [mib])
    absolute(res, f"{tag}, {n:,} uniform ids, first batch after open: MiB read <= 1.2 x ids x "
             "max(row, 4 KiB)", m, at_most=1.2 * n * max(rb, 4096) / 2**20)


def _device(res, npy, batches, tag):
    """The device's limit on the same batches (:mod:`.devlimit`), or None (skipped)."""
    try:
        reader = DeviceReader()
    except Skip as exc:
        res.notes.append(f"{tag}: {DEV}: skipped: {exc}")
        return None
    try:
        ms = [reader.ms(npy, ids) for ids in batches]  # (O_DIRECT: no page cache to evict)
    except Skip as exc:
        res.notes.append(f"{tag}: {DEV}: skipped: {exc}")
        return None
    finally:
        reader.close()
    return _add(res, f"cold uniform, {tag}", DEV, "limit", "ms", ms)


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def _cold(fn, batches, files):
    """(ms per batch, MiB read per batch) with the files evicted before every batch."""
    ms, mib = [], []
    for ids in batches:
        evict(files)
        b0 = read_bytes()
        t0 = time.perf_counter()
        fn(ids)
        ms.append((time.perf_counter() - t0) * 1e3)
        b1 = read_bytes()
        mib.append((b1 - b0) / 2**20 if b0 is not None and b1 is not None else float("nan"))
    return ms, mib


def _warm(fn, ids, reps):
    fn(ids)
    fn(ids)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(ids)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _add(res, case, method, kind, unit, values, **extra):
    m = Measurement(case, method, kind, unit, values, extra)
    res.measurements.append(m)
    log(f"  {case}: {method}: {fmt(m.median, unit)} (n={len(values)})")
    return m


def _table(ctx, res, cfg, es, npy, store, rows, dim, *, first: bool) -> None:
    n, nb = cfg["ids"], cfg["batches"]
    rb = dim * 4
    tag = f"{rows:,} x {dim}"
    files = [store, npy]
    E = np.load(npy, mmap_mode="r")
    t = es.open(store, cache_bytes=0)
    try:
        methods = {EMB: ("embstore", t.lookup), MMAP: ("peer", peers.memmap(npy))}
        for name, make in ((TS, peers.tensorstore), (ZARR, peers.zarr_python)):
            if name == ZARR and not (first and cfg.get("zarr", True)):
                continue  # seconds to a minute a call: the first table only, not in --quick
            try:
                methods[name] = ("peer", make(store))
            except Skip as exc:
                res.notes.append(f"{tag}: {name}: skipped: {exc}")
        batches = [data.ids(rows, (n,), "uniform", seed=100 + s) for s in range(nb)]
        b0 = batches[0]
        _first_after_open(res, es, store, files, b0, tag, n, rb)
        for name, (kind, fn) in methods.items():  # check, and read each shard index once
            if not np.array_equal(np.asarray(fn(b0[:64])), E[b0[:64]]):
                raise AssertionError(f"{name}: rows differ from the .npy")
        cold, warm = {}, {}
        for name, (kind, fn) in methods.items():
            k = 1 if name == ZARR else nb
            ms, mib = _cold(fn, batches[:k], files)
            cold[name] = _add(res, f"cold uniform, {tag}", name, kind, "ms", ms,
                              mib_read=mib, mib_read_median=statistics.median(mib))
            _add(res, f"cold uniform, {tag}, MiB read", name, kind, "MiB", mib)
            warm[name] = _add(res, f"warm uniform, {tag}", name, kind, "ms",
                              _warm(fn, b0, 1 if name == ZARR else cfg["warm_reps"]))
        label = f"{tag}, {n:,} uniform ids"
        budget = 1.2 * n * max(rb, 4096) / 2**20
        absolute(res, f"{label}, cold: MiB read <= 1.2 x ids x max(row, 4 KiB)",
                 res.find(f"cold uniform, {tag}, MiB read", EMB), at_most=budget)
        compare(res, f"{label}, cold: embstore vs tensorstore", cold[EMB], cold.get(TS),
                target=("faster", 3))
        compare(res, f"{label}, cold: embstore vs np.memmap", cold[EMB], cold[MMAP],
                target=("faster", 10))
        compare(res, f"{label}, cold: embstore vs zarr-python", cold[EMB], cold.get(ZARR),
                target=("faster", None))
        dev = _device(res, npy, batches, tag)
        if dev is not None:
            compare(res, f"{label}, cold: embstore vs the device's limit", cold[EMB], dev)
            compare(res, f"{label}, cold: the device's limit vs np.memmap (the largest "
                    "speed-up the disk allows)", dev, cold[MMAP], target=("faster", None))
        compare(res, f"{label}, warm: embstore vs np.memmap", warm[EMB], warm[MMAP])
        compare(res, f"{label}, warm: embstore vs tensorstore", warm[EMB], warm.get(TS),
                target=("faster", None))
    finally:
        t.close()

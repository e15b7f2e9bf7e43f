"""ooc: out of core. Batches of ids with the table's pages evicted before each batch.

Before every cold batch the pages of the store files (and of the peers' files) are taken
out of memory (``benchmarks.common.evict``: this process's mappings unmapped, then
``posix_fadvise(DONTNEED)``), as a table larger than the page cache would be; the bytes
really read come from ``read_bytes`` in ``/proc/self/io``.  Methods: embstore (default
layout, no row cache), ``np.load(mmap_mode="r")[ids]``, tensorstore and zarr-python (first
table only: it takes up to a minute a call) on the same store; each cold and warm; tables
of growing size show the cold cost per batch stays flat.  Then Zipf(1.1) traffic with and without a row cache,
pages evicted between batches (steady state, after the cache has filled).
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

NAME = "ooc"
TITLE = "Out of core: cold batches (pages evicted), bytes read"

EMB = "embstore on-disk, no row cache"
EMB_CACHE = "embstore on-disk, row cache"
MMAP = "np.load(mmap_mode='r')[ids]"
TS = "tensorstore"
ZARR = "zarr-python oindex"


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
        budget = 1.5 * n * max(rb, 4096) / 2**20
        absolute(res, f"{label}, cold: MiB read <= 1.5 x ids x max(row, 4 KiB)",
                 res.find(f"cold uniform, {tag}, MiB read", EMB), at_most=budget)
        compare(res, f"{label}, cold: embstore vs tensorstore", cold[EMB], cold.get(TS),
                target=("faster", 3))
        compare(res, f"{label}, cold: embstore vs np.memmap", cold[EMB], cold[MMAP],
                target=("faster", 10))
        compare(res, f"{label}, cold: embstore vs zarr-python", cold[EMB], cold.get(ZARR),
                target=("faster", None))
        compare(res, f"{label}, warm: embstore vs np.memmap", warm[EMB], warm[MMAP])
        compare(res, f"{label}, warm: embstore vs tensorstore", warm[EMB], warm.get(TS),
                target=("faster", None))
        if cfg.get("zipf") and first:
            _zipf(res, cfg, es, store, files, rows, dim, tag, t)
    finally:
        t.close()


def _zipf(res, cfg, es, store, files, rows, dim, tag, plain) -> None:
    """Zipf(1.1) batches, pages evicted before each: row cache vs none, steady state."""
    n = cfg["ids"]
    cache = es.open(store, cache_bytes=cfg["cache_bytes"])
    try:
        warmup = [data.ids(rows, (n,), "zipf1.1", seed=200 + s) for s in range(cfg["zipf_warmup"])]
        for ids in warmup:  # the cache fills (its admission takes rows on their second miss)
            cache.lookup(ids)
        batches = [data.ids(rows, (n,), "zipf1.1", seed=300 + s) for s in range(cfg["batches"])]
        h0 = cache.cache_info()
        with_ms, with_mib, without_ms, without_mib = [], [], [], []
        for i, ids in enumerate(batches):  # interleaved, alternating which goes first
            runs = [(cache.lookup, with_ms, with_mib), (plain.lookup, without_ms, without_mib)]
            for fn, ms, mib in (runs if i % 2 == 0 else runs[::-1]):
                a, b = _cold(fn, [ids], files)
                ms += a
                mib += b
        h1 = cache.cache_info()
        hits, misses = h1.hits - h0.hits, h1.misses - h0.misses
        # what no cache can serve: distinct ids of a batch never asked for before
        before = np.unique(np.concatenate(warmup))
        new = []
        for ids in batches:
            u = np.unique(ids)
            new.append(float(np.count_nonzero(~np.isin(u, before))) / u.size)
            before = np.union1d(before, u)
        res.notes.append(
            f"{tag}, zipf(1.1): {statistics.median(new):.0%} of a batch's distinct ids were "
            f"never asked for before (the tail): the row cache cannot serve them, and each "
            f"costs its page either way; row cache hit rate {hits / max(1, hits + misses):.0%}")
        res.notes.append(f"{tag}, zipf(1.1): " + _bounds(warmup, batches, cache))
        a = _add(res, f"zipf(1.1), pages evicted, {tag}", EMB_CACHE, "embstore", "ms", with_ms,
                 mib_read=with_mib, cache_bytes=cfg["cache_bytes"],
                 hit_rate=round(hits / max(1, hits + misses), 4))
        b = _add(res, f"zipf(1.1), pages evicted, {tag}", EMB, "embstore", "ms", without_ms,
                 mib_read=without_mib)
        _add(res, f"zipf(1.1), pages evicted, {tag}, MiB read", EMB_CACHE, "embstore", "MiB",
             with_mib)
        _add(res, f"zipf(1.1), pages evicted, {tag}, MiB read", EMB, "embstore", "MiB",
             without_mib)
        compare(res, f"{tag}, zipf(1.1), pages evicted: row cache vs none", a, b,
                target=("faster", 5))
    finally:
        cache.close()


def _bounds(warmup, batches, cache) -> str:
    """The best any row cache could do here, in chunks read (each costs its page or two).

    Without a cache a batch reads the chunks of all its distinct ids.  Ideal cache: every
    row asked for before (warm-up included) is held and a hit is free, so a batch reads the
    chunks of its first-time ids only.  Oracle: the cache holds its ``slots`` most frequent
    rows for ever (ids here are Zipf ranks: ids < slots), the steady state of a perfect
    frequency-based cache after unbounded traffic.
    """
    lay = cache.layout  # a format-2 table reads rows, not chunks: one "chunk" a row
    cr = 1 if lay.get("format") == 2 else lay["chunk_rows"]
    slots = cache._cache.slots
    seen = np.unique(np.concatenate(warmup))
    ideal, oracle = [], []
    for ids in batches:
        u = np.unique(ids)
        allc = np.unique(u // cr).size
        oracle.append(allc / max(1, np.unique(u[u >= slots] // cr).size))
        ideal.append(allc / max(1, np.unique(u[~np.isin(u, seen)] // cr).size))
        seen = np.union1d(seen, u)
    return (f"bounds on the row cache's gain (chunks read without / with it): holding every "
            f"row asked for before {statistics.median(ideal):.2f}x; holding the {slots:,} "
            f"most frequent rows for ever {statistics.median(oracle):.2f}x")

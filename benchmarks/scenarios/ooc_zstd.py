"""ooc, zstd layout: warm and cold lookups on a zstd store against tensorstore on the same
store, with equal cache budgets.

- warm (page cache warm), no decoded cache on either side: embstore's row cache cleared
  before each call, tensorstore without a ``cache_pool`` (its default): both decode every
  chunk a batch touches; this is the decode-bound comparison.
- warm, equal cache budgets: embstore's row cache and tensorstore's ``cache_pool`` of the
  same bytes, both large enough for the batch's rows (a 1-row chunk is one row, so the
  budgets hold the same rows), the batch looked up before timing.
- cold (the store's pages evicted before each batch): ms and MiB read, no caches.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import embstore
from embstore.store.codecs import choose_layout

from .. import data
from ..common import Skip, absolute, compare, log
from . import peers

EMB = "embstore zstd, no decoded cache (row cache cleared)"
EMB_WARM = "embstore zstd, row cache holding the batch"
EMB_COLD = "embstore zstd, no row cache"
TS = "tensorstore zstd, no cache_pool"
TS_WARM = "tensorstore zstd, cache_pool of the same bytes"


def _time(fn, ids, reps, before=None):
    out = []
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn(ids)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def run(ctx, res, cfg, add, cold) -> None:
    rows, dim = cfg["zstd_table"]
    n, reps = cfg["ids"], cfg["warm_reps"]
    npy = data.table_npy(ctx.data_dir, rows, dim)
    cr, _ = choose_layout(dim, "float32", rows, compression="zstd")  # today's default
    store = data.store(ctx.data_dir, npy, compression="zstd", layout={"chunk_rows": cr})
    tag = f"{rows:,} x {dim} zstd ({cr}-row chunks)"
    E = np.load(npy, mmap_mode="r")
    budget = max(16 << 20, 4 * n * dim * 4)
    plain = embstore.open(store, cache_bytes=budget)
    off = embstore.open(store, cache_bytes=0)
    try:
        try:
            ts_plain = peers.tensorstore(store)
            ts_warm = peers.tensorstore(store, cache_bytes=budget)
        except Skip as exc:
            res.notes.append(f"{tag}: tensorstore skipped: {exc}")
            ts_plain = ts_warm = None
        batches = [data.ids(rows, (n,), "uniform", seed=500 + s) for s in range(cfg["batches"])]
        b0 = batches[0]
        for fn in (plain.lookup, off.lookup, ts_plain, ts_warm):
            if fn is not None and not np.array_equal(np.asarray(fn(b0)), E[b0]):
                raise AssertionError(f"{tag}: rows differ from the .npy")
        m = {}
        m[EMB] = add(f"warm uniform, {tag}", EMB, "embstore", "ms",
                     _time(plain.lookup, b0, reps, before=plain.cache_clear))
        plain.lookup(b0)
        plain.lookup(b0)  # held now (admitted on the first or second miss)
        m[EMB_WARM] = add(f"warm uniform, {tag}", EMB_WARM, "embstore", "ms",
                          _time(plain.lookup, b0, reps), cache_bytes=budget)
        if ts_plain is not None:
            m[TS] = add(f"warm uniform, {tag}", TS, "peer", "ms", _time(ts_plain, b0, reps))
            ts_warm(b0)
            m[TS_WARM] = add(f"warm uniform, {tag}", TS_WARM, "peer", "ms",
                             _time(ts_warm, b0, reps), cache_bytes=budget)
        files = [store, npy]
        c = {}
        for name, kind, fn in ((EMB_COLD, "embstore", off.lookup), (TS, "peer", ts_plain)):
            if fn is None:
                continue
            ms, mib = cold(fn, batches, files)
            c[name] = add(f"cold uniform, {tag}", name, kind, "ms", ms, mib_read=mib,
                          mib_read_median=statistics.median(mib))
            add(f"cold uniform, {tag}, MiB read", name, kind, "MiB", mib)
        label = f"{tag}, {n:,} uniform ids"
        compare(res, f"{label}, warm, no decoded cache either side: embstore vs tensorstore",
                m[EMB], m.get(TS), target=("faster", 3))
        compare(res, f"{label}, warm, equal cache budgets ({budget >> 20} MiB): embstore vs "
                "tensorstore", m[EMB_WARM], m.get(TS_WARM), target=("faster", 3))
        budget_mib = 1.5 * n * max(dim * 4, 4096) / 2**20
        absolute(res, f"{label}, cold: MiB read <= 1.5 x ids x max(row, 4 KiB)",
                 res.find(f"cold uniform, {tag}, MiB read", EMB_COLD), at_most=budget_mib)
        compare(res, f"{label}, cold: embstore vs tensorstore", c[EMB_COLD], c.get(TS),
                target=("faster", None))
        log(f"  {tag}: done")
    finally:
        plain.close()
        off.close()

"""ooc-zipf: out of core, truncated Zipf(1.1) ids, the row cache filled by traffic or warmed.

The table's pages (store and ``.npy``) are evicted before every measured batch
(``benchmarks.common.evict``: this process's mappings dropped, then ``posix_fadvise
DONTNEED``), as on a table larger than the page cache; the bytes really read come from
``read_bytes`` in ``/proc/self/io``.  Ids: ``data.ids(..., "zipf1.1")``, a truncated Zipf
over ranks 1..rows (exact), ranks scattered over the table by a fixed permutation.

Four handles on the same store, their batches interleaved (the order rotating):

- no row cache (``cache_bytes=0``);
- a row cache filled by traffic: ``warmup`` batches (pages evicted before each) first;
- a row cache after ``warm(hottest)``, the table's ``slots`` hottest rows (what a frequency
  file gives: for a word embedding, the vocabulary's counts);
- a row cache after ``warm(sample)``, the ids of those same ``warmup`` batches of traffic.

Rows read per batch are the distinct ids not cached when the batch starts.  The
hottest-rows ideal: a cache holding the ``slots`` hottest rows for ever reads the batch's
distinct ids outside them.  Steady state: after ``steady`` more batches of traffic.
Each batch's result is checked against the ``.npy`` on ``CHECKED`` random positions (every
row would read 16,384 cold pages from it).
"""

from __future__ import annotations

import mmap
import time

import numpy as np

import embstore

from .. import data
from ..common import Measurement, compare, evict, fmt, log, read_bytes

NAME = "ooc-zipf"
TITLE = "Out of core, Zipf(1.1): the row cache filled by traffic or warmed"

NONE = "embstore, no row cache"
TRAFFIC = "embstore, row cache filled by traffic"
WARM = "embstore, row cache after warm(hottest rows)"
SAMPLE = "embstore, row cache after warm(sample of traffic)"
IDEAL = "hottest-rows cache (ideal, computed)"
CHECKED = 512  # rows of each batch checked against the .npy


def _cached(t) -> np.ndarray:
    c = t._cache  # (the ids the cache holds: to count the rows a batch must read)
    if getattr(c, "_slot_id", None) is None:
        return np.empty(0, dtype=np.int64)
    ids = c._slot_id[: c._filled]
    return ids[ids >= 0]


def _batch(t, ids, files, E):
    """(ms, MiB read, rows read) of one lookup with the pages evicted first."""
    rows = np.unique(ids[~np.isin(ids, _cached(t))]).size
    evict(files)
    b0 = read_bytes()
    t0 = time.perf_counter()
    out = t.lookup(ids)
    ms = (time.perf_counter() - t0) * 1e3
    b1 = read_bytes()
    check = np.random.default_rng(ids[:4]).integers(0, ids.size, CHECKED)
    if not np.array_equal(out[check], E[ids[check]]):  # (read outside the timed window)
        raise AssertionError(f"{t}: rows differ from the .npy")
    mib = (b1 - b0) / 2**20 if b0 is not None and b1 is not None else float("nan")
    return ms, mib, rows


def run(ctx, res) -> None:
    cfg = ctx.cfg["ooc-zipf"]
    rows, dim, n = cfg["rows"], cfg["dim"], cfg["ids"]
    budget = int(cfg["cache_bytes"])
    res.params = dict(cfg)
    npy = data.table_npy(ctx.data_dir, rows, dim)
    store = data.store(ctx.data_dir, npy)
    files = [store, npy]
    E = np.load(npy, mmap_mode="r")
    E._mmap.madvise(mmap.MADV_RANDOM)  # checked rows read a page each (no 8 MiB read-ahead)
    seed = iter(range(1000, 10**6))

    def batch():
        return data.ids(rows, (n,), "zipf1.1", seed=next(seed))

    tables = {NONE: embstore.open(store, cache_bytes=0)}
    for name in (TRAFFIC, WARM, SAMPLE):
        tables[name] = embstore.open(store, cache_bytes=budget)
    try:
        slots = tables[WARM]._cache.slots
        hottest = data.zipf_order(rows)[:slots]
        res.params.update(slots=slots, cached_fraction=round(slots / rows, 4))
        sample = []
        for _ in range(cfg["warmup"]):  # traffic fills one cache; its ids are the sample
            ids = batch()
            sample.append(ids)
            _batch(tables[TRAFFIC], ids, files, E)
        for name, hot in ((WARM, hottest), (SAMPLE, np.concatenate(sample))):
            evict(files)
            b0, t0 = read_bytes(), time.perf_counter()
            held = tables[name].warm(hot)
            s, b1 = time.perf_counter() - t0, read_bytes()
            mib = (b1 - b0) / 2**20 if b0 is not None and b1 is not None else float("nan")
            res.notes.append(f"{name}: warm() held {held:,} rows in {s:.1f} s, read "
                             f"{mib:,.0f} MiB")
            log(f"  {name}: warm() {held:,} rows, {s:.1f} s, {mib:,.0f} MiB")
        after = _measure(res, tables, batch, files, E, hottest, cfg["batches"], "after warm-up")
        for _ in range(cfg["steady"]):  # more traffic (not measured, pages evicted)
            ids = batch()
            for name in (TRAFFIC, WARM, SAMPLE):
                _batch(tables[name], ids, files, E)
        steady = _measure(res, tables, batch, files, E, hottest, cfg["batches"],
                          f"steady state (+{cfg['steady']} batches)")
        for name, t in tables.items():
            info = t.cache_info()
            res.notes.append(f"{name}: cache_info {tuple(info)}")
    finally:
        for t in tables.values():
            t.close()
    tag = f"{rows:,} x {dim}, {fmt(budget / 2**20, 'MiB')} cache ({slots:,} rows)"
    for when, m in (("after warm-up", after), ("steady state", steady)):
        compare(res, f"{tag}, {when}: warm() vs no cache, bytes read", m[WARM, "MiB"],
                m[NONE, "MiB"], target=("faster", 5 if when == "after warm-up" else None))
        compare(res, f"{tag}, {when}: warm() vs no cache, time per batch", m[WARM, "ms"],
                m[NONE, "ms"], target=("faster", 3 if when == "after warm-up" else None))
        compare(res, f"{tag}, {when}: warm() vs hottest-rows ideal, rows read",
                m[WARM, "rows"], m[IDEAL, "rows"],
                target=("within", 1.1) if when == "steady state" else None)
        for name in (TRAFFIC, SAMPLE):
            compare(res, f"{tag}, {when}: {name.split(', ', 1)[1]} vs no cache, bytes read",
                    m[name, "MiB"], m[NONE, "MiB"], target=("faster", None))
            compare(res, f"{tag}, {when}: {name.split(', ', 1)[1]} vs hottest-rows ideal, "
                    "rows read", m[name, "rows"], m[IDEAL, "rows"])


def _measure(res, tables, batch, files, E, hottest, nb, when) -> dict:
    got: dict = {(name, u): [] for name in (*tables, IDEAL) for u in ("ms", "MiB", "rows")}
    names = list(tables)
    for b in range(nb):
        ids = batch()
        got[IDEAL, "rows"].append(np.unique(ids[~np.isin(ids, hottest)]).size)
        for name in names[b % len(names):] + names[: b % len(names)]:  # rotate who goes first
            for u, v in zip(("ms", "MiB", "rows"), _batch(tables[name], ids, files, E)):
                got[name, u].append(v)
    out = {}
    for (name, unit), values in got.items():
        if not values:
            continue
        kind = "peer" if name == IDEAL else "embstore"
        m = Measurement(f"zipf(1.1), pages evicted, {when}, {unit}", name, kind, unit,
                        [float(v) for v in values])
        res.measurements.append(m)
        out[name, unit] = m
        log(f"  {when}: {name}: {fmt(m.median, unit)}")
    return out

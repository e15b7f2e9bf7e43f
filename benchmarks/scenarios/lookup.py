"""lookup: (32, 512) ids on a 1,000,000 x 256 float32 table, uniform and Zipf(1.1) ids.

embstore: MemoryTable; the on-disk table (default layout) with its row cache
cold (cleared before every call), off (``cache_bytes=0``), as ``open()`` gives it
(``cache_bytes`` not given: ``"auto"``) and warm (every batch looked up before timing);
the zstd layout, cold.  Peers: ``np.take`` in
RAM (the reference), ``E[ids]``, ``np.load(mmap_mode="r")[ids]``, zarr-python
``oindex`` and tensorstore on the very same stores.  The page cache is warm.
"""

from __future__ import annotations

import numpy as np

import embstore

from .. import data
from ..common import Method, Skip, Warmer, compare, interleave
from . import peers

NAME = "lookup"
TITLE = "Row lookup by id"

MEM = "MemoryTable.lookup"
COLD = "embstore on-disk, cold row cache"
OFF = "embstore on-disk, no row cache"
DEFAULT = "embstore on-disk, default open()"
WARM = "embstore on-disk, warm row cache"
ZSTD = "embstore on-disk zstd, cold row cache"
TAKE = "np.take in RAM"
FANCY = "E[ids] in RAM"
MMAP = "np.load(mmap_mode='r')[ids]"
ZARR = "zarr-python oindex"
TS = "tensorstore"
ZARR_Z = "zarr-python oindex, zstd store"
TS_Z = "tensorstore, zstd store"


def run(ctx, res) -> None:
    cfg = ctx.cfg["lookup"]
    rows, dim, shape = cfg["rows"], cfg["dim"], tuple(cfg["ids"])
    reps, slow, nb = cfg["reps"], cfg["slow_reps"], cfg["batches"]
    res.params = {"rows": rows, "dim": dim, "dtype": "float32", "ids_shape": list(shape),
                  "distributions": ["uniform", "zipf(1.1)"], "reps": reps,
                  "reps_zarr_python": slow, "reps_tensorstore": cfg["ts_reps"],
                  "batches_per_distribution": nb}
    npy = data.table_npy(ctx.data_dir, rows, dim)
    E = data.load_in_ram(npy)

    tables, stores, opened = {}, {}, []
    stores["none"] = data.store(ctx.data_dir, npy)
    stores["zstd"] = data.store(ctx.data_dir, npy, compression="zstd")
    tables[MEM] = embstore.MemoryTable(E)
    row_bytes = dim * 4
    warm_bytes = max(256 << 20, int(1.5 * nb * int(np.prod(shape)) * row_bytes))
    for name, path, cache in ((COLD, stores["none"], "256MiB"), (OFF, stores["none"], 0),
                              (WARM, stores["none"], warm_bytes), (ZSTD, stores["zstd"], "256MiB")):
        tables[name] = embstore.open(path, mode="r", cache_bytes=cache)
        opened.append(tables[name])
    tables[DEFAULT] = embstore.open(stores["none"])  # what a user gets
    opened.append(tables[DEFAULT])
    res.params["default_cache_bytes"] = tables[DEFAULT].cache_info().capacity_bytes
    res.params["warm_cache_bytes"] = warm_bytes

    warmer = Warmer([npy, *stores.values()])
    try:
        for dist in ("uniform", "zipf"):
            batches = [data.ids(rows, shape, dist + ("1.1" if dist == "zipf" else ""), seed=s)
                       for s in range(nb)]
            _one(ctx, res, dist, E, npy, tables, stores, batches, reps, slow, cfg["ts_reps"], warmer)
    finally:
        for t in opened:
            t.close()


def _one(ctx, res, dist, E, npy, tables, stores, batches, reps, slow, ts_reps, warmer) -> None:
    cur = {"ids": batches[0]}

    def on_rep(r: int) -> None:
        cur["ids"] = batches[r % len(batches)]

    def check(out):
        ids = cur["ids"]
        if out.shape != ids.shape + (E.shape[1],) or not np.array_equal(out, E[ids]):
            raise AssertionError("rows differ from E[ids]")

    def method(name, kind, fn_of_ids, **kw):
        return Method(name, kind, lambda: fn_of_ids(cur["ids"]), check=check, **kw)

    methods = [method(TAKE, "peer", peers.np_take(E)), method(MEM, "embstore", tables[MEM].lookup),
               method(FANCY, "peer", peers.fancy(E)), method(MMAP, "peer", peers.memmap(npy))]
    if COLD in tables:
        cold, off, warm, zstd = tables[COLD], tables[OFF], tables[WARM], tables[ZSTD]
        for b in batches + batches:  # warm: every batch has been looked up before
            warm.lookup(b)
        hits0 = warm.cache_info()
        methods += [
            method(COLD, "embstore", cold.lookup, before=cold.cache_clear),
            method(OFF, "embstore", off.lookup),
            method(DEFAULT, "embstore", tables[DEFAULT].lookup),
            method(WARM, "embstore", warm.lookup,
                   extra=lambda: _hit_rate(hits0, warm.cache_info())),
            method(ZSTD, "embstore", zstd.lookup, before=zstd.cache_clear),
        ]
        small = batches[0].reshape(-1)[:64]
        for name, make, path, k in ((ZARR, peers.zarr_python, stores["none"], slow),
                                    (TS, peers.tensorstore, stores["none"], ts_reps),
                                    (ZARR_Z, peers.zarr_python, stores["zstd"], slow),
                                    (TS_Z, peers.tensorstore, stores["zstd"], ts_reps)):
            try:
                fn = make(path)
            except Skip as exc:
                res.notes.append(f"{dist}: {name}: skipped: {exc}")
                continue
            # warm-up on a few ids only (these peers take up to seconds per call)
            methods.append(Method(name, "peer", lambda fn=fn: fn(cur["ids"]), reps=k, check=check,
                                  warmup=lambda fn=fn: fn(small)))
    warmer.warm()
    found = interleave(res, dist, methods, reps=reps, warmer=warmer, on_rep=on_rep)
    g = found.get
    label = f"lookup {dist}"
    compare(res, f"{label}: default open() vs cache_bytes=0", g(DEFAULT), g(OFF),
            target=("within", 1.05))
    compare(res, f"{label}: default open() vs memmap", g(DEFAULT), g(MMAP),
            target=("within", 1.1))
    if dist == "uniform":
        compare(res, f"{label}: MemoryTable vs np.take", g(MEM), g(TAKE), target=("within", 1.1))
        compare(res, f"{label}: on-disk (row cache empty) vs memmap", g(COLD), g(MMAP),
                target=("within", 2))
        compare(res, f"{label}: on-disk vs zarr-python, same store", g(COLD), g(ZARR),
                target=("faster", 100))
        compare(res, f"{label}: on-disk vs tensorstore, same store", g(COLD), g(TS),
                target=("faster", 10))
        compare(res, f"{label}: zstd layout vs tensorstore, same store", g(ZSTD), g(TS_Z),
                target=("faster", 3))
        compare(res, f"{label}: zstd layout vs zarr-python, same store", g(ZSTD), g(ZARR_Z),
                target=("faster", None))
        compare(res, f"{label}: on-disk, no row cache vs memmap", g(OFF), g(MMAP))
    else:
        compare(res, f"{label}: MemoryTable vs np.take", g(MEM), g(TAKE), target=("within", 1.1))
        compare(res, f"{label}: on-disk warm row cache vs np.take", g(WARM), g(TAKE),
                target=("within", 1.5))
        compare(res, f"{label}: on-disk (row cache empty) vs memmap", g(COLD), g(MMAP))
        compare(res, f"{label}: on-disk vs tensorstore, same store", g(COLD), g(TS),
                target=("faster", None))


def _hit_rate(before, after) -> dict:
    hits, misses = after.hits - before.hits, after.misses - before.misses
    return {"cache_hits": hits, "cache_misses": misses,
            "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None}

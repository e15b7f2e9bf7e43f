"""scale: the same (32, 512) uniform lookup on tables of growing row count.

A lookup touches a fixed number of rows, so its cost should not grow with the
table.  Compared with the memory map of the same ``.npy`` at every size, which
grows only by the hardware's own effects (TLB and cache misses over more memory).
"""

from __future__ import annotations

import embstore

from .. import data
from ..common import Comparison, Method, Warmer, compare, interleave
from . import peers

NAME = "scale"
TITLE = "Lookup cost against table size"

TAKE = "np.take in RAM"
MMAP = "np.load(mmap_mode='r')[ids]"
COLD = "embstore on-disk, cold row cache"


def run(ctx, res) -> None:
    cfg = ctx.cfg["scale"]
    sizes, dim, shape, reps = cfg["rows"], cfg["dim"], tuple(cfg["ids"]), cfg["reps"]
    res.params = {"rows": sizes, "dim": dim, "dtype": "float32", "ids_shape": list(shape),
                  "distribution": "uniform", "reps": reps}
    if cfg.get("note"):
        res.notes.append(cfg["note"])
    medians: dict[str, dict[int, float]] = {TAKE: {}, MMAP: {}, COLD: {}}
    for rows in sizes:
        case = f"{rows:,} rows"
        npy = data.table_npy(ctx.data_dir, rows, dim)
        E = data.load_in_ram(npy)
        paths = [npy]
        table = None
        path = data.store(ctx.data_dir, npy)
        paths.append(path)
        table = embstore.open(path, mode="r", cache_bytes="256MiB")
        batches = [data.ids(rows, shape, "uniform", seed=s) for s in range(cfg["batches"])]
        cur = {"ids": batches[0]}

        def on_rep(r, cur=cur, batches=batches):
            cur["ids"] = batches[r % len(batches)]

        def check(out, E=E, cur=cur):
            if not (out.shape == cur["ids"].shape + (E.shape[1],) and (out == E[cur["ids"]]).all()):
                raise AssertionError("rows differ from E[ids]")

        def method(name, kind, fn, **kw):
            return Method(name, kind, lambda: fn(cur["ids"]), check=check, **kw)

        methods = [method(TAKE, "peer", peers.np_take(E)), method(MMAP, "peer", peers.memmap(npy))]
        if table is not None:
            methods.append(method(COLD, "embstore", table.lookup, before=table.cache_clear))
        warmer = Warmer(paths)
        warmer.warm()
        try:
            found = interleave(res, case, methods, reps=reps, warmer=warmer, on_rep=on_rep)
        finally:
            if table is not None:
                table.close()
            del E
        for name, m in found.items():
            medians[name][rows] = m.median
        compare(res, f"scale {case}: on-disk vs memmap", found.get(COLD), found.get(MMAP))
    small, big = min(sizes), max(sizes)
    if small != big and all(small in medians[n] and big in medians[n] for n in (COLD, MMAP)):
        grow_e = medians[COLD][big] / medians[COLD][small]
        grow_m = medians[MMAP][big] / medians[MMAP][small]
        res.comparisons.append(Comparison(
            f"scale: cost growth {small:,} -> {big:,} rows", f"{grow_e:.2f}x (on-disk)",
            f"{grow_m:.2f}x (memmap)", grow_e / grow_m, f"{grow_e / grow_m:.2f}x",
            "does not grow with the table (<= 1.25x the memmap's growth)",
            grow_e <= 1.25 * grow_m))

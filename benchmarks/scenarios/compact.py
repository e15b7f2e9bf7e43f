"""compact: the same 1,000,000 x 256 table stored float32, bfloat16 and int8 (row-wise).

Size on disk; warm lookups of (32, 512) uniform ids (page cache warm, no row cache and
the default row cache); cold batches (every file of the store evicted from the page cache
with ``posix_fadvise(DONTNEED)`` and the table reopened before each batch): bytes really
read (``read_bytes`` of ``/proc/self/io``) and time.  Accuracy of int8 on real vectors
(gensim's Lee-corpus word vectors): error against half a step, mean cosine, top-10
neighbour overlap.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import numpy as np

from .. import data
from ..common import Measurement, Method, Warmer, absolute, compare, drop_page_cache, interleave

NAME = "compact"
TITLE = "Compact storage: bfloat16 and int8 against float32"

DTYPES = ("float32", "bfloat16", "int8")


def _store(ctx, npy: Path, dtype: str) -> Path:
    if dtype == "float32":
        return data.store(ctx.data_dir, npy)
    import embstore
    path = Path(ctx.data_dir) / f"{npy.stem}-{dtype}.embstore"
    if not path.exists():
        arr = np.load(npy, mmap_mode="r", allow_pickle=False)
        embstore.save(path, arr, dtype=dtype, overwrite=True).close()
    return path


def _read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise OSError("no read_bytes in /proc/self/io")


def _stored(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(ctx, res) -> None:
    import embstore

    cfg = ctx.cfg["compact"]
    rows, dim, shape, reps = cfg["rows"], cfg["dim"], tuple(cfg["ids"]), cfg["reps"]
    cold_batches = cfg["cold_batches"]
    res.params = {"rows": rows, "dim": dim, "ids_shape": list(shape), "reps": reps,
                  "cold_batches": cold_batches}
    npy = data.table_npy(ctx.data_dir, rows, dim)
    stores = {dt: _store(ctx, npy, dt) for dt in DTYPES}

    size = {dt: _stored(p) for dt, p in stores.items()}
    for dt in DTYPES:
        res.measurements.append(Measurement("size", f"{dt} on disk", "embstore", "MB",
                                            [size[dt] / 1e6]))
    for dt, limit in (("int8", 0.27), ("bfloat16", 0.51)):
        r = size[dt] / size["float32"]
        c = absolute(res, f"size: {dt} / float32", res.find("size", f"{dt} on disk"),
                     at_most=limit * size["float32"] / 1e6)
        if c is not None:
            c.embstore, c.target = f"{r:.3f}x ({size[dt] / 1e6:,.0f} MB)", f"<= {limit}x"

    # warm: page cache warm, interleaved
    ids = {"batch": data.ids(rows, shape, "uniform", seed=1)}
    tables, methods = [], []
    for dt in DTYPES:
        for cache, label in ((0, "no row cache"), ("256MiB", "row cache")):
            t = embstore.open(stores[dt], cache_bytes=cache)
            tables.append(t)
            methods.append(Method(f"{dt}, {label}", "embstore",
                                  (lambda t=t: t.lookup(ids["batch"]))))

    def on_rep(r):
        ids["batch"] = data.ids(rows, shape, "uniform", seed=100 + r % cfg["batches"])

    try:
        found = interleave(res, "warm uniform", methods, reps=reps,
                           warmer=Warmer(list(stores.values())), on_rep=on_rep)
    finally:
        for t in tables:
            t.close()
    for label in ("no row cache", "row cache"):
        for dt in ("int8", "bfloat16"):
            compare(res, f"warm uniform, {label}: {dt} vs float32", found.get(f"{dt}, {label}"),
                    found.get(f"float32, {label}"),
                    target=("within", 1.3) if dt == "int8" else None)

    # cold: evict, reopen, one batch; bytes read and time
    cold = {dt: ([], []) for dt in DTYPES}
    for b in range(cold_batches):
        batch = data.ids(rows, shape, "uniform", seed=200 + b)
        for dt in DTYPES:
            gc.collect()
            drop_page_cache([stores[dt]])
            with embstore.open(stores[dt], cache_bytes=0) as t:
                r0, t0 = _read_bytes(), time.perf_counter()
                t.lookup(batch)
                cold[dt][1].append((time.perf_counter() - t0) * 1e3)
                cold[dt][0].append((_read_bytes() - r0) / 2**20)
    for dt in DTYPES:
        res.measurements.append(Measurement("cold uniform", f"{dt}, bytes read", "embstore",
                                            "MiB", cold[dt][0]))
        res.measurements.append(Measurement("cold uniform", f"{dt}, time", "embstore", "ms",
                                            cold[dt][1]))
    f = res.find
    compare(res, "cold batch, bytes read: int8 vs float32", f("cold uniform", "int8, bytes read"),
            f("cold uniform", "float32, bytes read"), target=("within", 0.3))
    compare(res, "cold batch, bytes read: bfloat16 vs float32",
            f("cold uniform", "bfloat16, bytes read"), f("cold uniform", "float32, bytes read"))
    compare(res, "cold batch, time: int8 vs float32", f("cold uniform", "int8, time"),
            f("cold uniform", "float32, time"), target=("faster", 2))
    _accuracy(res)


def _accuracy(res) -> None:
    """int8 on the Lee-corpus word vectors shipped with embstore (gensim's test data)."""
    import tempfile

    import embstore
    lee = Path(embstore.__file__).parent / "data" / "lee_word2vec.txt"
    with tempfile.TemporaryDirectory() as d:
        embstore.import_file(lee, Path(d) / "f32")
        embstore.import_file(lee, Path(d) / "i8", dtype="int8")
        with embstore.open(Path(d) / "f32") as t32, embstore.open(Path(d) / "i8") as t8:
            x, y = t32.to_numpy().astype(np.float64), t8.to_numpy()
            _, scale, _ = t8.raw(np.arange(t8.vocab_size))
            half = 0.5 * scale[:, None]
            err = np.abs(y - x)
            worst = float(np.max(err / np.where(half > 0, half, 1)))
            n = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
            cos = float(np.mean(np.sum(x * y, axis=1)[n > 0] / n[n > 0]))
            q = np.arange(0, min(500, t8.vocab_size))
            a, _ = embstore.Embedding(t32).most_similar(q, k=10)
            b, _ = embstore.Embedding(t8).most_similar(q, k=10)
            overlap = float(np.mean([len(set(u) & set(v)) / 10
                                     for u, v in zip(a.tolist(), b.tolist())]))
    for label, value, unit in (("worst error / half step", worst, "x"),
                               ("mean cosine int8 vs float32", cos, "cos"),
                               ("top-10 overlap with float32", overlap, "share")):
        m = Measurement("accuracy (Lee word vectors)", label, "embstore", unit, [value])
        res.measurements.append(m)
    f = res.find
    case = "accuracy (Lee word vectors)"
    for label, name, bound, value in (
            ("int8: worst error in half steps of its row", "worst error / half step",
             {"at_most": 1.0 + 1e-4}, worst),
            ("int8: mean cosine with float32", "mean cosine int8 vs float32",
             {"at_least": 0.999}, cos),
            ("int8: top-10 most_similar overlap", "top-10 overlap with float32",
             {"at_least": 0.9}, overlap)):
        c = absolute(res, label, f(case, name), **bound)
        if c is not None:
            c.embstore = f"{value:.5f}"
            c.target = f"{'<=' if 'at_most' in bound else '>='} {next(iter(bound.values())):g}"

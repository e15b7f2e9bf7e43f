"""Quick side-by-side lookup timings on one machine, in one run (medians, ms).

    python tools/bench_lookup.py [--rows 1000000] [--dim 256] [--dir /tmp/embstore-bench]
                                 [--compression none] [--slow-reps 3]

Builds (once) a random float32 table as .npy and as an embstore table, then times
(32, 512) uniform and Zipf(1.1) ids: np.take in RAM, np.load(mmap_mode="r")[ids],
embstore without row cache, embstore with a warm row cache (Zipf), tensorstore and
zarr-python reading the same store.  Pages are warmed right before each timing.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def timeit(f, reps: int) -> float:
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def zipf_ids(rng, a: float, rows: int, shape) -> np.ndarray:
    ids = rng.zipf(a, size=int(np.prod(shape)) * 2) - 1
    ids = ids[ids < rows][: int(np.prod(shape))]
    return rng.permutation(rows)[ids].reshape(shape)  # popular rows spread over the table


def main() -> None:
    import embstore
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--dir", default="/tmp/embstore-bench")
    ap.add_argument("--compression", default="none")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--slow-reps", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    npy = os.path.join(args.dir, f"E_{args.rows}_{args.dim}.npy")
    if not os.path.exists(npy):
        rng = np.random.default_rng(0)
        E = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float32,
                                      shape=(args.rows, args.dim))
        for s in range(0, args.rows, 65536):
            E[s: s + 65536] = rng.standard_normal((min(65536, args.rows - s), args.dim),
                                                  dtype=np.float32)
        E.flush()
        del E
    path = os.path.join(args.dir, f"T_{args.rows}_{args.dim}_{args.compression}")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        embstore.save(path, np.load(npy, mmap_mode="r"), compression=args.compression).close()
        print(f"save: {time.perf_counter() - t0:.1f} s")
    Emm = np.load(npy, mmap_mode="r")
    Eram = np.load(npy)
    rng = np.random.default_rng(1)
    uni = rng.integers(0, args.rows, size=(32, 512))
    zipf = zipf_ids(rng, 1.1, args.rows, (32, 512))
    out = np.empty(uni.shape + (args.dim,), np.float32)
    t = embstore.open(path, cache_bytes=0)
    print(t.layout)
    _ = t.to_numpy() if args.rows * args.dim * 4 < (4 << 30) else None  # warm pages + crc
    res = {}
    for name, ids in (("uniform", uni), ("zipf", zipf)):
        flat = ids.reshape(-1)
        res[name, "np.take RAM"] = timeit(
            lambda: np.take(Eram, flat, axis=0, out=out.reshape(-1, args.dim), mode="clip"),
            args.reps)
        res[name, "np.load mmap [ids]"] = timeit(lambda: Emm[ids], args.reps)
        res[name, "embstore no cache"] = timeit(lambda: t.lookup(ids), args.reps)
    tc = embstore.open(path, cache_bytes="256MiB")
    tc.lookup(zipf)
    res["zipf", "embstore warm cache"] = timeit(lambda: tc.lookup(zipf), args.reps)
    info = tc.cache_info()
    try:
        import tensorstore as ts
        store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file",
                                                        "path": os.path.join(path, "vectors")}},
                        read=True).result()
        res["uniform", "tensorstore"] = timeit(
            lambda: store[ts.d[0].translate_to[0]][uni.reshape(-1)].read().result(),
            args.slow_reps)
    except ImportError:
        pass
    import zarr
    za = zarr.open_array(os.path.join(path, "vectors"), mode="r")
    res["uniform", "zarr-python oindex"] = timeit(lambda: za.oindex[uni.reshape(-1)],
                                                  args.slow_reps)
    base = res["uniform", "np.load mmap [ids]"]
    for (kind, name), ms in res.items():
        print(f"{kind:8s} {name:24s} {ms:10.2f} ms   {ms / base:7.2f} x np memmap")
    print(info)


if __name__ == "__main__":
    main()

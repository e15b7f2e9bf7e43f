"""train: training an embedding table (issue 40) against PyTorch's own sparse training.

A (rows, dim) float32 table, ``ids`` lookups a step (uniform, and Zipf 1.05 over a
scattered permutation of the rows), loss = the sum of squares of the looked-up rows:

- **embstore**: ``embstore.torch.Embedding(table, optimizer="rowwise_adagrad")`` over the
  on-disk table opened ``"r+"`` (in the page cache), the row cache holding the table, the
  next batch's rows prefetched; the optimizer runs in the backward.
- **PyTorch**: ``nn.Embedding(rows, dim, sparse=True)`` (the table in RAM) +
  ``torch.optim.Adagrad`` (a dense state the table's size), the same ids and loss.

Steps a second, the two paired and interleaved (repetitions of ``steps`` steps each,
alternating).  The bar: embstore at least 0.9x PyTorch's steps a second.  The
checkpoint after the run (every dirty row written back as deltas, one commit of rows and
one of state) is timed once and reported.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # (run as a file: the repository on the path)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import data  # noqa: E402
from benchmarks.common import Measurement, Skip, compare, log  # noqa: E402

NAME = "train"
TITLE = "Training a table: embstore rowwise Adagrad vs nn.Embedding(sparse) + optim.Adagrad"

EMB = "embstore.torch.Embedding, rowwise_adagrad, on disk (r+)"
TORCH = "nn.Embedding(sparse=True) + optim.Adagrad"


def _steps(fn, batches) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for i, ids in enumerate(batches):  # a loop per step
        fn(ids, batches[i + 1] if i + 1 < len(batches) else None)
    return len(batches) / (time.perf_counter() - t0)


def run(ctx, res) -> None:
    try:
        import torch

        import embstore
        import embstore.torch as et
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from None
    cfg = ctx.cfg["train"]
    rows, dim, n_ids, steps, reps = (cfg["rows"], cfg["dim"], cfg["ids"], cfg["steps"],
                                     cfg["reps"])
    res.params = {"rows": rows, "dim": dim, "ids": n_ids, "steps": steps, "reps": reps,
                  "torch_threads": torch.get_num_threads()}
    npy = data.table_npy(ctx.data_dir, rows, dim)
    base = data.store(ctx.data_dir, npy)
    work = Path(ctx.scratch) / "train.embstore"
    for dist in ("uniform", "zipf1.05"):  # a loop per id distribution
        case = f"{rows:,} x {dim}, {n_ids:,} ids a step, {dist}"
        ids = data.ids(rows, (reps + 1, steps, n_ids), dist, seed=3)
        batches = [[torch.from_numpy(b) for b in rep] for rep in ids]
        if work.exists():
            shutil.rmtree(work)
        subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(work)], check=True)
        emb = et.Embedding(embstore.open(work, mode="r+", cache_bytes=0),
                           optimizer="rowwise_adagrad", lr=0.01)
        ref = torch.nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(np.load(npy)))
        opt = torch.optim.Adagrad(ref.parameters(), lr=0.01)

        def ours(b, nxt):
            out = emb(b)
            if nxt is not None:
                emb.prefetch(nxt)
            out.pow(2).sum().backward()

        def theirs(b, nxt):
            opt.zero_grad()
            ref(b).pow(2).sum().backward()
            opt.step()

        _steps(ours, batches[0])  # warm-up: the row cache fills, buffers settle
        _steps(theirs, batches[0])
        got: dict[str, list[float]] = {EMB: [], TORCH: []}
        for r in range(reps):  # a loop per repetition, interleaved
            got[EMB].append(_steps(ours, batches[1 + r]))  # the same ids for both
            got[TORCH].append(_steps(theirs, batches[1 + r]))
        t0 = time.perf_counter()
        version = emb.checkpoint()
        ckpt = time.perf_counter() - t0
        stats = dict(emb.trainer.cache.stats)
        emb.close()
        emb.table.close()
        del ref, opt
        for method, vals in got.items():
            kind = "embstore" if method == EMB else "peer"
            extra = {"checkpoint_s": round(ckpt, 2), "version": version,
                     "cache": stats} if kind == "embstore" else {}
            res.measurements.append(Measurement(case, method, kind, "steps/s", vals, extra))
        log(f"train {dist}: embstore {np.median(got[EMB]):.1f} steps/s, torch "
            f"{np.median(got[TORCH]):.1f} steps/s; checkpoint {ckpt:.1f} s")
        compare(res, f"steps/s, {dist}: embstore vs {TORCH}", res.find(case, EMB),
                res.find(case, TORCH), target=("atleast", 0.9))
        res.notes.append(f"{dist}: checkpoint after {(reps + 1) * steps} steps (every "
                         f"dirty row written back, then committed) took {ckpt:.1f} s")
    shutil.rmtree(work, ignore_errors=True)


# -- larger than memory: ``python -m benchmarks.scenarios.train --larger-than-ram`` --------
# (benchmarks/scenarios/train_big.py: two long-lived children, paired and interleaved)

# -- lazy init: ``python -m benchmarks.scenarios.train --lazy-create`` -----------------------
#
# create(init=) of a 10^8 x 64 float32 table (25.6 GB of rows) against create() of zeros
# (holes with their page checksums), in one run, alternated; bytes on disk of each; then a
# gather of 8,192 uniform ids from the never-written table (rows generated) against the
# same ids from a stored table of 2^20 rows (page cache warm).

def lazy_create(work: Path, out: Path, rows: int = 10 ** 8, dim: int = 64, reps: int = 3
                ) -> dict:
    import embstore
    from embstore.fs.copytree import disk_usage
    embstore.create(work / "warm", shape=(1000, dim), init="normal", overwrite=True).close()
    got: dict = {"lazy_s": [], "zeros_s": []}
    for i in range(reps):  # a loop per repetition, the two alternated
        for kind in ("lazy", "zeros"):
            path = work / f"{kind}-{i}.embstore"
            t0 = time.perf_counter()
            embstore.create(path, shape=(rows, dim), overwrite=True,
                            init={"kind": "normal", "seed": i} if kind == "lazy" else None
                            ).close()
            got[f"{kind}_s"].append(time.perf_counter() - t0)
            got[f"{kind}_disk_bytes"] = disk_usage(path)
            if i + 1 < reps:
                shutil.rmtree(path)
    ids = np.random.default_rng(0).integers(0, rows, 8192)
    small = np.random.default_rng(1).standard_normal((1 << 20, dim)).astype(np.float32)
    stored = embstore.save(work / "stored.embstore", small, overwrite=True)
    lazy = embstore.open(work / f"lazy-{reps - 1}.embstore", cache_bytes=0)
    for name, t, ii in (("gather_lazy_s", lazy, ids), ("gather_stored_s", stored,
                                                       ids % (1 << 20))):
        t[ii]
        times = []
        for _ in range(5):  # a loop per repetition
            t0 = time.perf_counter()
            t[ii]
            times.append(time.perf_counter() - t0)
        got[name] = float(np.median(times))
    lazy.close()
    stored.close()
    res = {"rows": rows, "dim": dim, "load": os.getloadavg(), **got,
           "lazy_s_median": float(np.median(got["lazy_s"])),
           "zeros_s_median": float(np.median(got["zeros_s"]))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    mib = 1 << 20
    lines = [f"# Lazy init ({_dt.date.today().isoformat()})", "",
             f"`python -m benchmarks.scenarios.train --lazy-create`: create a {rows:,} x {dim} "
             f"float32 table ({rows * dim * 4 / 2**30:,.1f} GiB of rows), {reps} times each, "
             f"alternated; load average {res['load'][0]:.1f} on 2 cores.", "",
             "| create | median s | on disk |", "|---|---|---|",
             f"| init='normal' (nothing written) | {res['lazy_s_median']:.2f} | "
             f"{got['lazy_disk_bytes'] / mib:,.1f} MiB |",
             f"| zeros (holes, page checksums written) | {res['zeros_s_median']:.2f} | "
             f"{got['zeros_disk_bytes'] / mib:,.1f} MiB |", "",
             f"8,192 uniform ids: never-written rows generated in "
             f"{got['gather_lazy_s'] * 1e3:.0f} ms, stored rows (warm, 2^20 rows) "
             f"{got['gather_stored_s'] * 1e3:.1f} ms."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return res


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--larger-than-ram" in argv:  # (the interleaved run of train_big; its options)
        from benchmarks.scenarios import train_big
        train_big.main([x for x in argv if x != "--larger-than-ram"])
        return
    p = argparse.ArgumentParser(description="training benchmarks outside the runner")
    p.add_argument("--larger-than-ram", action="store_true",
                   help="the table 3x a memory cgroup's limit, paired and interleaved with "
                        "the in-RAM baseline (root; minutes; see train_big --help)")
    p.add_argument("--work", type=Path, default=Path("/tmp/embstore-train-big"))
    p.add_argument("--out", type=Path, default=None, help="results file stem")
    p.add_argument("--lazy-create", action="store_true",
                   help="create(init=) of 10^8 x 64 against zeros (seconds, bytes on disk)")
    a = p.parse_args(argv)
    if a.lazy_create:
        a.work.mkdir(parents=True, exist_ok=True)
        out = a.out or (Path(__file__).resolve().parents[1] / "results" /
                        f"{_dt.date.today().isoformat()}-train-lazy-init")
        lazy_create(a.work / "lazy", out)
        print(out.with_suffix(".md").read_text())
        return
    p.print_help()


if __name__ == "__main__":
    main()

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

import gc
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from .. import data
from ..common import Measurement, Skip, compare, log

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

"""waits: where a process still waits (CLI start-up, first touch of pages, row-cache misses).

- CLI start-up: wall time of fresh ``embstore --help`` and ``embstore info TABLE``
  processes (bytecode caches warm), beside ``python -c pass`` and ``python -c "import
  click"`` (the floor of any click CLI) in the same run.
- Fresh process, both files' page caches filled the same way (read sequentially right
  before): open + a first (32, 512) batch of uniform or Zipf 1.1 ids, a second batch of new
  ids, the second batch again; embstore (``cache_bytes=0``) against ``np.load(mmap_mode=
  "r")[ids]``; the page checks' own time (``PageChecks.check``) is reported beside.
- One warm process drawing new (32, 512) ids each call (the first call untimed):
  ``cache_bytes=0`` and ``cache_bytes="256MiB"`` against the memmap, uniform and Zipf 1.1.
- word2vec binary, ``w2v_rows`` x 100 (300,000 in full) via the command line, start-up
  included (the child times ``main()``: the command's lazy imports, NumPy's too): ``embstore
  export TABLE DEST`` against gensim ``save_word2vec_format`` of the same vectors and keys
  (loaded before its clock starts), ``embstore import`` against ``load_word2vec_format``;
  each export checked byte for byte against the file of its layout.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from .. import data
from ..children import child_method_runs, run_child
from ..common import ROOT, Measurement, Method, Warmer, absolute, compare, interleave

NAME = "waits"
TITLE = "Where a process still waits: start-up, first touch, row-cache misses"

MEMMAP = "np.load(mmap_mode='r')[ids]"
EMB = "embstore, cache_bytes=0"
CACHED = "embstore, cache_bytes='256MiB'"


def _wall(argv: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # users have bytecode caches
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def _startup(res, table, reps: int) -> None:
    py = sys.executable
    runs = {"embstore --help": [py, "-m", "embstore", "--help"],
            "embstore info TABLE": [py, "-m", "embstore", "info", str(table)],
            'python -c "import click"': [py, "-c", "import click"],
            "python -c pass": [py, "-c", "pass"]}
    for argv in runs.values():  # bytecode caches written, files in the page cache
        _wall(argv)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(reps):
        names = list(runs)[r % len(runs):] + list(runs)[: r % len(runs)]
        for name in names:  # interleaved, a fresh process each
            times[name].append(_wall(runs[name]))
    case = "CLI start-up, fresh process, bytecode caches warm"
    for name, values in times.items():
        kind = "embstore" if name.startswith("embstore") else "peer"
        res.measurements.append(Measurement(case, name, kind, "s", values))
    f = res.find
    absolute(res, "embstore --help", f(case, "embstore --help"), at_most=0.15)
    absolute(res, "embstore info TABLE", f(case, "embstore info TABLE"), at_most=0.15)
    compare(res, "embstore --help vs a bare click start-up", f(case, "embstore --help"),
            f(case, 'python -c "import click"'))


def _fresh(ctx, res, npy, table, rows: int, reps: int, warmer) -> None:
    for dist in ("uniform", "zipf1.1"):
        ids = data.ids(rows, (2, 32, 512), dist, seed=11)
        path = ctx.scratch / f"waits-ids-{dist}.npy"
        np.save(path, ids)
        case = f"fresh process, open + (32, 512) {dist} ids, page caches filled alike"
        runs = {EMB: ("embstore", lambda p=path: run_child("fresh-batches", "embstore", table, p)),
                MEMMAP: ("peer", lambda p=path: run_child("fresh-batches", "memmap", npy, p))}
        done = child_method_runs(res, case, runs, reps=reps, warmer=warmer)
        for name, datas in done.items():  # the later batches and the checks, from the same runs
            kind = runs[name][0]
            for key, label in (("second_s", "second batch, new ids"),
                               ("again_s", "second batch again"),
                               ("checks_s", "page checks of both batches")):
                values = [d[key] for d in datas if key in d]
                if values:
                    res.measurements.append(Measurement(f"{case}: {label}", name, kind, "s",
                                                        values))
        f = res.find
        compare(res, f"fresh {dist}: open + first batch vs the memmap", f(case, EMB),
                f(case, MEMMAP), target=("within", 1.5))
        for label, bar in (("second batch, new ids", 1.5), ("second batch again", 1.1)):
            compare(res, f"fresh {dist}: {label} vs the memmap", f(f"{case}: {label}", EMB),
                    f(f"{case}: {label}", MEMMAP), target=("within", bar))


def _warm(res, npy, table, rows: int, reps: int, warmer) -> None:
    import embstore

    mm = np.load(npy, mmap_mode="r")
    for dist in ("uniform", "zipf1.1"):
        t0 = embstore.open(table, cache_bytes=0)
        t256 = embstore.open(table, cache_bytes="256MiB")
        batches = data.ids(rows, (reps + 1, 32, 512), dist, seed=23)
        cur: dict[str, np.ndarray] = {}

        def pick(r: int) -> None:
            cur["ids"] = batches[r + 1]  # (batch 0: the untimed first call of each method)

        case = f"one warm process, new (32, 512) {dist} ids each call"
        methods = [Method(MEMMAP, "peer", lambda: mm[cur["ids"]],
                          warmup=lambda: mm[batches[0]]),
                   Method(EMB, "embstore", lambda: t0[cur["ids"]], warmup=lambda: t0[batches[0]]),
                   Method(CACHED, "embstore", lambda: t256[cur["ids"]],
                          warmup=lambda: t256[batches[0]])]
        found = interleave(res, case, methods, reps=reps, warmer=warmer, on_rep=pick)
        np.testing.assert_array_equal(t256[batches[-1]], mm[batches[-1]])
        res.notes.append(f"{case}: 256 MiB cache {t256.cache_info()}")
        t0.close()
        t256.close()
        compare(res, f"warm {dist}: cache_bytes=0 vs the memmap", found.get(EMB),
                found.get(MEMMAP), target=("within", 1.5))
        compare(res, f"warm {dist}: 256 MiB row cache vs the memmap", found.get(CACHED),
                found.get(MEMMAP), target=("within", 1.5))
        compare(res, f"warm {dist}: 256 MiB row cache vs cache_bytes=0", found.get(CACHED),
                found.get(EMB), target=("faster", 1.0) if dist != "uniform" else ("within", 1.0))


def _word2vec(ctx, res, rows: int, reps: int) -> None:
    dim = 100
    _, npy = data.w2v_text(ctx.data_dir, rows, dim)
    c_bin = data.w2v_binary(ctx.data_dir, rows, dim, newline=True)
    g_bin = data.w2v_binary(ctx.data_dir, rows, dim, newline=False)
    table = data.store(ctx.data_dir, npy, with_keys=True)
    dest = ctx.scratch / "waits-w2v.out"

    def clean():
        if dest.is_dir():
            shutil.rmtree(dest)
        elif dest.exists():
            dest.unlink()

    size = f"{rows:,} x {dim}"
    export = f"word2vec binary export, {size}, via the CLI (start-up included)"
    expected = {"embstore export": c_bin, "gensim save_word2vec_format": g_bin}

    def same_bytes(name, out):
        if not filecmp.cmp(dest, expected[name], shallow=False):
            raise AssertionError(f"{name} wrote other bytes than {expected[name].name}")

    runs = {"embstore export": ("embstore", lambda: run_child(
                "cli", "export", table, dest, "--format", "word2vec-binary", "--overwrite",
                "--quiet")),
            "gensim save_word2vec_format": ("peer", lambda: run_child(
                "gensim-save", c_bin, "binary", dest))}
    try:
        child_method_runs(res, export, runs, reps=reps, warmer=Warmer([table, c_bin]),
                          before=clean, check=same_bytes)
        imp = f"word2vec binary import, {size}, via the CLI (start-up included)"
        runs = {"embstore import": ("embstore", lambda: run_child(
                    "cli", "import", c_bin, dest, "--format", "word2vec-binary", "--quiet",
                    "--overwrite")),
                "gensim load_word2vec_format": ("peer", lambda: run_child("gensim-w2v-bin",
                                                                          c_bin))}
        child_method_runs(res, imp, runs, reps=reps, warmer=Warmer([c_bin]), before=clean)
    finally:
        clean()
    f = res.find
    compare(res, f"word2vec binary export {size}: embstore vs gensim",
            f(export, "embstore export"), f(export, "gensim save_word2vec_format"),
            target=("faster", 2))
    compare(res, f"word2vec binary import {size}: embstore vs gensim",
            f(imp, "embstore import"), f(imp, "gensim load_word2vec_format"),
            target=("faster", 2))


def run(ctx, res) -> None:
    cfg = ctx.cfg["waits"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    res.params = {"rows": rows, "dim": dim, "ids": 32 * 512, "reps": reps}
    npy = data.table_npy(ctx.data_dir, rows, dim)
    table = data.store(ctx.data_dir, npy)
    warmer = Warmer([npy, table])
    _startup(res, table, cfg.get("startup_reps", reps))
    _fresh(ctx, res, npy, table, rows, reps, warmer)
    warmer.warm()
    _warm(res, npy, table, rows, cfg.get("warm_reps", reps), warmer)
    _word2vec(ctx, res, cfg.get("w2v_rows", 300_000), reps)

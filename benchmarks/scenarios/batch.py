"""batch: a file of ids in, a ``.npy`` of vectors out.

``embstore.batch.lookup_file`` (streamed on one machine, and on a Dask
``LocalCluster`` of 1 and 2 single-threaded workers, started before timing)
against the in-RAM baseline: load the whole table and ids, ``np.take``,
``np.save``.  Each run is a fresh process; time of the work after imports;
throughput in ids per second; peak RSS of the process (for Dask: the largest of
the client and its worker processes; each worker's own peak is in the JSON).
"""

from __future__ import annotations

import numpy as np

from .. import data
from ..children import child_method_runs, run_child
from ..common import Measurement, Skip, Warmer, absolute, compare

NAME = "batch"
TITLE = "Offline batch lookup job"

RAM = "in-RAM np.take + np.save"
EMB = "embstore lookup_file"
DASK = "embstore lookup_file, Dask {} worker{}"


def run(ctx, res) -> None:
    cfg = ctx.cfg["batch"]
    rows, dim, n, reps = cfg["rows"], cfg["dim"], cfg["ids"], cfg["reps"]
    npy = data.table_npy(ctx.data_dir, rows, dim)
    ids = data.ids_npy(ctx.data_dir, rows, n, "uniform")
    shape = np.load(ids, mmap_mode="r").shape
    n = int(np.prod(shape))
    res.params = {"rows": rows, "dim": dim, "ids": n, "ids_shape": list(shape),
                  "distribution": "uniform", "output_bytes": n * dim * 4, "reps": reps,
                  "dask_workers": cfg["workers"]}
    out = {name: ctx.scratch / f"batch-{i}.npy" for i, name in enumerate(
        [RAM, EMB] + [DASK.format(w, "s" if w > 1 else "") for w in cfg["workers"]])}

    def clean():
        for p in out.values():
            p.unlink(missing_ok=True)

    runs = {RAM: ("peer", lambda: run_child("batch-ram", npy, ids, out[RAM]))}
    files = [npy, ids]
    try:
        store = data.store(ctx.data_dir, npy)
        files.append(store)
        runs[EMB] = ("embstore", lambda: run_child("batch-embstore", store, ids, out[EMB], 0))
        for w in cfg["workers"]:
            name = DASK.format(w, "s" if w > 1 else "")
            runs[name] = ("embstore", lambda w=w, name=name: run_child(
                "batch-embstore", store, ids, out[name], w))
    except Skip as exc:
        res.notes.append(f"{EMB}: skipped: {exc}")

    def check(name, result):
        _check_output(out[name], npy, ids)

    case = f"{n:,} ids, dim {dim}"
    try:
        child_method_runs(res, case, runs, reps=reps, warmer=Warmer(files), before=clean,
                          check=check)
    finally:
        clean()
    rates = {}
    for name in runs:
        m = res.find(case, name)
        if m is None:
            continue
        rates[name] = Measurement(case, name + " [ids/s]", m.kind, "ids/s",
                                  [n / v for v in m.values])
        res.measurements.append(rates[name])
    compare(res, "batch job throughput: embstore vs in-RAM baseline", rates.get(EMB), rates.get(RAM),
            target=("atleast", 0.5))
    for w in cfg["workers"]:
        name = DASK.format(w, "s" if w > 1 else "")
        compare(res, f"batch job throughput: Dask {w} worker{'s' if w > 1 else ''} vs in-RAM baseline",
                rates.get(name), rates.get(RAM))
    if len(cfg["workers"]) > 1:
        a, b = (DASK.format(w, "s" if w > 1 else "") for w in cfg["workers"][:2])
        compare(res, "batch job: Dask scaling", rates.get(b), rates.get(a))
    absolute(res, "batch job: peak RSS", res.find(case, EMB + " [peak RSS]"), at_most=600)
    compare(res, "batch job: peak RSS, embstore vs in-RAM baseline", res.find(case, EMB + " [peak RSS]"),
            res.find(case, RAM + " [peak RSS]"))


def _check_output(path, table_npy, ids_npy, *, block: int = 1 << 16) -> None:
    """The output equals ``table[ids]``, compared block by block (never whole in memory)."""
    table = np.load(table_npy, mmap_mode="r", allow_pickle=False)
    ids = np.load(ids_npy, mmap_mode="r", allow_pickle=False).reshape(-1)
    got = np.load(path, mmap_mode="r", allow_pickle=False)
    if got.shape[:-1] != np.load(ids_npy, mmap_mode="r").shape or got.dtype != table.dtype:
        raise AssertionError(f"output {got.shape} {got.dtype}, expected ids.shape + "
                             f"({table.shape[1]},) {table.dtype}")
    flat = got.reshape(-1, table.shape[1])
    for start in range(0, ids.size, block):
        sl = slice(start, start + block)
        if not np.array_equal(flat[sl], table[np.asarray(ids[sl])]):
            raise AssertionError(f"output rows {start}.. differ from table[ids]")

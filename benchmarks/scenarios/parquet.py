"""parquet: a Parquet batch job (a list column of ids in, Parquet vectors out) vs the ``.npy`` job.

Throughput is ids per second end to end (a fresh process, time of the work after
imports: open the table, read the ids, look up, write, rename into place) for the
same ids and the same table: ``lookup_file(table, ids.parquet, out.parquet,
column="ids", keep=["doc"])`` over a ``list<int64>`` column (1-63 ids per row,
uniform over the table, row groups of 65,536 rows), against ``lookup_file(table,
ids.npy, out.npy)`` over the same ids flattened into a 1-D ``.npy``.  The output is
``list<fixed_size_list<float>[dim]>`` plus the kept column.  Optionally the Parquet
job on a Dask ``LocalCluster`` (part files; peak RSS per worker in the JSON).
Every output is checked against ``table[ids]`` before its time counts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from .. import data
from ..children import child_method_runs, run_child
from ..common import Measurement, Skip, Warmer, absolute, compare, log

NAME = "parquet"
TITLE = "Parquet batch job vs the .npy job"

NPY = "embstore lookup_file .npy -> .npy"
PQ = "embstore lookup_file Parquet lists -> Parquet"
PQD = "embstore lookup_file Parquet lists -> Parquet, Dask {} workers"


def inputs(data_dir: Path, rows: int, n: int, *, seed: int = 0) -> tuple[Path, Path]:
    """``n`` uniform ids over ``rows`` as a Parquet list column (plus ``doc``, the row
    number) and the same ids as a 1-D ``.npy``; built once."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise Skip("pyarrow not installed") from None
    base = Path(data_dir) / f"pq-ids-{n}-of-{rows}-s{seed}"
    pq_path, npy_path = base.with_suffix(".parquet"), base.with_suffix(".npy")
    if pq_path.exists() and npy_path.exists():
        return pq_path, npy_path
    log(f"generating {pq_path.name} ({n:,} ids in list columns)")
    rng = np.random.default_rng([seed, rows, n, 21])
    lens = rng.integers(1, 64, size=n // 16 + 64)  # about twice as many ids as needed
    ends = np.cumsum(lens)
    k = int(np.searchsorted(ends, n))
    lens = lens[: k + 1]
    lens[-1] -= int(ends[k]) - n
    ids = rng.integers(0, rows, size=n, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    table = pa.table({"doc": np.arange(lens.size, dtype=np.int64),
                      "ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))})
    for path, write in ((pq_path, lambda p: pq.write_table(table, p, row_group_size=65536)),
                        (npy_path, lambda p: np.save(open(p, "wb"), ids))):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        write(tmp)
        os.replace(tmp, path)
    return pq_path, npy_path


def _check_parquet(path: Path, table_npy: Path, ids_npy: Path) -> None:
    """The vectors of ``path`` (a file or a directory of parts) equal ``table[ids]``."""
    import pyarrow.parquet as pq

    table = np.load(table_npy, mmap_mode="r", allow_pickle=False)
    ids = np.load(ids_npy, mmap_mode="r", allow_pickle=False)
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    at = 0
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(columns=["vector"]):
            got = batch.column(0).flatten().flatten().to_numpy().reshape(-1, table.shape[1])
            if not np.array_equal(got, table[np.asarray(ids[at: at + len(got)])]):
                raise AssertionError(f"{f}: vectors from id {at} differ from table[ids]")
            at += len(got)
    if at != ids.size:
        raise AssertionError(f"{path}: {at} vectors, expected {ids.size}")


def run(ctx, res) -> None:
    from .batch import _check_output

    cfg = ctx.cfg["parquet"]
    rows, dim, n, reps = cfg["rows"], cfg["dim"], cfg["ids"], cfg["reps"]
    npy = data.table_npy(ctx.data_dir, rows, dim)
    store = data.store(ctx.data_dir, npy)
    pq_in, npy_in = inputs(ctx.data_dir, rows, n)
    res.params = {"rows": rows, "dim": dim, "ids": n, "ids_per_row": "1-63 (mean 32)",
                  "row_group_rows": 65536, "output_bytes": n * dim * 4, "reps": reps,
                  "dask_workers": cfg["workers"], "throughput": "ids/s end to end, same ids"}
    out = {NPY: ctx.scratch / "pq-bench.npy", PQ: ctx.scratch / "pq-bench.parquet"}
    runs = {NPY: ("embstore", lambda: run_child("batch-embstore", store, npy_in, out[NPY], 0)),
            PQ: ("embstore", lambda: run_child("batch-parquet", store, pq_in, out[PQ], 0))}
    for w in cfg["workers"]:
        name = PQD.format(w)
        out[name] = ctx.scratch / f"pq-bench-dask{w}.parquet"
        runs[name] = ("embstore", lambda w=w, name=name: run_child(
            "batch-parquet", store, pq_in, out[name], w))

    def clean():
        for p in out.values():
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)

    def check(name, result):
        if name == NPY:
            _check_output(out[name], npy, npy_in)
        else:
            _check_parquet(out[name], npy, npy_in)

    case = f"{n:,} ids in list columns, dim {dim}"
    try:
        child_method_runs(res, case, runs, reps=reps, warmer=Warmer([store, pq_in, npy_in]),
                          before=clean, check=check)
    finally:
        clean()
    rates = {}
    for name in runs:
        m = res.find(case, name)
        if m is not None:
            rates[name] = Measurement(case, name + " [ids/s]", m.kind, "ids/s",
                                      [n / v for v in m.values])
            res.measurements.append(rates[name])
    compare(res, "Parquet job throughput vs .npy job", rates.get(PQ), rates.get(NPY),
            target=("atleast", 0.5))
    for w in cfg["workers"]:
        compare(res, f"Parquet job on Dask ({w} workers) vs .npy job", rates.get(PQD.format(w)),
                rates.get(NPY))
    absolute(res, "Parquet job: peak RSS", res.find(case, PQ + " [peak RSS]"), at_most=1000)

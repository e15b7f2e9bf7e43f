"""parquet: a Parquet batch job (a list column of ids in, Parquet vectors out) vs the ``.npy`` job.

Throughput is ids per second end to end (a fresh process, time of the work after
imports: open the table, read the ids, look up, write, rename into place) for the
same ids and the same table: ``lookup_file(table, ids.parquet, out.parquet,
column="ids", keep=["doc"])`` over a ``list<int64>`` column (1-63 ids per row,
uniform over the table, row groups of 65,536 rows), against ``lookup_file(table,
ids.npy, out.npy)`` over the same ids flattened into a 1-D ``.npy``.  The output is
``list<fixed_size_list<float>[dim]>`` plus the kept column.  Optionally the Parquet
job on a Dask ``LocalCluster`` (part files; peak RSS per worker in the JSON).
Every output is checked against ``table[ids]`` before its time counts.  Each local
job also reports its CPU time (all threads): on a shared machine the wall-time
ratio drifts toward the CPU-time ratio.

A second case times pyarrow's encoding alone (CPU time of the writing thread, the
same vectors in memory, written to the scratch directory) under embstore's writer
options and the variants that might make it cheaper: the number that bounds the
Parquet job, since the encoding runs in one thread per file.
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


ENC = "pyarrow encode, {}"
ENC_BASE = "embstore's options"


def _encode_variants(job):
    """Writer option sets to time: ``name -> (schema change, writer options)``."""
    from embstore.batch.arrowio import writer_options

    base = writer_options(job)
    return {ENC_BASE: (False, base),
            "pyarrow defaults (dictionary, snappy, statistics)": (False, {}),
            "non-nullable vectors and floats": (True, base),
            "data_page_version 2.0": (False, {**base, "data_page_version": "2.0"}),
            "write_batch_size 1Mi": (False, {**base, "write_batch_size": 1 << 20}),
            "data_page_size 128 KiB": (False, {**base, "data_page_size": 128 << 10}),
            "byte_stream_split floats": (False, {**base, "use_dictionary": list(job.keep),
                                                 "column_encoding": {job.vector_column:
                                                                     "BYTE_STREAM_SPLIT"}}),
            "all dictionaries and statistics off": (False, {**base, "use_dictionary": False,
                                                            "write_statistics": False})}


def encode_options(ctx, res, table_npy: Path, n: int, reps: int) -> None:
    """CPU time of pyarrow's writer for ``n`` vectors in list columns (as the job writes
    them: row groups of one batch) under each option set of :func:`_encode_variants`."""
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    from embstore.batch.arrowio import PartJob

    table = np.load(table_npy, mmap_mode="r", allow_pickle=False)
    dim = table.shape[1]
    rng = np.random.default_rng([n, 21, 1])
    lens = rng.integers(1, 64, size=n // 16 + 64)
    lens = lens[: int(np.searchsorted(np.cumsum(lens), n)) + 1]
    lens[-1] -= int(lens.sum()) - n
    ids = rng.integers(0, table.shape[0], size=n)
    vecs = np.ascontiguousarray(table[ids], dtype=np.float32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    job = PartJob(input="", column="ids", keep=("doc",), vector_column="vector", oov="error",
                  unk_id=None, batch_rows=2048, dim=dim, dtype="<f4", is_list=True, keys=False)

    def arrow_table(required: bool):
        item = pa.field("item", pa.float32(), nullable=not required)
        vt = pa.list_(item, dim)
        flat = pa.Array.from_buffers(pa.float32(), vecs.size, [None, pa.py_buffer(vecs)])
        vec = pa.Array.from_buffers(vt, n, [None], children=[flat])
        lt = pa.list_(pa.field("item", vt, nullable=not required))
        schema = pa.schema([pa.field("vector", lt, nullable=not required),
                            pa.field("doc", pa.int64())])
        return pa.Table.from_arrays([pa.ListArray.from_arrays(offsets, vec, type=lt),
                                     pa.array(np.arange(lens.size, dtype=np.int64))],
                                    schema=schema)

    tables = {False: arrow_table(False), True: arrow_table(True)}
    variants = _encode_variants(job)
    dest = ctx.scratch / "pq-encode.parquet"
    rows = max(1, int(np.ceil(lens.size * (16 << 20) / (n * dim * 4))))  # the job's batches
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    try:
        for r in range(reps):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                required, opts = variants[name]
                t = tables[required]
                c0 = time.thread_time()
                with pq.ParquetWriter(dest, t.schema, **opts) as w:
                    for start in range(0, t.num_rows, rows):
                        w.write_table(t.slice(start, rows))
                times[name].append(time.thread_time() - c0)
                if r == 0:
                    got = pq.read_table(dest, columns=["vector"]).column(0)
                    got = got.combine_chunks().flatten().flatten().to_numpy()
                    if not np.array_equal(got.reshape(n, dim), vecs):
                        raise AssertionError(f"{name}: vectors read back differ")
    finally:
        dest.unlink(missing_ok=True)
    case = f"encode {n:,} vectors of dim {dim} in list columns (CPU of the writing thread)"
    res.params.update(encode_ids=n, encode_reps=reps)
    for name, values in times.items():
        res.measurements.append(Measurement(case, ENC.format(name), "embstore", "s", values))
    for name in names[1:]:
        compare(res, f"Parquet encoding CPU: {name} vs {ENC_BASE}",
                res.find(case, ENC.format(name)), res.find(case, ENC.format(ENC_BASE)))


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
        done = child_method_runs(res, case, runs, reps=reps,
                                 warmer=Warmer([store, pq_in, npy_in]), before=clean,
                                 check=check)
    finally:
        clean()
    for name, datas in done.items():  # local jobs: CPU time of every thread
        if datas and all("cpu_seconds" in d for d in datas):
            res.measurements.append(Measurement(case, name + " [CPU]", runs[name][0], "s",
                                                [float(d["cpu_seconds"]) for d in datas]))
    rates = {}
    for name in runs:
        m = res.find(case, name)
        if m is not None:
            rates[name] = Measurement(case, name + " [ids/s]", m.kind, "ids/s",
                                      [n / v for v in m.values])
            res.measurements.append(rates[name])
    compare(res, "Parquet job throughput vs .npy job", rates.get(PQ), rates.get(NPY),
            target=("atleast", 0.5))
    compare(res, "Parquet job CPU time vs .npy job (all threads; lower is better)",
            res.find(case, PQ + " [CPU]"), res.find(case, NPY + " [CPU]"))
    for w in cfg["workers"]:
        compare(res, f"Parquet job on Dask ({w} workers) vs .npy job", rates.get(PQD.format(w)),
                rates.get(NPY))
    absolute(res, "Parquet job: peak RSS", res.find(case, PQ + " [peak RSS]"), at_most=1000)
    if cfg.get("encode_ids"):
        encode_options(ctx, res, npy, int(cfg["encode_ids"]), int(cfg.get("encode_reps", 3)))

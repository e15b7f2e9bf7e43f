"""Batch lookup jobs on a Dask cluster (the optional ``embstore[dask]`` extra).

Each block of the job is one task.  The worker that runs it opens the table
itself by path (once per worker process, kept with its row cache), reads its
block of the input, looks it up and writes the result straight into the output:
a whole chunk of the Zarr array, or its byte range of the pre-sized ``.npy``
file.  Only row counts travel back to the client, never vectors.

A Parquet job (:mod:`embstore.batch.parquet`) is split into parts of whole row
groups: each task opens the input itself, reads its row groups in batches and
writes its own ``part-NNNNN.parquet`` (under a temporary name, renamed when the
part is complete) with :func:`embstore.batch.arrowio.write_part`, so a worker
holds at most two batches of vectors, whatever the size of its part.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

import numpy as np

from .arrowio import PartJob, write_part
from .io import Job, lookup_into, open_sink, open_source, open_table, read_block
from .remote import is_url
from ..errors import EmbstoreError
from ..fs.atomic import replace
from ..optional import require

__all__ = ["run_dask", "run_block", "run_parquet_dask", "run_parquet_part", "CONNECT_TIMEOUT"]

CONNECT_TIMEOUT = 30  # seconds to reach a scheduler given by address

_tables: dict = {}  # (path, cache_bytes, mtime) -> Table, per worker process
_tables_lock = threading.Lock()


def _worker_table(path: str, cache_bytes):
    key = (path, str(cache_bytes), 0 if is_url(path) else os.stat(path).st_mtime_ns)
    with _tables_lock:
        table = _tables.get(key)
        if table is None:
            while len(_tables) >= 4:  # a worker serving many jobs keeps only a few tables
                _tables.pop(next(iter(_tables))).close()
            table = _tables[key] = open_table(path, cache_bytes=cache_bytes)
    return table


def run_block(job: Job, i: int) -> int:
    """Run block ``i`` of ``job`` in this process; returns its number of leading rows."""
    table = _worker_table(job.table, job.cache_bytes)
    source = open_source(job)
    ids = read_block(job, source, i, table)
    out = np.empty(ids.shape + (job.dim,), dtype=job.dtype)
    lookup_into(table, ids, out, pads=job.pads)
    sink = open_sink(job)
    try:
        sink.write(i, out)
    except OSError as exc:  # (zarr's writes name no file: a full disk said only ENOSPC)
        if exc.filename is not None or isinstance(exc, EmbstoreError):
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), job.tmp) from None
    finally:
        sink.close()
    a, b = job.block(i)
    return b - a


def part_name(i: int) -> str:
    return f"part-{i:05d}.parquet"


def run_parquet_part(job: PartJob, table_path: str, cache_bytes, out_dir: str, i: int,
                     groups: tuple[int, int], first_row: int) -> dict:
    """Write part ``i`` (row groups ``groups`` of the input) as ``out_dir/part-<i>.parquet``
    in this process; returns its ``rows``, ``ids`` and ``batches``."""
    pa = require("pyarrow", extra="parquet", feature="a Parquet batch job")
    pq = require("pyarrow.parquet", extra="parquet", feature="a Parquet batch job")
    table = _worker_table(table_path, cache_bytes)
    dest = os.path.join(out_dir, part_name(i))
    tmp = os.path.join(out_dir, f".{part_name(i)}.tmp-{os.getpid()}")
    try:
        with pq.ParquetFile(job.input, pre_buffer=False) as pf:  # see parquet.open_input
            stats = write_part(pa, pq, pf, table, job, tmp, range(*groups), first_row)
        replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return stats


def run_parquet_dask(job: PartJob, table_path: str, cache_bytes, out_dir: str,
                     parts: list[tuple[int, int]], firsts: list[int], scheduler: str, *,
                     n_workers: int = 2, bar=None, timeout: float | None = None) -> dict:
    """Run every part of a Parquet job on ``scheduler``; returns the summed counts."""
    total = {"rows": 0, "ids": 0, "batches": 0}

    def done(stats: dict) -> None:
        for k in total:
            total[k] += stats[k]
        if bar is not None:
            bar.update(stats["rows"])

    calls = [(job, table_path, cache_bytes, out_dir, i, part, first)
             for i, (part, first) in enumerate(zip(parts, firsts))]
    run_tasks(run_parquet_part, calls, scheduler, n_workers=n_workers, on_result=done,
              timeout=timeout)
    return total


def run_dask(job: Job, todo: list[int], scheduler: str, *, n_workers: int = 2, bar=None,
             timeout: float | None = None) -> None:
    """Run blocks ``todo`` of ``job`` on ``scheduler`` (``"local"`` or an address)."""
    run_tasks(run_block, [(job, i) for i in todo], scheduler, n_workers=n_workers,
              on_result=None if bar is None else bar.update, timeout=timeout)


def run_tasks(fn, calls: list[tuple], scheduler: str, *, n_workers: int = 2, on_result=None,
              timeout: float | None = None) -> None:
    """``fn(*args)`` for every ``args`` of ``calls`` as Dask tasks on ``scheduler``
    (``"local"``: a ``LocalCluster`` of ``n_workers`` processes, or an address);
    ``on_result`` gets each result as its task finishes.  The first failure cancels
    the tasks not yet done and is raised."""
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    distributed = require("dask.distributed", extra="dask",
                          feature="running a batch job on a Dask scheduler")
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    as_completed = distributed.as_completed
    cluster = None
    if scheduler == "local":
        # no dashboard (bokeh is not a dependency); its HTTP server on a free loopback port,
        # as dashboard_address=None would still bind :8787 and clash with other clusters
        # and its workers' logs silenced: a failed task logged its traceback ("Compute
        # Failed") on this terminal before the one error raised here (a full disk: pages)
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               dashboard_address="127.0.0.1:0", host="127.0.0.1",
                               silence_logs=logging.CRITICAL)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout=timeout)
        except (OSError, ValueError) as exc:
            raise EmbstoreError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") \
                from None
    futures = []
    try:
        token = uuid.uuid4().hex
        futures = [client.submit(fn, *args, key=f"embstore-lookup-{token}-{i}", retries=0)
                   for i, args in enumerate(calls)]
        for fut in as_completed(futures):
            result = fut.result()
            if on_result is not None:
                on_result(result)
    finally:
        for fut in futures:
            if not fut.done():
                fut.cancel()
        client.close()
        if cluster is not None:
            cluster.close()

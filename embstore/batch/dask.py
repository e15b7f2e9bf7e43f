"""Batch lookup jobs on a Dask cluster (the optional ``embstore[dask]`` extra).

Each block of the job is one task.  The worker that runs it opens the table
itself by path (once per worker process, kept with its row cache), reads its
block of the input, looks it up and writes the result straight into the output:
a whole chunk of the Zarr array, or its byte range of the pre-sized ``.npy``
file.  Only row counts travel back to the client, never vectors.
"""

from __future__ import annotations

import os
import threading
import uuid

import numpy as np

from .io import Job, lookup_into, open_sink, open_source, open_table, read_block
from .remote import is_url
from ..errors import EmbstoreError
from ..optional import require

__all__ = ["run_dask", "run_block", "CONNECT_TIMEOUT"]

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
    finally:
        sink.close()
    a, b = job.block(i)
    return b - a


def run_dask(job: Job, todo: list[int], scheduler: str, *, n_workers: int = 2, bar=None,
             timeout: float | None = None) -> None:
    """Run blocks ``todo`` of ``job`` on ``scheduler`` (``"local"`` or an address)."""
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    distributed = require("dask.distributed", extra="dask",
                          feature="running a batch job on a Dask scheduler")
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    as_completed = distributed.as_completed
    cluster = None
    if scheduler == "local":
        # no dashboard (bokeh is not a dependency); its HTTP server on a free loopback port,
        # as dashboard_address=None would still bind :8787 and clash with other clusters
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               dashboard_address="127.0.0.1:0", host="127.0.0.1")
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
        futures = [client.submit(run_block, job, i, key=f"embstore-lookup-{token}-{i}",
                                 retries=0) for i in todo]
        for fut in as_completed(futures):
            rows = fut.result()
            if bar is not None:
                bar.update(rows)
    finally:
        for fut in futures:
            if not fut.done():
                fut.cancel()
        client.close()
        if cluster is not None:
            cluster.close()

"""remote: row lookups on a table in an S3 bucket (moto's server on loopback), row cache empty.

The same table (default layout: 16 KiB chunks in 128 MiB shards) uploaded once, read by
embstore (``embstore.open("s3://...")``, obstore), tensorstore's ``s3`` kvstore and
zarr-python over ``zarr.storage.ObjectStore`` (obstore as well), (32, 512) uniform ids.
Every method has read the shard indexes of a first batch before timing (embstore keeps
them, tensorstore caches them, zarr-python reads them again each call).

The server runs in a child process and counts the requests it serves.  Loopback hides
latency, so a modelled time is reported too: the measured time plus 30 ms for every wave
of requests, ``ceil(requests / concurrency)``, with each client's own concurrency
(32 for all three: embstore's and tensorstore's ``s3_request_concurrency`` default;
zarr-python's ``async.concurrency`` is raised from its default 10 to the same 32).
Every method is repeated and the median taken (the peers, at about 2 minutes a batch,
``slow_reps`` times), in rotating order, on the same server and bucket.
"""

from __future__ import annotations

import math
import os

import numpy as np

import embstore

from .. import data
from ..common import Measurement, Method, Skip, compare, interleave, log

NAME = "remote"
TITLE = "Row lookup on object storage (S3 on loopback), row cache empty"

EMB = "embstore s3:// (obstore)"
TS = "tensorstore s3 kvstore"
ZARR = "zarr-python ObjectStore (obstore)"
LATENCY_MS = 30.0
CONCURRENCY = 32  # requests in flight, every client (embstore's and tensorstore's default)
BUCKET = "bench"


def _tensorstore(endpoint: str, path: str):
    try:
        import tensorstore as ts
    except ImportError:
        raise Skip("tensorstore not installed") from None
    spec = {"driver": "zarr3", "kvstore": {
        "driver": "s3", "bucket": BUCKET, "path": path, "endpoint": endpoint,
        "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}}
    ta = ts.open(spec, read=True).result()
    return lambda ids: ta[np.unique(ids)].read().result(), CONCURRENCY


def _zarr(endpoint: str, path: str):
    try:
        import zarr
        from obstore.store import S3Store
    except ImportError as exc:
        raise Skip(f"{exc.name} not installed") from None
    st = S3Store(BUCKET, endpoint=endpoint, region="us-east-1",
                 client_options={"allow_http": True})
    za = zarr.open_array(zarr.storage.ObjectStore(st, read_only=True), path=path, mode="r")

    def read(ids):  # as many requests in flight as the others (its default is 10)
        with zarr.config.set({"async.concurrency": CONCURRENCY}):
            return za.get_orthogonal_selection((np.unique(ids), slice(None)))

    return read, CONCURRENCY


def run(ctx, res) -> None:
    cfg = ctx.cfg["remote"]
    rows, dim, shape = cfg["rows"], cfg["dim"], tuple(cfg["ids"])
    reps, slow = cfg["reps"], cfg["slow_reps"]
    try:
        from .. import s3server
        from embstore.store.remote.transfer import copy_table
        import moto  # noqa: F401
    except ImportError as exc:
        raise Skip(f"{exc.name} not installed (pip install 'embstore[s3]' 'moto[server]')")
    es = embstore
    npy = data.table_npy(ctx.data_dir, rows, dim)
    E = data.load_in_ram(npy)
    store = data.store(ctx.data_dir, npy)
    res.params = {"rows": rows, "dim": dim, "dtype": "float32", "ids_shape": list(shape),
                  "distribution": "uniform", "reps": reps, "reps_peers": slow,
                  "latency_ms_modelled": LATENCY_MS, "server": "moto (server mode), loopback"}
    srv = s3server.ServerProcess()
    saved = {k: os.environ.get(k) for k in srv.env()}
    os.environ.update(srv.env())
    opened = []
    try:
        srv.make_bucket(BUCKET)
        url = f"s3://{BUCKET}/t.emb"
        log(f"uploading {store.name} to {url}")
        copy_table(store, url)
        res.params["objects_uploaded"] = True
        t = es.open(url, cache_bytes="256MiB")
        opened.append(t)
        batches = [data.ids(rows, shape, "uniform", seed=s) for s in range(max(2, reps))]
        cur = {"ids": batches[0]}
        clients = {EMB: (lambda ids: t.lookup(ids), CONCURRENCY)}
        for name, make in ((TS, _tensorstore), (ZARR, _zarr)):
            try:
                clients[name] = make(srv.endpoint, "t.emb/vectors")
            except Skip as exc:
                res.notes.append(f"{name}: skipped: {exc}")

        def checker(name):
            def check(out):
                ids = cur["ids"]
                want = E[ids] if name == EMB else E[np.unique(ids)]
                if not np.array_equal(np.asarray(out), want):
                    raise AssertionError(f"{name}: rows differ from E[ids]")
            return check

        # warm-up on another batch (shard indexes read, connections open), then one counted
        # call per method on the first batch
        warm = data.ids(rows, shape, "uniform", seed=99).reshape(-1)[:1024]
        requests = {}
        for name, (fn, _) in clients.items():
            fn(warm)
            t.cache_clear()
            srv.reset()
            checker(name)(fn(batches[0]))
            requests[name] = srv.counts()
            t.cache_clear()
            log(f"  requests per batch, {name}: {requests[name]}")

        def on_rep(r):
            cur["ids"] = batches[r % len(batches)]

        methods = [Method(name, "embstore" if name == EMB else "peer",
                          lambda fn=fn: fn(cur["ids"]), check=checker(name),
                          before=t.cache_clear if name == EMB else None,
                          reps=None if name == EMB else slow, warmup=lambda: None)
                   for name, (fn, _) in clients.items()]
        found = interleave(res, "uniform", methods, reps=reps, on_rep=on_rep)
        for name, meas in list(found.items()):
            n = sum(requests[name].values())
            conc = clients[name][1]
            meas.extra.update(requests_per_batch=n, concurrency=conc)
            modelled = meas.median + math.ceil(n / conc) * LATENCY_MS
            m = Measurement("uniform, modelled 30 ms first byte", name, meas.kind, "ms",
                            [modelled], {"requests_per_batch": n, "concurrency": conc})
            res.measurements.append(m)
            found[f"{name} modelled"] = m
        g = found.get
        compare(res, "S3 lookup: embstore vs tensorstore, same bucket", g(EMB), g(TS),
                target=("faster", 3))
        compare(res, "S3 lookup: embstore vs zarr-python, same bucket", g(EMB), g(ZARR),
                target=("faster", 30))
        compare(res, "S3 lookup at 30 ms latency (modelled): embstore vs tensorstore",
                g(f"{EMB} modelled"), g(f"{TS} modelled"), target=("faster", None))
        compare(res, "S3 lookup at 30 ms latency (modelled): embstore vs zarr-python",
                g(f"{EMB} modelled"), g(f"{ZARR} modelled"), target=("faster", None))
        res.notes.append("requests per batch (as the server counted them): " + "; ".join(
            f"{name}: {sum(c.values())}" for name, c in requests.items()))
    finally:
        for tb in opened:
            tb.close()
        srv.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

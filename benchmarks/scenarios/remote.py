"""remote: row lookups on a format-2 table in an S3 bucket (moto's server on loopback), row
cache off; against moto alone and through a proxy that makes it cost what S3 costs.

The same table (format 2, the default layout: rows at a fixed stride in ~64 MiB chunk
files, a crc32c per 4 KiB page) uploaded once, read by embstore (``embstore.open("s3://...",
cache_bytes=0)``, obstore), tensorstore's ``s3`` kvstore and zarr-python over
``zarr.storage.ObjectStore`` (obstore as well), (32, 512) uniform ids (dense: every
2.5 MB of the table holds rows of the batch, so the cost model reads it all) and a sparse
batch (``sparse_ids``, 256 in the full run), twice:

- ``moto``: the server alone (loopback hides latency; moto costs ~5 ms of its own CPU a
  request and serves ~400 MB/s in all);
- ``proxy``: through :mod:`benchmarks.latencyproxy` (25 ms more to every request's first byte,
  100 MB/s per connection: S3's figures), in front of the same server.  It relays by
  ``splice`` (no copy through its process); ``proxy, copying relay`` is the proxy of earlier
  runs (recv/sendall through its buffers: ~1.5x its CPU per GiB), dense batch only.  On 2
  cores the proxy's CPU (``proxy_cpu_s``) competes with the server and the client: S3's
  latency and bandwidth cost no CPU here.

Every method has looked up another batch before timing (metadata read, connections open).
The server runs in a child process and counts the requests and the bytes it serves per
batch; beside them, embstore's cost model (store/place/costs.py) says what a batch ideally
fetches: the pages the rows lie on, gaps that cost less than another request read through.
Then the disk cache: a fresh process opens the table with ``cache_dir=`` and looks a batch up
(timed in the child: open and lookup, its imports apart), then three more processes with the
same cache do the same (the median).  The full run measures two tables, 100,000 and
1,000,000 rows.  Every method is repeated and the median taken (the peers ``slow_reps`` times), in
rotating order, on the same server and bucket.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

import embstore
from embstore.store.place.costs import CostModel
from embstore.store.place.objects import ObjectStore
from embstore.store.rows.ranged import RangedRows
from embstore.store.rows.source import PagedSource

from .. import data
from ..common import ROOT, Measurement, Method, Skip, compare, interleave, log

NAME = "remote"
TITLE = "Row lookup on object storage (S3 on loopback, alone and through an S3-cost proxy)"

EMB = "embstore s3:// (obstore)"
TS = "tensorstore s3 kvstore"
ZARR = "zarr-python ObjectStore (obstore)"
LATENCY_S, BANDWIDTH = 0.025, 100e6  # the proxy's: S3's first byte and per-connection rate
CONCURRENCY = 32  # requests in flight, every client (embstore's and tensorstore's default)
BUCKET = "bench"
MIB = 1 << 20
SECOND_PROCESSES = 3  # second processes timed (the median): one figure is noise on 2 cores


def _tensorstore(endpoint: str, path: str):
    try:
        import tensorstore as ts
    except ImportError:
        raise Skip("tensorstore not installed") from None
    spec = {"driver": "zarr3", "kvstore": {
        "driver": "s3", "bucket": BUCKET, "path": path, "endpoint": endpoint,
        "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}}
    ta = ts.open(spec, read=True).result()
    return lambda ids: ta[np.unique(ids)].read().result()


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

    return read


def _ideal(t, ids: np.ndarray) -> tuple[int, int, int]:
    """``(requests, bytes, bytes of the rows' pages)`` the cost model asks for ``ids``."""
    src = t.row_source  # the vectors source (a version's deltas over its base table's)
    src = getattr(src, "base", src)
    if not isinstance(src, PagedSource) or src._ranged is None:
        raise Skip("not a table of rows at a fixed stride")
    L, ranged = src.row_layout, src._ranged
    ids = np.unique(ids)
    chunk, at = ids // L.chunk_rows, ids % L.chunk_rows * L.row_bytes
    k, lo, hi = ranged.plan(chunk, at)
    gap0 = RangedRows(ObjectStore(t._objects.client, costs=CostModel(0.0, 1.0, 1 << 62)), L,
                      "vectors", ranged.crc_name)
    _, plo, phi = gap0.plan(chunk, at)  # no gap read through: the pages alone
    return int(k.size), int((hi - lo).sum()), int((phi - plo).sum())


def _modelled_ms(requests: int, nbytes: int) -> float:
    """A batch's time on S3 by the proxy's figures: ``requests`` of equal size, at most
    ``CONCURRENCY`` in flight, each its latency plus its bytes at one connection's rate."""
    if not requests:
        return 0.0
    waves = -(-requests // CONCURRENCY)
    return waves * (LATENCY_S + nbytes / requests / BANDWIDTH) * 1e3


def _setting(res, srv, setting: str, label: str, endpoint: str, url: str, E, batches,
             cfg, px=None) -> dict:
    """Time every method against ``endpoint`` (``setting`` moto or proxy, ``label`` it with
    the table's size when several are measured; ``px`` the proxy, if any, whose CPU per
    batch is counted); the measurements by method name."""
    opts = {"storage_options": {"endpoint": endpoint}, "cache_bytes": 0}
    t = embstore.open(url, **opts)
    try:
        clients = {EMB: lambda ids: t.lookup(ids)}
        case = label if len(batches[0].shape) > 1 else f"{label}, {batches[0].size} ids"
        peers = [(TS, _tensorstore)] + ([(ZARR, _zarr)] if px is None else [])
        for name, make in peers:
            try:
                clients[name] = make(endpoint, url.split(f"{BUCKET}/", 1)[1] + "/vectors")
            except Skip as exc:
                res.notes.append(f"{label}: {name}: skipped: {exc}")
        cur = {"ids": batches[0]}

        def checker(name):
            def check(out):
                ids = cur["ids"]
                want = E[ids] if name == EMB else E[np.unique(ids)]
                if not np.array_equal(np.asarray(out), want):
                    raise AssertionError(f"{name}: rows differ from E[ids]")
            return check

        counted = {}
        warm = data.ids(E.shape[0], (min(1024, E.shape[0]),), "uniform", seed=99)
        for name, fn in clients.items():  # warm-up on another batch, then one counted call
            fn(warm)
            srv.reset()
            cpu0 = px.cpu_seconds() if px is not None else 0.0
            checker(name)(fn(batches[0]))
            n, sent = sum(srv.counts().values()), srv.sent()
            counted[name] = {"requests_per_batch": n, "MiB_per_batch": round(sent / MIB, 1),
                             "modelled_S3_ms": round(_modelled_ms(n, sent), 1)}
            if px is not None:  # the proxy's own CPU: on 2 cores it competes with the rest
                counted[name]["proxy_cpu_s"] = round(px.cpu_seconds() - cpu0, 2)
            log(f"  {case}: {name}: {n} requests, {sent / MIB:.1f} MiB per batch")
        req, ideal, pages = _ideal(t, batches[0])
        counted[EMB].update(model_requests=req, model_ideal_MiB=round(ideal / MIB, 1),
                            rows_pages_MiB=round(pages / MIB, 1),
                            fetched_over_ideal=round(counted[EMB]["MiB_per_batch"] * MIB
                                                     / max(ideal, 1), 2))

        def on_rep(r):
            cur["ids"] = batches[r % len(batches)]

        methods = [Method(name, "embstore" if name == EMB else "peer",
                          lambda fn=fn: fn(cur["ids"]), check=checker(name),
                          reps=None if name == EMB else cfg["slow_reps"], warmup=lambda: None)
                   for name, fn in clients.items()]
        found = interleave(res, case, methods, reps=cfg["reps"], on_rep=on_rep)
        for name, meas in found.items():
            meas.extra.update(counted[name])
        return found
    finally:
        t.close()


_CHILD = """
import json, sys, time
import numpy as np
url, endpoint, cache, ids = sys.argv[1:5]
t00 = time.perf_counter()
import embstore
opener = embstore.open  # (imports the store's modules: embstore loads them on first use)
t0 = time.perf_counter()
t = embstore.open(url, cache_bytes=0, cache_dir=cache, storage_options={"endpoint": endpoint})
rows = t[np.load(ids)]
dt = time.perf_counter() - t0
np.save(ids + ".out.npy", rows)
print(json.dumps({"seconds": dt, "imports": t0 - t00}))
"""


def _cache_runs(res, srv, setting: str, endpoint: str, url: str, E, ids, scratch) -> None:
    """A first and a second process with the same ``cache_dir``, timed in the children: the
    open and the lookup, after ``import embstore`` and its store modules (timed apart, as
    ``imports_ms``: the same in both processes)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", setting)
    cache = tempfile.mkdtemp(prefix=f"cache-{slug}-", dir=scratch)
    path = os.path.join(scratch, f"ids-{slug}.npy")
    np.save(path, ids)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    got = {}
    for which, n in (("first process", 1), ("second process", SECOND_PROCESSES)):
        secs, extra = [], {}
        for _ in range(n):  # (the first fills the cache; each second one is a fresh process)
            srv.reset()
            out = subprocess.run([sys.executable, "-c", _CHILD, url, endpoint, cache, path],
                                 env=env, capture_output=True, text=True, timeout=900)
            if out.returncode:
                raise RuntimeError(f"cache_dir child failed: {out.stderr[-2000:]}")
            if not np.array_equal(np.load(path + ".out.npy"), E[ids]):
                raise AssertionError(f"cache_dir {which}: rows differ from E[ids]")
            said = json.loads(out.stdout.strip().splitlines()[-1])
            secs.append(said["seconds"] * 1e3)
            extra = {"requests": sum(srv.counts().values()),
                     "MiB": round(srv.sent() / MIB, 1),
                     "imports_ms": round(said["imports"] * 1e3, 1)}
        m = Measurement(f"cache_dir, {setting}", f"embstore {which} (open + lookup)",
                        "embstore", "ms", secs, extra)
        res.measurements.append(m)
        got[which] = m
        log(f"  cache_dir, {setting}: {which}: {m.median:.0f} ms (n={n}), {extra}")
    compare(res, f"cache_dir ({setting}): second process vs first", got["second process"],
            got["first process"], target=("faster", 3))


def _report(res, label: str, found: dict, n: int, moto: bool, table: str = "") -> None:
    """Comparisons and a note of requests and bytes for one setting and batch size."""
    g = found.get
    what = f"{label}, {n:,} ids"
    compare(res, f"S3 lookup ({what}): embstore vs tensorstore", g(EMB), g(TS),
            target=("faster", 3))
    compare(res, f"S3 lookup ({what}): embstore vs zarr-python", g(EMB), g(ZARR),
            target=("faster", None))
    if g(EMB) is None:
        return
    x = g(EMB).extra
    res.notes.append(
        f"{what}: per batch, embstore {x['requests_per_batch']} requests, "
        f"{x['MiB_per_batch']} MiB; cost model: {x['model_requests']} requests, "
        f"{x['model_ideal_MiB']} MiB ideal (fetched/ideal {x['fetched_over_ideal']}), of "
        f"which {x['rows_pages_MiB']} MiB the rows' own pages; " + "; ".join(
            f"{k}: {m.extra['requests_per_batch']} requests, {m.extra['MiB_per_batch']} MiB"
            for k, m in found.items() if k != EMB))
    if moto and g(TS) is not None:  # the same requests and bytes on S3, by the proxy's model
        e, t = x["modelled_S3_ms"], g(TS).extra["modelled_S3_ms"]
        em = Measurement(f"{table}{n:,} ids, modelled on S3", EMB, "embstore", "ms", [e], {})
        tm = Measurement(f"{table}{n:,} ids, modelled on S3", TS, "peer", "ms", [t], {})
        res.measurements += [em, tm]
        compare(res, f"S3 lookup ({table}{n:,} ids), modelled on S3 (32 in flight): embstore "
                "vs tensorstore", em, tm, target=("faster", None))


def run(ctx, res) -> None:
    cfg = ctx.cfg["remote"]
    sizes = cfg["rows"] if isinstance(cfg["rows"], list) else [cfg["rows"]]
    dim, shape = cfg["dim"], tuple(cfg["ids"])
    try:
        from .. import s3server
        from ..latencyproxy import ProxyProcess
        import moto  # noqa: F401
    except ImportError as exc:
        raise Skip(f"{exc.name} not installed (pip install 'embstore[s3]' 'moto[server]')")
    res.params = {"rows": cfg["rows"], "dim": dim, "dtype": "float32", "format": 2,
                  "ids_shape": list(shape), "sparse_ids": cfg["sparse_ids"],
                  "distribution": "uniform", "reps": cfg["reps"],
                  "reps_peers": cfg["slow_reps"], "row_cache": "off",
                  "proxy": f"{LATENCY_S * 1e3:.0f} ms first byte, {BANDWIDTH / 1e6:.0f} MB/s "
                           "per connection; relays by splice (and, 'copying relay', through "
                           "its own buffers, as before)", "server": "moto (server mode), loopback"}
    srv = s3server.ServerProcess()
    saved = {k: os.environ.get(k) for k in srv.env()}
    os.environ.update(srv.env())
    proxies = []
    try:
        srv.make_bucket(BUCKET)
        px = ProxyProcess(srv.endpoint, LATENCY_S, BANDWIDTH)  # (relays by splice)
        proxies.append(px)
        pxc = ProxyProcess(srv.endpoint, LATENCY_S, BANDWIDTH, relay="copy")
        proxies.append(pxc)
        for rows in sizes:
            _table(ctx, res, cfg, srv, px, pxc, rows, dim, shape,
                   f"{rows:,} x {dim}, " if len(sizes) > 1 else "")
    finally:
        for p in proxies:
            p.stop()
        srv.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _table(ctx, res, cfg, srv, px, pxc, rows: int, dim: int, shape, table: str) -> None:
    """Every setting and batch on one table of ``rows`` rows (``table`` labels its cases
    when the run measures several)."""
    from embstore.store.remote.transfer import copy_table

    npy = data.table_npy(ctx.data_dir, rows, dim)
    E = data.load_in_ram(npy)
    store = data.store(ctx.data_dir, npy, layout={"format_version": 2})
    url = f"s3://{BUCKET}/t{rows}.emb"
    with embstore.open(store) as t:
        res.notes.append(f"{table.rstrip(', ') or 'the table'}: chunks of "
                         f"{t.layout['chunk_rows']:,} rows")
    log(f"uploading {store.name} to {url}")
    copy_table(store, url)
    batches = [data.ids(rows, shape, "uniform", seed=s) for s in range(max(2, cfg["reps"]))]
    sparse = [data.ids(rows, (cfg["sparse_ids"],), "uniform", seed=50 + s)
              for s in range(max(2, cfg["reps"]))]
    for setting, proxy in (("moto", None), ("proxy", px), ("proxy, copying relay", pxc)):
        label = f"{table}{setting}"
        endpoint = srv.endpoint if proxy is None else proxy.endpoint
        # (the copying relay, the proxy of earlier runs: the dense batch only, for continuity)
        for batch in (batches, sparse) if proxy is not pxc else (batches,):
            found = _setting(res, srv, setting, label, endpoint, url, E, batch, cfg, proxy)
            _report(res, label, found, batch[0].size, moto=proxy is None, table=table)
        if proxy is not pxc:
            _cache_runs(res, srv, label, endpoint, url, E, batches[-1].reshape(-1),
                        ctx.scratch)

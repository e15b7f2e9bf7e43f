"""Commits on object storage: what a write uploads and what reads of a table with deltas cost.

    python benchmarks/s3commits.py                     # 1,000,000 x 256 float32
    python benchmarks/s3commits.py --rows 100000 --latency 0.025   # through the latency proxy

Against the loopback S3 server (moto, ``benchmarks/s3server.py``), optionally behind the
latency proxy (``benchmarks/latencyproxy.py``: ``--latency`` seconds to first byte, 100 MB/s
per connection).  One run, figures side by side:

- a ``write`` of 10,000 random rows: seconds, requests by method and bytes uploaded (new
  objects under the commit area) against the rows' bytes;
- 16,384 uniform ids (row cache off, a fresh handle each time) on the table with those rows
  in a delta and on the same table after ``compact``: seconds, requests and bytes served
  (the open included), and their ratios.

Prints a Markdown table and writes the figures as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import s3server  # noqa: E402
from benchmarks.latencyproxy import ProxyProcess  # noqa: E402

AREA = "vectors/.embstore/commits/"


def _sizes(srv, bucket: str, prefix: str) -> dict[str, int]:
    out, token = {}, None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        res = srv.client().list_objects_v2(Bucket=bucket, Prefix=prefix, **kw)
        out.update({o["Key"]: o["Size"] for o in res.get("Contents", [])})
        if not res.get("IsTruncated"):
            return out
        token = res["NextContinuationToken"]


def _read(srv, url: str, ids: np.ndarray, want: np.ndarray) -> dict:
    import embstore
    srv.reset()
    t0 = time.perf_counter()
    with embstore.open(url, cache_bytes=0) as t:
        got = t[ids]
    dt = time.perf_counter() - t0
    assert np.array_equal(got, want), "rows read differ from the reference"
    return {"seconds": dt, "requests": srv.total(), "bytes": srv.sent()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--update", type=int, default=10_000)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    srv = s3server.start()
    bucket = "commits-bench"
    srv.make_bucket(bucket)
    os.environ.update(srv.env())
    proxy = ProxyProcess(srv.endpoint, a.latency) if a.latency else None
    if proxy is not None:
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
    import embstore
    rng = np.random.default_rng(0)
    E = rng.standard_normal((a.rows, a.dim)).astype(np.float32)
    url = f"s3://{bucket}/t.emb"
    t0 = time.perf_counter()
    embstore.save(url, E).close()
    upload_s = time.perf_counter() - t0
    ids = rng.choice(a.rows, size=a.update, replace=False)
    vals = rng.standard_normal((a.update, a.dim)).astype(np.float32)
    res: dict = {"rows": a.rows, "dim": a.dim, "latency_s": a.latency, "upload_s": upload_s}
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        before = _sizes(srv, bucket, f"t.emb/{AREA}")
        srv.reset()
        t0 = time.perf_counter()
        t.write(ids, vals)
        res["write"] = {"seconds": time.perf_counter() - t0, "requests": dict(srv.requests),
                        "row_bytes": int(vals.nbytes)}
        new = {k: n for k, n in _sizes(srv, bucket, f"t.emb/{AREA}").items() if k not in before}
        res["write"]["uploaded_bytes"] = sum(new.values())
        E[ids] = vals
        probe = rng.integers(0, a.rows, size=(32, 512))
        res["read_deltas"] = _read(srv, url, probe, E[probe])
        t0 = time.perf_counter()
        t.compact()
        res["compact_s"] = time.perf_counter() - t0
    res["read_compacted"] = _read(srv, url, probe, E[probe])
    d, c = res["read_deltas"], res["read_compacted"]
    res["ratios"] = {k: d[k] / max(1e-9, c[k]) for k in ("seconds", "requests", "bytes")}
    if proxy is not None:
        proxy.stop()
    srv.stop()
    w = res["write"]
    print(f"| {a.rows:,} x {a.dim} float32, latency {a.latency * 1e3:g} ms | value |\n|---|---|")
    print(f"| write {a.update:,} rows: time | {w['seconds']:.3f} s |")
    print(f"| write: requests | {w['requests']} |")
    print(f"| write: uploaded / rows' bytes | {w['uploaded_bytes']:,} / {w['row_bytes']:,} "
          f"= {w['uploaded_bytes'] / w['row_bytes']:.3f} |")
    for k in ("seconds", "requests", "bytes"):
        print(f"| 16,384 ids, deltas / compacted: {k} | {d[k]:,.3f} / {c[k]:,.3f} = "
              f"{res['ratios'][k]:.3f} |")
    print(f"| compact (rewrites the table) | {res['compact_s']:.1f} s |")
    if a.out is not None:
        a.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

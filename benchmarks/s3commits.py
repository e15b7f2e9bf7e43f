"""Commits on object storage: what a commit uploads and requests, and what reads of a table
with deltas cost, on the merge code (docs/FORMAT.md §11a, *Merged deltas*).

    python benchmarks/s3commits.py                     # 1,000,000 x 256 float32
    python benchmarks/s3commits.py --rows 100000 --latency 0.025   # through the latency proxy

Against the loopback S3 server (moto, ``benchmarks/s3server.py``), optionally behind the
latency proxy (``benchmarks/latencyproxy.py``: ``--latency`` seconds to first byte, 100 MB/s
per connection).  One run, figures side by side:

- ``--commits`` writes of ``--update`` random rows each, then ``--small`` writes of
  ``--small-rows`` rows (these merge their parent's newest deltas): per commit seconds,
  requests by method, requests beyond the data objects (manifest, hint, any GET or LIST:
  everything not under ``commits/data/``), bytes uploaded (new objects under the commit
  area) against the rows' bytes, and the deltas the version lists;
- 16,384 uniform ids (row cache off, a fresh handle each time) on the table with those
  deltas and on the same table after ``compact``: seconds, requests and bytes served (the
  open included), and their ratios;
- a table with keys (``--keyed-rows`` x 64) taking ``--appends`` appends of ``--append-rows``
  rows with keys: the key deltas its newest manifest lists, and ``ids_of`` of 16,384 of its
  keys on a fresh handle (requests, bytes) against the compacted table; the same appends on
  a twin table with merges off (``MERGE_BYTES`` 0: what the code did before key merges).

Prints Markdown tables and writes the figures as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
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


def _manifest(srv, bucket: str, name: str, n: int) -> dict:
    key = f"{name}/{AREA}v{n:020d}.json"
    return json.loads(srv.client().get_object(Bucket=bucket, Key=key)["Body"].read())


def _read(srv, url: str, ids: np.ndarray, want: np.ndarray) -> dict:
    import embstore
    srv.reset()
    t0 = time.perf_counter()
    with embstore.open(url, cache_bytes=0) as t:
        got = t[ids]
    dt = time.perf_counter() - t0
    assert np.array_equal(got, want), "rows read differ from the reference"
    return {"seconds": dt, "requests": srv.total(), "bytes": srv.sent()}


def _what(path: str) -> str:
    """A request's path without the bucket, table and chunk numbers (``key_hash/c``,
    ``commits/v``, ``commits/latest.json``)."""
    rest = path.split("/", 3)[-1]
    if "commits/" in rest:
        tail = rest.split("commits/", 1)[1]
        return "commits/v" if tail.startswith("v") else f"commits/{tail}"
    return "/".join(x for x in rest.split("/") if not x.isdigit())


def _commit(srv, bucket: str, name: str, t, job) -> dict:
    """One commit (``job(t)``, returning the rows' bytes): what it cost."""
    before = _sizes(srv, bucket, f"{name}/{AREA}")
    srv.reset()
    t0 = time.perf_counter()
    row_bytes = job(t)
    dt = time.perf_counter() - t0
    calls = list(srv.calls)
    new = {k: n for k, n in _sizes(srv, bucket, f"{name}/{AREA}").items() if k not in before}
    doc = _manifest(srv, bucket, name, t.version)
    return {"version": t.version, "seconds": dt,
            "requests": dict(Counter(m for m, _ in calls)),
            "data_requests": sum("/commits/data/" in p for _, p in calls),
            "other_requests": sum("/commits/data/" not in p for _, p in calls),
            "other": dict(Counter(f"{m} {_what(p)}" for m, p in calls
                                  if "/commits/data/" not in p)),
            "row_bytes": int(row_bytes), "uploaded_bytes": sum(new.values()),
            "deltas": len(doc["deltas"]),
            "key_deltas": sum(e["array"] == "keys" for e in doc["deltas"]),
            "merged": doc["change"].get("merged", 0),
            "merged_keys": doc["change"].get("merged_keys", 0)}


def _writes(srv, bucket: str, a, E: np.ndarray, rng) -> tuple[list[dict], list[dict]]:
    """The big writes, then the small ones, on the table ``t.emb``; ``E`` follows them."""
    import embstore

    def write(n: int):
        def job(t):
            ids = np.sort(rng.choice(a.rows, size=n, replace=False))
            vals = rng.standard_normal((n, a.dim)).astype(np.float32)
            t.write(ids, vals)
            E[ids] = vals
            return vals.nbytes
        return job
    with embstore.open(f"s3://{bucket}/t.emb", mode="r+", cache_bytes=0) as t:
        big = [_commit(srv, bucket, "t.emb", t, write(a.update)) for _ in range(a.commits)]
        small = [_commit(srv, bucket, "t.emb", t, write(a.small_rows)) for _ in range(a.small)]
    return big, small


def _keyed(srv, bucket: str, a, rng, name: str) -> dict:
    """``--appends`` appends of keys to a fresh keyed table ``name``; then ``ids_of`` of
    16,384 of its keys with the deltas and after compaction."""
    import embstore
    dim = 64
    K = rng.standard_normal((a.keyed_rows, dim)).astype(np.float32)
    keys = [f"key-{i:08d}" for i in range(a.keyed_rows)]
    url = f"s3://{bucket}/{name}"
    embstore.save(url, K, keys=keys).close()
    commits = []

    def append(c: int):
        def job(t):
            new = [f"new-{c:04d}-{j:06d}" for j in range(a.append_rows)]
            t.append(np.full((a.append_rows, dim), c, np.float32), keys=new)
            keys.extend(new)
            return a.append_rows * dim * 4
        return job
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        for c in range(a.appends):
            commits.append(_commit(srv, bucket, name, t, append(c)))
    probe = rng.choice(len(keys), size=min(16_384, len(keys)), replace=False)
    asked = [keys[i] for i in probe]
    out: dict = {"commits": commits}
    for label in ("deltas", "compacted"):
        if label == "compacted":
            with embstore.open(url, mode="r+") as t:
                t.compact()
        srv.reset()
        t0 = time.perf_counter()
        with embstore.open(url, cache_bytes=0) as t:
            got = t.ids_of(asked)
        out[label] = {"seconds": time.perf_counter() - t0, "requests": srv.total(),
                      "bytes": srv.sent()}
        assert np.array_equal(got, probe), "ids_of differs from the keys' rows"
    return out


def _print_commits(title: str, rows: list[dict]) -> None:
    print(f"\n| {title} | seconds | requests (data / other) | uploaded / rows' bytes | "
          "deltas listed (keys) | merged (keys) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| version {r['version']} | {r['seconds']:.3f} | {r['requests']} "
              f"({r['data_requests']} / {r['other_requests']}) | {r['uploaded_bytes']:,} / "
              f"{r['row_bytes']:,} = {r['uploaded_bytes'] / r['row_bytes']:.3f} | "
              f"{r['deltas']} ({r['key_deltas']}) | {r['merged']} ({r['merged_keys']}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--update", type=int, default=10_000)
    ap.add_argument("--commits", type=int, default=4)
    ap.add_argument("--small", type=int, default=12)
    ap.add_argument("--small-rows", type=int, default=100)
    ap.add_argument("--keyed-rows", type=int, default=200_000)
    ap.add_argument("--appends", type=int, default=30)
    ap.add_argument("--append-rows", type=int, default=1_000)
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
    from embstore.store.objects import merging
    rng = np.random.default_rng(0)
    E = rng.standard_normal((a.rows, a.dim)).astype(np.float32)
    url = f"s3://{bucket}/t.emb"
    t0 = time.perf_counter()
    embstore.save(url, E).close()
    res: dict = {"rows": a.rows, "dim": a.dim, "latency_s": a.latency,
                 "upload_s": time.perf_counter() - t0, "loadavg": os.getloadavg()}
    res["big"], res["small"] = _writes(srv, bucket, a, E, rng)
    probe = rng.integers(0, a.rows, size=(32, 512))
    res["read_deltas"] = _read(srv, url, probe, E[probe])
    t0 = time.perf_counter()
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        t.compact()
    res["compact_s"] = time.perf_counter() - t0
    res["read_compacted"] = _read(srv, url, probe, E[probe])
    d, c = res["read_deltas"], res["read_compacted"]
    res["ratios"] = {k: d[k] / max(1e-9, c[k]) for k in ("seconds", "requests", "bytes")}
    res["keyed"] = _keyed(srv, bucket, a, rng, "k.emb")
    budget = merging.MERGE_BYTES
    merging.MERGE_BYTES = 0  # (a twin without merges: one key delta more per append)
    try:
        res["keyed_unmerged"] = _keyed(srv, bucket, a, rng, "k0.emb")
    finally:
        merging.MERGE_BYTES = budget
    res["loadavg_end"] = os.getloadavg()
    if proxy is not None:
        proxy.stop()
    srv.stop()
    print(f"{a.rows:,} x {a.dim} float32, latency {a.latency * 1e3:g} ms, load "
          f"{res['loadavg'][0]:.1f} -> {res['loadavg_end'][0]:.1f}")
    _print_commits(f"write {a.update:,} rows", res["big"])
    _print_commits(f"write {a.small_rows:,} rows", res["small"])
    print("\n| 16,384 ids | deltas | compacted | ratio |\n|---|---|---|---|")
    for k in ("seconds", "requests", "bytes"):
        print(f"| {k} | {d[k]:,.3f} | {c[k]:,.3f} | {res['ratios'][k]:.3f} |")
    print(f"| compact (rewrites the table) | {res['compact_s']:.1f} s | | |")
    for label in ("keyed", "keyed_unmerged"):
        k = res[label]
        last = k["commits"][-1]
        print(f"\n{label}: {a.appends} appends of {a.append_rows:,} rows with keys on "
              f"{a.keyed_rows:,} x 64: the last lists {last['key_deltas']} key deltas, "
              f"{last['deltas']} deltas; uploads per append (last) {last['uploaded_bytes']:,}"
              f" bytes, {last['requests']} (beyond the data objects: {last['other']})")
        print("| ids_of 16,384 keys | deltas | compacted | ratio |\n|---|---|---|---|")
        for m in ("seconds", "requests", "bytes"):
            x, y = k["deltas"][m], k["compacted"][m]
            print(f"| {m} | {x:,.3f} | {y:,.3f} | {x / max(1e-9, y):.3f} |")
    if a.out is not None:
        a.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

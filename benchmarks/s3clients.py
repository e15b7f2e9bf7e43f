"""Which client for object storage: obstore vs fsspec/s3fs on the same ranged-read pattern.

    python benchmarks/s3clients.py                   # starts the loopback server itself
    python benchmarks/s3clients.py --endpoint URL    # a server started elsewhere (for a
                                                     # venv with s3fs, whose botocore pin
                                                     # conflicts with moto's)

Pattern: one 64 MiB object, 2,000 ranged GETs of 16 KiB at random chunk offsets, 32 in
flight, as the remote read path issues them; then 8 ranges of 8 MiB (coalesced reads).
Reports wall time and process CPU time per client, each the best of 3.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BUCKET, KEY = "clients", "blob"
SIZE = 64 << 20


def _patterns():
    rng = np.random.default_rng(0)
    small = (rng.integers(0, SIZE // 16384, size=2000) * 16384).tolist()
    return [(s, s + 16384) for s in small], [(s, s + (8 << 20)) for s in range(0, SIZE, 8 << 20)]


def _best(fn) -> tuple[float, float]:
    best = (float("inf"), 0.0)
    for _ in range(3):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


def obstore_client(endpoint: str):
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    from obstore.store import S3Store
    st = S3Store(BUCKET, endpoint=endpoint, region="us-east-1",
                 client_options={"allow_http": True})
    pool = ThreadPoolExecutor(32)

    def read(ranges):
        return list(pool.map(lambda r: obstore.get_range(st, KEY, start=r[0], end=r[1]), ranges))
    return read


def s3fs_client(endpoint: str):
    import s3fs
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, max_concurrency=32)
    path = f"{BUCKET}/{KEY}"

    def read(ranges):
        return fs.cat_ranges([path] * len(ranges), [r[0] for r in ranges],
                             [r[1] for r in ranges], batch_size=32)
    return read


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint")
    args = p.parse_args()
    from benchmarks import s3server
    srv = None
    if args.endpoint is None:
        srv = s3server.ServerProcess()
        endpoint = srv.endpoint
        srv.make_bucket(BUCKET)
    else:
        endpoint = args.endpoint
    os.environ.update({"AWS_ACCESS_KEY_ID": s3server.ACCESS_KEY, "AWS_REGION": "us-east-1",
                       "AWS_SECRET_ACCESS_KEY": s3server.SECRET_KEY})
    small, large = _patterns()
    try:
        if srv is not None:
            import obstore
            from obstore.store import S3Store
            obstore.put(S3Store(BUCKET, endpoint=endpoint, region="us-east-1",
                                client_options={"allow_http": True}), KEY, os.urandom(SIZE))
        for name, make in (("obstore", obstore_client), ("s3fs", s3fs_client)):
            try:
                read = make(endpoint)
            except ImportError as exc:
                print(f"{name}: not installed ({exc.name})")
                continue
            read(small[:32])
            for label, ranges in (("2,000 x 16 KiB", small), ("8 x 8 MiB", large)):
                wall, cpu = _best(lambda: read(ranges))
                print(f"{name}: {label}: {wall * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU")
    finally:
        if srv is not None:
            if "--keep" in sys.argv:
                input()
            srv.stop()


if __name__ == "__main__":
    main()

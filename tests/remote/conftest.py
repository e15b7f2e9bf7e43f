"""Fixtures for tables on object storage: a real S3 server (moto) on loopback.

The server (benchmarks/s3server.py) runs in this process for the whole session; every test
gets a fresh bucket and the standard AWS environment variables pointing at the server
(set for that test only).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("moto")
pytest.importorskip("obstore")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import embstore  # noqa: E402
from benchmarks import s3server  # noqa: E402

_buckets = itertools.count()

# name -> keyword arguments of embstore.save for the remote contract suite
REMOTE_LAYOUTS = {
    "s3": {},
    "s3-small-chunks": {"chunk_rows": 4, "shard_rows": 16},
    "s3-zstd-nocache": {"compression": "zstd", "chunk_rows": 8, "shard_rows": 32,
                        "cache_bytes": 0},
}


@pytest.fixture(scope="session")
def s3_server():
    srv = s3server.start()
    yield srv
    srv.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The server, with a fresh bucket ``s3.bucket`` and the AWS variables set for it."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT", "AWS_SKIP_SIGNATURE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"embstore-test-{next(_buckets)}"
    s3_server.make_bucket(bucket)
    s3_server.bucket = bucket
    s3_server.reset()
    return s3_server


# the default layout in every run; the others (same code paths, more requests) in full runs
@pytest.fixture(params=[pytest.param(name, marks=() if name == "s3" else pytest.mark.slow)
                        for name in REMOTE_LAYOUTS], ids=list(REMOTE_LAYOUTS))
def make_table(request, s3, tmp_path):
    """``make_table(array, keys=None, mode=...)``: a table on S3 holding ``array``, opened
    read-only (remote tables are)."""
    kw = dict(REMOTE_LAYOUTS[request.param])
    cache = kw.pop("cache_bytes", "1MiB")
    opened = []
    names = itertools.count()

    def make(array, keys=None, mode="r"):
        url = f"s3://{s3.bucket}/t{next(names)}.emb"
        embstore.save(url, np.ascontiguousarray(array), keys=keys, **kw).close()
        t = embstore.open(url, cache_bytes=cache)
        opened.append(t)
        return t

    make.backend = request.param
    yield make
    for t in opened:
        t.close()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)

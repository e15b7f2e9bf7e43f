"""The whole Table contract (tests/contract.py) over tables on S3 (the moto server of
tests/remote/conftest.py).

Remote tables are read-only (``writable = False``): the contract's write tests assert the
refusal and that the rows stay.  The default layout runs in every run; the others (the same
code paths, more requests) in full runs.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract import TableContract, WrittenOnce, saver, saving_factory  # noqa: E402

_classes = itertools.count()


class S3Tables(TableContract):
    """Tables written by ``embstore.save`` to a URL of the class's bucket, each distinct one
    once (112 uploads took 23 CPU-s and 150 s at load 22; now 9 CPU-s), opened read-only
    (the only mode of remote tables)."""

    writable = False
    remote = True
    layout: dict = {}

    @pytest.fixture(scope="class")
    @classmethod
    def written_once(cls, s3_server) -> WrittenOnce:
        """Each distinct table uploaded once per class, to a bucket of the class (remote
        tables open read-only, so the tests share them)."""
        bucket = f"embstore-contract-{next(_classes)}"
        s3_server.make_bucket(bucket)
        names = itertools.count()
        return WrittenOnce(saver(cls.layout, cls.storage_dtype)[0],
                           lambda: f"s3://{bucket}/t{next(names)}.emb")

    @pytest.fixture
    def make_table(self, s3, written_once):
        names = itertools.count()
        make, opened = saving_factory(lambda: f"s3://{s3.bucket}/t{next(names)}.emb",
                                      layout=self.layout, storage_dtype=self.storage_dtype,
                                      fixed_mode="r", once=written_once)
        yield make
        for t in opened:
            t.close()


class TestS3(S3Tables):
    pass


@pytest.mark.slow
class TestS3SmallChunks(S3Tables):
    layout = {"chunk_rows": 4, "shard_rows": 16}


@pytest.mark.slow
class TestS3ZstdNoCache(S3Tables):
    layout = {"compression": "zstd", "chunk_rows": 8, "shard_rows": 32, "cache_bytes": 0}


class TestS3Int8(S3Tables):
    storage_dtype = "int8"
    row_steps = 0.5


@pytest.mark.slow
class TestS3Bfloat16(S3Tables):
    storage_dtype = "bfloat16"
    rtol = 2.0**-8

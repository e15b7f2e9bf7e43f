"""Shared fixtures; ``make_table`` runs the layer, search and bag tests on several backends.

The Table contract itself is tests/contract.py, subclassed per backend.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

pytest.register_assert_rewrite("contract")  # tests/contract.py: the contract suite

import embstore  # noqa: E402

if os.environ.get("EMBSTORE_TEST_CPU"):  # CPU seconds per test: see tests/cputimes.py
    from cputimes import (  # noqa: E402,F401
        pytest_collection,
        pytest_collection_finish,
        pytest_runtest_call,
        pytest_runtest_setup,
        pytest_runtest_teardown,
        pytest_sessionfinish,
    )

# name -> keyword arguments of embstore.save (None: the in-memory backend)
BACKENDS = {
    "memory": None,
    "zarr": {},
    "zarr-small-chunks": {"chunk_rows": 4, "shard_rows": 16},
    "zarr-zstd": {"compression": "zstd", "chunk_rows": 8, "shard_rows": 32},
    "zarr-blosc-nocache": {"compression": "blosc", "chunk_rows": 8, "shard_rows": 32,
                           "cache_bytes": 0},
}

_counter = itertools.count()


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def make_table(request, tmp_path):
    """``make_table(array, keys=None, mode="r+")``: a table of that backend holding ``array``."""
    layout = BACKENDS[request.param]
    opened = []

    def make(array, keys=None, mode="r+"):
        array = np.ascontiguousarray(array)
        if layout is None:
            t = embstore.MemoryTable(array.copy(), keys=keys)
            if mode == "r":
                t.array.flags.writeable = False
            return t
        if not hasattr(embstore, "save"):
            pytest.skip("the on-disk backend is not built yet")
        kw = dict(layout)
        cache = kw.pop("cache_bytes", "1MiB")
        path = tmp_path / f"table{next(_counter)}"
        embstore.save(path, array, keys=keys, **kw).close()
        t = embstore.open(path, mode=mode, cache_bytes=cache)
        opened.append(t)
        return t

    make.backend = request.param
    yield make
    for t in opened:
        t.close()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)

"""A table read by xarray and dask: the same values as to_numpy(), lookups as t[ids]."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import embstore  # noqa: E402
from embstore import dasktable  # noqa: E402

V, D = 203, 6
LAYOUTS = {"memory": None, "zarr": {"chunk_rows": 4, "shard_rows": 16},
           "zarr-zstd": {"compression": "zstd", "chunk_rows": 8, "shard_rows": 32},
           "zarr-default": {}}


@pytest.fixture(scope="module")
def weights():
    return np.random.default_rng(5).standard_normal((V, D)).astype(np.float32)


@pytest.fixture(params=list(LAYOUTS))
def table(request, weights, tmp_path):
    layout = LAYOUTS[request.param]
    if layout is None:
        yield embstore.MemoryTable(weights.copy())
        return
    t = embstore.save(tmp_path / "t", weights, **layout)
    yield t
    t.close()


def test_to_dask_reads_the_table(table, weights):
    x = table.to_dask()
    assert x.shape == (V, D) and x.dtype == weights.dtype
    np.testing.assert_array_equal(x.compute(), weights)
    np.testing.assert_array_equal(x[7:150:3, 1:4].compute(), weights[7:150:3, 1:4])
    np.testing.assert_array_equal(x[-1].compute(), weights[-1])
    np.testing.assert_array_equal((x * 2).sum(axis=0).compute(), (weights * 2).sum(axis=0))


def test_blocks_are_whole_shards(tmp_path, weights, monkeypatch):
    t = embstore.save(tmp_path / "t", weights, chunk_rows=4, shard_rows=16)
    assert t.to_dask().chunks == ((V,), (D,))  # the whole small table fits one block
    monkeypatch.setattr(dasktable, "_BLOCK_BYTES", 16 * D * 4 * 3 + 5)  # three shards fit
    x = t.to_dask()
    assert x.chunks[0] == (48, 48, 48, 48, 11)
    monkeypatch.setattr(dasktable, "_BLOCK_BYTES", 10)  # less than a shard: one shard
    assert set(t.to_dask().chunks[0][:-1]) == {16}
    np.testing.assert_array_equal(t.to_dask().compute(), weights)
    assert t.to_dask(block_rows=50).chunks[0] == (50, 50, 50, 50, 3)
    with pytest.raises(ValueError, match="block_rows must be a positive integer, got 0"):
        t.to_dask(block_rows=0)


@pytest.mark.parametrize("shape", [(17,), (5, 7), (0,)], ids=str)
def test_take_equals_lookup(table, weights, shape):
    rng = np.random.default_rng(9)
    ids = rng.integers(0, V, size=shape)
    x = table.to_dask()
    np.testing.assert_array_equal(x[ids].compute(), table[ids])
    np.testing.assert_array_equal(x[ids, :].compute(), weights[ids])
    np.testing.assert_array_equal(da.take(x, ids.reshape(-1), axis=0).compute(),
                                  table[ids.reshape(-1)])
    dids = da.from_array(ids, chunks=(4,) + ids.shape[1:])
    np.testing.assert_array_equal(x[dids].compute(), weights[ids])


def test_take_counts_from_the_end_and_refuses_out_of_range(table, weights):
    x = table.to_dask()
    np.testing.assert_array_equal(x[[-1, 0, -V]].compute(), weights[[-1, 0, -V]])
    with pytest.raises(embstore.InvalidIdError, match=f"id {V} at position"):
        x[[0, V]]
    with pytest.raises(embstore.InvalidIdError, match=f"id {-V - 1} is out of range"):
        x[[-V - 1]]


def test_take_reads_through_the_row_cache(tmp_path, weights):
    t = embstore.save(tmp_path / "t", weights, chunk_rows=4, shard_rows=16)
    t = embstore.open(tmp_path / "t", cache_bytes="1MiB")
    t.to_dask().compute()
    assert t.cache_info().misses == t.cache_info().entries == 0  # blocks are scans: no cache
    t.to_dask()[np.array([3, 3, 150])].compute()
    assert t.cache_info().entries == 2  # ids are lookups: the gather, through the cache
    t.close()


def test_an_on_disk_table_pickles_as_its_path(tmp_path, weights):
    t = embstore.save(tmp_path / "t", weights)
    t = embstore.open(tmp_path / "t", mode="r+", cache_bytes=12345)
    blob = pickle.dumps(t)
    assert len(blob) < 500 and weights[:2].tobytes() not in blob
    clone = copy.deepcopy(t)  # the same reduction pickle uses
    assert clone is not t and clone.mode == "r" and clone.path == t.path
    assert clone.cache_info().capacity_bytes == 12345
    np.testing.assert_array_equal(clone[[4, 1]], weights[[4, 1]])
    clone.close()
    t.close()


FORMATS = {1: {"chunk_rows": 4, "shard_rows": 16, "format_version": 1}, 2: {}}


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize("keys", [False, True], ids=["nokeys", "keys"])
def test_xarray_opens_a_table(tmp_path, weights, keys, fmt):
    xr = pytest.importorskip("xarray")
    names = [f"w{i}" for i in range(V)] if keys else None
    embstore.save(tmp_path / "t", weights, keys=names, **FORMATS[fmt]).close()
    meta = json.loads((tmp_path / "t" / "vectors" / "zarr.json").read_text())
    assert meta["dimension_names"] == ["row", "dim"]
    with embstore.open(tmp_path / "t", mode="r+") as t:
        t.append(np.ones((2, D), np.float32), keys=["new1", "new2"] if keys else None)
        want = t.to_numpy()
    ds = xr.open_zarr(tmp_path / "t", consolidated=False)
    assert ds["vectors"].dims == ("row", "dim")
    np.testing.assert_array_equal(ds["vectors"].values, want)
    if keys:
        assert ds["keys"].dims == ("key",)
        assert list(ds["keys"].values) == names + ["new1", "new2"]
        assert not ds.indexes  # the key index arrays stay lazy data, not pandas indexes
    assert ds.attrs["embstore"]["format"] == 2  # (a format-1 table's first commit: format 2)


@pytest.mark.parametrize("fmt", [1, 2])
def test_xarray_opens_an_int8_table_and_dask_decodes_it(tmp_path, weights, fmt):
    xr = pytest.importorskip("xarray")
    t = embstore.save(tmp_path / "t", weights, dtype="int8", **FORMATS[fmt])
    ds = xr.open_zarr(tmp_path / "t", consolidated=False)
    assert ds["vectors"].dims == ("row", "dim") and ds["vectors"].dtype == np.int8  # codes
    assert ds["row_scale"].dims == ("scale_row", "scale_field")
    x = t.to_dask()
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x.compute(), t.to_numpy())  # decoded, as t[a:b]
    np.testing.assert_array_equal(x[[5, 0, 5]].compute(), t[[5, 0, 5]])
    t.close()

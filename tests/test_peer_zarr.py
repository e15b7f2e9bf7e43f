"""Zarr round trips after ``zarr.consolidate_metadata`` (issue 32, point 2).

``xarray.Dataset.to_zarr`` consolidates by default, and zarr-python and xarray then read
every array's shape from the copy in the group's ``zarr.json``.  After an embstore write,
embstore, zarr-python and xarray must see the same rows, and ``verify`` must read the
arrays themselves, never the copy.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import embstore

zarr = pytest.importorskip("zarr")

V, D = 100, 4


def _consolidate(path) -> None:
    with warnings.catch_warnings():  # "not part of the Zarr format 3 specification"
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(path))
    assert json.loads((path / "zarr.json").read_text())["consolidated_metadata"]


@pytest.fixture
def consolidated(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "t"
    embstore.save(path, rng.standard_normal((V, D)).astype(np.float32),
                  keys=[f"k{i}" for i in range(V)], chunk_rows=16, shard_rows=64).close()
    _consolidate(path)
    return path


def _zarr_rows(path) -> tuple[np.ndarray, list[str]]:
    """vectors and keys as zarr-python reads them (through the consolidated copy)."""
    g = zarr.open_group(str(path), mode="r")
    assert g.metadata.consolidated_metadata is not None  # the copy is what is read
    return np.asarray(g["vectors"][:]), [str(k) for k in g["keys"][:]]


def test_append_after_consolidate_same_rows_in_zarr_and_xarray(consolidated):
    """ports xarray's ``to_zarr`` then ``open_zarr`` round trip (consolidated=None, the
    default) and zarr-python's ``test_consolidated.py::test_consolidated`` reading after a
    change: an append leaves no stale shape behind."""
    xr = pytest.importorskip("xarray")
    new = np.arange(10 * D, dtype=np.float32).reshape(10, D)
    with embstore.open(consolidated, mode="r+") as t:
        ids = t.append(new, keys=[f"n{i}" for i in range(10)])
        t.write([5, V + 2], np.full((2, D), 7.0, np.float32))
        ours, our_keys = t.to_numpy(), list(t.keys)
        t.compact()  # (other Zarr readers see the rows as of the last compaction)
    np.testing.assert_array_equal(ids, np.arange(V, V + 10))
    assert ours.shape == (V + 10, D)
    got, keys = _zarr_rows(consolidated)
    np.testing.assert_array_equal(got, ours)
    assert keys == our_keys
    ds = xr.open_zarr(consolidated)
    np.testing.assert_array_equal(ds["vectors"].values, ours)
    assert [str(k) for k in ds["keys"].values] == our_keys
    with embstore.open(consolidated) as t:
        np.testing.assert_array_equal(t.lookup_keys(["n3", "k5"]), ours[[V + 3, 5]])
    report = embstore.verify(consolidated)
    assert report.ok, str(report)


def test_verify_reads_arrays_not_a_stale_consolidated_copy(consolidated):
    """ports the issue's case: a copy left stale by a tool that does not refresh it (here:
    put back by hand) must not make ``verify`` call a healthy table DAMAGED, nor hide keys."""
    stale = (consolidated / "zarr.json").read_text()
    with embstore.open(consolidated, mode="r+") as t:
        t.append(np.ones((10, D), np.float32), keys=[f"n{i}" for i in range(10)])
    (consolidated / "zarr.json").write_text(stale)  # shapes of 100 rows for 110
    report = embstore.verify(consolidated)
    assert report.ok, str(report)
    assert report.vocab_size == V + 10
    with embstore.open(consolidated) as t:
        assert len(t) == V + 10
        assert int(t.ids_of("n9")) == V + 9


def test_commit_refreshes_exactly_what_zarr_would_consolidate(consolidated):
    """After an append, the copy equals what ``zarr.consolidate_metadata`` itself writes."""
    with embstore.open(consolidated, mode="r+") as t:
        t.append(np.ones((3, D), np.float32), keys=["x", "y", "z"])
    ours = json.loads((consolidated / "zarr.json").read_text())["consolidated_metadata"]
    _consolidate(consolidated)
    theirs = json.loads((consolidated / "zarr.json").read_text())["consolidated_metadata"]
    assert ours == theirs

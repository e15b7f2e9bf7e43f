"""Batch jobs with --oov zero/unk on out-of-range ids: every input dtype, output and runner."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import embstore
import embstore.batch.io as batch_io
from embstore.batch import lookup_file
from embstore.cli import cli

V, D = 60, 4


@pytest.fixture
def table_array(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture
def table_path(tmp_path, table_array):
    path = tmp_path / "table"
    embstore.save(path, table_array, chunk_rows=8, shard_rows=32).close()
    return str(path)


def bad_ids(rng, dtype):
    ids = rng.integers(0, V, size=(30, 3)).astype(dtype)
    big = np.iinfo(dtype).max
    ids[[0, 11, 29], [1, 0, 2]] = [V, big, V + 1]
    if np.iinfo(dtype).min < 0:
        ids[5, 1] = -1
    return ids


def expected(table_array, ids, oov):
    raw = ids.astype(object)
    bad = np.asarray((raw < 0) | (raw >= V), dtype=bool)
    good = np.where(bad, 5, ids.astype(np.int64, copy=False) % V).astype(np.int64)
    want = table_array[good]
    if oov == "zero":
        want[bad] = 0
    return want


def read_out(path):
    if str(path).endswith(".zarr"):
        return zarr.open_array(path, mode="r")[:]
    return np.load(path)


def leftovers(directory):
    return sorted(p for p in os.listdir(directory) if ".partial" in p)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint8],
                         ids=["int64", "uint64", "int32", "uint8"])
@pytest.mark.parametrize("ext", ["npy", "zarr"])
@pytest.mark.parametrize("oov", ["zero", "unk"])
def test_cli_oov_out_of_range(tmp_path, table_path, table_array, rng, dtype, ext, oov):
    """int64 ids used to come back as a read-only memory map and crash the in-place fix-up."""
    ids = bad_ids(rng, dtype)
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / f"o.{ext}"
    args = ["lookup", table_path, str(tmp_path / "ids.npy"), str(out), "--oov", oov,
            "--batch-rows", "7", "-q"] + (["--unk-id", "5"] if oov == "unk" else [])
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(read_out(out), expected(table_array, ids, oov))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("threads", [True, False], ids=["pipeline", "sequential"])
@pytest.mark.parametrize("ext", ["npy", "zarr"])
def test_api_oov_out_of_range(tmp_path, table_path, table_array, rng, threads, ext):
    ids = bad_ids(rng, np.int64)
    np.save(tmp_path / "ids.npy", ids)
    for oov in ("zero", "unk"):
        out = tmp_path / f"{oov}.{ext}"
        lookup_file(table_path, tmp_path / "ids.npy", out, oov=oov, unk_id=5, batch_rows=4,
                    threads=threads)
        np.testing.assert_array_equal(read_out(out), expected(table_array, ids, oov))
        with embstore.open(table_path) as t:  # a Table object, too
            lookup_file(t, tmp_path / "ids.npy", tmp_path / f"t{oov}.{ext}", oov=oov,
                        unk_id=5, threads=threads)
        np.testing.assert_array_equal(read_out(tmp_path / f"t{oov}.{ext}"),
                                      expected(table_array, ids, oov))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("ext", ["npy", "zarr"])
def test_failed_job_removes_its_partial_output(tmp_path, table_path, rng, monkeypatch, ext):
    """A job that fails on an error (not an interruption) leaves no hidden partial output."""
    np.save(tmp_path / "ids.npy", rng.integers(0, V, size=(30, 3)))
    calls = []
    original = batch_io.lookup_into

    def broken(table, ids, out, *, pads):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("boom")
        original(table, ids, out, pads=pads)

    monkeypatch.setattr("embstore.batch.job.lookup_into", broken)
    with pytest.raises(ValueError, match="boom"):
        lookup_file(table_path, tmp_path / "ids.npy", tmp_path / f"o.{ext}", batch_rows=4,
                    threads=False)
    assert leftovers(tmp_path) == [] and not (tmp_path / f"o.{ext}").exists()


@pytest.mark.slow
@pytest.mark.dask
@pytest.mark.parametrize("oov", ["zero", "unk"])
def test_dask_oov_out_of_range(tmp_path, table_path, table_array, rng, oov):
    pytest.importorskip("dask.distributed")
    ids = bad_ids(rng, np.int64)
    np.save(tmp_path / "ids.npy", ids)
    for ext in ("npy", "zarr"):
        out = tmp_path / f"o.{ext}"
        lookup_file(table_path, tmp_path / "ids.npy", out, oov=oov, unk_id=5, batch_rows=8,
                    scheduler="local", n_workers=1)
        np.testing.assert_array_equal(read_out(out), expected(table_array, ids, oov))
    assert leftovers(tmp_path) == []

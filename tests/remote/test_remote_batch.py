"""Batch lookup jobs with the table, the ids and the output all on S3 (no shared disk)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.batch import lookup_file
from embstore.batch import remote as remote_io
from embstore.cli import cli
from embstore.errors import InvalidIdError


def _put_npy(s3, key: str, arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=buf.getvalue())
    return f"s3://{s3.bucket}/{key}"


def _read_zarr(s3, prefix: str, tmp_path) -> np.ndarray:
    """The output array, downloaded object by object and read by zarr-python."""
    import zarr
    root = tmp_path / "download.zarr"
    res = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/")
    for obj in res.get("Contents", []):
        p = root / obj["Key"][len(prefix) + 1:]
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(s3.client().get_object(Bucket=s3.bucket, Key=obj["Key"])["Body"].read())
    return zarr.open_array(str(root), mode="r")[...]


@pytest.fixture
def job(s3, rng):
    E = rng.standard_normal((3000, 8)).astype(np.float32)
    table = f"s3://{s3.bucket}/t.emb"
    embstore.save(table, E, chunk_rows=16, shard_rows=512).close()
    ids = rng.integers(0, 3000, size=(45, 7)).astype(np.int32)
    return E, table, ids, _put_npy(s3, "ids.npy", ids)


def test_everything_on_s3_equals_numpy(job, s3, tmp_path):
    E, table, ids, ids_url = job
    out = f"s3://{s3.bucket}/out.zarr"
    summary = lookup_file(table, ids_url, out, batch_rows=10)
    assert summary["blocks"] == 5 and summary["shape"] == (45, 7, 8)
    got = _read_zarr(s3, "out.zarr", tmp_path)
    np.testing.assert_array_equal(got, E[ids])
    keys = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="out.zarr/")["Contents"]
    assert not [k["Key"] for k in keys if ".embstore-lookup" in k["Key"]]  # markers gone


def test_killed_job_is_invisible_then_resumes(job, s3, tmp_path, monkeypatch):
    E, table, ids, ids_url = job
    out = f"s3://{s3.bucket}/out.zarr"
    write = remote_io.RemoteZarrSink.write
    written = []

    def dying_write(self, i, block):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(i)
        return write(self, i, block)

    monkeypatch.setattr(remote_io.RemoteZarrSink, "write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        lookup_file(table, ids_url, out, batch_rows=10, threads=False)
    monkeypatch.setattr(remote_io.RemoteZarrSink, "write", write)
    head = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="out.zarr/zarr.json")
    assert head["KeyCount"] == 0  # no array metadata: the partial output does not open
    summary = lookup_file(table, ids_url, out, batch_rows=10, resume=True)
    assert summary["resumed_blocks"] == 2
    np.testing.assert_array_equal(_read_zarr(s3, "out.zarr", tmp_path), E[ids])


def test_existing_output_needs_overwrite_and_bad_ids_are_named(job, s3):
    E, table, ids, ids_url = job
    out = f"s3://{s3.bucket}/out.zarr"
    lookup_file(table, ids_url, out)
    with pytest.raises(embstore.DestinationExistsError, match="out.zarr already exists"):
        lookup_file(table, ids_url, out)
    bad = ids.copy()
    bad[3, 4] = 3000
    bad_url = _put_npy(s3, "bad.npy", bad)
    with pytest.raises(InvalidIdError, match=r"bad.npy: id 3000 at position \(3, 4\)"):
        lookup_file(table, bad_url, out, overwrite=True)


def test_npy_output_on_s3_is_refused(job, s3):
    _, table, _, ids_url = job
    r = CliRunner().invoke(cli, ["lookup", table, ids_url, f"s3://{s3.bucket}/o.npy"])
    assert r.exit_code == 1
    assert "outputs on object storage are Zarr arrays (.zarr)" in r.output


@pytest.mark.dask
@pytest.mark.slow
def test_dask_two_workers_everything_on_s3(job, s3, tmp_path):
    E, table, ids, ids_url = job
    out = f"s3://{s3.bucket}/dask.zarr"
    r = CliRunner().invoke(cli, ["lookup", table, ids_url, out, "--scheduler", "local",
                                 "--workers", "2", "--batch-rows", "8", "--quiet"])
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(_read_zarr(s3, "dask.zarr", tmp_path), E[ids])

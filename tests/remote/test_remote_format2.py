"""Format-2 tables on object storage (moto on loopback): the same layout read by ranges,
every page checked, rows equal to the local table's (and to NumPy)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore import CorruptStoreError
from embstore.cli import cli


@pytest.fixture
def E(rng):
    return rng.standard_normal((6000, 40)).astype(np.float32)  # 160-byte rows


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
def test_a_copied_format_2_table_reads_as_the_local_one(s3, rng, tmp_path, E, dtype):
    keys = [f"w{i}" for i in range(E.shape[0])]
    local = embstore.save(tmp_path / "t", E, keys=keys, dtype=dtype, format_version=2,
                          chunk_rows=1024)
    url = f"s3://{s3.bucket}/t2-{dtype}.emb"
    res = CliRunner().invoke(cli, ["copy", str(tmp_path / "t"), url])
    assert res.exit_code == 0, res.output
    with embstore.open(url) as t:
        assert t.info()["format"] == 2 and t.storage_dtype == dtype
        ids = rng.integers(0, E.shape[0], size=(7, 33))
        np.testing.assert_array_equal(t[ids], local[ids])
        np.testing.assert_array_equal(t.to_numpy(), local.to_numpy())
        np.testing.assert_array_equal(t.lookup_keys(["w5", "w5999"]), local[[5, 5999]])
    if dtype == "float32":
        np.testing.assert_array_equal(local.to_numpy(), E)


def test_save_to_a_url_in_format_2_and_a_damaged_page(s3, rng, E):
    url = f"s3://{s3.bucket}/direct.emb"
    embstore.save(url, E, format_version=2, chunk_rows=1024).close()
    with embstore.open(url) as t:
        np.testing.assert_array_equal(t[[0, 1023, 1024, 5999]], E[[0, 1023, 1024, 5999]])
    client = s3.client()
    key = "direct.emb/vectors/c/2/0"
    body = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[4096 * 3 + 7] ^= 0x40  # a byte of page 3 of chunk 2: rows 2048+76..2048+102
    client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))
    with embstore.open(url) as t:
        np.testing.assert_array_equal(t[[2048, 5999]], E[[2048, 5999]])  # other pages
        with pytest.raises(CorruptStoreError, match=r"vectors/c/2/0: crc32c mismatch in page 3"):
            t[[2048 + 80]]


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_remote_table_deleted_under_a_reader_never_reads_zeros(s3, E, fmt):
    """Every object of the table deleted while a reader is open: the rows it asks for
    later are a clear error (or rows it had), never the fill value."""
    from embstore.store.place.objstore import ObjectClient

    url = f"s3://{s3.bucket}/gone-{fmt}.emb"
    layout = {"format_version": 2, "chunk_rows": 1024} if fmt == 2 else {
        "chunk_rows": 16, "shard_rows": 1024}
    embstore.save(url, E, **layout).close()
    t = embstore.open(url, cache_bytes=0)
    np.testing.assert_array_equal(t[[0]], E[[0]])
    client = ObjectClient(url)
    try:
        client.delete(["zarr.json"] + [rel for rel, _ in client.list() if rel != "zarr.json"])
    finally:
        client.close()
    try:
        got = t[np.arange(2000, 6000)]
    except (CorruptStoreError, OSError) as exc:
        assert "removed" in str(exc) or "missing" in str(exc) or "not found" in str(
            exc).lower(), exc
    else:
        np.testing.assert_array_equal(got, E[2000:6000])
    t.close()


def test_verify_finds_a_damaged_page_of_a_remote_format_2_table(s3, E, tmp_path):
    from embstore.store.place.objstore import ObjectClient

    url = f"s3://{s3.bucket}/bad.emb"
    embstore.save(url, E, format_version=2, chunk_rows=1024).close()
    assert embstore.verify(url).ok
    client = ObjectClient(url)
    try:
        raw = bytearray(client.get("vectors/c/2/0"))
        raw[5000] ^= 1
        client.put("vectors/c/2/0", bytes(raw))
    finally:
        client.close()
    report = embstore.verify(url)
    assert not report.ok and "vectors/c/2/0" in str(report) and "crc32c" in str(report)


@pytest.mark.parametrize("change", ["write", "append keys"])
def test_a_table_with_pending_deltas_is_uploaded_after_compact(s3, tmp_path, E, change):
    """Remote readers read chunks and the key index: rows written (and keys appended)
    since the last compaction are refused by an upload, which works once compacted."""
    keys = [f"w{i}" for i in range(E.shape[0])]
    path = tmp_path / "t"
    embstore.save(path, E, keys=keys).close()
    extra = np.full((3, E.shape[1]), 2.5, np.float32)
    with embstore.open(path, "r+") as t:
        if change == "write":
            t.write([4, 5000], extra[:2])
        else:
            t.append(extra, keys=["x", "y", "z"])
        want = t.to_numpy()
    url = f"s3://{s3.bucket}/pending-{change.replace(' ', '-')}.emb"
    res = CliRunner().invoke(cli, ["copy", str(path), url])
    assert res.exit_code == 1 and "delta file(s), which tables on object storage do not " \
        "read: run `embstore compact` on it first" in res.output, res.output
    assert CliRunner().invoke(cli, ["compact", str(path)]).exit_code == 0
    res = CliRunner().invoke(cli, ["copy", str(path), url])
    assert res.exit_code == 0, res.output
    with embstore.open(url) as t:
        np.testing.assert_array_equal(t.to_numpy(), want)
        if change != "write":
            np.testing.assert_array_equal(t.lookup_keys(["y", "w7"]), want[[E.shape[0] + 1, 7]])

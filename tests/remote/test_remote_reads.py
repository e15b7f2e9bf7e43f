"""Reading tables on S3: requests per open and per batch, the disk cache, damage, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import embstore
from embstore import CorruptStoreError, ReadOnlyError
from embstore.errors import EmbstoreError, FormatError
from embstore.store.place.objstore import RemoteError
from embstore.fs import beside
from embstore.store.remote.transfer import copy_table, download_table


@pytest.fixture
def table(s3, rng):
    """A 2,000 x 8 float32 table in 4 shards of 512 rows, chunks of 16 rows, on S3."""
    E = rng.standard_normal((2000, 8)).astype(np.float32)
    url = f"s3://{s3.bucket}/t.emb"
    embstore.save(url, E, chunk_rows=16, shard_rows=512).close()
    s3.reset()
    return url, E


def _shard_object(s3, key: str) -> bytes:
    return s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()


def _put(s3, key: str, data: bytes) -> None:
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=data)


def test_open_is_two_requests_whatever_the_size(s3, rng):
    for rows in (10, 5000):
        url = f"s3://{s3.bucket}/t{rows}.emb"
        embstore.save(url, rng.standard_normal((rows, 4)).astype(np.float32),
                      chunk_rows=8, shard_rows=64).close()
        s3.reset()
        with embstore.open(url) as t:
            assert s3.total() == 3 and t.shape == (rows, 4)  # a LIST, two zarr.json


def test_batch_requests_one_index_per_shard_then_coalesced_ranges(table, s3, rng):
    url, E = table
    ids = rng.integers(0, 2000, size=(4, 50))
    with embstore.open(url) as t:
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        touched = np.unique(ids // 512).size
        # one index per touched shard, then one coalesced range per shard (1 MiB gap)
        assert s3.requests == {"GET": 2 * touched}
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() == 0  # the row cache
        t.cache_clear()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() == touched  # indexes kept: only the chunk ranges


def test_no_coalescing_gives_a_request_per_run_of_chunks(table, s3):
    url, E = table
    ids = np.array([0, 1, 17, 100, 101, 600])  # chunks 0, 1, 6 (shard 0) and 37 (shard 1)
    with embstore.open(url, cache_bytes=0) as t:
        t._source.base.ranged.gap = 0  # (the base table's source, below the deltas)
        np.testing.assert_array_equal(t[ids], E[ids])
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() == 3  # chunks 0-1 adjacent: one range; chunk 6; chunk 37


def test_max_request_bytes_splits_long_ranges(table, s3):
    url, E = table
    with embstore.open(url, cache_bytes=0) as t:
        t._source.base.ranged.cap = 3 * (16 * 32 + 4)  # three chunks per request
        ids = np.arange(0, 512)
        np.testing.assert_array_equal(t[ids], E[ids])
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() == 11  # 32 chunks of the shard, 3 a request


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_disk_cache_serves_a_fresh_process_with_no_request(s3, rng, tmp_path, compression):
    E = rng.standard_normal((3000, 16)).astype(np.float32)
    url = f"s3://{s3.bucket}/c.emb"
    embstore.save(url, E, chunk_rows=32, shard_rows=1024, compression=compression).close()
    ids = rng.integers(0, 3000, size=500)
    with embstore.open(url, cache_dir=tmp_path / "cache") as t:
        np.testing.assert_array_equal(t[ids], E[ids])
    np.save(tmp_path / "ids.npy", ids)
    code = textwrap.dedent(f"""
        import sys, numpy as np, embstore
        sys.path.insert(0, {str(tmp_path)!r})
        t = embstore.open({url!r}, cache_dir={str(tmp_path / 'cache')!r})
        np.save({str(tmp_path / 'out.npy')!r}, t[np.load({str(tmp_path / 'ids.npy')!r})])
    """)
    s3.reset()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert s3.total() == 3  # the open (a LIST, two zarr.json); no index, no chunk
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), E[ids])


def test_disk_cache_not_stale_after_the_table_is_replaced(s3, rng, tmp_path):
    url = f"s3://{s3.bucket}/r.emb"
    A = rng.standard_normal((600, 8)).astype(np.float32)
    B = A + 1
    ids = np.arange(0, 600, 7)
    embstore.save(url, A, chunk_rows=16, shard_rows=256).close()
    with embstore.open(url, cache_dir=tmp_path) as t:
        np.testing.assert_array_equal(t[ids], A[ids])
    embstore.save(url, B, chunk_rows=16, shard_rows=256, overwrite=True).close()
    with embstore.open(url, cache_dir=tmp_path) as t:
        np.testing.assert_array_equal(t[ids], B[ids])


def test_damaged_disk_cache_entry_is_fetched_again(table, s3, tmp_path):
    url, E = table
    ids = np.arange(0, 2000, 3)
    with embstore.open(url, cache_dir=tmp_path) as t:
        t[ids]
    entries = [p for p in tmp_path.rglob("*-*") if p.is_file()]
    assert entries
    for p in entries:
        data = bytearray(p.read_bytes())
        data[0] ^= 0xFF
        p.write_bytes(bytes(data))
    with embstore.open(url, cache_dir=tmp_path) as t:
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() > 0


def test_disk_cache_keeps_to_its_budget(s3, rng, tmp_path):
    E = rng.standard_normal((4096, 64)).astype(np.float32)  # 1 MiB in 256 chunks of 4 KiB
    url = f"s3://{s3.bucket}/b.emb"
    embstore.save(url, E, chunk_rows=16, shard_rows=1024).close()
    with embstore.open(url, cache_dir=tmp_path, cache_dir_bytes=200_000) as t:
        np.testing.assert_array_equal(t[np.arange(4096)], E)
    total = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert total <= 200_000 + 20_000  # evicted to 90% when a tenth of the budget was added


def test_damaged_chunk_is_detected(table, s3):
    url, E = table
    key = "t.emb/vectors/c/1/0"
    data = bytearray(_shard_object(s3, key))
    data[5 * (16 * 32 + 4) + 7] ^= 0x01  # a byte of chunk 5 of shard 1
    _put(s3, key, bytes(data))
    with embstore.open(url) as t:
        np.testing.assert_array_equal(t[[0, 512 + 16 * 4]], E[[0, 512 + 16 * 4]])
        with pytest.raises(CorruptStoreError, match=r"shard s3://.*/c/1/0, chunk 5: crc32c"):
            t[512 + 16 * 5 + 3]


def test_damaged_or_truncated_index_is_detected(table, s3):
    url, _ = table
    key = "t.emb/vectors/c/2/0"
    data = _shard_object(s3, key)
    _put(s3, key, data[:-1] + bytes([data[-1] ^ 1]))
    _put(s3, "t.emb/vectors/c/3/0", data[:100])
    with embstore.open(url) as t:
        with pytest.raises(CorruptStoreError, match="shard index fails its crc32c"):
            t[1100]
        with pytest.raises(CorruptStoreError, match="shorter than its .*index"):
            t[1600]


def test_absent_shard_reads_as_fill(table, s3):
    url, E = table
    s3.client().delete_object(Bucket=s3.bucket, Key="t.emb/vectors/c/1/0")
    with embstore.open(url) as t:
        got = t[[3, 600, 1200]]
    np.testing.assert_array_equal(got[0], E[3])
    np.testing.assert_array_equal(got[1], 0)
    np.testing.assert_array_equal(got[2], E[1200])


def test_remote_tables_are_read_only(table, s3, tmp_path):
    url, E = table
    with embstore.open(url) as t, pytest.raises(ReadOnlyError):
        t.write([0], E[:1])  # (mode "r"; mode "r+" commits versions: test_s3_commits.py)
    with pytest.raises(ReadOnlyError, match="written whole"):
        embstore.create(f"s3://{s3.bucket}/new.emb", shape=(4, 2))
    with embstore.open(url) as t, pytest.raises(ReadOnlyError, match="commits"):
        t._source.write(np.array([0]), E[:1], None)
    with pytest.raises(TypeError, match="storage_options"):
        embstore.open(tmp_path, storage_options={})


@pytest.mark.parametrize("cached", [False, True], ids=["no-cache-dir", "cache-dir"])
def test_keys_of_a_remote_table(s3, rng, tmp_path, cached):
    E = rng.standard_normal((300, 4)).astype(np.float32)
    keys = [f"w{i}" for i in range(299)] + ["東京"]
    url = f"s3://{s3.bucket}/k.emb"
    embstore.save(url, E, keys=keys, chunk_rows=8, shard_rows=64).close()
    kw = {"cache_dir": tmp_path / "c"} if cached else {}
    with embstore.open(url, **kw) as t:
        assert t.ids_of(["w7", "東京"]).tolist() == [7, 299]
        np.testing.assert_array_equal(t.lookup_keys(["w5", "nope"], oov="zero"),
                                      np.stack([E[5], np.zeros(4, np.float32)]))
        assert t.keys[10:12] == ["w10", "w11"]
        with pytest.raises(embstore.KeyNotFoundError):
            t.ids_of(["nope"])
    if cached:  # a second process finds the blocks read before in the cache: no listing,
        s3.reset()  # no download (which blocks hold a key depends on the table's hash salt,
        with embstore.open(url, **kw) as t:  # so only keys looked up above are asked again)
            assert t.ids_of(["nope", "東京"], missing=-1).tolist() == [-1, 299]
            assert t.ids_of(["w7"]).tolist() == [7]
        assert s3.total() == 3  # the open: the versions' LIST, two zarr.json documents


def test_one_line_errors(s3, monkeypatch):
    with pytest.raises(RemoteError, match=r"^s3://no-such-bucket/t.emb: bucket "
                                          r"'no-such-bucket' does not exist$"):
        embstore.open("s3://no-such-bucket/t.emb")
    with pytest.raises(FormatError, match="not an embstore table: the group's zarr.json is "
                                          "missing"):
        embstore.open(f"s3://{s3.bucket}/nothing.emb")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(RemoteError, match="no credentials"):
        embstore.open(f"s3://{s3.bucket}/t.emb")


def test_unreachable_endpoint_fails_fast(s3, monkeypatch):
    import socket
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(RemoteError, match="cannot reach the object store") as info:
        embstore.open(f"s3://{s3.bucket}/t.emb")
    assert "\n" not in str(info.value)


def test_refused_credentials_are_one_line(s3):
    from embstore.store.place.objstore import ObjectClient
    client = ObjectClient(f"s3://{s3.bucket}/t.emb")
    exc = RuntimeError('Client error with status 403 Forbidden: <?xml version="1.0"?>\n<Error>'
                       "<Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you "
                       "provided does not exist in our records.</Message></Error>\n\nDebug")
    err = client._translate(exc, "zarr.json")
    assert str(err) == (f"s3://{s3.bucket}/t.emb/zarr.json: access denied, check the "
                        "credentials (InvalidAccessKeyId: The AWS Access Key Id you provided "
                        "does not exist in our records.)")


def test_empty_batches_and_slices(table, s3):
    url, E = table
    with embstore.open(url, cache_bytes=0) as t:
        assert t.lookup(np.zeros((0, 3), dtype=np.int64)).shape == (0, 3, 8)
        assert t._source.take(np.zeros(0, dtype=np.int64)).shape == (0, 8)
        t._source.gather(np.zeros(0, dtype=np.int64), np.empty((0, 8), np.float32))
        np.testing.assert_array_equal(t[510:515], E[510:515])


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "float16"])
def test_quantised_and_half_rows_read_as_locally(s3, rng, tmp_path, dtype):
    E = rng.standard_normal((700, 12)).astype(np.float32)
    local = tmp_path / "q.emb"
    embstore.save(local, E, dtype=dtype, chunk_rows=16, shard_rows=128).close()
    url = f"s3://{s3.bucket}/q.emb"
    copy_table(local, url)
    ids = rng.integers(0, 700, size=(9, 11))
    with embstore.open(local) as ref, embstore.open(url) as t:
        assert (t.dtype, t.storage_dtype) == (ref.dtype, ref.storage_dtype)
        np.testing.assert_array_equal(t[ids], ref[ids])
        for got, want in zip(t.raw(ids[0]), ref.raw(ids[0])):
            np.testing.assert_array_equal(got, want)
    if dtype == "float16":  # and the reference itself against NumPy
        with embstore.open(url) as t:
            np.testing.assert_array_equal(t[ids], E[ids].astype(np.float16))


def test_download_over_a_table_swaps_it_whole(s3, rng, tmp_path, monkeypatch):
    """The downloaded table replaces an existing one through ``fs.atomic.replace``: one
    exchange, or (where the system has none) two renames of which a failed second puts the
    old table back, never a destination left missing."""
    E, old = rng.standard_normal((300, 8)).astype(np.float32), np.ones((5, 8), np.float32)
    embstore.save(tmp_path / "a.emb", E, chunk_rows=16, shard_rows=64).close()
    url = f"s3://{s3.bucket}/a.emb"
    copy_table(tmp_path / "a.emb", url)
    dest = tmp_path / "down.emb"
    embstore.save(dest, old).close()
    exchange, real = beside._exchange, os.rename
    monkeypatch.setattr(beside, "_exchange", lambda a, b: False)

    def rename(a, b):
        if os.fspath(b) == str(dest) and os.path.basename(a).startswith(".down.emb."):
            raise OSError(28, "No space left on device")
        real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        download_table(url, dest, overwrite=True)
    with embstore.open(dest) as t:
        np.testing.assert_array_equal(t.to_numpy(), old)
    assert sorted(os.listdir(tmp_path)) == ["a.emb", "down.emb"]
    monkeypatch.setattr(os, "rename", real)
    monkeypatch.setattr(beside, "_exchange", exchange)
    download_table(url, dest, overwrite=True)  # the exchange
    with embstore.open(dest) as t:
        np.testing.assert_array_equal(t.to_numpy(), E)
    assert sorted(os.listdir(tmp_path)) == ["a.emb", "down.emb"]

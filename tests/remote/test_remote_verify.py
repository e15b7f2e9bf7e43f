"""``embstore verify s3://...``: every chunk of a remote table checked, reported as locally."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import NotATableError
from embstore.store.remote.ranged import sidecar_name


@pytest.fixture
def pair(s3, rng, tmp_path):
    """The same table (2,000 x 8, keys) locally and on S3."""
    E = rng.standard_normal((2000, 8)).astype(np.float32)
    keys = [f"w{i}" for i in range(2000)]
    kw = {"keys": keys, "chunk_rows": 16, "shard_rows": 512}
    embstore.save(tmp_path / "t.emb", E, **kw).close()
    url = f"s3://{s3.bucket}/t.emb"
    embstore.save(url, E, **kw).close()
    return tmp_path / "t.emb", url


def _flip(s3, key: str, at: int) -> None:
    body = bytearray(s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[at] ^= 0x10
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))


def test_remote_verify_reports_as_local(pair):
    local, url = pair
    want, got = embstore.verify(local), embstore.verify(url)
    assert got.ok and want.ok
    assert (got.vocab_size, got.shards, got.chunks, sorted(got.arrays)) == (
        want.vocab_size, want.shards, want.chunks, sorted(want.arrays)) == (
        2000, 4, 125, sorted(want.arrays))
    assert str(got) == str(want).replace(str(local.absolute()), url)


def test_damaged_chunk_named_by_shard_and_chunk(pair, s3):
    _, url = pair
    _flip(s3, "t.emb/vectors/c/2/0", 7 * (16 * 32 + 4) + 3)  # chunk 7 of shard 2
    report = embstore.verify(url)
    assert not report.ok
    assert [(d.file, d.chunk) for d in report.damaged] == [(f"{url}/vectors/c/2/0", 7)]
    assert "chunk 7: crc32c mismatch" in report.damaged[0].message
    r = CliRunner().invoke(cli, ["verify", url])
    assert r.exit_code == 1 and f"DAMAGED {url}: 1 problem" in r.output


def test_damaged_index_and_truncated_shard(pair, s3):
    _, url = pair
    body = s3.client().get_object(Bucket=s3.bucket, Key="t.emb/vectors/c/1/0")["Body"].read()
    s3.client().put_object(Bucket=s3.bucket, Key="t.emb/vectors/c/1/0", Body=body[:50])
    _flip(s3, "t.emb/vectors/c/3/0", -9)  # in the index of the last shard
    report = embstore.verify(url)
    msgs = " | ".join(d.message for d in report.damaged)
    assert "shorter than its" in msgs and "shard index fails its crc32c" in msgs, msgs
    assert [d.file for d in report.damaged] == [f"{url}/vectors/c/1/0", f"{url}/vectors/c/3/0"]


@pytest.mark.parametrize("key, expect", [
    ("t.emb/key_utf8/c/0", "key index: "),
    ("t.emb/key_order/c/0", "key index: "),
    (f"t.emb/{sidecar_name('key_hash', 0)}", "block sidecar damaged"),
], ids=["key_utf8", "key_order", "sidecar"])
def test_damaged_key_index(pair, s3, key, expect):
    _, url = pair
    _flip(s3, key, 40)
    report = embstore.verify(url)
    assert not report.ok and expect in report.damaged[0].message
    assert tempfile.gettempdir() not in report.damaged[0].message  # no temporary folder


def test_cli_verify_remote_ok_and_not_a_table(pair, s3):
    _, url = pair
    r = CliRunner().invoke(cli, ["verify", url, "--json"])
    assert r.exit_code == 0 and '"ok": true' in r.output
    r = CliRunner().invoke(cli, ["verify", url])
    assert r.exit_code == 0 and r.output.startswith(f"OK {url}: 2000 rows")
    with pytest.raises(NotATableError):
        embstore.verify(f"s3://{s3.bucket}/nothing.emb")
    r = CliRunner().invoke(cli, ["verify", f"s3://{s3.bucket}/nothing.emb"])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "not an embstore table" in r.output
    r = CliRunner().invoke(cli, ["verify", "s3://no-such-bucket/t.emb"])
    assert r.exit_code == 1 and r.output == ("Error: s3://no-such-bucket/t.emb: bucket "
                                             "'no-such-bucket' does not exist\n")


def test_verify_lists_the_shards_of_a_header_declaring_many(s3, monkeypatch):
    """A header declaring 10^15 rows on object storage: the shards are listed (one request a
    1,000 objects), not fetched one declared shard at a time; a damaged one far out is found."""
    import json

    import embstore.store.shard.verify as shard_verify

    url = f"s3://{s3.bucket}/many.emb"
    embstore.save(url, np.arange(160, dtype=np.float32).reshape(40, 4), chunk_rows=4,
                  shard_rows=16).close()
    c, meta = s3.client(), "many.emb/vectors/zarr.json"
    doc = json.loads(c.get_object(Bucket=s3.bucket, Key=meta)["Body"].read())
    doc["shape"][0] = 10**15
    c.put_object(Bucket=s3.bucket, Key=meta, Body=json.dumps(doc).encode())
    far = 10**13
    body = c.get_object(Bucket=s3.bucket, Key="many.emb/vectors/c/1/0")["Body"].read()
    c.put_object(Bucket=s3.bucket, Key=f"many.emb/vectors/c/{far}/0", Body=body)
    _flip(s3, f"many.emb/vectors/c/{far}/0", 2 * (4 * 16 + 4) + 3)  # chunk 2 of that shard
    walked = []
    real = shard_verify._shard

    def counted(place, name, L, k, codec):
        walked.append((name, k))
        assert len(walked) < 100, "verify walks every declared shard"
        return real(place, name, L, k, codec)
    monkeypatch.setattr(shard_verify, "_shard", counted)
    report = embstore.verify(url)
    assert [k for name, k in walked if name == "vectors"] == [0, 1, 2, far]
    assert [(d.file, d.chunk) for d in report.damaged] == [(f"{url}/vectors/c/{far}/0", 2)]
    assert report.chunks == 14 and not report.ok

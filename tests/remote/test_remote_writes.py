"""Writing tables to S3: save, import, export, copy; a killed upload leaves nothing that opens."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore import DestinationExistsError
from embstore.cli import cli
from embstore.errors import FormatError
from embstore.store.place import objstore
from embstore.store.remote.transfer import copy_table, upload_table


def _keys(s3, prefix: str) -> list[str]:
    res = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in res.get("Contents", []))


def test_save_refuses_an_existing_table_and_overwrite_replaces_it(s3, rng):
    url = f"s3://{s3.bucket}/t.emb"
    A = rng.standard_normal((300, 4)).astype(np.float32)
    embstore.save(url, A, chunk_rows=8, shard_rows=64).close()  # 5 shards
    with pytest.raises(DestinationExistsError, match="t.emb already exists"):
        embstore.save(url, A[:10])
    embstore.save(url, A[:10] * 2, chunk_rows=8, shard_rows=64, overwrite=True).close()
    assert [k for k in _keys(s3, "t.emb/vectors/c/")] == ["t.emb/vectors/c/0/0"]  # old gone
    with embstore.open(url) as t:
        np.testing.assert_array_equal(t.to_numpy(), A[:10] * 2)


def test_killed_upload_leaves_nothing_that_opens(s3, rng, tmp_path, monkeypatch):
    local = tmp_path / "t.emb"
    embstore.save(local, rng.standard_normal((300, 4)).astype(np.float32), chunk_rows=8,
                  shard_rows=64).close()
    url = f"s3://{s3.bucket}/t.emb"
    put = objstore.ObjectClient.put
    calls = []

    def dying_put(self, rel, data):
        calls.append(rel)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the writer is killed mid-upload
        return put(self, rel, data)

    monkeypatch.setattr(objstore.ObjectClient, "put", dying_put)
    with pytest.raises(KeyboardInterrupt):
        upload_table(local, url)
    monkeypatch.setattr(objstore.ObjectClient, "put", put)
    assert "zarr.json" not in calls  # the group zarr.json comes last
    assert _keys(s3, "t.emb/")  # some objects were written ...
    with pytest.raises(FormatError, match="not an embstore table"):
        embstore.open(url)  # ... and none of them opens
    with pytest.raises(DestinationExistsError, match="no table"):
        upload_table(local, url)
    upload_table(local, url, overwrite=True)
    with embstore.open(url) as t, embstore.open(local) as ref:
        np.testing.assert_array_equal(t.to_numpy(), ref.to_numpy())


def test_copy_both_ways_with_progress(s3, rng, tmp_path):
    E = rng.standard_normal((1000, 8)).astype(np.float32)
    src = tmp_path / "a.emb"
    embstore.save(src, E, keys=[f"k{i}" for i in range(1000)], compression="zstd").close()
    url = f"s3://{s3.bucket}/a.emb"
    seen = []
    copy_table(src, url, on_progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] > 0 and seen[0][0] == 0
    back = tmp_path / "b.emb"
    copy_table(url, back)
    with embstore.open(back) as t:
        np.testing.assert_array_equal(t.to_numpy(), E)
        assert t.keys[999] == "k999" and t.ids_of(["k5"]).tolist() == [5]
    with pytest.raises(DestinationExistsError):
        copy_table(url, back)
    url2 = f"s3://{s3.bucket}/c.emb"
    copy_table(url, url2)
    with embstore.open(url2) as t:
        np.testing.assert_array_equal(t[[0, 999]], E[[0, 999]])


def test_cli_import_info_export_copy(s3, rng, tmp_path):
    E = rng.standard_normal((50, 3)).astype(np.float32)
    vec = tmp_path / "v.vec"
    vec.write_text(f"50 3\n" + "".join(f"w{i} " + " ".join(f"{x:.6f}" for x in row) + "\n"
                                       for i, row in enumerate(E)))
    url = f"s3://{s3.bucket}/v.emb"
    runner = CliRunner()
    r = runner.invoke(cli, ["import", str(vec), url, "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["info", url, "--json"])
    assert r.exit_code == 0, r.output
    assert '"vocab_size": 50' in r.output and '"has_keys": true' in r.output
    r = runner.invoke(cli, ["import", str(vec), url, "--quiet"])
    assert r.exit_code == 1 and "already exists" in r.output
    out = tmp_path / "out.npy"
    r = runner.invoke(cli, ["export", url, str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(np.load(out), E, atol=1e-6)
    r = runner.invoke(cli, ["copy", url, str(tmp_path / "local.emb"), "--quiet"])
    assert r.exit_code == 0, r.output
    with embstore.open(tmp_path / "local.emb") as t:
        assert t.ids_of(["w7"]).tolist() == [7]


@pytest.mark.parametrize("args, message", [
    (["info", "s3://no-such-bucket/t.emb"],
     "Error: s3://no-such-bucket/t.emb: bucket 'no-such-bucket' does not exist\n"),
    (["export", "s3://{bucket}/none.emb", "{tmp}/o.npy"],
     "Error: s3://{bucket}/none.emb: not an embstore table: the group's zarr.json is missing\n"),
    (["copy", "{tmp}", "{tmp}/x"], "Error: {tmp}: not a table (no zarr.json)\n"),
], ids=["missing-bucket", "missing-table", "copy-of-a-folder-not-a-table"])
def test_cli_errors_are_one_line(s3, tmp_path, args, message):
    args = [a.format(bucket=s3.bucket, tmp=tmp_path) for a in args]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1
    assert r.output == message.format(bucket=s3.bucket, tmp=tmp_path)

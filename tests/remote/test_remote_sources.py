"""Issue 34: source files on object storage (import s3://...), and a Parquet job over an
s3:// table (it opens the table as the .npy job does)."""

from __future__ import annotations

import gzip
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli

DATA = Path(__file__).resolve().parents[1] / "data"


def _put(s3, key: str, data: bytes) -> str:
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=data)
    return f"s3://{s3.bucket}/{key}"


def _opened(path):
    with embstore.open(path) as t:
        return t.to_numpy(), None if t.keys is None else list(t.keys)


@pytest.fixture
def reference(tmp_path):
    embstore.import_file(DATA / "gensim.txt", tmp_path / "ref.emb")
    return _opened(tmp_path / "ref.emb")


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_import_from_s3_streams_the_object(s3, tmp_path, reference, packed):
    data = (DATA / "gensim.txt").read_bytes()
    url = _put(s3, "vectors/lee.txt.gz" if packed else "vectors/lee.txt",
               gzip.compress(data) if packed else data)
    res = CliRunner().invoke(cli, ["import", url, str(tmp_path / "s.emb")])
    assert res.exit_code == 0, res.output
    got, keys = _opened(tmp_path / "s.emb")
    np.testing.assert_array_equal(got, reference[0])
    assert keys == reference[1]


def test_import_a_zip_member_and_a_safetensors_from_s3(s3, tmp_path, reference):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a.txt", "1 2\nx 1 2\n")
        z.writestr("lee.txt", (DATA / "gensim.txt").read_bytes())
    url = _put(s3, "glove.zip", buf.getvalue())
    with pytest.raises(embstore.FormatError, match=r"holds 2 members \(a.txt, lee.txt\); choose"):
        embstore.import_file(url, tmp_path / "z.emb")
    embstore.import_file(url, tmp_path / "z.emb", member="lee.txt")
    np.testing.assert_array_equal(_opened(tmp_path / "z.emb")[0], reference[0])
    url = _put(s3, "one.safetensors", (DATA / "one2d.safetensors").read_bytes())
    res = embstore.import_file(url, tmp_path / "st.emb")  # random access: copied first
    embstore.import_file(DATA / "one2d.safetensors", tmp_path / "st_ref.emb")
    np.testing.assert_array_equal(_opened(tmp_path / "st.emb")[0], _opened(tmp_path / "st_ref.emb")[0])
    assert any("random access" in n for n in res.notes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.emb", "st.emb", "st_ref.emb",
                                                         "z.emb"]  # nothing left beside


def test_a_missing_object_is_named(s3, tmp_path):
    url = f"s3://{s3.bucket}/nope.vec"
    res = CliRunner().invoke(cli, ["import", url, str(tmp_path / "n.emb")])
    assert res.exit_code == 1 and f"Error: {url}: no such object" in res.output


def test_parquet_job_opens_an_s3_table(s3, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    E = np.random.default_rng(4).standard_normal((100, 8)).astype(np.float32)
    table = f"s3://{s3.bucket}/t.emb"
    embstore.save(table, E, chunk_rows=8, shard_rows=32).close()
    pq.write_table(pa.table({"input_ids": [[1, 2], [99]]}), tmp_path / "in.parquet")
    res = CliRunner().invoke(cli, ["lookup", table, str(tmp_path / "in.parquet"),
                                   str(tmp_path / "out.parquet")])
    assert res.exit_code == 0, res.output
    got = pq.read_table(tmp_path / "out.parquet").column("vector").to_pylist()
    np.testing.assert_array_equal(np.array(got[0], np.float32), E[[1, 2]])
    np.testing.assert_array_equal(np.array(got[1], np.float32), E[[99]])

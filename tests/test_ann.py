"""The approximate index (embstore/ann.py): recall against the exact scan, exclusions,
stale detection after write/append, the durable layout, the CLI, the missing extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.ann import INDEX_FILE, META_FILE, StaleIndexWarning, index_info, index_path
from embstore.cli import cli

pytest.importorskip("usearch")
REPO = Path(__file__).resolve().parents[1]
K = 10


def _clustered(n=3000, dim=24, clusters=30, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    return (centres[rng.integers(0, clusters, n)]
            + 0.4 * rng.standard_normal((n, dim))).astype(np.float32)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    path = tmp_path_factory.mktemp("ann") / "t.emb"
    a = _clustered()
    a[17] = 0  # a zero row: no cosine, never a neighbour
    embstore.save(path, a, keys=[f"w{i}" for i in range(len(a))]).close()
    meta = embstore.build_index(path, connectivity=16, expansion_add=64)
    return path, a, meta


def _numpy_top(a: np.ndarray, q: np.ndarray, k: int = K) -> np.ndarray:
    """Independent reference: cosine of pre-normalised rows, zero rows left out."""
    n = np.linalg.norm(a, axis=1)
    s = (a @ q) / np.where(n == 0, np.inf, n) / np.linalg.norm(q)
    s[n == 0] = -np.inf
    return np.argsort(-s, kind="stable")[:k]


def test_recall_on_a_clustered_set(indexed):
    path, a, meta = indexed
    assert meta["indexed_rows"] == len(a) - 1 and meta["metric"] == "cos"
    rng = np.random.default_rng(1)
    qs = a[rng.integers(0, len(a), 100)] + 0.2 * rng.standard_normal((100, a.shape[1]))
    with embstore.open(path) as t:
        ids, scores = embstore.Embedding(t).most_similar(qs.astype(np.float32), k=K,
                                                         approx=True, ef=64)
    recall = np.mean([len(set(ids[j]) & set(_numpy_top(a, qs[j]))) / K for j in range(100)])
    assert recall >= 0.95
    assert 17 not in ids
    # the scores are cosines, best first
    cos = a[ids[0]] @ qs[0] / np.linalg.norm(a[ids[0]], axis=1) / np.linalg.norm(qs[0])
    np.testing.assert_allclose(scores[0], cos, rtol=1e-4, atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-6).all()


def test_query_by_key_and_id_leaves_itself_out(indexed):
    path, a, _ = indexed
    with embstore.open(path) as t:
        e = embstore.Embedding(t)
        ids, _ = e.most_similar("w5", k=K, approx=True)
        assert 5 not in ids and len(ids) == K
        ids2, _ = e.most_similar(5, k=K, approx=True, exclude=["w6", 7])
        assert not {5, 6, 7} & set(ids2.tolist())
        exact, _ = e.most_similar(5, k=K)
        assert len(set(ids.tolist()) & set(exact.tolist())) >= 8
        big, sc = e.most_similar(5, k=len(a) + 50, approx=True)
        assert big.shape == (len(a) - 1,)  # k larger than the table: every other row
        assert ((big == -1) == (sc == -np.inf)).all() and 5 not in big and 17 not in big
        assert (big >= 0).sum() >= len(a) - 30


def test_other_metrics(tmp_path):
    a = _clustered(800, 8)
    embstore.save(tmp_path / "t", a).close()
    q = a[3] * 2
    for metric in ("ip", "l2"):
        embstore.build_index(tmp_path / "t", metric=metric, overwrite=True,
                             expansion_add=64)
        with embstore.open(tmp_path / "t") as t:
            ids, scores = embstore.Embedding(t).most_similar(q, k=5, approx=True, ef=128)
        want = np.argsort(-(a @ q))[:5] if metric == "ip" else \
            np.argsort(np.linalg.norm(a - q, axis=1))[:5]
        assert len(set(ids.tolist()) & set(want.tolist())) >= 4, metric
        if metric == "l2":
            np.testing.assert_allclose(scores[0], -np.linalg.norm(a[ids[0]] - q), rtol=1e-4)
        else:
            np.testing.assert_allclose(scores[0], a[ids[0]] @ q, rtol=1e-4)


def test_stale_after_write_and_append_falls_back_to_exact(tmp_path):
    a = _clustered(1000, 8)
    path = tmp_path / "t"
    embstore.save(path, a).close()
    embstore.build_index(path, expansion_add=32)
    assert index_info(path)["stale"] is False
    for change in ("write", "append"):
        with embstore.open(path, mode="r+") as t:
            if change == "write":
                t.write([0], np.ones((1, 8)))
            else:
                t.append(np.ones((2, 8)))
            assert index_info(t)["stale"] is True
            with pytest.warns(StaleIndexWarning, match="changed after its approximate index"):
                ids, _ = embstore.Embedding(t).most_similar(a[9], k=5, approx=True)
            exact, _ = embstore.Embedding(t).most_similar(a[9], k=5)
            np.testing.assert_array_equal(ids, exact)
        assert "stale" in str(embstore.verify(path))
        embstore.build_index(path, expansion_add=32, overwrite=True)
        assert index_info(path)["stale"] is False
        assert "up to date" in str(embstore.verify(path))
        with embstore.open(path) as t, warnings.catch_warnings():
            warnings.simplefilter("error")
            embstore.Embedding(t).most_similar(a[9], k=5, approx=True)


def test_index_files_and_refusals(tmp_path):
    a = _clustered(500, 8)
    path = tmp_path / "t"
    embstore.save(path, a).close()
    with embstore.open(path) as t:
        with pytest.raises(embstore.IndexNotFoundError, match="has no approximate index"):
            embstore.Embedding(t).most_similar(a[0], approx=True)
    embstore.build_index(path, expansion_add=32)
    d = index_path(path)
    assert d == path / "vectors" / ".embstore" / "ann"
    assert sorted(os.listdir(d)) == [INDEX_FILE, META_FILE]
    assert [n for n in os.listdir(d.parent) if n.startswith("ann")] == ["ann"]  # no temp
    with pytest.raises(embstore.DestinationExistsError, match="overwrite=True"):
        embstore.build_index(path)
    meta = json.loads((d / META_FILE).read_text())
    assert meta["table_rows"] == 500 and meta["dim"] == 8 and meta["library"] == "usearch"
    with pytest.raises(ValueError, match="metric"):
        embstore.build_index(path, metric="hamming", overwrite=True)
    import zarr  # Zarr readers do not see the index
    assert sorted(dict(zarr.open_group(str(path), mode="r").members())) == ["norms", "vectors"]
    (d / META_FILE).write_text("{not json")
    with embstore.open(path) as t, pytest.raises(embstore.IndexNotFoundError,
                                                 match="unreadable index metadata"):
        embstore.Embedding(t).most_similar(a[0], approx=True)


def test_cli_index_and_similar_approx(tmp_path):
    a = _clustered(1500, 16)
    path = tmp_path / "t.emb"
    embstore.save(path, a, keys=[f"w{i}" for i in range(len(a))]).close()
    r = CliRunner()
    res = r.invoke(cli, ["similar", str(path), "w1", "--approx"])
    assert res.exit_code == 1 and "has no approximate index" in res.output
    res = r.invoke(cli, ["index", str(path), "--expansion-add", "64", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["indexed_rows"] == 1500
    res = r.invoke(cli, ["index", str(path)])
    assert res.exit_code == 1 and "--overwrite" in res.output
    res = r.invoke(cli, ["similar", str(path), "w1", "-k", "5", "--approx", "--ef", "64",
                         "--json"])
    assert res.exit_code == 0, res.output
    got = [n["id"] for n in json.loads(res.output)["neighbours"]]
    exact = r.invoke(cli, ["similar", str(path), "w1", "-k", "5", "--json"])
    want = [n["id"] for n in json.loads(exact.output)["neighbours"]]
    assert len(set(got) & set(want)) >= 4 and 1 not in got
    with embstore.open(path, mode="r+") as t:
        t.write([0], np.ones((1, 16)))
    res = r.invoke(cli, ["similar", str(path), "w1", "-k", "5", "--approx", "--json"])
    assert res.exit_code == 0 and "changed after its approximate index" in res.stderr
    assert [n["id"] for n in json.loads(res.stdout)["neighbours"]] == want


def test_missing_extra_names_it(tmp_path):
    embstore.save(tmp_path / "t", _clustered(100, 4)).close()
    code = ("import sys; sys.modules['usearch'] = None; sys.modules['usearch.index'] = None\n"
            "import embstore\n"
            "try:\n    embstore.build_index(sys.argv[1])\n"
            "except embstore.MissingDependencyError as e:\n    print(e.extra, e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.stdout.startswith("ann "), out.stderr
    assert "pip install 'embstore[ann]'" in out.stdout

"""The approximate index (embstore/search/ann.py, embstore/search/ivf.py): recall against the exact
scan, exclusions, stale detection after write/append, the durable layout, the streamed
build against FAISS's own in-RAM build, a moved table, a forked child, an index of an older
embstore (usearch), the CLI, the missing extra."""

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
from embstore.search.ann import META_FILE, StaleIndexWarning, index_info, index_path
from embstore.search.ivf import DATA_FILE, INDEX_FILE
from embstore.cli import cli

faiss = pytest.importorskip("faiss")
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
    meta = embstore.build_index(path)
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
    assert meta["library"] == "faiss" and meta["nlist"] == 55  # about sqrt(rows)
    assert meta["calibration"]["recall_at_10"] >= 0.99 and 1 <= meta["nprobe"] <= 55
    rng = np.random.default_rng(1)
    qs = a[rng.integers(0, len(a), 100)] + 0.2 * rng.standard_normal((100, a.shape[1]))
    with embstore.open(path) as t:
        ids, scores = embstore.Embedding(t).most_similar(qs.astype(np.float32), k=K,
                                                         approx=True)
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
        embstore.build_index(tmp_path / "t", metric=metric, overwrite=True)
        with embstore.open(tmp_path / "t") as t:
            ids, scores = embstore.Embedding(t).most_similar(q, k=5, approx=True)
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
    embstore.build_index(path)
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
        embstore.build_index(path, overwrite=True)
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
    embstore.build_index(path)
    d = index_path(path)
    assert d == path / "vectors" / ".embstore" / "ann"
    assert sorted(os.listdir(d)) == sorted([INDEX_FILE, DATA_FILE, "lists.crc32c", META_FILE])
    assert [n for n in os.listdir(d.parent) if n.startswith("ann")] == ["ann"]  # no temp
    with pytest.raises(embstore.DestinationExistsError, match="overwrite=True"):
        embstore.build_index(path)
    meta = json.loads((d / META_FILE).read_text())
    assert meta["table_rows"] == 500 and meta["dim"] == 8 and meta["library"] == "faiss"
    with pytest.raises(ValueError, match="metric"):
        embstore.build_index(path, metric="hamming", overwrite=True)
    with pytest.raises(ValueError, match="dtype"):
        embstore.build_index(path, dtype="i8", overwrite=True)
    with pytest.raises(ValueError, match="give one"):
        embstore.build_index(path, nprobe=3, expansion_search=4, overwrite=True)
    with pytest.warns(DeprecationWarning, match="connectivity: HNSW settings, ignored"):
        assert embstore.build_index(path, connectivity=32, expansion_search=5,
                                    overwrite=True)["nprobe"] == 5
    import zarr  # Zarr readers do not see the index
    assert sorted(dict(zarr.open_group(str(path), mode="r").members())) in (
        ["norms", "vectors"], ["norms", "norms_page_crc", "page_crc", "vectors"])  # (1, 2)
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
    res = r.invoke(cli, ["index", str(path), "--nlist", "20", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["indexed_rows"] == 1500
    assert json.loads(res.output)["nlist"] == 20
    res = r.invoke(cli, ["index", str(path)])
    assert res.exit_code == 1 and "--overwrite" in res.output
    res = r.invoke(cli, ["similar", str(path), "w1", "-k", "5", "--approx", "--ef", "20",
                         "--json"])
    assert res.exit_code == 0, res.output
    got = [n["id"] for n in json.loads(res.output)[0]["neighbours"]]
    exact = r.invoke(cli, ["similar", str(path), "w1", "-k", "5", "--json"])
    want = [n["id"] for n in json.loads(exact.output)[0]["neighbours"]]
    assert len(set(got) & set(want)) >= 4 and 1 not in got
    with embstore.open(path, mode="r+") as t:
        t.write([0], np.ones((1, 16)))
    res = r.invoke(cli, ["similar", str(path), "w1", "-k", "5", "--approx", "--json"])
    assert res.exit_code == 0 and "changed after its approximate index" in res.stderr
    assert [n["id"] for n in json.loads(res.stdout)[0]["neighbours"]] == want


def test_missing_extra_names_it(tmp_path):
    embstore.save(tmp_path / "t", _clustered(100, 4)).close()
    code = ("import sys; sys.modules['faiss'] = None\n"
            "import embstore\n"
            "try:\n    embstore.build_index(sys.argv[1])\n"
            "except embstore.MissingDependencyError as e:\n    print(e.extra, e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.stdout.startswith("ann "), out.stderr
    assert "pip install 'embstore[ann]'" in out.stdout


def _lists(index) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each list of a FAISS IVFFlat index: (ids, vectors), ordered by id."""
    inv, out = index.invlists, {}
    for j in range(index.nlist):
        n = inv.list_size(j)
        if n:
            ids = faiss.rev_swig_ptr(inv.get_ids(j), n).copy()
            vec = faiss.rev_swig_ptr(inv.get_codes(j), n * index.code_size).copy()
            vec = vec.view(np.float32).reshape(n, index.d)
            order = np.argsort(ids)
            out[j] = (ids[order], vec[order])
    return out


def test_streamed_build_equals_faiss_in_ram(tmp_path, monkeypatch):
    """Many small blocks written at their lists' offsets: the same lists as FAISS's own
    IndexIVFFlat.add of every row at once, with the index's trained centroids."""
    import embstore.search.ivf as ann_ivf
    monkeypatch.setattr(ann_ivf, "_BLOCK_BYTES", 64 * 4 * 12)  # 64 rows a block
    a = _clustered(2000, 12, clusters=15, seed=3)
    a[[4, 900]] = 0
    path = tmp_path / "t"
    embstore.save(path, a).close()
    meta = embstore.build_index(path, nlist=16)
    assert meta["indexed_rows"] == 1998 and meta["nlist"] == 16
    with embstore.open(path) as t:
        from embstore.search.ann import open_index
        mapped = open_index(t).ivf.index
        ref = faiss.IndexIVFFlat(faiss.downcast_index(mapped.quantizer), 12, 16,
                                 faiss.METRIC_INNER_PRODUCT)
        keep = np.linalg.norm(a, axis=1) > 0
        unit = a[keep] / np.linalg.norm(a[keep], axis=1, keepdims=True)
        ref.add_with_ids(unit, np.flatnonzero(keep).astype(np.int64))
        got, want = _lists(mapped), _lists(ref)
        assert got.keys() == want.keys()
        for j in want:
            np.testing.assert_array_equal(got[j][0], want[j][0])
            np.testing.assert_allclose(got[j][1], want[j][1], rtol=1e-6, atol=1e-7)
        assert os.path.getsize(index_path(t) / DATA_FILE) == 1998 * (12 * 4 + 8)


def test_moved_table_still_searches(tmp_path):
    a = _clustered(1200, 16)
    embstore.save(tmp_path / "a", a).close()
    embstore.build_index(tmp_path / "a", nprobe=4)
    with embstore.open(tmp_path / "a") as t:
        before, _ = embstore.Embedding(t).most_similar(a[3], k=5, approx=True)
    os.rename(tmp_path / "a", tmp_path / "b")
    with embstore.open(tmp_path / "b") as t:
        after, scores = embstore.Embedding(t).most_similar(a[3], k=5, approx=True)
    np.testing.assert_array_equal(before, after)
    want = a[after] @ a[3] / np.linalg.norm(a[after], axis=1) / np.linalg.norm(a[3])
    np.testing.assert_allclose(scores, want, rtol=1e-5)


def test_search_in_a_forked_child(indexed):
    """FAISS (OpenMP) searched in the parent, then in a forked child (a DataLoader worker)."""
    import multiprocessing
    path, a, _ = indexed
    with embstore.open(path) as t:
        want, _ = embstore.Embedding(t).most_similar(a[:8], k=5, approx=True)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply_async(_child_search, (str(path), a[:8])).get(timeout=120)
    np.testing.assert_array_equal(got, want)


def _child_search(path: str, q: np.ndarray) -> np.ndarray:
    with embstore.open(path) as t:
        return embstore.Embedding(t).most_similar(q, k=5, approx=True)[0]


def test_an_older_usearch_index_still_searches(tmp_path):
    """An index as embstore <= 0.4 wrote it (usearch HNSW, index.usearch) opens and searches."""
    usearch = pytest.importorskip("usearch.index")
    a = _clustered(600, 8)
    path = tmp_path / "t"
    embstore.save(path, a).close()
    embstore.build_index(path)
    meta = index_info(path)
    d = index_path(path)
    for name in (INDEX_FILE, DATA_FILE):
        os.remove(d / name)
    old = usearch.Index(ndim=8, metric="cos", connectivity=16, expansion_add=64)
    old.add(np.arange(600, dtype=np.uint64), a)
    old.save(str(d / "index.usearch"))
    meta.pop("stale")
    meta.update(library="usearch", expansion_search=64, connectivity=16)
    (d / META_FILE).write_text(json.dumps(meta))
    with embstore.open(path) as t:
        ids, scores = embstore.Embedding(t).most_similar(7, k=5, approx=True)
    want = np.argsort(-(a @ a[7]) / np.linalg.norm(a, axis=1))[:6]
    assert len(set(ids.tolist()) & set(want.tolist())) >= 4 and 7 not in ids
    np.testing.assert_allclose(scores[0], a[ids[0]] @ a[7] / np.linalg.norm(a[ids[0]])
                               / np.linalg.norm(a[7]), rtol=1e-4)


def test_tiny_and_all_zero_tables(tmp_path):
    """One row; only zero rows (a cosine index of nothing: every place empty)."""
    embstore.save(tmp_path / "one", np.ones((1, 4), np.float32)).close()
    assert embstore.build_index(tmp_path / "one")["indexed_rows"] == 1
    with embstore.open(tmp_path / "one") as t:
        ids, scores = embstore.Embedding(t).most_similar(np.ones(4), k=3, approx=True)
    assert ids.tolist() == [0] and np.allclose(scores, [1.0])
    embstore.save(tmp_path / "zeros", np.zeros((5, 4), np.float32)).close()
    assert embstore.build_index(tmp_path / "zeros")["indexed_rows"] == 0
    with embstore.open(tmp_path / "zeros") as t:
        ids, scores = embstore.Embedding(t).most_similar(np.ones(4), k=3, approx=True)
    assert (ids == -1).all() and (scores == -np.inf).all()


def test_rows_zeroed_during_the_build_refuse_the_index(tmp_path):
    """Rows that become zero between the build's two passes (its own read-write handle
    writes them from the progress callback) leave the lists short: TableChangedError,
    and no index is left behind."""
    a = _clustered(1000, 8)
    path = tmp_path / "t"
    embstore.save(path, a).close()
    writes = []
    with embstore.open(path, mode="r+") as t:
        def progress(done, total):
            if done == total // 2 and not writes:  # the end of pass 1
                writes.append(done)
                t.write([3, 500], np.zeros((2, 8)))
        with pytest.raises(embstore.TableChangedError, match="changed while its index was "
                                                              "built") as info:
            embstore.build_index(t, progress=progress)
        assert writes and info.value.path == t.path
    assert isinstance(info.value, RuntimeError)
    assert index_info(path) is None
    assert not index_path(path).parent.exists() or \
        {p.name for p in index_path(path).parent.iterdir()} <= {"last", "versions",
                                                                 "readers"}  # no staging left


def test_a_rebuild_swapped_in_while_opening_is_not_mixed_in(tmp_path, monkeypatch):
    """A rebuild renamed into place between reading ``index.faiss`` and mapping its lists:
    the index opened keeps the lists of the build it read (one descriptor of the
    directory), so it still finds each row as its own nearest neighbour."""
    from embstore.fs import atomic
    from embstore.search.ivf import IvfIndex, faiss_module
    a = _clustered(2000, 16, seed=1)
    b = _clustered(2000, 16, seed=2)  # same shape, other rows and lists
    embstore.save(tmp_path / "a", a).close()
    embstore.save(tmp_path / "b", b).close()
    embstore.build_index(tmp_path / "a", nlist=20)
    embstore.build_index(tmp_path / "b", nlist=20)
    home = index_path(tmp_path / "a")
    other = index_path(tmp_path / "b")
    fm = faiss_module()
    real = fm.deserialize_index

    def swap_then_read(*args):
        atomic.replace(other, home)  # b's index files now where a's were
        return real(*args)

    monkeypatch.setattr(fm, "deserialize_index", swap_then_read)
    opened = IvfIndex(home)
    monkeypatch.setattr(fm, "deserialize_index", real)
    q = a[[0, 500, 1999]] / np.linalg.norm(a[[0, 500, 1999]], axis=1, keepdims=True)
    _, ids = opened.search(q, 1, 20)
    assert ids[:, 0].tolist() == [0, 500, 1999]
    assert not other.exists()  # a's files: removed by the swap, still mapped
    opened.close()
    again = IvfIndex(home)  # b's, whole
    qb = b[[7, 1500]] / np.linalg.norm(b[[7, 1500]], axis=1, keepdims=True)
    assert again.search(qb, 1, 20)[1][:, 0].tolist() == [7, 1500]
    again.close()


def test_a_killed_build_leaves_an_index_and_its_staging_is_swept(tmp_path):
    """A build killed (SIGKILL) while it writes its staging directory: the old index still
    opens and searches, and the next build removes the dead builder's staging."""
    import signal
    import time
    a = _clustered(60_000, 32)
    path = tmp_path / "t"
    embstore.save(path, a).close()
    embstore.build_index(path, nlist=16)
    area = index_path(path).parent
    code = f"import embstore; embstore.build_index({str(path)!r}, nlist=64, overwrite=True)"
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ,
                             "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(".tmp-" in p.name for p in area.iterdir()) and child.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    if child.returncode == -signal.SIGKILL:  # (killed while staging, as meant)
        assert any(".tmp-" in p.name for p in area.iterdir())
    assert index_info(path)["nlist"] in (16, 64)
    with embstore.open(path) as t:
        ids, _ = embstore.search.stream.most_similar(t, a[[3, 40_000]], k=3, approx=True, ef=64)
    assert ids[:, 0].tolist() == [3, 40_000]
    embstore.build_index(path, nlist=8, overwrite=True)
    assert sorted(p.name for p in area.iterdir()
                  if p.name not in ("last", "versions", "readers")) == ["ann"]

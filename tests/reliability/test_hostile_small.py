"""Smaller hostile cases (issue 31, point 7): each printed NumPy's error, accepted bad
input, or wrote a table no reader opens."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import zarr
from relhelpers import REPO, assert_clean_error, invoke, run_cli_subprocess

import embstore
import embstore.formats
from embstore.keys import hashing
from embstore.keys import writer as key_writer

sys.path.insert(0, str(REPO / "tests"))
from test_hostile_keys import emb64_collisions, siphash13_ref  # noqa: E402


def test_an_import_of_a_0_x_2_40_array_is_refused_by_the_writer(tmp_path):
    np.save(tmp_path / "zero.npy", np.empty((0, 2**40), np.float32))  # a 128-byte file
    line = assert_clean_error(invoke(["import", tmp_path / "zero.npy", tmp_path / "t.emb"]))
    assert line == ("Error: dim 1099511627776: more than the 268435456 values a table's row "
                    "may hold (no reader would open the table)")
    assert not (tmp_path / "t.emb").exists()  # written before, then refused by every open


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_an_append_rekeys_a_legacy_emb64_table_with_the_salted_hash(tmp_path, monkeypatch):
    keys = emb64_collisions(2000)  # one emb64-v1 hash: a run of 2000 to walk per lookup
    monkeypatch.setattr(key_writer, "new_hash_key", lambda: None)  # written as before
    E = np.arange(2000 * 2, dtype=np.float32).reshape(2000, 2)
    path = tmp_path / "old.emb"
    embstore.save(path, E, keys=keys).close()
    monkeypatch.undo()
    info = zarr.open_array(path / "key_hash").attrs["embstore_key_index"]
    assert info == {"version": 1, "hash": "emb64-v1"}
    more = emb64_collisions(2100)[2000:]
    with embstore.open(path, mode="r+") as t:
        t.append(np.ones((100, 2), np.float32), keys=more)
        assert t.ids_of([more[5], keys[7]]).tolist() == [2005, 7]
    info = zarr.open_array(path / "key_hash").attrs["embstore_key_index"]
    assert info["hash"] == "siphash-1-3" and len(info["key"]) == 32
    k = (int(info["key"][:16], 16), int(info["key"][16:], 16))
    stored = zarr.open_array(path / "key_hash")[:]
    order = zarr.open_array(path / "key_order")[:]
    every = keys + more
    assert stored.tolist() == sorted(stored.tolist())
    assert stored.tolist() == [siphash13_ref(every[r].encode(), *k) for r in order]
    assert embstore.verify(path).ok
    with embstore.open(path) as t:  # no run of equal hashes left to walk
        calls = []
        real = hashing.keys_equal
        monkeypatch.setattr(hashing, "keys_equal", lambda *a: calls.append(1) or real(*a))
        assert t.ids_of(every[::-1]).tolist() == list(range(2099, -1, -1))
        assert len(calls) <= 2
        np.testing.assert_array_equal(t.lookup_keys(keys[:3]), E[:3])


def test_after_close_approximate_search_and_to_dask_raise_closed_table_error(tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("dask")
    from embstore.search.stream import most_similar

    rows = np.random.default_rng(1).normal(size=(300, 8)).astype(np.float32)
    embstore.save(tmp_path / "t.emb", rows).close()
    embstore.build_index(tmp_path / "t.emb")
    t = embstore.open(tmp_path / "t.emb")
    ids, _ = most_similar(t, rows[3], k=1, approx=True)  # the index opened and cached
    assert ids.tolist() == [3]
    t.close()
    closed = f"the table at {tmp_path / 't.emb'} is closed"
    with pytest.raises(embstore.ClosedTableError, match=closed):
        most_similar(t, rows[3], k=1, approx=True)  # answered from the cached index before
    with pytest.raises(embstore.ClosedTableError, match=closed):
        t.to_dask()  # a graph that failed only when computed


@pytest.mark.parametrize("table", ["memory", "disk"])
def test_64_dimensional_ids_give_invalid_id_error(tmp_path, table):
    E = np.arange(6, dtype=np.float32).reshape(3, 2)
    if table == "memory":
        t = embstore.MemoryTable(E)
    else:
        embstore.save(tmp_path / "t.emb", E).close()
        t = embstore.open(tmp_path / "t.emb")
    with t:
        assert t.lookup(np.full((1,) * 63, 2)).reshape(2).tolist() == [4.0, 5.0]
        with pytest.raises(embstore.InvalidIdError, match=r"ids of 64 dimensions: at most 63 "
                           r"\(the result adds one for the vectors"):
            t.lookup(np.zeros((1,) * 64, np.int64))  # NumPy's ValueError before


def test_memory_table_refuses_duplicate_keys_naming_the_first(tmp_path):
    E = np.zeros((4, 2), np.float32)
    with pytest.raises(embstore.ShapeMismatchError, match=r"keys: key 'b' at row 2 repeats row "
                                                          r"1 \(2 duplicate\(s\); keys must be "
                                                          r"unique\)"):
        embstore.MemoryTable(E, keys=["a", "b", "b", "a"])  # row 2 was unreachable by key
    assert embstore.MemoryTable(E, keys=["a", "b", "c", "d"]).ids_of(["d"]).tolist() == [3]


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_a_10_gb_sparse_text_file_is_refused_after_a_few_mib(tmp_path):
    src = tmp_path / "v.vec"
    with open(src, "wb") as f:
        f.write(b"3 2\na 1 2\n")
        f.truncate(10 << 30)  # 10 GB of holes: NUL bytes and no newline
    res = run_cli_subprocess(["import", src, tmp_path / "t.emb", "--quiet"],
                             address_space=1 << 30)  # read 256 MiB deep before: 588 MB RSS
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr == (f"Error: {src}, line 3: expected lines shorter than 1048704 bytes "
                          "(a key and 2 values), got a longer one\n")


def test_a_word2vec_file_with_a_bom_is_detected_as_word2vec(tmp_path):
    gensim_models = pytest.importorskip("gensim.models")
    text = b"3 2\nalpha 1 2\nbeta 3 4\ngamma 5.5 6\n"
    src, plain = tmp_path / "v.txt", tmp_path / "plain.txt"
    src.write_bytes(b"\xef\xbb\xbf" + text)
    plain.write_bytes(text)  # the reference reads the same file without its BOM
    assert embstore.formats.detect(src) == "word2vec"  # GloVe before, then refused
    result = embstore.import_file(src, tmp_path / "t.emb")
    assert result.format == "word2vec"
    ref = gensim_models.KeyedVectors.load_word2vec_format(str(plain), binary=False)
    with embstore.open(tmp_path / "t.emb") as t:
        assert list(t.keys) == ref.index_to_key == ["alpha", "beta", "gamma"]
        np.testing.assert_array_equal(t[[0, 1, 2]], ref.vectors)

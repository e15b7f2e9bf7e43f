"""Issue 34, "Messages and output": what a newcomer reads when something is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import FormatError, InvalidIdError, KeyNotFoundError, ReadOnlyError

DATA = os.path.join(os.path.dirname(__file__), "data")


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def keyed(tmp_path):
    """A saved 40 x 8 table with keys w0..w39 and its array."""
    rng = np.random.default_rng(7)
    arr = rng.standard_normal((40, 8)).astype(np.float32)
    keys = [f"w{i}" for i in range(40)]
    embstore.save(tmp_path / "t.emb", arr, keys=keys).close()
    return tmp_path / "t.emb", arr, keys


def test_gensim_native_save_is_named_a_pickle(tmp_path):
    gensim = pytest.importorskip("gensim")
    kv = gensim.models.KeyedVectors(4)
    kv.add_vectors(["a", "b"], np.ones((2, 4), np.float32))
    kv.save(str(tmp_path / "g.kv"))
    want = (r"g.kv: this is a Python pickle \(gensim's native .save\(\)\); embstore never "
            r"unpickles: load it with gensim and call embstore.from_gensim")
    with pytest.raises(FormatError, match=want):
        embstore.import_file(tmp_path / "g.kv", tmp_path / "t.emb")
    res = invoke("import", tmp_path / "g.kv", tmp_path / "t2.emb")
    assert res.exit_code == 1 and "embstore.from_gensim" in res.stderr
    assert not os.path.exists(tmp_path / "t.emb")


def test_format_npy_on_text_gives_no_allow_pickle_advice(tmp_path):
    res = invoke("import", os.path.join(DATA, "gensim.txt"), tmp_path / "t.emb", "--format", "npy")
    assert res.exit_code == 1
    assert "allow_pickle" not in res.stderr and "pickle.load" not in res.stderr
    assert "gensim.txt: expected a .npy file (starting with b'\\x93NUMPY'), got one starting " \
        "with b'5 4\\nthe '" in res.stderr


def test_a_single_key_or_id_has_no_position(keyed):
    path, _, _ = keyed
    with embstore.open(path) as t:
        with pytest.raises(KeyNotFoundError, match=r"^key 'zzz' is not in the table$"):
            t.lookup_keys(["zzz"])
        with pytest.raises(InvalidIdError, match=r"^id 99 is out of range for a table of 40 rows"):
            t.lookup([99])
        # several ids: the position still says which
        with pytest.raises(InvalidIdError, match=r"id 99 at position \(1,\) is out of range"):
            t.lookup([0, 99])
    res = invoke("similar", path, "zzz")
    assert res.exit_code == 1 and res.stderr.strip() == "Error: key 'zzz' is not in the table"


def test_string_ids_hint_at_lookup_keys(keyed):
    path, arr, _ = keyed
    with embstore.open(path) as t:
        with pytest.raises(InvalidIdError, match=r"got str: 'w1' \(row ids are integers; look "
                                                 r"keys up with lookup_keys\(\[\.\.\.\]\)\)"):
            t["w1"]
        with pytest.raises(InvalidIdError, match=r"look keys up with lookup_keys"):
            t[["w1", "w2"]]
        np.testing.assert_array_equal(t.lookup_keys(["w1"]), arr[[1]])


def test_errors_name_the_path_not_a_repr(keyed):
    path, _, _ = keyed
    with embstore.open(path) as t:
        with pytest.raises(ReadOnlyError, match=rf"^{str(path)} is read-only \(open it"):
            t.write([0], np.zeros((1, 8), np.float32))
        with pytest.raises(embstore.EmbstoreError) as e:
            embstore.Embedding(t, oov="subword")
        assert "ZarrTable(" not in str(e.value) and str(path) in str(e.value)
    keys = path.parent / "k.txt"
    keys.write_text("w1 w2\n")
    res = invoke("lookup", path, keys, path.parent / "o.npy", "--keys", "--oov", "subword")
    assert res.exit_code == 1 and "ZarrTable(" not in res.stderr and str(path) in res.stderr


def test_similar_into_a_closed_pipe_exits_quietly(tmp_path):
    rng = np.random.default_rng(1)
    n = 3000
    embstore.save(tmp_path / "t.emb", rng.standard_normal((n, 8)).astype(np.float32),
                  keys=[f"w{i}" for i in range(n)]).close()
    code = ("import sys; from embstore.cli import main; sys.argv = ['embstore', 'similar', "
            f"{str(tmp_path / 't.emb')!r}] + ['w%d' % i for i in range(40)] + ['-k', '3000']; "
            "main()")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(embstore.__file__))}
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()  # `| head -1`
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(60) == 0, err
    assert first == b"w0:\n" and err == b""


def test_similar_json_is_a_list_for_one_query(keyed):
    path, arr, keys = keyed
    res = invoke("similar", path, "w3", "-k", "2", "--json")
    doc = json.loads(res.stdout)
    assert isinstance(doc, list) and len(doc) == 1 and doc[0]["query"] == "w3"
    unit = arr / np.linalg.norm(arr, axis=1, keepdims=True)
    cos = unit @ unit[3]
    cos[3] = -np.inf
    assert [n["key"] for n in doc[0]["neighbours"]] == [keys[i] for i in np.argsort(-cos)[:2]]
    doc = json.loads(invoke("similar", path, "w3", "w4", "-k", "2", "--json").stdout)
    assert [d["query"] for d in doc] == ["w3", "w4"]


def test_info_saved_bytes_never_negative_and_names_the_index(keyed):
    path, _, _ = keyed
    doc = json.loads(invoke("info", path, "--json").stdout)
    assert doc["nbytes"] == 40 * 8 * 4 < doc["stored_bytes"]  # a tiny table: overhead wins
    assert doc["saved_bytes"] == 0 and doc["approx_index"] is None
    assert "approx index" not in invoke("info", path).stdout
    pytest.importorskip("faiss")
    assert invoke("index", path, "--nlist", "2", "-q").exit_code == 0
    doc = json.loads(invoke("info", path, "--json").stdout)
    assert doc["approx_index"]["metric"] == "cos" and doc["approx_index"]["nlist"] == 2
    assert doc["approx_index"]["stale"] is False
    assert "approx index:  cos, 2 lists, search effort" in invoke("info", path).stdout


def test_plurals(keyed, tmp_path):
    path, _, _ = keyed
    np.save(tmp_path / "ids.npy", np.array([1], np.int64))
    res = invoke("lookup", path, tmp_path / "ids.npy", tmp_path / "o.npy")
    assert "(1 id in 1 block, " in res.stderr
    report = str(embstore.verify(path))
    assert "1 shard, 1 chunk of vectors" in report or "chunks of vectors" in report
    assert "(s)" not in report
    src = tmp_path / "dup.txt"
    src.write_text("2 2\na 1 2\na 3 4\n")
    res = invoke("import", src, tmp_path / "d.emb")
    assert "1 duplicate key dropped" in res.stderr


def test_plural_helper():
    from embstore.progress import plural
    assert [plural(1, "block"), plural(2, "block"), plural(0, "batch", "batches")] == \
        ["1 block", "2 blocks", "0 batches"]


def test_parquet_oov_error_hints_at_oov(keyed, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path, _, _ = keyed
    pq.write_table(pa.table({"tokens": [["w1", "the"], ["w2"]]}), tmp_path / "docs.parquet")
    res = invoke("lookup", path, tmp_path / "docs.parquet", tmp_path / "v.parquet",
                 "--column", "tokens")
    assert res.exit_code == 1
    assert "key 'the' is not in the table (use --oov zero or --oov unk)" in res.stderr
    res = invoke("lookup", path, tmp_path / "docs.parquet", tmp_path / "v.parquet",
                 "--column", "tokens", "--oov", "zero")
    assert res.exit_code == 0
    got = pq.read_table(tmp_path / "v.parquet").column("vector").to_pylist()
    assert got[0][1] == [0.0] * 8


def test_demo_quiet_prints_nothing(tmp_path):
    res = CliRunner().invoke(cli, ["demo", str(tmp_path), "--no-dask", "-q"])
    assert res.exit_code == 0, res.output
    assert res.stderr == "" and res.stdout == ""


# -- what gensim and xarray users reach for -----------------------------------------------------
@pytest.fixture(scope="module")
def lee():
    """gensim's Lee corpus vectors (2,747 x 32), as gensim and as an embstore table."""
    gensim = pytest.importorskip("gensim")
    src = os.path.join(os.path.dirname(embstore.__file__), "data", "lee_word2vec.txt")
    kv = gensim.models.KeyedVectors.load_word2vec_format(src)
    return kv, embstore.MemoryTable(kv.vectors.copy(), keys=list(kv.index_to_key))


@pytest.mark.parametrize("positive, negative", [
    (["government", "people"], ["year"]),  # gensim's test_most_similar shape: pos and neg
    (["war"], []), ([], ["police"]), (["president", "minister"], ["the"]), ("war", None)],
    ids=["pos-neg", "one-pos", "only-neg", "two-one", "lone-key"])
def test_most_similar_positive_negative_is_gensims(lee, positive, negative):
    kv, t = lee
    want = kv.most_similar(positive=positive, negative=negative, topn=10)
    ids, scores = embstore.Embedding(t).most_similar(positive=positive, negative=negative, k=10)
    assert [t.keys[i] for i in ids] == [w for w, _ in want]
    np.testing.assert_allclose(scores, [s for _, s in want], atol=1e-6)


def test_most_similar_analogy_takes_vectors_and_ids(lee):
    kv, t = lee
    vec = kv["war"] * 3.0  # gensim uses a given vector as it is (not normalised)
    want = kv.most_similar(positive=[vec, "government"], negative=["year"], topn=5)
    ids, _ = embstore.Embedding(t).most_similar(
        positive=[vec, kv.key_to_index["government"]], negative=["year"], k=5)
    assert [t.keys[i] for i in ids] == [w for w, _ in want]
    with pytest.raises(ValueError, match="needs a query, or positive/negative"):
        embstore.Embedding(t).most_similar()


def test_normalized_view_is_gensims_normed_vectors(lee, tmp_path):
    kv, t = lee
    n = embstore.normalized(t)
    np.testing.assert_allclose(n.to_numpy(), kv.get_normed_vectors(), atol=1e-6)
    np.testing.assert_allclose(n.lookup_keys(["war", "the"]),
                               [kv.get_vector("war", norm=True), kv.get_vector("the", norm=True)],
                               atol=1e-6)
    assert n.keys is not None and n.shape == t.shape
    with pytest.raises(embstore.ReadOnlyError):
        n.write([0], np.zeros((1, 32), np.float32))
    zero = embstore.normalized(embstore.MemoryTable(np.zeros((2, 3), np.float32)))
    assert (zero[[0, 1]] == 0).all()  # a zero row stays zero, no NaN


def test_xarray_view_has_keys_as_a_coordinate_of_row(keyed):
    xr = pytest.importorskip("xarray")
    path, arr, keys = keyed
    with embstore.open(path) as t:
        a = t.to_xarray()
        assert isinstance(a, xr.DataArray) and a.dims == ("row", "dim") and a.name == "vectors"
        assert list(a.coords) == ["key"] and a.coords["key"].dims == ("row",)
        assert list(a.coords["key"].values) == keys
        np.testing.assert_array_equal(a.values, arr)
        np.testing.assert_array_equal(a.swap_dims(row="key").sel(key=["w3", "w1"]).values,
                                      arr[[3, 1]])
        ds = a.to_dataset()
        assert list(ds.data_vars) == ["vectors"]  # no key_hash, key_order, key_utf8...
    plain = embstore.MemoryTable(arr).to_xarray()
    assert list(plain.coords) == [] and plain.dims == ("row", "dim")


def test_gensims_own_most_similar_tests_ported(tmp_path):
    """gensim's test_keyedvectors.py (test_most_similar, _parameter_types, _vector, _raises_
    keyerror) on its euclidean_vectors.bin, imported by embstore."""
    gensim = pytest.importorskip("gensim")
    from gensim.test.utils import datapath
    kv = gensim.models.KeyedVectors.load_word2vec_format(datapath("euclidean_vectors.bin"),
                                                         binary=True)
    embstore.import_file(datapath("euclidean_vectors.bin"), tmp_path / "e.emb")
    with embstore.open(tmp_path / "e.emb") as t:
        emb = embstore.Embedding(t)
        ids, _ = emb.most_similar(positive=["war"], k=5)
        assert list(t.keys[ids]) == ["conflict", "administration", "terrorism", "call", "israel"]
        want = kv.most_similar(positive="war", negative="peace", topn=5)
        for pos, neg in (("war", "peace"), (["war"], ["peace"])):
            ids, scores = emb.most_similar(positive=pos, negative=neg, k=5)
            assert list(t.keys[ids]) == [w for w, _ in want]
            np.testing.assert_allclose(scores, [s for _, s in want], atol=1e-6)
        vecs = kv.vectors[0:5]
        want = kv.most_similar(positive=list(vecs), topn=10)
        ids, _ = emb.most_similar(positive=list(vecs), k=10)
        assert list(t.keys[ids]) == [w for w, _ in want]
        with pytest.raises(KeyError):
            emb.most_similar(positive=["not_in_vocab"])

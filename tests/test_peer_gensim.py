"""gensim's own test cases, ported to embstore (issue 32): word2vec binary files as gensim
writes and reads them, ``to_gensim()`` under gensim's ``test_keyedvectors.py``,
``most_similar``'s ``topn`` and gensim's fastText loader.  The reference is gensim itself,
run on the same data."""

from __future__ import annotations

import numpy as np
import pytest

import embstore
from embstore.errors import FormatError
from embstore.formats import detect, get

gensim_models = pytest.importorskip("gensim.models")
KeyedVectors = gensim_models.KeyedVectors
from gensim.test.utils import datapath  # noqa: E402


def _read_all(fmt, path):
    with get(fmt).read(path) as r:
        blocks = list(r)
    return np.concatenate([b[0] for b in blocks]), [k for b in blocks for k in b[1]]


# -- point 1: detection of gensim's binary files -------------------------------------------
def _newline_first_float(tmp_path, name):
    """gensim's ``test_save_reload`` recipe (random vectors, ``save_word2vec_format(
    binary=True)``) over seeds until the first float's low byte is 0x0a (a "\\n")."""
    for seed in range(2000):
        vecs = np.random.default_rng(seed).standard_normal((20, 100)).astype(np.float32)
        if vecs[0, 0].tobytes()[0] == 0x0A:
            break
    kv = KeyedVectors(vector_size=100)
    kv.add_vectors([str(i) for i in range(20)], vecs)
    path = tmp_path / name
    kv.save_word2vec_format(str(path), binary=True)
    assert path.read_bytes()[len(b"20 100\n0 ")] == 0x0A
    return path, kv


@pytest.mark.parametrize("name", ["tmp_kv.bin", "tmp_kv"], ids=["bin", "no-extension"])
def test_detects_gensim_binary_with_newline_byte(tmp_path, name):
    """ports gensim's test_keyedvectors.py::TestKeyedVectors::test_save_reload (its binary
    half): the file gensim writes is detected and read back exactly."""
    path, kv = _newline_first_float(tmp_path, name)
    assert detect(path) == "word2vec-binary"
    embstore.import_file(path, tmp_path / "t.emb")
    t = embstore.open(tmp_path / "t.emb")
    assert list(t.keys) == kv.index_to_key
    np.testing.assert_array_equal(t.to_numpy(), kv.vectors)
    reloaded = KeyedVectors.load_word2vec_format(str(path), binary=True)
    np.testing.assert_array_equal(t.to_numpy(), reloaded.vectors)


def test_bin_name_counts_toward_binary(tmp_path):
    """A binary record whose float bytes are all printable ("abcd" is 2.6e20): text by its
    bytes alone, binary by its ``.bin`` name, and gensim reads it as binary."""
    data = b"1 1\nx abcd\n"
    (tmp_path / "v.bin").write_bytes(data)
    (tmp_path / "v.txt").write_bytes(data)
    assert detect(tmp_path / "v.bin") == "word2vec-binary"
    assert detect(tmp_path / "v.txt") == "word2vec"
    vecs, keys = _read_all("word2vec-binary", tmp_path / "v.bin")
    ref = KeyedVectors.load_word2vec_format(str(tmp_path / "v.bin"), binary=True)
    assert keys == ref.index_to_key == ["x"]
    np.testing.assert_array_equal(vecs, ref.vectors)


# -- point 3: a key with a space in the binary export -----------------------------------------
def test_binary_export_refuses_key_with_space(tmp_path):
    """gensim (and word2vec.c) cut a key at its first space and read the rest of the row
    shifted (2.9e26 values): the export refuses the key, naming it, as the text export."""
    t = embstore.MemoryTable(np.ones((2, 3), np.float32), keys=["a", "new york"])
    with pytest.raises(FormatError, match=r"row 1: key 'new york' is empty or holds "
                                          r"whitespace; word2vec-binary cannot store it"):
        get("word2vec-binary").write(tmp_path / "o.bin", t)
    t = embstore.MemoryTable(np.ones((2, 3), np.float32), keys=["a", "b"])
    get("word2vec-binary").write(tmp_path / "o.bin", t)
    ref = KeyedVectors.load_word2vec_format(str(tmp_path / "o.bin"), binary=True)
    assert ref.index_to_key == ["a", "b"]


# -- point 6: gensim's space-stripping test file ----------------------------------------------
def _save_dict(path, d):
    """gensim's test_keyedvectors.py::save_dict_to_word2vec_formated_file, as it is."""
    with open(path, "wb") as f:
        f.write(b"%d %d\n" % (len(d), len(next(iter(d.values())))))
        for word, vector in d.items():
            f.write(word.encode() + b" " + np.array(vector).astype(np.float32).tobytes())


@pytest.mark.parametrize("limit", [None, 1, 2], ids=["all", "limit1", "limit2"])
def test_space_stripping_file(tmp_path, limit):
    """ports gensim's test_keyedvectors.py::LoadWord2VecFormatTest::
    test_load_word2vec_format_space_stripping (and _basic, _limit): keys "\\nabc",
    "cdefdg", "\\n\\ndef" read as gensim reads them."""
    d = {"\nabc": [1, 2, 3], "cdefdg": [4, 5, 6], "\n\ndef": [7, 8, 9]}
    path = tmp_path / "tmp_w2v"
    _save_dict(path, d)
    ref = KeyedVectors.load_word2vec_format(str(path), binary=True, limit=limit)
    with get("word2vec-binary").read(path, limit=limit) as r:
        blocks = list(r)
    keys = [k for b in blocks for k in b[1]]
    vecs = np.concatenate([b[0] for b in blocks])
    assert keys == ref.index_to_key == [k.lstrip() for k in d][:limit]
    np.testing.assert_array_equal(vecs, ref.vectors)
    assert detect(path) == "word2vec-binary"


# -- point 8: to_gensim() and gensim's KeyedVectors tests ----------------------------------
@pytest.fixture(scope="module")
def euclid():
    return KeyedVectors.load_word2vec_format(datapath("euclidean_vectors.bin"), binary=True)


@pytest.fixture(scope="module")
def ours(euclid, tmp_path_factory):
    path = tmp_path_factory.mktemp("kv") / "t.emb"
    embstore.import_file(datapath("euclidean_vectors.bin"), path)
    return embstore.to_gensim(path)


def test_to_gensim_count_attribute(euclid, ours):
    """ports gensim's test_keyedvectors.py::TestKeyedVectors::
    test_vectors_for_all_with_copy_vecattrs and _without_copy_vecattrs: ``count`` as
    load_word2vec_format makes it up."""
    np.testing.assert_array_equal(ours.expandos["count"], euclid.expandos["count"])
    assert ours.expandos["count"].dtype == euclid.expandos["count"].dtype
    expected = ours.get_vecattr("conflict", "count")
    assert expected == euclid.get_vecattr("conflict", "count") == \
        len(euclid) - euclid.get_index("conflict")
    assert ours.vectors_for_all(["conflict"], copy_vecattrs=True).get_vecattr(
        "conflict", "count") == expected
    assert ours.vectors_for_all(["conflict"], copy_vecattrs=False).get_vecattr(
        "conflict", "count") != expected


def test_most_similar_topn(euclid, ours):
    """ports gensim's test_keyedvectors.py::TestKeyedVectors::test_most_similar_topn on
    ``Embedding.most_similar(k=...)``: k=0 and np.uint8(0) give nothing, k=None every
    row's score in row order (the query's own included, as gensim's topn=None)."""
    emb = embstore.Embedding(embstore.MemoryTable(euclid.vectors, keys=euclid.index_to_key))
    for k in (5, 10):
        ids, scores = emb.most_similar("war", k=k)
        assert len(ids) == k
        assert [euclid.index_to_key[i] for i in ids] == \
            [w for w, _ in euclid.most_similar("war", topn=k)]
    ids, scores = emb.most_similar("war", k=None)
    ref = euclid.most_similar("war", topn=None)
    assert len(scores) == len(ids) == len(euclid)
    np.testing.assert_array_equal(ids, np.arange(len(euclid)))
    np.testing.assert_allclose(scores, ref, rtol=1e-5, atol=1e-6)
    for k in (0, np.uint8(0)):
        ids, scores = emb.most_similar("war", k=k)
        assert ids.shape == scores.shape == (0,)
        assert len(euclid.most_similar("war", topn=k)) == 0
    ids, scores = emb.most_similar(["war", "peace"], k=0)
    assert ids.shape == (2, 0)
    assert ours.most_similar("war", topn=3) == euclid.most_similar("war", topn=3)


# -- point 8: fastText ----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["fasttext", "word2vec", "word2vec-binary"])
def test_old_format_fasttext_bin_gets_the_hint(tmp_path, fmt):
    """ports gensim's test_fasttext.py models: lee_fasttext.bin (the format before 2017, no
    magic number) read as a text format says what it is, as a new-format model does."""
    with pytest.raises(FormatError, match=r"lee_fasttext.bin: this is a fastText binary "
                                          r"model of the old format \(.bin, no magic number\)"
                                          r".*read it with format 'fasttext-bin'"):
        embstore.import_file(datapath("lee_fasttext.bin"), tmp_path / "t.emb", format=fmt)
    with pytest.raises(FormatError, match=r"magic number 0x2F4F16BA"):
        embstore.import_file(datapath("lee_fasttext_new.bin"), tmp_path / "t.emb", format=fmt)


def test_fasttext_invalid_utf8_word_as_gensim(tmp_path):
    """ports gensim's _fasttext_bin.py::_load_vocab fallback (exercised by test_fasttext.py's
    cp852/non-ASCII models): a word that is not UTF-8 gets gensim's key (backslash
    escapes) and gensim's vector (n-grams of that key) under unicode_errors='replace'."""
    load_facebook_vectors = pytest.importorskip("gensim.models.fasttext").load_facebook_vectors
    raw = bytearray(open(datapath("lee_fasttext_new.bin"), "rb").read())
    p = 92  # magic, version, 12 arguments, the dictionary header: the first word
    for _ in range(2):
        p = raw.index(0, p) + 10  # the word, NUL, int64 count, int8 type
    assert bytes(raw[p:p + 3]) == b"of\x00"
    raw[p + 1] = 0xFF  # "of" -> b"o\xff"
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(raw))
    ref = load_facebook_vectors(str(bad))
    assert ref.index_to_key[2] == "o\\xff"
    with pytest.raises(FormatError, match="word 3"):
        embstore.import_file(bad, tmp_path / "strict.emb")
    embstore.import_file(bad, tmp_path / "t.emb", unicode_errors="replace")
    t = embstore.open(tmp_path / "t.emb")
    assert list(t.keys) == ref.index_to_key
    np.testing.assert_array_equal(t.to_numpy(), ref.vectors)
    np.testing.assert_array_equal(t.lookup_keys("o\\xff"), ref["o\\xff"])

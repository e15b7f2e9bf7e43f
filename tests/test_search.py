"""Embedding.logits and most_similar: NumPy and gensim references, streaming proven."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embstore
from embstore import (Embedding, InvalidIdError, InvalidOptionError, KeyNotFoundError,
                      ShapeMismatchError)
from embstore.memory import DictVocab
from embstore.search.stream import top_k_columns

V, D = 50, 8
KEYS = [f"w{i}" for i in range(V)]


@pytest.fixture
def E(rng):
    E = rng.standard_normal((V, D)).astype(np.float32)
    E[7] = 0  # a zero-norm row
    return E


class RecordingTable(embstore.Table):
    """A table that remembers the largest read and refuses whole-table reads."""

    def __init__(self, array, keys=None):
        self._a = array
        self._keys = None if keys is None else DictVocab(keys)
        self.largest_block = 0
        self.largest_gather = 0
        self.blocks = 0

    @property
    def shape(self):
        return self._a.shape

    @property
    def dtype(self):
        return self._a.dtype

    def _vocab(self):
        return self._keys

    def _gather(self, ids, out):
        self.largest_gather = max(self.largest_gather, len(ids))
        np.take(self._a, ids, axis=0, out=out)

    def _read_rows(self, start, stop):
        self.largest_block = max(self.largest_block, stop - start)
        self.blocks += 1
        return self._a[start:stop].copy()

    def to_numpy(self):
        raise AssertionError("the whole table was read")


def brute_cosine(E, q):
    norms = np.linalg.norm(E.astype(np.float64), axis=1)
    qn = np.linalg.norm(q, axis=-1, keepdims=True)
    s = (q / np.where(qn == 0, 1, qn)) @ E.T.astype(np.float64)
    return s / np.where(norms == 0, 1, norms)


def ranked(scores, k, banned=()):
    """(ids, scores) of the k best, descending, ties by lower id."""
    s = np.array(scores, dtype=np.float64)
    s[list(banned)] = -np.inf
    order = np.lexsort((np.arange(len(s)), -s))[:k]
    return order, s[order]


# -- logits ------------------------------------------------------------------------------------
def test_logits_full_and_streamed(E, rng):
    h = rng.standard_normal((2, 3, D)).astype(np.float32)
    t = RecordingTable(E)
    got = Embedding(t).logits(h, block_rows=7)
    assert got.shape == (2, 3, V) and got.dtype == np.float32
    np.testing.assert_allclose(got, h @ E.T, rtol=1e-5, atol=1e-5)
    assert t.largest_block == 7 and t.blocks == 8 and t.largest_gather == 0


def test_logits_top_k(E, rng):
    h = rng.standard_normal((4, D))
    t = RecordingTable(E)
    values, ids = Embedding(t).logits(h, top_k=5, block_rows=6)
    assert t.largest_block <= 6 and t.largest_gather == 0
    full = h @ E.T.astype(np.float64)
    want = np.argsort(-full, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_allclose(values, np.take_along_axis(full, want, 1), rtol=1e-12)
    assert values.dtype == np.float64  # a float64 hidden promotes
    v1, i1 = Embedding(E).logits(h[0], top_k=V + 10)
    assert v1.shape == (V,) and (np.sort(i1) == np.arange(V)).all()


def test_logits_top_k_ties_lower_id_first():
    E = np.array([[1.0], [2.0], [2.0], [0.0], [2.0], [1.0]], dtype=np.float32)
    values, ids = Embedding(E).logits(np.ones((1, 1), np.float32), top_k=2, block_rows=2)
    np.testing.assert_array_equal(ids, [[1, 2]])
    values, ids = Embedding(E).logits(np.ones(1, np.float32), top_k=4, block_rows=4)
    np.testing.assert_array_equal(ids, [1, 2, 4, 0])
    np.testing.assert_array_equal(values, [2, 2, 2, 1])


def test_logits_on_backends(make_table, E, rng):
    h = rng.standard_normal((3, D)).astype(np.float32)
    emb = Embedding(make_table(E))
    np.testing.assert_allclose(emb.logits(h, block_rows=16), h @ E.T, rtol=1e-5, atol=1e-5)
    values, ids = emb.logits(h, top_k=3)
    np.testing.assert_array_equal(ids, np.argsort(-(h @ E.T), axis=1, kind="stable")[:, :3])


def test_logits_errors(E):
    emb = Embedding(E)
    with pytest.raises(ShapeMismatchError, match=r"with dim = 8, got \(2, 5\)"):
        emb.logits(np.ones((2, 5)))
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        emb.logits(np.ones(D), top_k=0)
    with pytest.raises(ValueError, match="block_rows must be a positive int"):
        emb.logits(np.ones(D), block_rows=0)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_top_k_columns_matches_lexsort(data):
    n = data.draw(st.integers(1, 4))
    m = data.draw(st.integers(1, 30))
    k = data.draw(st.integers(1, m))
    vals = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, -1.0, np.nan]),
                                       min_size=n * m, max_size=n * m))).reshape(n, m)
    cols = top_k_columns(vals, k)
    key = np.where(np.isnan(vals), -np.inf, vals)
    for r in range(n):
        want = np.sort(np.lexsort((np.arange(m), -key[r]))[:k])
        np.testing.assert_array_equal(cols[r], want)


# -- most_similar ----------------------------------------------------------------------------
def test_most_similar_vector_brute_force(E, rng):
    q = rng.standard_normal(D)
    t = RecordingTable(E)
    ids, scores = Embedding(t).most_similar(q, k=6, block_rows=9)
    want_ids, want_scores = ranked(brute_cosine(E, q), 6)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6, atol=1e-7)
    assert t.largest_block <= 9 and t.largest_gather == 0


def test_most_similar_by_id_key_and_exclude(E):
    t = RecordingTable(E, keys=KEYS)
    emb = Embedding(t)
    all_scores = brute_cosine(E, E[3].astype(np.float64))
    want_ids, want_scores = ranked(all_scores, 5, banned=[3])
    for query in (3, "w3", np.int16(3)):
        ids, scores = emb.most_similar(query, k=5, block_rows=11)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
    banned = [3, int(want_ids[0]), int(want_ids[2])]
    ids, _ = emb.most_similar("w3", k=5, exclude=[KEYS[want_ids[0]], int(want_ids[2])],
                              block_rows=11)
    np.testing.assert_array_equal(ids, ranked(all_scores, 5, banned=banned)[0])
    assert t.largest_block <= 11 and t.largest_gather <= 1


def test_most_similar_batch(E, rng):
    emb = Embedding(E)
    q = rng.standard_normal((3, D)).astype(np.float32)
    ids, scores = emb.most_similar(q, k=4, exclude=[0], block_rows=13)
    assert ids.shape == scores.shape == (3, 4)
    for r in range(3):
        want_ids, want_scores = ranked(brute_cosine(E, q[r].astype(np.float64)), 4, banned=[0])
        np.testing.assert_array_equal(ids[r], want_ids)
        np.testing.assert_allclose(scores[r], want_scores, rtol=1e-5, atol=1e-6)
    ids, _ = emb.most_similar([5, 9], k=3)
    assert ids.shape == (2, 3) and 5 not in ids[0] and 9 not in ids[1]
    t = embstore.MemoryTable(E, keys=KEYS)
    ids2, _ = Embedding(t).most_similar(["w5", "w9"], k=3)
    np.testing.assert_array_equal(ids, ids2)


def test_most_similar_zero_norm_rows_and_queries(E):
    ids, scores = Embedding(E).most_similar(np.zeros(D), k=3)
    np.testing.assert_array_equal(ids, [0, 1, 2])  # every score undefined: lower ids first
    assert np.isnan(scores).all()
    ids, scores = Embedding(E).most_similar(7, k=V)  # the zero row itself as the query
    assert ids.shape == (V - 1,) and 7 not in ids and np.isnan(scores).all()


def test_zero_norm_rows_never_outrank_real_neighbours(rng):
    """A zero row scores NaN and ranks last, below rows of negative cosine (it scored 0)."""
    E = np.array([[1, 0], [0, 0], [-1, 0.1], [-1, -0.1], [0, 0], [-0.5, 0.5]], np.float32)
    q = np.array([1.0, 0.0])
    for block_rows in (1, 2, 6):
        ids, scores = Embedding(E).most_similar(q, k=6, block_rows=block_rows)
        np.testing.assert_array_equal(ids, [0, 5, 2, 3, 1, 4])
        assert (scores[:4] < 1.01).all() and scores[2] < 0 and np.isnan(scores[4:]).all()
        ids, scores = Embedding(E).most_similar(0, k=5, exclude=[3], block_rows=block_rows)
        np.testing.assert_array_equal(ids, [5, 2, 1, 4])  # zero rows before excluded places
        assert np.isnan(scores[2:]).all()


def test_most_similar_k_beyond_candidates(E):
    small = E[:5]
    ids, scores = Embedding(small).most_similar(1, k=10, exclude=[3])
    assert ids.shape == (3,) and set(ids.tolist()) == {0, 2, 4}
    ids, scores = Embedding(small).most_similar([1, 3], k=10, exclude=[3])
    assert ids.shape == (2, 4)  # query 3 is excluded anyway: 4 candidates, query 1 has 3
    assert ids[0, 3] == -1 and scores[0, 3] == -np.inf
    assert set(ids[1].tolist()) == {0, 1, 2, 4}
    ids, scores = Embedding(small).most_similar(np.ones(D), k=10, exclude=range(5))
    assert ids.shape == scores.shape == (0,)


def test_most_similar_on_backends(make_table, E):
    emb = Embedding(make_table(E, keys=KEYS))
    want_ids, want_scores = ranked(brute_cosine(E, E[10].astype(np.float64)), 7, banned=[10])
    ids, scores = emb.most_similar("w10", k=7, block_rows=12)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)


def test_most_similar_errors(E):
    emb = Embedding(embstore.MemoryTable(E, keys=KEYS))
    with pytest.raises(KeyNotFoundError, match="nope"):
        emb.most_similar("nope")
    with pytest.raises(InvalidIdError, match=f"id {V} is out of range"):
        emb.most_similar(V)
    with pytest.raises(InvalidIdError):
        emb.most_similar(1, exclude=[-1])
    with pytest.raises(ShapeMismatchError, match="dim = 8"):
        emb.most_similar(np.ones(D + 1))
    with pytest.raises(ShapeMismatchError, match=r"\(dim,\) or \(n, dim\)"):
        emb.most_similar(np.ones((2, 2, D)))
    with pytest.raises(InvalidOptionError, match="k must be an int >= 0, got -1"):
        emb.most_similar(1, k=-1)  # (k=0: no results, as gensim's topn=0)
    with pytest.raises(KeyNotFoundError, match="no keys"):
        Embedding(E).most_similar("w1")


def test_most_similar_matches_gensim(E, rng):
    gensim_models = pytest.importorskip("gensim.models")
    E = E.copy()
    E[7] = rng.standard_normal(D)  # gensim scores a zero row NaN (0/0); we too, but rank it last
    kv = gensim_models.KeyedVectors(vector_size=D)
    kv.add_vectors(KEYS, E)
    emb = Embedding(embstore.MemoryTable(E, keys=KEYS))
    for key in ("w0", "w21", "w49"):
        want = kv.most_similar(key, topn=8)
        ids, scores = emb.most_similar(key, k=8, block_rows=16)
        assert [KEYS[i] for i in ids] == [w for w, _ in want]
        np.testing.assert_allclose(scores, [s for _, s in want], rtol=1e-5, atol=1e-6)
    vec = E[4] + 0.1
    want = kv.most_similar(positive=[vec], topn=5)  # a vector: nothing left out
    ids, scores = emb.most_similar(vec, k=5)
    assert [KEYS[i] for i in ids] == [w for w, _ in want]
    np.testing.assert_allclose(scores, [s for _, s in want], rtol=1e-5, atol=1e-6)

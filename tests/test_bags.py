"""Embedding.bag: torch.nn.EmbeddingBag equivalence and a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embstore import Embedding, ShapeMismatchError
from embstore.pooling import segment_reduce

V, D = 10, 4


@pytest.fixture
def E(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


def reference(E, ids, starts, ends, *, mode, weights=None, padding_idx=None):
    """One bag at a time, straight from the definition."""
    out = np.zeros((len(starts), E.shape[1]), dtype=np.float64)
    for b, (s, e) in enumerate(zip(starts, ends)):
        sel = [i for i in range(s, e) if ids[i] != padding_idx]
        if not sel:
            continue
        rows = E[ids[sel]].astype(np.float64)
        w = np.ones(len(sel)) if weights is None else np.asarray(weights, float)[sel]
        if mode == "sum":
            out[b] = (rows * w[:, None]).sum(0)
        elif mode == "mean":
            out[b] = (rows * w[:, None]).sum(0) / w.sum() if w.sum() != 0 else 0
        else:
            out[b] = rows.max(0)
    return out


# -- PyTorch ----------------------------------------------------------------------------------
def torch_bag(E, ids, offsets=None, weights=None, **kw):
    torch = pytest.importorskip("torch")
    m = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(E.copy()), **kw)
    out = m(torch.from_numpy(np.asarray(ids)),
            None if offsets is None else torch.from_numpy(np.asarray(offsets)),
            per_sample_weights=None if weights is None else torch.from_numpy(weights))
    return out.detach().numpy()


IDS_1D = np.array([1, 2, 3, 4, 4, 0, 9, 2, 5])
OFFSETS = np.array([0, 2, 2, 5, 8])  # an empty bag in the middle, a 1-long bag at the end


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 2, -1], ids=["nopad", "pad2", "pad-1"])
def test_torch_offsets(E, mode, padding_idx):
    want = torch_bag(E, IDS_1D, OFFSETS, mode=mode, padding_idx=padding_idx)
    got = Embedding(E, padding_idx=padding_idx).bag(IDS_1D, OFFSETS, mode=mode)
    assert got.shape == (len(OFFSETS), D) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_torch_2d_with_padding(E, rng, mode):
    ids = rng.integers(0, V, size=(6, 5))
    ids[0] = 3  # a bag made only of padding
    ids[1, :2] = 3
    want = torch_bag(E, ids, mode=mode, padding_idx=3)
    got = Embedding(E, padding_idx=3).bag(ids, mode=mode)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not got[0].any()


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_torch_include_last_offset(E, mode):
    offsets = np.array([0, 2, 2, 5, 9])
    want = torch_bag(E, IDS_1D, offsets, mode=mode, include_last_offset=True)
    got = Embedding(E).bag(IDS_1D, offsets, mode=mode, include_last_offset=True)
    assert got.shape == (4, D)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("padding_idx", [None, 4])
def test_torch_per_sample_weights_sum(E, rng, padding_idx):
    w = rng.uniform(-1, 2, size=IDS_1D.shape).astype(np.float32)
    want = torch_bag(E, IDS_1D, OFFSETS, w, mode="sum", padding_idx=padding_idx)
    got = Embedding(E, padding_idx=padding_idx).bag(IDS_1D, OFFSETS, weights=w, mode="sum")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    w2 = rng.uniform(0, 1, size=(3, 4)).astype(np.float32)
    ids2 = rng.integers(0, V, size=(3, 4))
    np.testing.assert_allclose(Embedding(E).bag(ids2, weights=w2, mode="sum"),
                               torch_bag(E, ids2, weights=w2, mode="sum"), rtol=1e-5, atol=1e-6)


def test_torch_max_norm_bag(E):
    want = torch_bag(E * 3, IDS_1D, OFFSETS, mode="mean", max_norm=1.0)
    got = Embedding(E * 3, max_norm=1.0).bag(IDS_1D, OFFSETS, mode="mean")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- what PyTorch lacks -------------------------------------------------------------------------
def test_weighted_mean(E):
    w = np.array([1, 3, 0.5, 0, 2, 0, 0, 1, 1], dtype=np.float64)  # bag 2 (3..4) has 0.5+0+2
    got = Embedding(E).bag(IDS_1D, OFFSETS, weights=w, mode="mean")
    starts, ends = OFFSETS, np.append(OFFSETS[1:], len(IDS_1D))
    want = reference(E, IDS_1D, starts, ends, mode="mean", weights=w)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], (E[1] + 3 * E[2]) / 4, rtol=1e-6)


def test_zero_weight_bag_and_empty_bags_give_zeros(E):
    ids = np.array([[1, 2], [3, 4]])
    w = np.array([[1.0, -1.0], [0.0, 0.0]])
    got = Embedding(E).bag(ids, weights=w, mode="mean")
    assert not got.any()
    empty = Embedding(E).bag(np.array([], dtype=np.int64), np.array([0, 0, 0]), mode="max")
    np.testing.assert_array_equal(empty, np.zeros((3, D), np.float32))
    assert Embedding(E).bag(np.zeros((0, 3), dtype=np.int64)).shape == (0, D)


def test_scale_and_oov_in_bags(E):
    ids = np.array([[1, V + 5, 2]])
    got = Embedding(E, oov="zero", scale=2.0).bag(ids, mode="mean")
    np.testing.assert_allclose(got[0], 2 * (E[1] + E[2]) / 3, rtol=1e-6)  # a zero row counts
    got = Embedding(E, oov="unk", unk_id=0).bag(ids, mode="sum", unk=[2])
    np.testing.assert_allclose(got[0], E[1] + 2 * E[0], rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_bag_dtype_follows_table(E, dtype):
    got = Embedding(E.astype(dtype)).bag(IDS_1D, OFFSETS, mode="mean")
    assert got.dtype == np.dtype(dtype)
    starts, ends = OFFSETS, np.append(OFFSETS[1:], len(IDS_1D))
    want = reference(E.astype(dtype), IDS_1D, starts, ends, mode="mean")
    np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == "float16" else 1e-12)


def test_bag_on_backends(make_table, E):
    emb = Embedding(make_table(E), padding_idx=9)
    starts, ends = OFFSETS, np.append(OFFSETS[1:], len(IDS_1D))
    for mode in ("sum", "mean", "max"):
        want = reference(E, IDS_1D, starts, ends, mode=mode, padding_idx=9)
        np.testing.assert_allclose(emb.bag(IDS_1D, OFFSETS, mode=mode), want, rtol=1e-5,
                                   atol=1e-6)


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda e: e.bag([1, 2]), "1-D ids need offsets"),
    (lambda e: e.bag([[1, 2]], offsets=[0]), "offsets must be None when ids is 2-D"),
    (lambda e: e.bag([[[1]]]), r"got shape \(1, 1, 1\)"),
    (lambda e: e.bag([1, 2, 3], offsets=[1, 2]), r"offsets\[0\] must be 0"),
    (lambda e: e.bag([1, 2, 3], offsets=[0, 2, 1]), r"non-decreasing, got offsets\[1\] = 2"),
    (lambda e: e.bag([1, 2, 3], offsets=[0, 4]), r"<= len\(ids\) = 3, got 4"),
    (lambda e: e.bag([1, 2, 3], offsets=[[0]]), "offsets must be 1-D"),
    (lambda e: e.bag([1, 2, 3], offsets=[0.0]), "offsets must be integers"),
    (lambda e: e.bag([1, 2], offsets=[], include_last_offset=True), "at least one offset"),
    (lambda e: e.bag([[1, 2]], weights=[1.0, 2.0]), "weights must have the shape of ids"),
], ids=["no-offsets", "2d-offsets", "3d", "first", "decreasing", "beyond", "offsets-2d",
        "float-offsets", "ilo-empty", "weights-shape"])  # ilo-short: tests/test_peer_torch.py
def test_bag_shape_errors(E, call, match):
    with pytest.raises(ShapeMismatchError, match=match):
        call(Embedding(E))


def test_bag_option_errors(E):
    with pytest.raises(ValueError, match="mode must be one of"):
        Embedding(E).bag([[1]], mode="median")
    with pytest.raises(ValueError, match="not for mode='max'"):
        Embedding(E).bag([[1]], weights=[[1.0]], mode="max")


# -- property: random ragged bags against the per-bag reference ----------------------------------
@settings(max_examples=60, deadline=None)
@given(data=st.data(), mode=st.sampled_from(["sum", "mean", "max"]),
       weighted=st.booleans(), pad=st.sampled_from([None, 0, 3]), ilo=st.booleans())
def test_random_bags_match_reference(data, mode, weighted, pad, ilo):
    E = np.arange(V * D, dtype=np.float64).reshape(V, D) % 7 - 3
    n = data.draw(st.integers(0, 12))
    ids = np.array(data.draw(st.lists(st.integers(0, V - 1), min_size=n, max_size=n)),
                   dtype=np.int64)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    offsets = np.array([0] + cuts + ([n] if ilo else []), dtype=np.int64)
    if ilo:
        starts, ends = offsets[:-1], offsets[1:]
    else:
        starts, ends = offsets, np.append(offsets[1:], n)
    w = None
    if weighted and mode != "max":
        w = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]),
                                        min_size=n, max_size=n)))
    got = Embedding(E, padding_idx=pad).bag(ids, offsets, weights=w, mode=mode,
                                            include_last_offset=ilo)
    want = reference(E, ids, starts, ends, mode=mode, weights=w, padding_idx=pad)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lens", [[1], [3, 1, 2], [65, 1, 64, 130], [1] * 50 + [5000], [4200]],
                         ids=["one", "short", "around-64", "skewed", "long"])
@pytest.mark.parametrize("op", [np.add, np.maximum], ids=["add", "max"])
def test_segment_reduce_matches_reduceat(rng, lens, op):
    lens = np.array(lens)
    vals = rng.standard_normal((int(lens.sum()), 3))
    starts = np.cumsum(lens) - lens
    np.testing.assert_allclose(segment_reduce(vals, lens, op), op.reduceat(vals, starts, axis=0),
                               rtol=1e-12, atol=1e-12)


def test_long_bags_match_torch(rng):
    E = rng.standard_normal((V, D)).astype(np.float32)
    ids = rng.integers(0, V, size=700)
    offsets = np.array([0, 1, 1, 300, 301, 650])
    for mode in ("sum", "mean", "max"):
        want = torch_bag(E, ids, offsets, mode=mode, padding_idx=0)
        got = Embedding(E, padding_idx=0).bag(ids, offsets, mode=mode)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_torch_nonzero_pad_row_on_backends(make_table, rng, mode):
    """A pretrained table whose pad row is not zero: bags leave it out, in memory and on disk."""
    E = rng.standard_normal((V, D)).astype(np.float32) + 3  # every row, the pad row too, > 0
    emb = Embedding(make_table(E), padding_idx=4)
    ids2d = rng.integers(0, V, size=(6, 5))
    ids2d[0] = 4  # a bag made only of padding
    ids2d[1, :3] = 4
    np.testing.assert_allclose(emb.bag(ids2d, mode=mode),
                               torch_bag(E, ids2d, mode=mode, padding_idx=4), rtol=1e-5)
    ids1d = ids2d.reshape(-1)
    offsets = np.array([0, 5, 5, 12, 20])
    np.testing.assert_allclose(emb.bag(ids1d, offsets, mode=mode),
                               torch_bag(E, ids1d, offsets, mode=mode, padding_idx=4), rtol=1e-5)
    if mode == "sum":
        w = rng.uniform(0.5, 2, size=ids1d.shape).astype(np.float32)
        np.testing.assert_allclose(emb.bag(ids1d, offsets, weights=w, mode="sum"),
                                   torch_bag(E, ids1d, offsets, w, mode="sum", padding_idx=4),
                                   rtol=1e-5)
        np.testing.assert_allclose(emb.bag(ids2d, weights=w.reshape(ids2d.shape), mode="sum"),
                                   torch_bag(E, ids2d, None, w.reshape(ids2d.shape), mode="sum",
                                             padding_idx=4), rtol=1e-5)

"""Embedding.__call__, slice, contextual: against NumPy references and PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import embstore
from embstore import Embedding, InvalidIdError, ShapeMismatchError

V, D = 12, 5


@pytest.fixture
def E(rng):
    return (rng.standard_normal((V, D)) * 2).astype(np.float32)


@pytest.fixture
def ids(rng):
    return rng.integers(0, V, size=(3, 7))


# -- plain lookups and options on every backend --------------------------------------------
def test_plain_call_is_lookup(make_table, E, ids):
    emb = Embedding(make_table(E))
    out = emb(ids)
    assert out.shape == ids.shape + (D,) and out.dtype == E.dtype and out.flags.c_contiguous
    np.testing.assert_array_equal(out, E[ids])
    np.testing.assert_array_equal(emb(4), E[4])
    np.testing.assert_array_equal(emb([[1, 2], [3, 4]]), E[[[1, 2], [3, 4]]])


def test_all_options_on_backends(make_table, E, ids, rng):
    t = make_table(E)
    emb = Embedding(t, padding_idx=2, max_norm=1.5, scale="sqrt_dim")
    mask = rng.integers(0, 2, size=ids.shape).astype(bool)
    weights = rng.uniform(0.5, 2, size=ids.shape)
    got = emb(ids, mask=mask, weights=weights)
    rows = E[ids].astype(np.float64)
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    rows = np.where(norms > 1.5, rows * (1.5 / (norms + 1e-7)), rows)
    rows[~mask] = 0  # padding_idx does not zero rows (as torch): the mask does
    want = rows * weights[..., None] * math.sqrt(D)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(t.to_numpy(), E)  # max_norm never touches the table


def test_accepts_plain_array(E, ids):
    emb = Embedding(E)
    assert isinstance(emb.table, embstore.MemoryTable)
    assert (emb.vocab_size, emb.dim, emb.dtype) == (V, D, np.float32)
    np.testing.assert_array_equal(emb(ids), E[ids])
    with pytest.raises(ShapeMismatchError, match="2-D"):
        Embedding(np.zeros(3, dtype=np.float32))


# -- oov modes ---------------------------------------------------------------------------
BAD = [[0, -1, 3], [V, 2**40, 5]]


def test_oov_error_names_first_bad_id(E):
    emb = Embedding(E)
    with pytest.raises(InvalidIdError, match=r"id -1 at position \(0, 1\)") as info:
        emb(BAD)
    assert info.value.id == -1 and info.value.position == (0, 1)
    with pytest.raises(InvalidIdError, match=f"id {V} is out of range"):
        Embedding(E, padding_idx=0)([V])


def test_oov_unk(E):
    got = Embedding(E, oov="unk", unk_id=1)(BAD)
    np.testing.assert_array_equal(got, E[[[0, 1, 3], [1, 1, 5]]])


def test_oov_clip(E):
    got = Embedding(E, oov="clip")(BAD)
    np.testing.assert_array_equal(got, E[[[0, 0, 3], [V - 1, V - 1, 5]]])


def test_oov_zero(E):
    got = Embedding(E, oov="zero")(BAD)
    want = E[[[0, 0, 3], [0, 0, 5]]].copy()
    want[0, 1] = want[1, 0] = want[1, 1] = 0
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["uint8", "uint64", "int8", "int32"])
def test_oov_with_unsigned_and_small_dtypes(E, dtype):
    info = np.iinfo(dtype)
    raw = np.array([1, info.max, 3, info.min if info.min < 0 else 0], dtype=dtype)
    want_ids = np.where((raw.astype(object) < 0) | (raw.astype(object) >= V), 7,
                        raw.astype(object)).astype(np.int64)
    np.testing.assert_array_equal(Embedding(E, oov="unk", unk_id=7)(raw), E[want_ids])
    clip = np.clip(raw.astype(object), 0, V - 1).astype(np.int64)
    np.testing.assert_array_equal(Embedding(E, oov="clip")(raw), E[clip])


def test_oov_huge_python_int(E):
    np.testing.assert_array_equal(Embedding(E, oov="unk", unk_id=2)([1, 2**70]), E[[1, 2]])
    np.testing.assert_array_equal(Embedding(E, oov="clip")(2**70), E[V - 1])


@pytest.mark.parametrize("oov", ["error", "unk", "clip", "zero"])
@pytest.mark.parametrize("bad", [[1.0, 2.0], [True, 1], np.array([1.5]), "3", [[1, None]]],
                         ids=["floats", "bool", "float-array", "str", "none"])
def test_non_integer_ids_always_raise(E, oov, bad):
    with pytest.raises(InvalidIdError, match="integers"):
        Embedding(E, oov=oov, unk_id=0)(bad)


def test_unk_list(E):
    emb = Embedding(E, unk_id=0, oov="unk")
    got = emb([[3, 4, 5], [6, V + 3, 4]], unk=[4, 6])
    np.testing.assert_array_equal(got, E[[[3, 0, 5], [0, 0, 0]]])
    with pytest.raises(InvalidIdError):
        emb([1], unk=[V])
    with pytest.raises(ValueError, match="unk_id"):
        Embedding(E)([1], unk=[1])


def test_unk_applies_only_to_in_range_ids(E):
    # clip maps V+3 to V-1; unk= lists V-1, but only ids given in range become unk
    got = Embedding(E, unk_id=0, oov="clip")([V + 3, V - 1], unk=[V - 1])
    np.testing.assert_array_equal(got, E[[V - 1, 0]])


def test_bad_options(E):
    with pytest.raises(ValueError, match="oov must be one of"):
        Embedding(E, oov="wrap")
    with pytest.raises(ValueError, match="needs unk_id"):
        Embedding(E, oov="unk")
    with pytest.raises(InvalidIdError, match="out of range"):
        Embedding(E, unk_id=V)
    with pytest.raises(InvalidIdError, match="padding_idx"):
        Embedding(E, padding_idx=-V - 1)
    with pytest.raises(ValueError, match="scale"):
        Embedding(E, scale="sqrt")
    with pytest.raises(ValueError, match="max_norm"):
        Embedding(E, max_norm=0)
    with pytest.raises(ValueError, match="norm_type"):
        Embedding(E, max_norm=1, norm_type=-1)


# -- padding, mask, weights, scale ------------------------------------------------------------
def test_padding_negative_index(E):
    emb = Embedding(E, padding_idx=-1)
    assert emb.padding_idx == V - 1
    got = emb([0, V - 1])
    np.testing.assert_array_equal(got, E[[0, V - 1]])  # the stored pad row, as torch
    assert E[V - 1].any()


def test_mask_int_and_bool(E, ids):
    mask = (np.arange(ids.size).reshape(ids.shape) % 3 != 0)
    want = E[ids] * mask[..., None]
    np.testing.assert_array_equal(Embedding(E)(ids, mask=mask), want)
    np.testing.assert_array_equal(Embedding(E)(ids, mask=mask.astype(np.int8)), want)


def test_mask_and_weights_errors(E, ids):
    emb = Embedding(E)
    with pytest.raises(ShapeMismatchError, match=r"mask must have the shape of ids \(3, 7\)"):
        emb(ids, mask=np.ones((3, 6), dtype=bool))
    with pytest.raises(ShapeMismatchError, match=r"0 and 1, got 2 at position \(0, 3\)"):
        m = np.ones(ids.shape, dtype=np.int64)
        m[0, 3] = 2
        emb(ids, mask=m)
    with pytest.raises(ShapeMismatchError, match=r"weights must have the shape of ids"):
        emb(ids, weights=np.ones(7))
    with pytest.raises(ShapeMismatchError, match="weights must be numbers"):
        emb(ids, weights=np.full(ids.shape, "a"))


def test_scale_float(E, ids):
    np.testing.assert_allclose(Embedding(E, scale=0.5)(ids), E[ids] * 0.5)
    np.testing.assert_allclose(Embedding(E, scale="sqrt_dim")(ids), E[ids] * np.sqrt(D),
                               rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_result_dtype_follows_table(E, ids, dtype):
    emb = Embedding(E.astype(dtype), padding_idx=0, max_norm=1.0, scale=2.0)
    out = emb(ids, weights=np.ones(ids.shape))
    assert out.dtype == np.dtype(dtype)


# -- slice and contextual -----------------------------------------------------------------
def test_slice(E, rng):
    ids = rng.integers(0, V, size=(2, 9, 3))
    emb = Embedding(E, padding_idx=1)
    np.testing.assert_array_equal(emb.slice(ids, 2, 6), emb(ids[:, 2:6]))
    np.testing.assert_array_equal(emb.slice(ids, -3, None), emb(ids[:, -3:]))
    mask = rng.integers(0, 2, size=ids.shape)
    np.testing.assert_array_equal(emb.slice(ids, 1, 4, mask=mask),
                                  emb(ids[:, 1:4], mask=mask[:, 1:4]))
    with pytest.raises(ShapeMismatchError, match="at least 2 dimensions"):
        emb.slice(ids[0, 0], 0, 1)


def test_contextual(E, rng):
    ids = rng.integers(0, V, size=(2, 4))
    hidden = rng.standard_normal((2, 4, 3))
    proj = rng.standard_normal((3, D))
    got = Embedding(E).contextual(ids, hidden, proj)
    assert got.dtype == np.float32 and got.shape == (2, 4, D)
    np.testing.assert_allclose(got, E[ids] + hidden @ proj, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeMismatchError, match=r"hidden must have shape ids.shape"):
        Embedding(E).contextual(ids, hidden[:, :3], proj)
    with pytest.raises(ShapeMismatchError, match=r"projection must have shape \(h, dim\)"):
        Embedding(E).contextual(ids, hidden, proj[:, :2])


# -- PyTorch equivalence ----------------------------------------------------------------------
def test_torch_embedding_plain_and_padding(make_table, E, rng):
    """padding_idx as torch with pretrained weights: the stored (non-zero) pad row comes back."""
    torch = pytest.importorskip("torch")
    ids = rng.integers(0, V, size=(4, 6))
    ids[0, :3] = 3
    ids[1, -2:] = V - 2
    assert E[3].any() and E[V - 2].any()
    t = make_table(E)
    for p in (3, -2):
        m = torch.nn.Embedding.from_pretrained(torch.from_numpy(E.copy()), padding_idx=p)
        want = m(torch.from_numpy(ids)).detach().numpy()
        F = torch.nn.functional
        np.testing.assert_array_equal(
            want, F.embedding(torch.from_numpy(ids), torch.from_numpy(E), padding_idx=p))
        got = Embedding(t, padding_idx=p)(ids)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(Embedding(t, padding_idx=p)(ids, mask=ids != p % V),
                                      np.where((ids != p % V)[..., None], want, 0))
    want = torch.nn.Embedding.from_pretrained(torch.from_numpy(E))(torch.from_numpy(ids))
    np.testing.assert_array_equal(Embedding(t)(ids), want.numpy())


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_torch_max_norm(E, rng, norm_type):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    ids = rng.integers(0, V, size=(5, 4))
    weight = torch.from_numpy(E.copy())  # torch renormalises its weight in place
    want = F.embedding(torch.from_numpy(ids), weight, max_norm=1.0, norm_type=norm_type)
    t = embstore.MemoryTable(E.copy())
    got = Embedding(t, max_norm=1.0, norm_type=norm_type)(ids)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(t.array, E)  # unlike torch, the table is untouched
    assert not np.array_equal(weight.numpy(), E)  # (torch did modify its copy)


def test_torch_module_max_norm_with_padding_and_scale(E, rng):
    torch = pytest.importorskip("torch")
    ids = rng.integers(0, V, size=(3, 8))
    ids[:, 0] = 0
    m = torch.nn.Embedding.from_pretrained(torch.from_numpy(E.copy()), padding_idx=0,
                                           max_norm=2.0)
    want = m(torch.from_numpy(ids)).detach().numpy() * 3.0
    got = Embedding(E, padding_idx=0, max_norm=2.0, scale=3.0)(ids)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_torch_max_norm_epsilon(E, rng):
    """Tiny rows: ``max_norm / (norm + 1e-7)`` (as PyTorch) visibly differs from ``/ norm``."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    tiny = E * 1e-6
    ids = rng.integers(0, V, size=9)
    want = F.embedding(torch.from_numpy(ids), torch.from_numpy(tiny.copy()), max_norm=1e-7)
    got = Embedding(tiny, max_norm=1e-7)(ids)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=0)
    norms = np.linalg.norm(tiny[ids], axis=1)
    assert not np.allclose(got, tiny[ids] * (1e-7 / norms)[:, None], rtol=1e-3, atol=0)


def test_slice_ragged_and_float_ids(E):
    with pytest.raises(InvalidIdError, match="rectangular"):
        Embedding(E).slice([[1, 2], [3]], 0, 1)
    with pytest.raises(InvalidIdError, match="integers"):
        Embedding(E).slice([[1.0, 2.0]], 0, 1)

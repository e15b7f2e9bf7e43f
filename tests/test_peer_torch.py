"""PyTorch's own test cases (test/nn/test_embedding.py), ported to ``embstore.torch`` and
the NumPy layer (issue 32, points 4, 5, 7, 8): torch itself, run on the same weights and
inputs, is the reference for values and for the exception classes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import embstore  # noqa: E402
import embstore.torch as et  # noqa: E402
from embstore import EmbstoreError, InvalidOptionError  # noqa: E402


def _raised(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the class is what is compared
        return exc
    return None


# -- point 5: max_norm ----------------------------------------------------------------------
def test_embedding_max_norm():
    """ports test_embedding.py::TestEmbeddingNN::test_embedding_max_norm over 300 seeds
    (torch's own init and input): no returned row above max_norm, repeated ids equal, values
    torch's (embstore's float32 scale left 13 of 300 at 1.0000001)."""
    for seed in range(300):
        torch.manual_seed(seed)
        ref_module = torch.nn.Embedding(22, 5, max_norm=1.0)
        weight = ref_module.weight.detach().clone()
        ids = torch.tensor([2, 8, 8, 6], dtype=torch.long)
        ours = et.Embedding(embstore.MemoryTable(weight.numpy().copy()), max_norm=1.0)
        output = ours(ids)
        assert torch.equal(output[1], output[2])
        assert output.norm(p=2, dim=1).le(1).all(), (seed, output.norm(p=2, dim=1))
        with torch.no_grad():
            torch.testing.assert_close(output, ref_module(ids))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_max_norm_bound_numpy_layer(dtype):
    """The same bound through the NumPy layer, float16 included, norms 1 and 2."""
    rng = np.random.default_rng(5)
    for norm_type in (2.0, 3.0):
        table = (rng.standard_normal((2000, 8)) * 3).astype(dtype)
        rows = embstore.Embedding(table, max_norm=1.5, norm_type=norm_type)(np.arange(2000))
        norms = np.linalg.norm(rows.astype(np.float64), ord=norm_type, axis=1)
        assert norms.max() <= 1.5
        ref = F.embedding(torch.arange(2000), torch.from_numpy(table.astype(np.float32)),
                          max_norm=1.5, norm_type=norm_type).numpy()
        np.testing.assert_allclose(rows.astype(np.float32), ref, rtol=2e-3 if dtype ==
                                   np.float16 else 1e-6, atol=1e-3 if dtype == np.float16 else 0)


# -- point 4: bfloat16 tables and per-sample weights -----------------------------------------
@pytest.fixture
def bf16_table(tmp_path):
    w = torch.randn(10, 5, generator=torch.Generator().manual_seed(0))
    t = embstore.save(tmp_path / "bf16", w.numpy(), dtype="bfloat16")
    yield t, w.to(torch.bfloat16)
    t.close()


def test_embedding_bag_bfloat16_per_sample_weights(bf16_table):
    """ports test_embedding.py::TestEmbeddingNNDeviceType::
    test_embedding_bag_per_sample_weights_and_offsets (dtype bfloat16): bf16 weights on a
    bf16 table, as torch requires them, and a bf16 result close to torch's."""
    table, weight = bf16_table
    ids = torch.tensor([3, 1, 1, 9, 4, 3])
    offsets = torch.tensor([0, 0, 3, 3, 6])
    psw = torch.randn(6, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = torch.nn.EmbeddingBag.from_pretrained(weight, mode="sum")(ids, offsets,
                                                                    per_sample_weights=psw)
    got = et.EmbeddingBag(table, mode="sum")(ids, offsets, per_sample_weights=psw)
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref)  # bfloat16 tolerances
    plain = et.Embedding(table)(ids)
    assert plain.dtype == torch.bfloat16
    torch.testing.assert_close(plain, weight[ids], rtol=0, atol=0)


@pytest.mark.parametrize("psw_dtype", [torch.float32, torch.float64, torch.float16],
                         ids=["f32", "f64", "f16"])
def test_per_sample_weights_of_another_dtype(bf16_table, psw_dtype):
    """ports test_embedding.py::TestEmbeddingNNDeviceType::
    test_EmbeddingBag_per_sample_weights_failures (the dtype case): weights whose dtype is
    not the table's raise what torch raises (RuntimeError), as an EmbstoreError."""
    table, weight = bf16_table
    ids = torch.tensor([[1, 2]])
    psw = torch.ones(1, 2, dtype=psw_dtype)
    ref = _raised(lambda: torch.nn.EmbeddingBag.from_pretrained(weight, mode="sum")(
        ids, per_sample_weights=psw))
    assert isinstance(ref, RuntimeError)
    with pytest.raises(RuntimeError, match=r"per_sample_weights must have the dtype of the "
                       r"rows \(torch.bfloat16, as torch requires\), got " + str(psw_dtype)):
        et.EmbeddingBag(table, mode="sum")(ids, per_sample_weights=psw)
    f32 = embstore.MemoryTable(np.ones((10, 5), np.float32))
    if psw_dtype != torch.float32:
        with pytest.raises(et.TorchShapeError):
            et.EmbeddingBag(f32, mode="sum")(ids, per_sample_weights=psw)
    else:
        et.EmbeddingBag(f32, mode="sum")(ids, per_sample_weights=psw)


# -- point 7: exception classes ---------------------------------------------------------------
W = torch.randn(10, 3, generator=torch.Generator().manual_seed(2))
BAG_CASES = {  # name: (torch call, embstore call), each given the module class and weights
    "bag-id-out-of-range": lambda B, w: B(w, mode="sum")(torch.tensor([[1, 10]])),
    "bag-id-negative": lambda B, w: B(w, mode="sum")(torch.tensor([1, -1]), torch.tensor([0])),
    "bag-float-ids": lambda B, w: B(w, mode="sum")(torch.tensor([[1.0]])),
    "offsets-first-not-0": lambda B, w: B(w)(torch.tensor([1, 2]), torch.tensor([1])),
    "offsets-decreasing": lambda B, w: B(w)(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1])),
    "offsets-beyond": lambda B, w: B(w)(torch.tensor([1, 2, 3]), torch.tensor([0, 5])),
    "offsets-2d": lambda B, w: B(w)(torch.tensor([1, 2, 3]), torch.tensor([[0]])),
    "ids-3d": lambda B, w: B(w)(torch.tensor([[[1]]])),
    "psw-shape": lambda B, w: B(w, mode="sum")(torch.tensor([[1, 2]]),
                                               per_sample_weights=torch.ones(1)),
    "psw-with-max": lambda B, w: B(w, mode="max")(torch.tensor([[1, 2]]),
                                                  per_sample_weights=torch.ones(1, 2)),
    "ilo-no-offsets": lambda B, w: B(w, include_last_offset=True)(
        torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)),
}


def _torch_bag(w, **kw):
    return torch.nn.EmbeddingBag.from_pretrained(w, **kw)


def _our_bag(w, **kw):
    return et.EmbeddingBag(embstore.MemoryTable(w.numpy().copy()), **kw)


@pytest.mark.parametrize("case", list(BAG_CASES), ids=list(BAG_CASES))
def test_bag_errors_have_torch_classes(case):
    """ports test_embedding.py::TestEmbeddingNNDeviceType::test_embedding_bag_device's
    error cases and test_EmbeddingBag_per_sample_weights_failures: the exception embstore
    raises is an instance of the class torch raises, and an EmbstoreError."""
    ref = _raised(lambda: BAG_CASES[case](_torch_bag, W))
    got = _raised(lambda: BAG_CASES[case](_our_bag, W))
    assert ref is not None and got is not None
    assert isinstance(got, type(ref)), (type(ref), type(got).__mro__)
    assert isinstance(got, EmbstoreError)


@pytest.mark.parametrize("shape", [(), (1, 1, 1)], ids=["0-D", "3-D"])
def test_embedding_scalar_weight_error(shape):
    """ports test_embedding.py::TestEmbeddingNNDeviceType::test_embedding_scalar_weight_error:
    a weight that is not 2-D raises RuntimeError "'weight' must be 2-D"."""
    indices = torch.rand(2, 2).long()
    weight = torch.tensor(1.0).reshape(shape)
    with pytest.raises(RuntimeError, match="'weight' must be 2-D"):
        F.embedding(indices, weight)
    with pytest.raises(RuntimeError, match="'weight' must be 2-D") as info:
        et.Embedding(weight)(indices)
    assert isinstance(info.value, EmbstoreError)
    with pytest.raises(RuntimeError, match="'weight' must be 2-D"):
        et.EmbeddingBag(weight.numpy())


def test_embedding_bag_padding_idx_error():
    """ports test_embedding.py::TestEmbeddingNN::test_embedding_bag_padding_idx_error (the
    module half): padding_idx out of range raises AssertionError, in range works."""
    num_embeddings = 4
    weight = torch.rand(num_embeddings, 3)
    table = embstore.MemoryTable(weight.numpy())
    for padding_idx in range(-(num_embeddings + 2), num_embeddings + 2):
        if padding_idx < -num_embeddings or padding_idx >= num_embeddings:
            for cls in (et.EmbeddingBag, et.Embedding):
                with pytest.raises(AssertionError, match="padding_idx") as info:
                    cls(table, padding_idx=padding_idx)
                assert isinstance(info.value, IndexError)  # embstore's InvalidIdError still
                assert isinstance(info.value, EmbstoreError)
        else:
            et.EmbeddingBag(table, padding_idx=padding_idx)


def test_embedding_out_of_range_keeps_index_error():
    """torch.nn.Embedding raises IndexError for ids out of range: so does embstore.torch."""
    assert isinstance(_raised(lambda: torch.nn.Embedding.from_pretrained(W)(
        torch.tensor([10]))), IndexError)
    with pytest.raises(IndexError, match="id 10"):
        et.Embedding(embstore.MemoryTable(W.numpy()))(torch.tensor([10]))


ARGUMENT_ERRORS = {
    "bag-max-weights": (lambda e: e.bag([[1]], weights=[[1.0]], mode="max"),
                        "not for mode='max'"),
    "max-norm-negative": (lambda e: embstore.Embedding(e.table, max_norm=-1),
                          "max_norm must be a positive number, got -1"),
    "unk-without-unk-id": (lambda e: embstore.Embedding(e.table, oov="unk"),
                           "oov='unk' needs unk_id"),
    "bag-mode": (lambda e: e.bag([[1]], mode="median"), "mode must be one of"),
    "scale": (lambda e: embstore.Embedding(e.table, scale="big"), "scale must be a number"),
    "torch-bag-mode": (lambda e: et.EmbeddingBag(e.table, mode="median"),
                       "mode must be one of 'sum', 'mean', 'max', got 'median'"),
    "k-negative": (lambda e: e.most_similar(1, k=-1), "k must be an int >= 0"),
}


@pytest.mark.parametrize("case", list(ARGUMENT_ERRORS), ids=list(ARGUMENT_ERRORS))
def test_numpy_api_argument_errors_are_embstore_errors(case):
    """The README's promise: every error derives from EmbstoreError; argument errors are
    InvalidOptionError, still a ValueError for code that catches that."""
    call, match = ARGUMENT_ERRORS[case]
    emb = embstore.Embedding(embstore.MemoryTable(W.numpy()))
    with pytest.raises(InvalidOptionError, match=match) as info:
        call(emb)
    assert isinstance(info.value, ValueError)


def test_save_compression_is_an_embstore_error(tmp_path):
    with pytest.raises(InvalidOptionError, match="compression must be one of 'none'"):
        embstore.save(tmp_path / "t", W.numpy(), compression="lz4")
    with pytest.raises(embstore.InvalidTypeError, match="padding_idx must be an int"):
        embstore.Embedding(W.numpy(), padding_idx=1.5)


# -- point 8: dim 0 and include_last_offset ---------------------------------------------------
def test_embedding_dim_zero():
    """ports test_embedding.py::TestEmbeddingNN::test_embedding_sparse_empty_tensor (its
    forward): nn.Embedding(0, 0) and nn.Embedding(10, 0) on a MemoryTable, as torch; a
    stored table of dim 0 is refused with a message that says so."""
    for n, ids in ((0, torch.tensor([], dtype=torch.int64)),
                   (10, torch.LongTensor([[0, 2, 4, 5], [4, 3, 0, 9]]))):
        ref = torch.nn.Embedding(n, 0)
        table = embstore.MemoryTable(np.zeros((n, 0), np.float32))
        got = et.Embedding(table, max_norm=1.0)(ids)
        assert got.shape == ref(ids).shape == ids.shape + (0,)
    bag = torch.nn.EmbeddingBag(10, 0, mode="max")(torch.tensor([[1, 2]]))
    ours = et.EmbeddingBag(embstore.MemoryTable(np.zeros((10, 0), np.float32)),
                           mode="max")(torch.tensor([[1, 2]]))
    assert ours.shape == bag.shape == (1, 0)
    emb = embstore.Embedding(np.zeros((10, 0), np.float32))
    np.testing.assert_array_equal(emb.logits(np.zeros((2, 0))), np.zeros((2, 10)))
    with pytest.raises(embstore.ShapeMismatchError, match="cosine similarity needs rows of "
                                                          "dim >= 1, the table has dim 0"):
        emb.most_similar(np.zeros(0))


def test_stored_table_dim_zero_refused(tmp_path):
    with pytest.raises(embstore.ShapeMismatchError, match=r"a stored table needs dim >= 1 "
                                                          r".*a MemoryTable takes dim 0"):
        embstore.save(tmp_path / "t", np.zeros((10, 0), np.float32))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embeddingbag_include_last_offset(mode):
    """ports test_embedding.py::TestEmbeddingNN::test_embeddingbag_include_last_offset
    (pytorch issue 89677): offsets [0, 3, 3] and [0, 3, 4] over 4 ids give the same two
    bags, the last one running to the end of the ids."""
    torch.manual_seed(0)
    embeddingbag = torch.nn.EmbeddingBag(100, 3, include_last_offset=True, padding_idx=61,
                                         mode=mode)
    weight = embeddingbag.weight.detach()
    ours = et.EmbeddingBag(embstore.MemoryTable(weight.numpy().copy()), mode=mode,
                           include_last_offset=True, padding_idx=61)
    input = torch.tensor([0, 1, 2, 3])  # noqa: A001 (torch's name)
    reduce = {"sum": lambda r: r.sum(0), "mean": lambda r: r.mean(0),
              "max": lambda r: r.max(0).values}[mode]
    ref_out = torch.stack([reduce(weight[0:3]), weight[3]])
    for offsets in ([0, 3, 3], [0, 3, 4]):
        with torch.no_grad():
            torch.testing.assert_close(embeddingbag(input, torch.tensor(offsets)), ref_out)
        torch.testing.assert_close(ours(input, torch.tensor(offsets)), ref_out)
    np_ours = embstore.Embedding(weight.numpy().copy()).bag(
        [0, 1, 2, 3], [0, 1, 2], mode="sum", include_last_offset=True)
    np.testing.assert_allclose(np_ours, np.stack([weight[0], weight[1:4].sum(0)]), rtol=1e-6)

"""embstore.torch against PyTorch itself: nn.Embedding / nn.EmbeddingBag with the same weights."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import embstore  # noqa: E402
import embstore.torch as et  # noqa: E402

V, D = 40, 6

@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(7)
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture(params=["memory", "zarr"])
def table(request, weights, tmp_path):
    if request.param == "memory":
        yield embstore.MemoryTable(weights.copy())
        return
    t = embstore.save(tmp_path / "t", weights, chunk_rows=4, shard_rows=16)
    yield t
    t.close()


def _ids(rng, shape, dtype):
    return torch.from_numpy(rng.integers(0, V, size=shape)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4), (0,)], ids=str)
def test_embedding_equals_torch(table, weights, shape, dtype):
    rng = np.random.default_rng(1)
    ids = _ids(rng, shape, dtype)
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights.copy()))
    got = et.Embedding(table)(ids)
    assert got.dtype == torch.float32 and not got.requires_grad
    torch.testing.assert_close(got, ref(ids), rtol=0, atol=0)


@pytest.mark.parametrize("padding_idx", [3, -1], ids=["pad3", "pad-1"])
@pytest.mark.parametrize("max_norm,norm_type", [(None, 2.0), (1.0, 2.0), (0.5, 1.0)],
                         ids=["plain", "maxnorm2", "maxnorm1"])
def test_embedding_padding_and_max_norm_equal_torch(table, weights, padding_idx, max_norm,
                                                    norm_type):
    ids = torch.tensor([[3, 1, V - 1], [3, 3, 0]])
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights.copy()),
                                             padding_idx=padding_idx, max_norm=max_norm,
                                             norm_type=norm_type)
    got = et.Embedding.from_table(table, padding_idx=padding_idx, max_norm=max_norm,
                                  norm_type=norm_type)(ids)
    torch.testing.assert_close(got, ref(ids))


@pytest.mark.parametrize("max_norm,norm_type", [(1.0, 2.0), (0.5, 1.0)], ids=["l2", "l1"])
def test_embedding_max_norm_equals_torch_and_leaves_table(table, weights, max_norm, norm_type):
    ids = torch.tensor([[5, 1, V - 1], [5, 2, 0]])
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights.copy()),
                                             max_norm=max_norm, norm_type=norm_type)
    got = et.Embedding(table, max_norm=max_norm, norm_type=norm_type)(ids)
    torch.testing.assert_close(got, ref(ids))
    np.testing.assert_array_equal(table.to_numpy(), weights)  # torch renorms its weight in place


def _bag_inputs(rng, kind):
    if kind == "fixed":
        return _ids(rng, (5, 4), torch.int64), None
    ids = _ids(rng, (11,), torch.int64)
    return ids, torch.tensor([0, 3, 3, 7, 10])  # an empty bag, a bag of one at the end


@pytest.mark.parametrize("kind", ["fixed", "offsets"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3], ids=["nopad", "pad3"])
def test_bag_equals_torch(table, weights, kind, mode, padding_idx):
    rng = np.random.default_rng(2)
    ids, offsets = _bag_inputs(rng, kind)
    ids[ids % 4 == 0] = 3  # plenty of padding entries, and bags made only of them
    if kind == "fixed":
        ids[1] = 3
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weights.copy()), mode=mode,
                                                padding_idx=padding_idx)
    got = et.EmbeddingBag(table, mode=mode, padding_idx=padding_idx)(ids, offsets)
    torch.testing.assert_close(got, ref(ids, offsets))


@pytest.mark.parametrize("kind", ["fixed", "offsets"])
@pytest.mark.parametrize("padding_idx", [None, 3], ids=["nopad", "pad3"])
def test_bag_per_sample_weights_sum_equals_torch(table, weights, kind, padding_idx):
    rng = np.random.default_rng(3)
    ids, offsets = _bag_inputs(rng, kind)
    ids.view(-1)[[0, 5]] = 3
    w = torch.from_numpy(rng.standard_normal(tuple(ids.shape)).astype(np.float32))
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weights.copy()), mode="sum",
                                                padding_idx=padding_idx)
    got = et.EmbeddingBag.from_table(table, mode="sum", padding_idx=padding_idx)(
        ids, offsets, per_sample_weights=w)
    torch.testing.assert_close(got, ref(ids, offsets, per_sample_weights=w))


def test_bag_include_last_offset_equals_torch(table, weights):
    ids = torch.tensor([1, 2, 3, 4, 5, 6])
    offsets = torch.tensor([0, 2, 2, 6])
    for mode in ("sum", "mean", "max"):
        ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weights.copy()), mode=mode,
                                                    include_last_offset=True)
        got = et.EmbeddingBag(table, mode=mode, include_last_offset=True)(ids, offsets)
        torch.testing.assert_close(got, ref(ids, offsets))


def test_bag_weighted_mean_is_weighted_average(table, weights):
    ids = torch.tensor([[1, 2, 3], [4, 4, 5]])
    w = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 1.0]])
    got = et.EmbeddingBag(table, mode="mean")(ids, per_sample_weights=w)
    x = weights[ids.numpy()]
    want = (x * w.numpy()[..., None]).sum(1) / w.numpy().sum(1)[:, None]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_out_of_range_ids_raise_index_error_like_torch(table, weights):
    ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights.copy()))
    for bad in (torch.tensor([1, V]), torch.tensor([-1, 0])):
        with pytest.raises(IndexError):
            ref(bad)
        with pytest.raises(embstore.InvalidIdError, match="position"):
            et.Embedding(table)(bad)
    with pytest.raises(embstore.InvalidIdError):
        et.Embedding(table)(torch.tensor([1.0, 2.0]))


def test_frozen(table):
    m = et.Embedding(table)
    assert list(m.parameters()) == [] and len(m.state_dict()) == 0
    assert m.num_embeddings == V and m.embedding_dim == D


def test_rows_become_the_tensor_without_a_copy():
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.shares_memory(et._tensor(rows, None).numpy(), rows)
    rows.flags.writeable = False  # torch warns on read-only arrays: those are copied
    out = et._tensor(rows, None)
    assert not np.shares_memory(out.numpy(), rows)
    np.testing.assert_array_equal(out.numpy(), rows)


def test_module_state_is_a_path_for_disk_tables(tmp_path, weights):
    t = embstore.save(tmp_path / "t", weights, chunk_rows=4, shard_rows=16)
    m = et.EmbeddingBag.from_table(tmp_path / "t", mode="max", padding_idx=2, cache_bytes=4096)
    state = m.__getstate__()
    assert state["_table_source"] == ("path", str(t.path), 4096)
    assert weights[:4].tobytes()[:16] not in pickle.dumps(m)  # no rows travel
    clone = copy.deepcopy(m)  # the same __getstate__/__setstate__ pickling uses
    assert clone.table is not m.table and clone.table.cache_info().capacity_bytes == 4096
    ids = torch.tensor([[1, 2, 2], [2, 2, 2]])
    torch.testing.assert_close(clone(ids), m(ids))
    assert clone.mode == "max" and clone.padding_idx == 2
    clone.close()
    m.close()
    t.close()


def test_memory_table_module_carries_its_array(weights):
    m = et.Embedding(embstore.MemoryTable(weights.copy()))
    kind, tbl = m.__getstate__()["_table_source"]
    assert kind == "table" and isinstance(tbl, embstore.MemoryTable)
    clone = copy.deepcopy(m)
    torch.testing.assert_close(clone(torch.tensor([3, 4])), m(torch.tensor([3, 4])))


def test_constructor_refuses_what_is_not_a_table():
    with pytest.raises(TypeError, match="expected an embstore Table, the path of a table or "
                                        "a 2-D weight, got list"):
        et.Embedding([[0.0, 1.0]])  # (a 2-D array or tensor: tests/test_peer_torch.py)
    with pytest.raises(ValueError, match="mode must be one of"):
        et.EmbeddingBag(embstore.MemoryTable(np.zeros((3, 2), np.float32)), mode="avg")


@pytest.mark.parametrize("padding_idx", [None, 1])
def test_to_nn_embedding(table, weights, padding_idx):
    emb = et.to_nn_embedding(table, padding_idx=padding_idx)
    assert isinstance(emb, torch.nn.Embedding) and not emb.weight.requires_grad
    np.testing.assert_array_equal(emb.weight.numpy(), weights)
    trainable = et.to_nn_embedding(table, freeze=False)
    assert trainable.weight.requires_grad
    with torch.no_grad():
        trainable.weight[0] += 1  # a copy: the table is untouched
    np.testing.assert_array_equal(table.to_numpy(), weights)


def test_to_nn_embedding_from_path(tmp_path, weights):
    embstore.save(tmp_path / "t", weights).close()
    np.testing.assert_array_equal(et.to_nn_embedding(tmp_path / "t").weight.numpy(), weights)


# -- DataLoader workers ----------------------------------------------------------------------
class RowsDataset(torch.utils.data.Dataset):
    """Item i: the module's rows for a small window of ids (looked up in the worker)."""

    def __init__(self, module):
        self.module = module

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return self.module(torch.tensor([i, (7 * i) % V, 3]))


@pytest.mark.parametrize("context", [
    "fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: ~20 s of torch imports
def test_dataloader_workers_match_in_process(tmp_path, weights, context):
    t = embstore.save(tmp_path / "t", weights, chunk_rows=4, shard_rows=16)
    m = et.Embedding.from_table(t.path)
    m(torch.tensor([0, 1]))  # the parent uses its handle before forking
    want = list(torch.utils.data.DataLoader(RowsDataset(m), batch_size=5))
    got = list(torch.utils.data.DataLoader(RowsDataset(m), batch_size=5, num_workers=2,
                                           multiprocessing_context=context))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    np.testing.assert_array_equal(want[0][1].numpy(), weights[[1, 7, 3]])
    m.close()
    t.close()

"""gensim KeyedVectors -> table -> KeyedVectors: keys, order and vectors exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gensim_models = pytest.importorskip("gensim.models")

import embstore  # noqa: E402
from embstore.errors import MissingDependencyError  # noqa: E402

KeyedVectors = gensim_models.KeyedVectors


@pytest.fixture
def kv():
    rng = np.random.default_rng(11)
    keys = ["the", "émile", "z", "北京", "a b", "", "THE"]  # order is not sorted on purpose
    out = KeyedVectors(9, count=0, dtype=np.float32)
    out.add_vectors(keys, rng.standard_normal((len(keys), 9)).astype(np.float32))
    return out


@pytest.mark.parametrize("layout", [None, {}, {"chunk_rows": 2, "shard_rows": 4},
                                    {"compression": "zstd"}],
                         ids=["memory", "zarr", "small-shards", "zstd"])
def test_round_trip_exact(kv, tmp_path, layout):
    path = None if layout is None else tmp_path / "t"
    t = embstore.from_gensim(kv, path, **(layout or {}))
    assert list(t.keys) == kv.index_to_key
    np.testing.assert_array_equal(t.to_numpy(), kv.vectors)
    np.testing.assert_array_equal(t.lookup_keys(["北京", "the"]), kv[["北京", "the"]])
    back = embstore.to_gensim(t if path is None else path)
    assert back.index_to_key == kv.index_to_key
    assert back.key_to_index == kv.key_to_index
    assert back.vectors.dtype == kv.vectors.dtype
    np.testing.assert_array_equal(back.vectors, kv.vectors)
    assert back.most_similar("the", topn=3) == kv.most_similar("the", topn=3)


def test_from_gensim_real_file(tmp_path):
    kv = KeyedVectors.load_word2vec_format(Path(__file__).parent / "data" / "gensim.txt")
    t = embstore.from_gensim(kv, tmp_path / "t")
    back = embstore.to_gensim(t)
    assert back.index_to_key == kv.index_to_key
    np.testing.assert_array_equal(back.vectors, kv.vectors)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_keyless_tables_become_row_number_keys_and_back(tmp_path, dtype):
    arr = np.arange(12, dtype=dtype).reshape(4, 3)
    kv = embstore.to_gensim(embstore.MemoryTable(arr))
    assert kv.index_to_key == [0, 1, 2, 3] and kv.vectors.dtype == dtype
    np.testing.assert_array_equal(kv[2], arr[2])
    t = embstore.from_gensim(kv, tmp_path / "t")
    assert t.keys is None and t.dtype == dtype
    np.testing.assert_array_equal(t.to_numpy(), arr)


def test_from_gensim_refuses_non_string_keys(tmp_path):
    kv = KeyedVectors(2, count=0)
    kv.add_vectors(["a", 7], np.ones((2, 2), dtype=np.float32))
    with pytest.raises(embstore.ShapeMismatchError,
                       match="the KeyedVectors key at index 1 is int 7"):
        embstore.from_gensim(kv, tmp_path / "t")
    assert not (tmp_path / "t").exists()
    with pytest.raises(TypeError, match="expected a gensim KeyedVectors, got ndarray"):
        embstore.from_gensim(np.ones((2, 2)), tmp_path / "t")


def test_from_gensim_refuses_an_existing_path(kv, tmp_path):
    embstore.from_gensim(kv, tmp_path / "t").close()
    with pytest.raises(embstore.DestinationExistsError):
        embstore.from_gensim(kv, tmp_path / "t")
    embstore.from_gensim(kv, tmp_path / "t", overwrite=True).close()


def test_without_gensim_the_error_names_the_extra(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "gensim.models", None)
    with pytest.raises(MissingDependencyError, match=r"embstore\[gensim\]"):
        embstore.to_gensim(embstore.MemoryTable(np.ones((2, 2), np.float32)))

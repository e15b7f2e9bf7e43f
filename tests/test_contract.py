"""The Table contract, run on every backend and layout (see conftest.BACKENDS)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import embstore
from embstore import InvalidIdError, KeyNotFoundError, ReadOnlyError

V, D = 37, 5
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.fixture
def E(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture
def KEYS():
    return [f"w{i}" for i in range(V - 3)] + ["", "naïve", "東京 tower"]


def test_geometry(make_table, E):
    t = make_table(E)
    assert t.shape == (V, D) and t.vocab_size == V == len(t) and t.dim == D
    assert t.dtype == np.float32
    assert t.keys is None
    assert isinstance(t, embstore.Table)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 4), (2, 3, 4), (2, 1, 3, 2)],
                         ids=str)
def test_lookup_any_shape(make_table, E, rng, shape):
    t = make_table(E)
    ids = rng.integers(0, V, size=shape)
    got = t.lookup(ids)
    assert got.shape == tuple(shape) + (D,)
    assert got.dtype == E.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, E[ids])
    np.testing.assert_array_equal(t[ids], E[ids])
    np.testing.assert_array_equal(t(ids), E[ids])


def test_lookup_python_int_and_list(make_table, E):
    t = make_table(E)
    np.testing.assert_array_equal(t[3], E[3])
    np.testing.assert_array_equal(t[[3, 3, 0, V - 1]], E[[3, 3, 0, V - 1]])
    np.testing.assert_array_equal(t[[[1, 2], [2, 1]]], E[[[1, 2], [2, 1]]])
    assert t[[]].shape == (0, D)


def test_scalar_result_is_a_copy(make_table, E):
    t = make_table(E)
    row = t[4]
    row[:] = 99
    np.testing.assert_array_equal(t[4], E[4])


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_every_integer_dtype(make_table, E, rng, dtype):
    t = make_table(E)
    hi = min(V, np.iinfo(dtype).max + 1)
    ids = rng.integers(0, hi, size=(4, 6)).astype(dtype)
    np.testing.assert_array_equal(t[ids], E[ids.astype(np.int64)])


def test_out_buffer(make_table, E, rng):
    t = make_table(E)
    ids = rng.integers(0, V, size=(3, 4))
    out = np.full((3, 4, D), -1, dtype=np.float32)
    res = t.lookup(ids, out=out)
    assert res is out
    np.testing.assert_array_equal(out, E[ids])


@pytest.mark.parametrize("bad_out", [
    np.empty((3, 4, D), np.float64),
    np.empty((3, 5, D), np.float32),
    np.empty((3, 4, D * 2), np.float32)[..., ::2],
], ids=["dtype", "shape", "noncontiguous"])
def test_out_buffer_checked(make_table, E, bad_out):
    t = make_table(E)
    with pytest.raises(embstore.ShapeMismatchError, match="out must"):
        t.lookup(np.zeros((3, 4), np.int64), out=bad_out)


def test_slices(make_table, E):
    t = make_table(E)
    np.testing.assert_array_equal(t[2:9], E[2:9])
    np.testing.assert_array_equal(t[:], E)
    np.testing.assert_array_equal(t[-3:], E[-3:])
    np.testing.assert_array_equal(t[::5], E[::5])
    assert t[10:2].shape == (0, D)
    np.testing.assert_array_equal(t.to_numpy(), E)


@pytest.mark.parametrize("bad, first, pos", [
    (-1, -1, ()),
    (V, V, ()),
    ([0, 1, V + 5, -2], V + 5, (2,)),
    (np.array([[0, 1], [2, -7]]), -7, (1, 1)),
    (np.array([3, 2**63 + 5], dtype=np.uint64), 2**63 + 5, (1,)),
    (np.array([[1], [200]], dtype=np.uint8), 200, (1, 0)),
    (2**70, 2**70, ()),
], ids=["negative", "too-large", "list", "2d-negative", "uint64-huge", "uint8", "pyint-huge"])
def test_bad_ids_raise(make_table, E, bad, first, pos):
    t = make_table(E)
    with pytest.raises(InvalidIdError) as info:
        t.lookup(bad)
    assert info.value.id == first and info.value.position == pos
    assert str(first) in str(info.value)
    if pos != ():  # a single id has no position worth naming (issue 34)
        assert str(pos) in str(info.value)
    assert isinstance(info.value, IndexError) and isinstance(info.value, embstore.EmbstoreError)


@pytest.mark.parametrize("bad", [
    1.0, True, np.float32(2), "3", None, [1, 2.5], [0, True], np.array([1.0, 2.0]),
    np.array([True, False]), np.array(["1"]), np.array([1, 2], dtype=object), [[1, 2], [3]],
], ids=["float", "bool", "np-float", "str", "none", "list-float", "list-bool", "float-array",
        "bool-array", "str-array", "object-array", "ragged"])
def test_non_integer_ids_raise(make_table, E, bad):
    t = make_table(E)
    with pytest.raises(InvalidIdError):
        t.lookup(bad)


def test_write_and_append(make_table, E, rng):
    t = make_table(E)
    ref = E.copy()
    ids = np.array([[0, 5], [36, 5]])
    vec = rng.standard_normal((2, 2, D)).astype(np.float32)
    t.write(ids, vec)
    ref[[0, 36]] = vec[0, 0], vec[1, 0]
    ref[5] = vec[1, 1]  # the last write of a duplicate id wins
    np.testing.assert_array_equal(t[np.arange(V)], ref)
    new = rng.standard_normal((3, D)).astype(np.float32)
    got = t.append(new)
    np.testing.assert_array_equal(got, [V, V + 1, V + 2])
    assert len(t) == V + 3
    np.testing.assert_array_equal(t[[V + 2, 1, V]], np.stack([new[2], ref[1], new[0]]))


def test_write_checks(make_table, E):
    t = make_table(E)
    with pytest.raises(embstore.ShapeMismatchError, match="shape"):
        t.write([1, 2], np.zeros((3, D)))
    with pytest.raises(InvalidIdError):
        t.write([V], np.zeros((1, D)))
    with pytest.raises(embstore.ShapeMismatchError, match="NaN"):
        t.write([1], np.full((1, D), np.nan))
    np.testing.assert_array_equal(t[1], E[1])


def test_read_only(make_table, E):
    t = make_table(E, mode="r")
    with pytest.raises(ReadOnlyError):
        t.write([0], np.zeros((1, D), np.float32))
    with pytest.raises(ReadOnlyError):
        t.append(np.zeros((1, D), np.float32))
    np.testing.assert_array_equal(t[0], E[0])


def test_keys(make_table, E, KEYS):
    t = make_table(E, keys=KEYS)
    assert len(t.keys) == V and list(t.keys) == KEYS
    assert t.keys[3] == "w3" and t.keys[-1] == "東京 tower" and t.keys[1:4] == KEYS[1:4]
    assert "naïve" in t.keys and "nope" not in t.keys
    np.testing.assert_array_equal(t.ids_of(["w2", "", "東京 tower"]), [2, V - 3, V - 1])
    ids = t.ids_of([["w1", "w0"], ["naïve", "w9"]])
    assert ids.dtype == np.int64 and ids.shape == (2, 2)
    np.testing.assert_array_equal(ids, [[1, 0], [V - 2, 9]])
    assert t.ids_of("w7") == 7
    np.testing.assert_array_equal(t.ids_of(["w1", "zzz"], missing=-1), [1, -1])
    np.testing.assert_array_equal(t.lookup_keys(["w4", "naïve"]), E[[4, V - 2]])


def test_unknown_keys(make_table, E, KEYS):
    t = make_table(E, keys=KEYS)
    with pytest.raises(KeyNotFoundError, match="'zzz' at position \\(1,\\)"):
        t.ids_of(["w1", "zzz"])
    with pytest.raises(KeyError):
        t.lookup_keys(["zzz"])
    got = t.lookup_keys([["w1", "zzz"]], oov="zero")
    np.testing.assert_array_equal(got, np.stack([[E[1], np.zeros(D, np.float32)]]))
    got = t.lookup_keys(["zzz", "w2"], oov="unk", unk_id=5)
    np.testing.assert_array_equal(got, E[[5, 2]])


def test_keys_absent(make_table, E):
    t = make_table(E)
    with pytest.raises(KeyNotFoundError, match="no keys"):
        t.ids_of(["a"])


def test_append_with_keys(make_table, E, KEYS):
    t = make_table(E, keys=KEYS)
    new = np.ones((2, D), np.float32)
    ids = t.append(new, keys=["new1", "new2"])
    np.testing.assert_array_equal(ids, [V, V + 1])
    np.testing.assert_array_equal(t.ids_of(["new2", "w0"]), [V + 1, 0])
    assert t.keys[V] == "new1"
    with pytest.raises(embstore.ShapeMismatchError, match="already exists"):
        t.append(new[:1], keys=["w3"])
    with pytest.raises(KeyNotFoundError):
        t.append(new[:1])


def test_functional_form(E, rng):
    ids = rng.integers(0, V, size=(2, 3))
    np.testing.assert_array_equal(embstore.embedding_lookup(E, ids), E[ids])
    t = embstore.MemoryTable(E)
    np.testing.assert_array_equal(embstore.embedding_lookup(t, ids), E[ids])


def test_memory_table_wraps_without_copy(E):
    t = embstore.MemoryTable(E)
    assert np.shares_memory(t.array, E)


def test_threads_read_concurrently(make_table, rng):
    E = rng.standard_normal((500, 8)).astype(np.float32)
    t = make_table(E, mode="r")
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        for _ in range(20):
            ids = r.integers(0, 500, size=(16, 8))
            if not np.array_equal(t[ids], E[ids]):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_context_manager(make_table, E):
    with make_table(E) as t:
        np.testing.assert_array_equal(t[1], E[1])
    info = t.cache_info()
    assert set(info._fields) == {"hits", "misses", "evictions", "entries", "bytes",
                                 "capacity_bytes"}

"""NumPy and Python protocols on tables: np.asarray, iteration, ``in``."""

from __future__ import annotations

import numpy as np
import pytest

import embstore

V, D = 300, 6
KEYS = [f"w{i}" for i in range(V)]


@pytest.fixture
def E(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


def test_asarray_reads_blocks_not_rows(make_table, E, monkeypatch):
    t = make_table(E, mode="r")
    monkeypatch.setattr(type(t), "lookup", lambda *a, **k: pytest.fail("read row by row"))
    got = np.asarray(t)
    np.testing.assert_array_equal(got, E)
    assert got.dtype == np.float32 and got.shape == (V, D)
    got64 = np.asarray(t, dtype=np.float64)
    assert got64.dtype == np.float64
    np.testing.assert_array_equal(got64, E.astype(np.float64))
    np.testing.assert_array_equal(np.array(t), E)
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":  # NumPy 1 never passes copy=
        with pytest.raises(ValueError, match="without a copy"):
            np.array(t, copy=False)
    with pytest.raises(ValueError, match="without a copy"):
        t.__array__(copy=False)


def test_iter_and_list_read_blocks(make_table, E, monkeypatch):
    t = make_table(E, mode="r")
    monkeypatch.setattr(type(t), "lookup", lambda *a, **k: pytest.fail("read row by row"))
    rows = list(t)
    assert len(rows) == V
    np.testing.assert_array_equal(np.stack(rows), E)
    np.testing.assert_array_equal(next(iter(t)), E[0])


def test_contains_tests_keys(make_table, E):
    t = make_table(E, keys=KEYS, mode="r")
    assert "w7" in t and f"w{V - 1}" in t
    assert "nope" not in t and "" not in t
    with pytest.raises(TypeError, match=r"'in' tests keys \(str\) of a table, got int 3"):
        3 in t  # noqa: B015
    plain = make_table(E, mode="r")
    assert "w7" not in plain


def test_asarray_empty_table(tmp_path):
    t = embstore.create(tmp_path / "t", shape=(0, 4))
    assert np.asarray(t).shape == (0, 4)
    assert list(t) == []
    t.close()

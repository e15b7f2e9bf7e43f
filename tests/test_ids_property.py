"""Property tests: any shape and integer dtype of ids gives exactly ``E[ids]``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import embstore

V, D = 50, 3
E = np.arange(V * D, dtype=np.float32).reshape(V, D)
TABLE = embstore.MemoryTable(E)

int_dtypes = st.sampled_from([np.int8, np.int16, np.int32, np.int64,
                              np.uint8, np.uint16, np.uint32, np.uint64])


@settings(max_examples=200, deadline=None)
@given(dt=int_dtypes, data=st.data())
def test_valid_ids_match_numpy(dt, data):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    ids = data.draw(hnp.arrays(dt, shape, elements=st.integers(0, min(V - 1, np.iinfo(dt).max))))
    got = TABLE.lookup(ids)
    assert got.shape == ids.shape + (D,)
    assert got.flags.c_contiguous and got.dtype == E.dtype
    np.testing.assert_array_equal(got, E[ids.astype(np.int64)])


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_out_of_range_named_first(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    ids = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(-(2**40), 2**40)))
    bad = (ids < 0) | (ids >= V)
    if not bad.any():
        np.testing.assert_array_equal(TABLE[ids], E[ids])
        return
    first = int(np.argmax(bad.reshape(-1)))
    pos = tuple(int(i) for i in np.unravel_index(first, shape))
    try:
        TABLE.lookup(ids)
    except embstore.InvalidIdError as exc:
        assert exc.position == pos and exc.id == ids[pos]
    else:
        raise AssertionError("no InvalidIdError")


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, V - 1), max_size=20))
def test_lists_match_numpy(ids):
    np.testing.assert_array_equal(TABLE[ids], E[np.array(ids, dtype=np.int64)].reshape(-1, D))

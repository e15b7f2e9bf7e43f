"""NumPy and Python protocols on tables: np.asarray, iteration, ``in``.

On every backend they are part of the Table contract (tests/contract.py); here the cases
that need no backend fixture.
"""

from __future__ import annotations

import numpy as np

import embstore


def test_asarray_empty_table(tmp_path):
    t = embstore.create(tmp_path / "t", shape=(0, 4))
    assert np.asarray(t).shape == (0, 4)
    assert list(t) == []
    t.close()

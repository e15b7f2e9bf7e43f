"""The compiled first-touch page check (``store/rows/_pagecrc.c``) reports exactly the ranges
whose crc32c differs, as google-crc32c computes it (the reference), and refuses ranges
outside the buffer; the pure-Python path is what runs where it was not built."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest

from embstore.store.rows import pages

ext = pytest.importorskip("embstore.store.rows._pagecrc")


def test_the_compiled_check_finds_exactly_the_damaged_ranges():
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 4 << 20, dtype=np.uint8)
    starts = np.sort(rng.choice(raw.size // 4096, 301, replace=False)).astype(np.int64) * 4096
    stops = starts + 4096
    stops[[5, 6, 7, 100]] -= np.array([17, 1, 4095, 4096])  # short ranges, one empty
    want = np.array([google_crc32c.value(raw[a:b]) for a, b in zip(starts, stops)],
                    dtype=np.uint32)
    bad = np.array([0, 3, 6, 100, 299, 300])
    expected = want.copy()
    expected[bad] ^= np.uint32(1 << 7)
    out = np.empty(starts.size, dtype=np.int64)
    assert ext.HARDWARE
    n = ext.mismatched(raw, starts, stops, expected, out)
    assert out[:n].tolist() == bad.tolist()
    assert ext.mismatched(raw, starts, stops, want, out) == 0
    with pytest.raises(ValueError, match="outside the"):
        ext.mismatched(raw, starts, stops + raw.size, want, out)


def test_pages_uses_it_where_built():
    assert pages.COMPILED is ext

"""The batched page check (``fs.checksum.mismatched``) against a crc32c call per buffer,
and the zero-feeding operators it combines checksums with against the library itself."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest

from embstore.fs.checksum import combine, mismatched, shift, zeros_tables

PAGE = 4096


def _one_by_one(raw, starts, stops):
    return np.array([google_crc32c.value(raw[a:b].tobytes()) for a, b in zip(starts, stops)],
                    dtype=np.uint32)


@pytest.fixture(scope="module")
def raw():
    return np.random.default_rng(5).integers(0, 256, size=(1 << 22) + 1234, dtype=np.uint8)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 63, 64, 65, 200, 700], ids=lambda n: f"{n}pages")
@pytest.mark.parametrize("offset", [0, 5], ids=["aligned", "unaligned"])
def test_intact_buffers_pass_and_every_damaged_one_is_found(raw, n, offset):
    rng = np.random.default_rng(n + offset)
    pages = np.sort(rng.choice(raw.size // PAGE - 1, size=n, replace=False))
    starts = pages * PAGE + offset
    stops = starts + PAGE
    if n:
        stops[-1] -= 100  # a short last page, as the one holding a chunk's end
    good = _one_by_one(raw, starts, stops)
    assert mismatched(raw, starts, stops, good).tolist() == []
    for k in range(3):  # wrong checksums, and flipped bits in the bytes
        if not n:
            break
        bad = rng.choice(n, size=min(n, 1 + 3 * k), replace=False)
        wrong = good.copy()
        wrong[bad] ^= np.uint32(1 << k)
        assert mismatched(raw, starts, stops, wrong).tolist() == sorted(bad.tolist())
        flipped = raw.copy()
        at = starts[bad] + rng.integers(0, 3000, size=bad.size)
        flipped[at] ^= np.uint8(1 << k)
        assert mismatched(flipped, starts, stops, good).tolist() == sorted(bad.tolist())


def test_buffers_off_a_common_grid_and_of_mixed_lengths(raw):
    starts = np.array([0, 4096, 3 * 4096 + 1, 9000, 20000, 50000] + [100000 + 4096 * i
                                                                   for i in range(70)])
    stops = starts + np.r_[[4096, 17, 4096, 4096, 1, 4096], [4096] * 70]
    good = _one_by_one(raw, starts, stops)
    assert mismatched(raw, starts, stops, good).tolist() == []
    good[[2, 40]] ^= np.uint32(8)
    assert mismatched(raw, starts, stops, good).tolist() == [2, 40]


def test_a_range_past_the_end_ends_with_the_bytes_as_a_slice_does(raw):
    starts = np.array([raw.size - 100])
    got = mismatched(raw, starts, starts + PAGE, _one_by_one(raw, starts, [raw.size]))
    assert got.tolist() == []


def test_bad_ranges_are_refused(raw):
    with pytest.raises(ValueError, match="as many of each"):
        mismatched(raw, np.array([0, 1]), np.array([5]), np.array([0], dtype=np.uint32))
    with pytest.raises(ValueError, match="starts before"):
        mismatched(raw, np.array([-1]), np.array([5]), np.array([0], dtype=np.uint32))


@pytest.mark.parametrize("nbytes", [1, 2, 3, 100, 4096, 4100, 65536, 1 << 18])
def test_zero_feeding_tables_combine_as_the_library_concatenates(nbytes):
    rng = np.random.default_rng(nbytes)
    a = rng.integers(0, 256, size=(8, 37), dtype=np.uint8)
    b = rng.integers(0, 256, size=(8, nbytes), dtype=np.uint8)
    ca = np.array([google_crc32c.value(x.tobytes()) for x in a], dtype=np.uint32)
    cb = np.array([google_crc32c.value(x.tobytes()) for x in b], dtype=np.uint32)
    both = np.array([google_crc32c.value(x.tobytes() + y.tobytes()) for x, y in zip(a, b)],
                    dtype=np.uint32)
    assert (shift(zeros_tables(nbytes), ca) ^ cb).tolist() == both.tolist()


def test_combine_gives_the_checksum_of_the_buffers_back_to_back():
    rng = np.random.default_rng(1)
    bufs = rng.integers(0, 256, size=(3, 16, 512), dtype=np.uint8)
    each = np.array([[google_crc32c.value(p.tobytes()) for p in g] for g in bufs],
                    dtype=np.uint32)
    whole = [google_crc32c.value(g.tobytes()) for g in bufs]
    assert combine(each, 512).tolist() == whole

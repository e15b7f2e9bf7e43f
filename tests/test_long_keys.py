"""Long keys cost linear time with a small constant: a key of many 8-byte words is
hashed alone with Python ints (no NumPy pass per word over one key), equal to the
reference SipHash-1-3; a 64 KiB key (the longest a table stores) saves and is found."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_hostile_keys import siphash13_ref

import embstore
from embstore.keys.hashing import MAX_KEY_BYTES, hash_keys

KEY = (0x0706050403020100, 0x0F0E0D0C0B0A0908)


@pytest.mark.parametrize("lengths", [[511, 512, 513, 519, 520, 521, 527, 528],
                                     [0, 3, 8, 4099, 17, MAX_KEY_BYTES, 600, 1]],
                         ids=["around-the-cut", "mixed"])
def test_long_keys_hash_as_the_reference(lengths):
    rng = np.random.default_rng(len(lengths))
    keys = ["".join(map(chr, rng.integers(32, 0x2FF, n // 2 + 1)))[: n // 2] + "a" * (n % 2)
            for n in lengths]
    got = hash_keys(keys, key=KEY)
    assert [int(x) for x in got] == [siphash13_ref(k.encode(), *KEY) for k in keys]


def test_one_longest_key_hashes_in_linear_time():
    key = "é" * (MAX_KEY_BYTES // 2)
    hash_keys(["warm"], key=KEY)
    t0 = time.process_time()
    got = hash_keys([key], key=KEY)
    spent = time.process_time() - t0
    assert int(got[0]) == siphash13_ref(key.encode(), *KEY)
    assert spent < 0.1, f"{spent:.3f} CPU s for one 64 KiB key (a NumPy pass a word: 0.36 s)"


def test_a_table_with_the_longest_keys_saves_appends_and_finds_them(tmp_path):
    long_a, long_b = "é" * (MAX_KEY_BYTES // 2), "ü" * (MAX_KEY_BYTES // 2)
    keys = [f"k{i}" for i in range(99)] + [long_a]
    rows = np.arange(100 * 4, dtype=np.float32).reshape(100, 4)
    embstore.save(tmp_path / "t", rows, keys=keys)
    with embstore.open(tmp_path / "t", mode="r+") as t:
        t.append(np.full((1, 4), -1, np.float32), keys=[long_b])
    with embstore.open(tmp_path / "t") as t:
        np.testing.assert_array_equal(t.ids_of([long_a, long_b, "k5", long_a + "x"],
                                               missing=-1), [99, 100, 5, -1])
        np.testing.assert_array_equal(t.lookup_keys([long_a]), rows[99:])
        assert embstore.verify(tmp_path / "t").ok

"""Smaller hostile cases (issue 31, point 7): each printed NumPy's error, accepted bad
input, or wrote a table no reader opens."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import zarr
from relhelpers import REPO, assert_clean_error, invoke

import embstore
from embstore.keys import hashing
from embstore.keys import writer as key_writer

sys.path.insert(0, str(REPO / "tests"))
from test_hostile_keys import emb64_collisions, siphash13_ref  # noqa: E402


def test_an_import_of_a_0_x_2_40_array_is_refused_by_the_writer(tmp_path):
    np.save(tmp_path / "zero.npy", np.empty((0, 2**40), np.float32))  # a 128-byte file
    line = assert_clean_error(invoke(["import", tmp_path / "zero.npy", tmp_path / "t.emb"]))
    assert line == ("Error: dim 1099511627776: more than the 268435456 values a table's row "
                    "may hold (no reader would open the table)")
    assert not (tmp_path / "t.emb").exists()  # written before, then refused by every open


def test_an_append_rekeys_a_legacy_emb64_table_with_the_salted_hash(tmp_path, monkeypatch):
    keys = emb64_collisions(2000)  # one emb64-v1 hash: a run of 2000 to walk per lookup
    monkeypatch.setattr(key_writer, "new_hash_key", lambda: None)  # written as before
    E = np.arange(2000 * 2, dtype=np.float32).reshape(2000, 2)
    path = tmp_path / "old.emb"
    embstore.save(path, E, keys=keys).close()
    monkeypatch.undo()
    info = zarr.open_array(path / "key_hash").attrs["embstore_key_index"]
    assert info == {"version": 1, "hash": "emb64-v1"}
    more = emb64_collisions(2100)[2000:]
    with embstore.open(path, mode="r+") as t:
        t.append(np.ones((100, 2), np.float32), keys=more)
        assert t.ids_of([more[5], keys[7]]).tolist() == [2005, 7]
    info = zarr.open_array(path / "key_hash").attrs["embstore_key_index"]
    assert info["hash"] == "siphash-1-3" and len(info["key"]) == 32
    k = (int(info["key"][:16], 16), int(info["key"][16:], 16))
    stored = zarr.open_array(path / "key_hash")[:]
    order = zarr.open_array(path / "key_order")[:]
    every = keys + more
    assert stored.tolist() == sorted(stored.tolist())
    assert stored.tolist() == [siphash13_ref(every[r].encode(), *k) for r in order]
    assert embstore.verify(path).ok
    with embstore.open(path) as t:  # no run of equal hashes left to walk
        calls = []
        real = hashing.keys_equal
        monkeypatch.setattr(hashing, "keys_equal", lambda *a: calls.append(1) or real(*a))
        assert t.ids_of(every[::-1]).tolist() == list(range(2099, -1, -1))
        assert len(calls) <= 2
        np.testing.assert_array_equal(t.lookup_keys(keys[:3]), E[:3])

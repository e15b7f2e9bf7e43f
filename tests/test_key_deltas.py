"""Key deltas (docs/FORMAT.md §6d): keys appended to a format-2 table go to one file per
append, searched beside the key index, until a compaction folds them in.  Checked against a
plain Python dict and list of the keys every version holds."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import zarr

import embstore
from embstore.errors import CorruptStoreError, ShapeMismatchError
from embstore.keys.segments import SegmentedVocab
from embstore.store import table as handle

DIM = 4


def _rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _table(tmp_path, n=2000):
    path = tmp_path / "t.emb"
    keys = [f"w{i}" for i in range(n)]
    embstore.save(path, _rows(n, 0), keys=keys).close()
    return path, keys


def _appends(path, keys, sizes, seed=1):
    """Append batches of keyed rows (keys of any Unicode, some long); returns every version's
    keys (the reference) by version number."""
    versions = {}
    with embstore.open(path, "r+") as t:
        versions[t.version] = list(keys)
        for j, m in enumerate(sizes):  # a loop per append
            new = [f"a{j}-{i}" + "é" * (i % 5) + ("x" * 40 if i % 7 == 0 else "")
                   for i in range(m)]
            t.append(_rows(m, seed + j), keys=new)
            keys = keys + new
            versions[t.version] = list(keys)
    return versions


def _index_files(path):
    return {name: os.stat(path / name / "c" / "0").st_ino
            for name in ("key_utf8", "key_offsets", "key_hash", "key_order")}


def test_appended_keys_are_deltas_and_every_lookup_is_exact(tmp_path):
    path, keys = _table(tmp_path)
    before = _index_files(path)
    versions = _appends(path, keys, [300, 1, 250])
    want = versions[max(versions)]
    assert _index_files(path) == before  # the key index is not rewritten by appends
    with embstore.open(path) as t:
        vocab = t._vocab()
        assert isinstance(vocab, SegmentedVocab) and len(vocab.segments) == 3
        assert list(t.keys) == want and len(t.keys) == len(want)
        ref = {k: i for i, k in enumerate(want)}
        rng = np.random.default_rng(5)
        asked = [want[i] for i in rng.integers(0, len(want), 500)] + ["nope", "a1-0x", ""]
        got = vocab.find(np.array(asked, dtype=object))
        np.testing.assert_array_equal(got, [ref.get(k, -1) for k in asked])
        ids = rng.integers(0, len(want), 300)
        assert vocab.key_at(ids) == [want[i] for i in ids]
        for a, b in ((1990, 2310), (2299, 2301), (0, len(want)), (2300, 2300)):
            assert list(t.keys[a:b]) == want[a:b]
        np.testing.assert_array_equal(t.lookup_keys([want[2300], want[0]]),
                                      t[[2300, 0]])
    # the contract's ``keys`` array, for other Zarr readers, holds every key
    assert zarr.open_array(str(path / "keys"), mode="r")[:].tolist() == want
    assert embstore.verify(path).ok


def test_every_version_reads_its_keys_and_compaction_changes_none(tmp_path):
    path, keys = _table(tmp_path)
    versions = _appends(path, keys, [100, 200])
    with embstore.open(path, "r+") as t:
        t.compact()
        after = t.version
        assert not isinstance(t._vocab(), SegmentedVocab)  # folded into the index
        assert list(t.keys) == versions[max(versions)]
    versions[after] = versions[max(versions)]
    for v, want in versions.items():  # a loop per version
        with embstore.open(path, version=v) as t:
            assert list(t.keys) == want, v
            np.testing.assert_array_equal(t.ids_of(want[-3:]), [len(want) - 3, len(want) - 2,
                                                                len(want) - 1])
            later = [k for k in versions[max(versions)] if k not in set(want)][:3]
            if later:
                assert t._vocab().find(np.array(later, dtype=object)).tolist() == [-1] * 3
    assert embstore.verify(path).ok


def test_a_key_already_in_a_delta_is_refused(tmp_path):
    path, keys = _table(tmp_path, 100)
    _appends(path, keys, [10])
    with embstore.open(path, "r+") as t:
        with pytest.raises(ShapeMismatchError, match=r"append: key 'a0-3ééé' already exists "
                                                     r"at row 103"):
            t.append(_rows(2, 9), keys=["fresh", "a0-3ééé"])
        assert len(t) == 110


def test_many_key_deltas_are_folded(tmp_path):
    path, keys = _table(tmp_path)
    versions = _appends(path, keys, [3] * (handle.MAX_KEY_DELTAS + 1))
    with embstore.open(path) as t:
        assert not isinstance(t._vocab(), SegmentedVocab)
        assert list(t.keys) == versions[max(versions)]
    assert embstore.verify(path).ok


def test_a_damaged_key_delta_is_refused_and_reported(tmp_path):
    path, keys = _table(tmp_path)
    _appends(path, keys, [50])
    snap = path / "vectors" / ".embstore" / "versions"
    (delta,) = [p for p in snap.rglob("*.keys")]
    data = bytearray(delta.read_bytes())
    data[-20] ^= 1
    delta.write_bytes(bytes(data))
    with embstore.open(path) as t:
        with pytest.raises(CorruptStoreError, match=r"\.keys: crc32c mismatch: the key delta "
                                                    r"is damaged"):
            t.ids_of(["w3"])
    report = embstore.verify(path)
    assert not report.ok and "the key delta is damaged" in str(report)


def test_a_format_1_tables_first_append_makes_key_deltas_and_a_version(tmp_path):
    path = tmp_path / "t1"
    keys = [f"w{i}" for i in range(500)]
    embstore.save(path, _rows(500, 0), keys=keys, format_version=1).close()
    assert not (path / "vectors" / ".embstore" / "versions").exists()
    with embstore.open(path, "r+") as t:
        t.append(_rows(20, 3), keys=[f"n{i}" for i in range(20)])
        assert isinstance(t._vocab(), SegmentedVocab) and t.version == 1
    assert (path / "vectors" / ".embstore" / "versions" / "1").is_dir()
    with embstore.open(path) as t:
        assert list(t.keys) == keys + [f"n{i}" for i in range(20)]
    shutil.rmtree(path)


def test_a_key_delta_with_hashes_out_of_order_is_refused():
    """The order checks compare neighbours: an unsigned difference wraps and never goes
    below zero (hashes in descending order loaded, and ids_of reported their keys missing)."""
    from embstore.keys.segments import KeySegment

    utf8 = np.frombuffer(b"abcd" + b"\0" * 8, np.uint8)
    offsets = np.array([0, 2, 4], np.uint64)
    rows = np.array([10, 11], np.int64)
    KeySegment(10, np.array([3, 5], np.uint64), rows, offsets, utf8, "ok")  # in order: fine
    with pytest.raises(CorruptStoreError, match="hashes not sorted"):
        KeySegment(10, np.array([5, 3], np.uint64), rows, offsets, utf8, "delta")
    with pytest.raises(CorruptStoreError, match="offsets do not fit"):
        KeySegment(10, np.array([3, 5], np.uint64), rows, np.array([0, 4, 2], np.uint64),
                   utf8, "delta")

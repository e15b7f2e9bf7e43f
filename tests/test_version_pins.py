"""Versions pinned by content (docs/FORMAT.md section 6f): a delta swapped for another valid
delta, a manifest re-checksummed without one of its deltas, a key delta swapped, the newest
version directory removed:
each is refused at open (CorruptStoreError) or, for files a reader never opens, reported
by verify (exit 1); a clean table still opens and verifies."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import embstore
from embstore.errors import CorruptStoreError
from embstore.store.versions.snapshot import manifest_crc

DIM = 4
V = Path("vectors") / ".embstore" / "versions"


def _table(path: Path) -> np.ndarray:
    rows = np.arange(300 * DIM, dtype=np.float32).reshape(300, DIM)
    embstore.save(path, rows, keys=[f"k{i}" for i in range(300)]).close()
    with embstore.open(path, mode="r+") as t:  # versions 2..5, each with its own delta
        t.write([3, 4], np.full((2, DIM), 7, np.float32))
        t.write([5, 6], np.full((2, DIM), 8, np.float32))
        t.append(np.full((2, DIM), 9, np.float32), keys=["a0", "a1"])
        t.append(np.full((2, DIM), 10, np.float32), keys=["b0", "b1"])
    rows[[3, 4]], rows[[5, 6]] = 7, 8
    return np.concatenate([rows, np.full((2, DIM), 9), np.full((2, DIM), 10)]).astype(np.float32)


def _replace(dst: Path, src: Path) -> None:
    """Put a copy of ``src`` at ``dst`` (a new inode: the other versions keep theirs)."""
    data = src.read_bytes()
    os.remove(dst)
    dst.write_bytes(data)


def _manifest(path: Path, n: int) -> dict:
    return json.loads((path / V / str(n) / "manifest.json").read_text())


def _rewrite(path: Path, n: int, doc: dict) -> None:
    doc["crc32c"] = manifest_crc(doc)
    p = path / V / str(n) / "manifest.json"
    os.remove(p)
    p.write_text(json.dumps(doc))


def _refused(path: Path) -> None:
    with pytest.raises(CorruptStoreError):
        with embstore.open(path) as t:
            t.to_numpy()
            t.ids_of(["a0", "b1"])
    assert not embstore.verify(path).ok


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "t"
    want = _table(path)
    return path, want


def test_a_clean_table_opens_and_verifies(table):
    path, want = table
    with embstore.open(path) as t:
        np.testing.assert_array_equal(t.to_numpy(), want)
        assert t.version == 5
    report = embstore.verify(path)
    assert report.ok, [d.message for d in report.damaged]
    doc = _manifest(path, 3)
    assert doc["deltas"] and all(f"deltas/{e['name']}" in doc["objects"] for e in doc["deltas"])


def test_a_delta_swapped_for_another_valid_delta(table):
    path, _ = table
    d = path / V / "5" / "deltas"
    _replace(d / "3.vectors", d / "2.vectors")  # both valid, the same size
    _refused(path)


def test_a_delta_of_an_older_version_swapped_is_found_by_verify(table):
    path, want = table
    d = path / V / "3" / "deltas"
    _replace(d / "3.vectors", d / "2.vectors")
    with embstore.open(path) as t:  # the newest version links its own copy
        np.testing.assert_array_equal(t.to_numpy(), want)
    report = embstore.verify(path)
    assert not report.ok and any("3.vectors" in d.file for d in report.damaged)


def test_a_manifest_rechecksummed_without_one_of_its_deltas(table):
    path, _ = table
    doc = _manifest(path, 5)
    doc["deltas"] = [e for e in doc["deltas"] if e["name"] != "3.vectors"]
    _rewrite(path, 5, doc)
    _refused(path)


def test_an_older_manifest_rechecksummed_is_found_through_its_child(table):
    path, want = table
    doc = _manifest(path, 3)
    doc["deltas"] = [e for e in doc["deltas"] if e["name"] != "3.vectors"]
    _rewrite(path, 3, doc)
    with pytest.raises(CorruptStoreError, match="SHA-256"):
        with embstore.open(path, version=3) as t:
            t.to_numpy()
    with embstore.open(path) as t:  # the newest version is untouched
        np.testing.assert_array_equal(t.to_numpy(), want)
    assert not embstore.verify(path).ok


def test_a_key_delta_swapped_for_another_valid_key_delta(table):
    path, _ = table
    d = path / V / "5" / "deltas"
    _replace(d / "5.keys", d / "4.keys")  # (2 keys each: the same size)
    _refused(path)


def test_the_newest_version_directory_removed(table):
    path, _ = table
    shutil.rmtree(path / V / "5")
    _refused(path)

"""Nothing inside a table follows a symbolic link or opens a FIFO, and a writer never writes
or deletes outside the table's directory (embstore/files.py ``real_dir``, ``open_regular(...,
nofollow=True)``): the commit area ``vectors/.embstore/`` (journal, last, staged files), the
approximate index's ``ann/`` and its files, the directory a commit moves a shard into.

Each case points the link at a directory outside the table holding files that look like
embstore's own (``txn-notes``, ``journal.tmp-draft``, a journal, a shard): opening ``r+``,
writing, ``repair``, building or searching the index refuse with a ``CorruptStoreError``
naming the path, the directory outside is left exactly as it was, and ``verify`` exits 1.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from relhelpers import assert_clean_error, invoke, time_limit

import embstore
from embstore.errors import CorruptStoreError

ROWS, DIM = 64, 4
ARR = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
AREA = Path("vectors") / ".embstore"
LINK = "expected a directory of the table, got a symbolic link"
FILE_LINK = "expected a regular file, got a symbolic link"


def snapshot(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` with its bytes (what must not change)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def table(tmp_path) -> Path:
    path = tmp_path / "t"
    embstore.save(path, ARR, keys=[f"k{i}" for i in range(ROWS)], chunk_rows=8,
                  shard_rows=16).close()
    with embstore.open(path, mode="r+") as t:  # one commit: the area and `last` exist
        t.write([0], ARR[[0]])
    return path


@pytest.fixture
def outside(tmp_path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "txn-notes").write_text("someone's notes")
    (d / "journal.tmp-draft").write_text("someone's draft")
    return d


def _writes_refused(path: Path, pattern: str) -> None:
    with pytest.raises(CorruptStoreError, match=pattern):
        with embstore.open(path, mode="r+") as t:
            t.write([1], np.ones((1, DIM), np.float32))
            t.append(np.ones((2, DIM), np.float32), keys=["new1", "new2"])


def test_a_symlinked_commit_area(table, outside):
    shutil.rmtree(table / AREA)
    os.symlink(outside, table / AREA)
    before = snapshot(outside)
    _writes_refused(table, f"{AREA}: {LINK}")
    with pytest.raises(CorruptStoreError, match=f"{AREA}: {LINK}"):
        embstore.open(table)
    assert_clean_error(invoke(["repair", table]))
    res = invoke(["verify", table])
    assert res.exit_code == 1 and ".embstore" in res.output, res.output
    assert snapshot(outside) == before
    assert sorted(os.listdir(outside)) == ["journal.tmp-draft", "txn-notes"]


def test_a_symlinked_vectors_directory_is_refused_for_writing(table, tmp_path):
    moved = tmp_path / "vectors-elsewhere"
    shutil.move(table / "vectors", moved)
    os.symlink(moved, table / "vectors")
    before = snapshot(moved)
    _writes_refused(table, f"{table / 'vectors'}: {LINK}")
    assert snapshot(moved) == before


@pytest.mark.parametrize("name", ["journal", "last"])
def test_a_symlinked_journal_or_last(table, tmp_path, name):
    target = tmp_path / f"{name}-elsewhere"
    # a journal that would move a file over the live vectors/zarr.json if followed
    staged = table / AREA / "txn-0123456789abcdef.0"
    staged.write_text("{}")
    target.write_text(json.dumps({"embstore_journal": 1, "txn": "0123456789abcdef",
                                  "moves": [["txn-0123456789abcdef.0", "vectors/zarr.json"]]}))
    live = (table / AREA / name)
    if live.exists():
        live.unlink()
    os.symlink(target, live)
    meta_before = (table / "vectors" / "zarr.json").read_bytes()
    before = target.read_bytes()
    with pytest.raises(CorruptStoreError, match=f"{AREA / name}: {FILE_LINK}"):
        embstore.open(table, mode="r+")
    with pytest.raises(CorruptStoreError, match=f"{AREA / name}: {FILE_LINK}"):
        embstore.open(table)
    assert target.read_bytes() == before and os.path.islink(live)
    assert (table / "vectors" / "zarr.json").read_bytes() == meta_before
    res = invoke(["verify", table])
    assert res.exit_code == 1 and name in res.output, res.output


@pytest.mark.parametrize("name", ["journal", "last"])
def test_a_fifo_in_the_commit_area_never_blocks(table, name):
    live = table / AREA / name
    if live.exists():
        live.unlink()
    os.mkfifo(live)
    with time_limit(20, f"opening a table whose {name} is a FIFO"):
        for mode in ("r", "r+"):
            with pytest.raises(CorruptStoreError, match=f"{name}: expected a regular file, "
                                                        "got a FIFO"):
                embstore.open(table, mode=mode)


def test_a_commit_never_moves_a_shard_through_a_symlinked_directory(tmp_path, outside):
    path = tmp_path / "fresh"
    embstore.create(path, shape=(ROWS, DIM), chunk_rows=8, shard_rows=16).close()
    (path / "vectors" / "c").mkdir(exist_ok=True)
    os.symlink(outside, path / "vectors" / "c" / "3")  # shard 3 was never written
    before = snapshot(outside)
    with pytest.raises(CorruptStoreError, match=f"{Path('vectors', 'c', '3')}: {LINK}"):
        with embstore.open(path, mode="r+") as t:
            t.write([50], np.ones((1, DIM), np.float32))  # row 50 lives in shard 3: a
            t.compact()  # delta, then the compaction rewrites shard 3
    assert snapshot(outside) == before
    with embstore.open(path) as t:  # the compaction did not happen: all or nothing
        np.testing.assert_array_equal(t[[50]], 1)
        assert t.info()["pending_rows"] == 1


# -- the approximate index ------------------------------------------------------------------
faiss_needed = pytest.mark.skipif(__import__("importlib").util.find_spec("faiss") is None,
                                  reason="needs faiss (the ann extra)")


@faiss_needed
def test_a_symlinked_ann_directory(table, tmp_path):
    other = tmp_path / "other"
    embstore.save(other, ARR[::-1].copy()).close()
    embstore.build_index(other, nlist=4)
    foreign = other / AREA / "ann"
    os.symlink(foreign, table / AREA / "ann")
    before = snapshot(foreign)
    ann = AREA / "ann"
    with pytest.raises(CorruptStoreError, match=f"{ann}: {LINK}"):
        embstore.build_index(table, nlist=4, overwrite=True)
    with embstore.open(table) as t, pytest.raises(CorruptStoreError, match=f"{ann}: {LINK}"):
        embstore.Embedding(t).most_similar(ARR[3], k=3, approx=True)
    res = invoke(["verify", table])
    assert res.exit_code == 1 and f"{ann}: " in res.output and "symbolic link" in res.output
    assert snapshot(foreign) == before and os.path.islink(table / ann)


@faiss_needed
@pytest.mark.parametrize("name", ["index.faiss", "lists.ivfdata", "meta.json", "lists.crc32c"])
def test_a_symlinked_file_in_ann(table, tmp_path, name):
    embstore.build_index(table, nlist=4)
    home = table / AREA / "ann"
    target = tmp_path / name
    shutil.move(home / name, target)  # the right bytes, but behind a link
    os.symlink(target, home / name)
    with embstore.open(table) as t, pytest.raises(CorruptStoreError,
                                                  match=f"{name}: {FILE_LINK}"):
        embstore.Embedding(t).most_similar(ARR[3], k=3, approx=True)
    res = invoke(["verify", table])
    assert res.exit_code == 1 and name in res.output, res.output


@faiss_needed
@pytest.mark.parametrize("name", ["index.faiss", "lists.ivfdata", "meta.json", "lists.crc32c"])
def test_a_fifo_in_ann_never_blocks(table, name):
    embstore.build_index(table, nlist=4)
    home = table / AREA / "ann"
    (home / name).unlink()
    os.mkfifo(home / name)
    with time_limit(20, f"searching with a FIFO at ann/{name}"):
        with embstore.open(table) as t, pytest.raises(CorruptStoreError,
                                                      match=f"{name}: expected a regular "
                                                            "file, got a FIFO"):
            embstore.Embedding(t).most_similar(ARR[3], k=3, approx=True)
        res = invoke(["verify", table])
    assert res.exit_code == 1 and name in res.output, res.output

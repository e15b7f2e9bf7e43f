"""A FIFO in a table's commit area or approximate index is refused, never waited on.

Opening a FIFO for reading blocks until a writer appears: each of these opens, searches
and appends blocked forever (the README promises refusal without blocking).  Each case
runs under a time limit, so a regression fails instead of hanging.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from relhelpers import assert_clean_error, invoke, time_limit

import embstore
from embstore.errors import CorruptStoreError
from embstore.search.stream import most_similar

pytest.importorskip("faiss")

E = np.random.default_rng(3).normal(size=(300, 8)).astype(np.float32)
KEYS = [f"k{i}" for i in range(300)]
AREA = "vectors/.embstore"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A table with an approximate index and one commit (so ``last`` exists)."""
    path = tmp_path_factory.mktemp("fifo") / "src.emb"
    embstore.save(path, E, keys=KEYS).close()
    embstore.build_index(path)
    with embstore.open(path, mode="r+") as t:
        t.write([0], E[:1])
    return path


def _with_fifo(built, tmp_path, rel):
    path = tmp_path / "t.emb"
    shutil.copytree(built, path)
    target = path / rel
    if os.path.lexists(target):
        os.remove(target)
    os.mkfifo(target)
    return path


@pytest.mark.parametrize("rel", ["last", "journal"])
def test_a_fifo_in_the_commit_area_is_refused(built, tmp_path, rel):
    path = _with_fifo(built, tmp_path, f"{AREA}/{rel}")
    shown = str(path / AREA / rel)
    with time_limit(20, f"a FIFO at {rel}"):
        for mode in ("r", "r+"):
            with pytest.raises(CorruptStoreError, match=f"{shown}: .*expected a regular "
                                                        r"file, got a FIFO \(named pipe\)"):
                embstore.open(path, mode=mode)
        report = embstore.verify(path)
        assert not report.ok and f"{shown}: expected a regular file" in str(report)
        line = assert_clean_error(invoke(["info", path], seconds=20), context=rel)
        assert "expected a regular file, got a FIFO" in line


@pytest.mark.parametrize("rel", ["meta.json", "index.faiss", "lists.ivfdata"])
def test_a_fifo_in_the_approximate_index_is_refused(built, tmp_path, rel):
    path = _with_fifo(built, tmp_path, f"{AREA}/ann/{rel}")
    shown = str(path / AREA / "ann" / rel)
    with time_limit(20, f"a FIFO at ann/{rel}"):
        with embstore.open(path) as t:
            np.testing.assert_array_equal(t[[1, 2]], E[[1, 2]])  # exact reads unaffected
            with pytest.raises(CorruptStoreError,  # damage: never waited on
                               match=f"{shown}: expected a regular file, got a FIFO"):
                most_similar(t, E[5], k=3, approx=True)
        with embstore.open(path, mode="r+") as t:  # writes do not read the index
            t.append(E[:1], keys=["extra"])
        report = embstore.verify(path)
        assert not report.ok and f"{shown}: expected a regular file" in str(report)
        line = assert_clean_error(invoke(["similar", path, "k5", "--approx"], seconds=20),
                                  context=rel)
        assert "expected a regular file, got a FIFO" in line

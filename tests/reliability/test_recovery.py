"""Leftovers of interrupted writes: who removes them, and what ``verify`` says about them.

- temporary tables of killed saves beside DEST: removed by the next writer to DEST and by
  ``repair`` when their process is gone, never while it runs;
- staging directories and older embstore versions' temporary files inside a table:
  removed by the next ``r+`` open and ``embstore repair``;
- a hostile journal is refused, never followed outside the table;
- ``verify`` agrees with the reader on the states the reader serves or refuses.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from relhelpers import assert_clean_error, invoke

import embstore
import forked  # (processes forked from a server that has imported embstore)
from embstore.errors import CorruptStoreError
from embstore.fs.beside import owned_prefix

ROWS, DIM = 300, 4


def _vals(n=ROWS) -> np.ndarray:
    return np.repeat(np.arange(n, dtype=np.float32)[:, None], DIM, 1)


def _save(path: Path) -> None:
    embstore.save(path, _vals(), keys=[f"k{i}" for i in range(ROWS)], chunk_rows=8,
                  shard_rows=64, format_version=1).close()  # (its live files are read)


def _start_and_die(dest: str) -> None:
    """A save that is killed half way: its temporary table stays, its process is gone."""
    w = embstore.TableWriter(dest, dim=DIM, has_keys=False, overwrite=True)
    w.add(_vals())
    w._flush(final=True)
    os._exit(0)


def test_killed_saves_are_swept_by_the_next_writer_only_when_dead(tmp_path):
    dest = tmp_path / "dest"
    p = forked.context().Process(target=_start_and_die, args=(str(dest),))
    p.start()
    p.join(60)
    dead = [n for n in os.listdir(tmp_path) if n.lstrip(".").startswith("dest.tmp-")]
    assert len(dead) == 1
    mine = tmp_path / (owned_prefix(dest) + "live")  # a writer of this process, still working
    mine.mkdir()
    embstore.save(dest, _vals()).close()
    assert sorted(os.listdir(tmp_path)) == ["dest", mine.name]
    shutil.rmtree(mine)
    # the same through repair, after a second killed save
    p = forked.context().Process(target=_start_and_die, args=(str(dest),))
    p.start()
    p.join(60)
    res = invoke(["repair", dest])
    assert res.exit_code == 0, res.output
    assert "removed 1 leftover" in res.output and "OK" in res.output
    assert sorted(os.listdir(tmp_path)) == ["dest"]


def test_repair_and_r_plus_open_remove_leftovers_inside(tmp_path):
    path = tmp_path / "t"
    _save(path)
    area = path / "vectors" / ".embstore"
    area.mkdir(exist_ok=True)
    (area / "txn-0123").mkdir()
    (area / "txn-0123" / "f0").write_bytes(b"x" * 1000)
    (area / "journal.tmp-0123").write_text("{")
    (path / "vectors" / "c" / "0" / "0.tmp-abcd1234").write_bytes(b"y" * 100)  # older embstore
    shutil.copytree(path / "key_hash", path / "key_hash.__tmp__")
    assert embstore.verify(path).ok  # the reader serves this table: not damage
    res = invoke(["repair", path])
    assert res.exit_code == 0, res.output
    assert "removed 4 leftovers" in res.output, res.output
    assert os.listdir(area) == []
    assert not (path / "key_hash.__tmp__").exists()
    assert os.listdir(path / "vectors" / "c" / "0") == ["0"]
    (area / "txn-4567").mkdir()
    embstore.open(path, mode="r+").close()  # the next writer does the same
    assert os.listdir(area) == []
    with embstore.open(path) as t:
        np.testing.assert_array_equal(t.to_numpy(), _vals())


@pytest.mark.parametrize("moves", [
    [["txn-abc.0", "../outside"]], [["../../x", "vectors/zarr.json"]],
    [["txn-abc.0", "/etc/passwd"]], [["other-file", "vectors/zarr.json"]], "nope"], ids=str)
def test_a_hostile_journal_is_refused(tmp_path, moves):
    path = tmp_path / "t"
    _save(path)
    area = path / "vectors" / ".embstore"
    area.mkdir(exist_ok=True)
    (area / "journal").write_text(json.dumps({"txn": "abc", "moves": moves}))
    with pytest.raises(CorruptStoreError, match="journal"):
        embstore.open(path)
    report = embstore.verify(path)
    assert not report.ok and "journal" in str(report)
    assert_clean_error(invoke(["info", path]))
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize("first", ["open", "verify"])
def test_a_committed_write_is_finished_by_the_next_reader(tmp_path, first):
    """The state a killed writer leaves right after its commit point: journal and staged
    files.  A reader opening it finishes the write (the lock is free) and sees it whole."""
    path = tmp_path / "t"
    embstore.save(path, _vals(), chunk_rows=8, shard_rows=64,  # no keys: rows drop
                  format_version=1).close()  # (a journal of format 1: no snapshot)
    area = path / "vectors" / ".embstore"
    (area / "txn-feed").mkdir(parents=True)
    meta = json.loads((path / "vectors" / "zarr.json").read_text())
    meta["shape"][0] = ROWS - 10  # a "write" that drops rows: easy to see
    (area / "txn-feed.0").write_text(json.dumps(meta))
    (area / "journal").write_text(json.dumps({"txn": "feed",
                                              "moves": [["txn-feed.0", "vectors/zarr.json"]]}))
    if first == "verify":
        report = embstore.verify(path)
        assert report.ok and report.vocab_size == ROWS - 10, str(report)
    with embstore.open(path) as t:
        assert len(t) == ROWS - 10
        np.testing.assert_array_equal(t.to_numpy(), _vals()[:ROWS - 10])
    assert os.listdir(area) == ["last"]
    assert embstore.verify(path).ok


def test_opening_a_plain_folder_for_writing_removes_nothing(tmp_path):
    (tmp_path / "notes.tmp-1").write_text("mine")
    (tmp_path / "vectors").mkdir()
    (tmp_path / "vectors" / "x.tmp-2").write_text("mine too")
    with pytest.raises(embstore.EmbstoreError):
        embstore.open(tmp_path, mode="r+")
    embstore.repair(tmp_path)
    assert (tmp_path / "notes.tmp-1").exists() and (tmp_path / "vectors" / "x.tmp-2").exists()

"""Shard tags (docs/FORMAT.md §3b): a shard swapped for another valid shard, a chunk swapped
for another shard's, or damage in the tag's own bytes is a CorruptStoreError before rows
come back; a reader checks a shard against the pins of the version whose files it reads
(never another version's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_fasttext_bin import write_model

import embstore
from embstore.errors import CorruptStoreError
from embstore.store.shard.tag import MAGIC, tag_len

DIM, ROWS, CHUNK, SHARD = 4, 48, 4, 16
V = Path("vectors") / ".embstore" / "versions"


def _rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, DIM)).astype(np.float32)


def _save(path: Path, rows: np.ndarray, **kw) -> None:
    embstore.save(path, rows, chunk_rows=CHUNK, shard_rows=SHARD, **kw).close()


def _replace(dst: Path, data: bytes) -> None:
    """``data`` at ``dst`` as a new inode (the other versions keep theirs)."""
    os.remove(dst)
    dst.write_bytes(data)


def _newest(path: Path) -> Path:
    return path / V / str(max(int(n) for n in os.listdir(path / V) if n.isdigit()))


def test_a_reader_of_an_older_version_reads_its_own_shards_after_a_commit(tmp_path):
    """A handle's commit rewrites a shard (a write past the fold threshold) while threads
    still read the version it had: they read that version's shard against that version's
    pin (the pin of the new shard was once written into the old reader: a spurious
    "its shard tag has crc32c X, the version's manifest records Y")."""
    rows = _rows(1)
    _save(tmp_path / "t", rows)
    with embstore.open(tmp_path / "t", mode="r+", cache_bytes=0) as t:
        t.write([40], rows[40:41])  # (a commit: the handle now writes through its version)
        old = t._v  # what a thread that looked the version up before the commit reads
        t.write(np.arange(16), rows[:16] + 100)  # past 5% of the rows: shard 0 rewritten
        assert t._v is not old
        assert json.loads((_newest(tmp_path / "t") / "manifest.json").read_text())[
            "change"].get("folded") == "chunks"
        np.testing.assert_array_equal(old.source.take(np.arange(ROWS)), rows)
        np.testing.assert_array_equal(t[np.arange(16)], rows[:16] + 100)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_flipped_byte_in_the_tag_of_an_unpinned_shard_is_damage(tmp_path, compression):
    """A format-1 table has no manifest: its shards' tags are checked by their geometry."""
    path = tmp_path / "t"
    _save(path, _rows(2), format_version=1, compression=compression)
    f = path / "vectors" / "c" / "1" / "0"
    raw = bytearray(f.read_bytes())
    n = SHARD // CHUNK
    at = len(raw) - 16 * n - 4 - tag_len(n)
    assert raw[at: at + 8] == MAGIC
    for pos in (at, at + 12, at + 20, at + tag_len(n) - 1):  # magic, index crc, entry, crc
        bad = bytearray(raw)
        bad[pos] ^= 0x40
        f.write_bytes(bytes(bad))
        with embstore.open(path, cache_bytes=0) as t:
            np.testing.assert_array_equal(t[np.arange(16)], _rows(2)[:16])  # shard 0: fine
            with pytest.raises(CorruptStoreError, match="shard tag"):
                t[np.arange(16, 32)]
        report = embstore.verify(path)
        assert not report.ok and any("vectors/c/1/0" in d.file for d in report.damaged)
    f.write_bytes(bytes(raw))
    assert embstore.verify(path).ok


def test_a_chunk_of_another_shard_in_a_tagged_shard_is_damage(tmp_path):
    """A stored chunk replaced by the twin table's chunk of the same place: its own crc32c
    and the index hold; the tag's entry does not."""
    for name, seed in (("t", 3), ("twin", 4)):
        _save(tmp_path / name, _rows(seed))
    f = _newest(tmp_path / "t") / "vectors" / "c" / "0" / "0"
    g = _newest(tmp_path / "twin") / "vectors" / "c" / "0" / "0"
    raw, other = bytearray(f.read_bytes()), g.read_bytes()
    step = CHUNK * DIM * 4 + 4
    raw[step: 2 * step] = other[step: 2 * step]  # inner chunk 1 (rows 4..7)
    _replace(f, bytes(raw))
    with embstore.open(tmp_path / "t", cache_bytes=0) as t:
        np.testing.assert_array_equal(t[np.arange(4)], _rows(3)[:4])
        with pytest.raises(CorruptStoreError, match="chunk 1: ends in crc32c .* its shard tag"):
            t[np.arange(4, 8)]
    assert not embstore.verify(tmp_path / "t").ok


def _fasttext(path: Path, src: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    write_model(src, ["the", "of", "a"], rng.standard_normal((3, DIM)).astype(np.float32),
                rng.standard_normal((50, DIM)).astype(np.float32))
    embstore.import_file(src, path)


def test_an_ngram_shard_of_another_table_is_damage(tmp_path):
    """The n-grams' shards are pinned by the version's manifest as the rows' are."""
    _fasttext(tmp_path / "t.emb", tmp_path / "a.bin", 5)
    _fasttext(tmp_path / "twin.emb", tmp_path / "b.bin", 6)
    with embstore.open(tmp_path / "t.emb") as t:
        want = t.lookup_keys(["unknownword"], oov="subword")
    newest = _newest(tmp_path / "t.emb")
    entry = json.loads((newest / "manifest.json").read_text())["objects"]["ngrams/c/0/0"]
    assert len(entry) == 4  # [size, digest, tail, tag]
    f, g = newest / "ngrams" / "c" / "0" / "0", _newest(tmp_path / "twin.emb") / "ngrams/c/0/0"
    assert f.stat().st_size == g.stat().st_size and f.read_bytes() != g.read_bytes()
    _replace(f, g.read_bytes())
    with embstore.open(tmp_path / "t.emb") as t:
        with pytest.raises(CorruptStoreError, match="manifest records"):
            got = t.lookup_keys(["unknownword"], oov="subword")
            assert not np.array_equal(got, want)  # (what it returned before the pins)
    assert not embstore.verify(tmp_path / "t.emb").ok

"""Whole-table scans of a format-2 table (``to_numpy``, slices, ``verify``, export to
``.npy``, the exact search) on chunks large enough that their pages are checked a group at a
time (:mod:`embstore.store.rows.runs`): exact against NumPy and the bytes on disk, and a
damaged page inside a group named page by page, as a check per page names it."""

from __future__ import annotations

import numpy as np
import pytest
from google_crc32c import value as crc32c

import embstore
from embstore import CorruptStoreError
from embstore.convert import export_table
from embstore.store.versions.commit import Transaction
from embstore.store.rows import runs, verify as rows_verify

V, D, CR = 10_000, 300, 2048  # 1,200-byte rows (across pages); chunks of 600 pages, 5 files
PAGES = CR * D * 4 // 4096


@pytest.fixture
def E(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture
def path(tmp_path, E):
    embstore.save(tmp_path / "t", E, format_version=2, chunk_rows=CR).close()
    return tmp_path / "t"


def test_a_group_checksum_is_the_crc32c_of_the_group(rng):
    data = rng.integers(0, 256, size=5 * runs.GROUP * 4096, dtype=np.uint8)
    pages = np.array([crc32c(data[p: p + 4096]) for p in range(0, data.size, 4096)], "<u4")
    got = runs.group_crcs(pages.reshape(5, runs.GROUP))
    span = runs.GROUP * 4096
    assert got.tolist() == [crc32c(data[g * span: (g + 1) * span]) for g in range(5)]


def test_scans_equal_numpy(path, E, tmp_path, monkeypatch):
    monkeypatch.setattr(rows_verify, "PIECE", 256 << 10)  # several pieces a chunk, rows carried
    with embstore.open(path) as t:
        np.testing.assert_array_equal(t.to_numpy(), E)
    with embstore.open(path) as t:  # fresh: slices across chunk files, unaligned
        np.testing.assert_array_equal(t[1000:9000], E[1000:9000])
        np.testing.assert_array_equal(t[2047:2049], E[2047:2049])
    En = E / np.linalg.norm(E, axis=1, keepdims=True)
    q = E[[7, 5000]] + 0.5
    want = np.argsort(-(q / np.linalg.norm(q, axis=1, keepdims=True)) @ En.T, axis=1,
                      kind="stable")[:, :10]
    for block_rows in (None, 3000, 2048):  # blocks that straddle chunk files, and that don't
        with embstore.open(path) as t:
            ids, scores = embstore.Embedding(t).most_similar(q, k=10, block_rows=block_rows)
        np.testing.assert_array_equal(ids, want)
    export_table(path, tmp_path / "out.npy")
    np.save(tmp_path / "ref.npy", E)
    assert (tmp_path / "out.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    report = embstore.verify(path)
    assert report.ok and report.chunks == 5, str(report)


def test_a_wrong_norm_is_found_by_verify_in_pieces(path, monkeypatch):
    """The norms are compared piece by piece as the rows are read: a wrong one is found in a
    row that begins in one piece and ends in the next (rows carried over)."""
    monkeypatch.setattr(rows_verify, "PIECE", 256 << 10)
    assert embstore.verify(path).ok
    row = CR + 218  # chunk 1, its row 218: bytes 261,600..262,799, across the first piece's end
    with embstore.open(path, mode="r+") as t:
        good = float(t.norms_source.read(row, row + 1)[0, 0])
        with t._versions.writing(t._handle):
            txn = Transaction(t.path)
            t.norms_source.write(np.array([row]), np.array([[good * 1.001]], np.float32), txn)
            txn.commit()
    report = embstore.verify(path)
    assert not report.ok and len(report.damaged) == 1
    assert f"row {row} has stored norm {float(np.float32(good * 1.001))!r}" in report.damaged[0].message


def _flip(path, chunk: int, byte: int) -> None:
    f = path / "vectors" / "c" / str(chunk) / "0"
    with open(f, "r+b") as fh:
        fh.seek(byte)
        b = fh.read(1)
        fh.seek(byte)
        fh.write(bytes([b[0] ^ 0x04]))


def test_a_damaged_page_inside_a_group_is_named_by_every_scan(path, E, tmp_path):
    _flip(path, 1, 130 * 4096 + 77)  # page 130 of chunk 1: group 2, checked whole first
    msg = r"c/1/0: crc32c mismatch in page 130 \(bytes 532480\.\.536575\)"
    with embstore.open(path) as t:
        np.testing.assert_array_equal(t[CR: CR + 400], E[CR: CR + 400])  # pages 0..117
        with pytest.raises(CorruptStoreError, match=msg):
            t[CR + 443]  # a row on page 130
    with embstore.open(path) as t, pytest.raises(CorruptStoreError, match=msg):
        t.to_numpy()
    with embstore.open(path) as t, pytest.raises(CorruptStoreError, match=msg):
        t[0:V]
    with embstore.open(path) as t, pytest.raises(CorruptStoreError, match=msg):
        embstore.Embedding(t).most_similar(E[0], k=3)
    with pytest.raises(CorruptStoreError, match=msg):
        export_table(path, tmp_path / "out.npy")
    assert not (tmp_path / "out.npy").exists()
    report = embstore.verify(path)
    assert [d.message.split(": ", 1)[1] for d in report.damaged] == [
        f"crc32c mismatch in 1 of its {PAGES} pages (130): the stored rows are damaged"]


def test_damage_in_the_last_short_page_and_in_two_groups(path, E):
    """The last chunk ends inside a page (1,808 rows: 529.7 pages): its last page is checked
    alone; two damaged pages of two groups are both listed."""
    _flip(path, 4, 529 * 4096 + 5)
    _flip(path, 3, 64 * 4096)
    _flip(path, 3, 300 * 4096 + 4095)
    report = embstore.verify(path)
    got = sorted(d.message.split(": ", 1)[1] for d in report.damaged)
    assert got == [f"crc32c mismatch in 1 of its 530 pages (529): the stored rows are damaged",
                   f"crc32c mismatch in 2 of its {PAGES} pages (64, 300): the stored rows are "
                   "damaged"]
    with embstore.open(path) as t:
        with pytest.raises(CorruptStoreError, match=r"c/3/0: crc32c mismatch in page 64 "):
            t.to_numpy()
        with pytest.raises(CorruptStoreError, match=r"c/4/0: crc32c mismatch in page 529 "
                                                    r"\(bytes 2166784\.\.2169599\)"):
            t[V - 1]


def test_ties_across_parts_rank_by_the_lower_id(tmp_path, E):
    """Equal rows in different pieces and parts of a block (scored by whichever thread took
    them): the lower ids win, on the first scan (rows read piece by piece) and the next
    (rows in place), as NumPy's stable sort ranks them."""
    E = E.copy()
    E[[100, 5000, 9000, 9999]] = E[7]
    embstore.save(tmp_path / "t", E, format_version=2, chunk_rows=CR).close()
    En = E / np.linalg.norm(E, axis=1, keepdims=True)
    want = np.argsort(-(En @ En[7]), kind="stable")[:4]
    assert want.tolist() == [7, 100, 5000, 9000]
    with embstore.open(tmp_path / "t") as t:
        emb = embstore.Embedding(t)
        for _ in range(2):  # the first scan reads and checks, the second reads in place
            ids, _scores = emb.most_similar(E[7], k=4)
            np.testing.assert_array_equal(ids, want)
            ids, _scores = emb.most_similar(7, k=3)  # its own row left out
            np.testing.assert_array_equal(ids, [100, 5000, 9000])

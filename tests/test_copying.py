"""Tables that copy: chunks and side arrays sized to what they hold, `cp -a` and
`embstore copy` keep a table's size on disk, `info` counts bytes as `du` does
(docs/copying.md)."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import DestinationExistsError, FormatError
from embstore.store.remote.transfer import copy_table
from embstore.store.rows.layout import CHUNK_TARGET, PAGE, choose_chunk_rows, min_chunk_rows

KEY_ARRAYS = ("key_utf8", "key_offsets", "key_hash", "key_order")


def _files(path):
    """(device, inode) -> (apparent bytes, allocated bytes) of every file once."""
    seen = {}
    for d, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            seen[(st.st_dev, st.st_ino)] = (st.st_size, st.st_blocks * 512)
    return seen


def _du(path) -> int:
    """What `du -s -B1` prints: allocated blocks of every file and folder once."""
    out = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0])


def _apparent(path) -> int:
    return sum(a for a, _ in _files(path).values())


@pytest.mark.parametrize("row_bytes", [4, 8, 200, 256, 1001, 1200, 3 * 1024])
def test_chunk_rows_of_a_known_size_pad_little(row_bytes):
    """A table of a known size: whole pages a chunk, at most ~64 MiB, as few chunks as
    chunks of that size allow (equal ones: big requests on object storage), padding at most
    1/16 of the rows or 1 MiB."""
    low = min_chunk_rows(row_bytes)
    top = choose_chunk_rows(row_bytes)  # the size of a table of unknown rows
    for rows in [1, 37, 1000, 150_000, 262_145, 400_000, 2_000_001, 3 * top + 1]:
        cr = choose_chunk_rows(row_bytes, rows)
        assert cr % low == 0 and (cr * row_bytes) % PAGE == 0, (rows, cr)
        assert cr <= top, (rows, cr)
        pad = -rows % cr
        assert cr == low or pad <= max(rows / 16, (1 << 20) / row_bytes), (rows, cr, pad)
        n = -(-rows // top)  # the fewest chunks of at most ``top`` rows
        even = -(-rows // n // low) * low if rows % n == 0 else -(-(rows // n + 1) // low) * low
        if cr == low or -rows % even <= max(rows // 16, (1 << 20) // row_bytes):
            assert -(-rows // cr) == n, (rows, cr)  # no more chunks than needed
            assert pad < low * n, (rows, cr, pad)  # under a page's worth of rows a chunk
    assert top == max(low, 1 << int(np.log2(CHUNK_TARGET / row_bytes)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A freshly saved 400,000 x 50 float32 table with keys (80 MB of rows)."""
    path = tmp_path_factory.mktemp("copy") / "t.emb"
    E = np.random.default_rng(0).standard_normal((400_000, 50)).astype(np.float32)
    embstore.save(path, E, keys=[f"w{i}" for i in range(len(E))]).close()
    return path, E


@pytest.mark.slow  # a 400,000-row table
def test_a_saved_table_takes_its_rows_and_keys_on_disk_sparse_or_not(saved):
    path, E = saved
    keys = sum(_apparent(path / name) for name in KEY_ARRAYS)
    assert _apparent(path) <= 1.1 * E.nbytes + keys  # the size a copy without holes takes
    assert _du(path) <= 1.1 * E.nbytes + keys
    with embstore.open(path) as t:
        info = t.info()
    assert info["stored_bytes"] == _du(path)  # as du counts
    assert info["saved_bytes"] == 0  # uncompressed rows save nothing


def test_side_arrays_of_an_unknown_count_hold_a_chunk_of_vectors(tmp_path):
    """Rows streamed with no count (a GloVe file): the norms' chunks hold as many rows as
    a chunk of vectors, not 64 MiB of norms (16M rows) beside a small table."""
    dim = 1024
    E = np.random.default_rng(1).standard_normal((2_500, dim)).astype(np.float32)
    with embstore.TableWriter(tmp_path / "t.emb", dim=dim) as w:  # 10 MB: past the 8 MiB
        for a in range(0, len(E), 500):  # the writer holds before choosing a layout
            w.add(E[a:a + 500])
    vchunk = choose_chunk_rows(dim * 4)
    norms = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / "t.emb"
                                                                          / "norms" / "c")
             for f in fs]
    assert norms == [vchunk * 4]  # one chunk of float32 norms, as many rows as vectors'
    stored = zarr.open_array(tmp_path / "t.emb" / "norms", mode="r")[:, 0]
    ref = np.sqrt(np.einsum("ij,ij->i", E.astype(np.float64), E.astype(np.float64)))
    np.testing.assert_array_equal(stored, ref.astype(np.float32))  # read by zarr itself
    with embstore.open(tmp_path / "t.emb") as t:
        np.testing.assert_array_equal(t[:], E)


def _same_table(a, b, E):
    with embstore.open(a) as t, embstore.open(b) as u:
        assert t.info()["version"] == u.info()["version"]
        np.testing.assert_array_equal(u[:], E)
        assert list(u.keys[:3]) == ["w0", "w1", "w2"] and u.ids_of(["w399999"]).tolist() == [
            399_999]
    assert embstore.verify(b).ok


def _links_kept(src, dest):
    """Files hard-linked together in ``src`` are hard-linked together in ``dest``."""
    def groups(root):
        by = {}
        for d, _, fs in os.walk(root):
            for f in fs:
                p = os.path.join(d, f)
                by.setdefault(os.lstat(p).st_ino, set()).add(os.path.relpath(p, root))
        return sorted(sorted(g) for g in by.values())
    return groups(src) == groups(dest)


@pytest.mark.slow  # a 400,000-row table
@pytest.mark.skipif(shutil.which("cp") is None, reason="no cp")
def test_cp_a_keeps_the_size_and_cp_r_doubles_it(saved, tmp_path):
    path, E = saved
    subprocess.run(["cp", "-a", str(path), str(tmp_path / "a.emb")], check=True)
    assert _du(tmp_path / "a.emb") <= 1.1 * _du(path) and _links_kept(path, tmp_path / "a.emb")
    _same_table(path, tmp_path / "a.emb", E)
    subprocess.run(["cp", "-r", str(path), str(tmp_path / "r.emb")], check=True)
    assert _du(tmp_path / "r.emb") > 1.8 * _du(path)  # what docs/copying.md warns of


@pytest.mark.slow  # a 400,000-row table
def test_embstore_copy_local_to_local_keeps_size_links_and_rows(saved, tmp_path):
    path, E = saved
    seen = []
    res = CliRunner().invoke(cli, ["copy", str(path), str(tmp_path / "c.emb")])
    assert res.exit_code == 0, res.output
    assert _du(tmp_path / "c.emb") <= 1.1 * _du(path) and _links_kept(path, tmp_path / "c.emb")
    assert _files(tmp_path / "c.emb").__len__() == _files(path).__len__()
    _same_table(path, tmp_path / "c.emb", E)
    with pytest.raises(DestinationExistsError):
        copy_table(path, tmp_path / "c.emb")
    copy_table(path, tmp_path / "c.emb", overwrite=True,
                        on_progress=lambda done, total: seen.append(done))
    assert seen == sorted(seen) and E.nbytes <= seen[-1] <= _apparent(path)  # data, no holes
    with pytest.raises(FormatError, match="not a table"):
        copy_table(tmp_path, tmp_path / "x")
    assert not (tmp_path / "x").exists()

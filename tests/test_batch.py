"""Batch lookup jobs on one machine: `embstore lookup` and `embstore.batch.lookup_file`."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import embstore
import embstore.batch.io as batch_io
from embstore.batch import lookup_file
from embstore.cli import cli

ROOT = Path(__file__).resolve().parents[1]
V, D = 500, 8


def save_table(tmp_path: Path, array: np.ndarray, kind: str, keys=None) -> str:
    """A table on disk: a store (``embstore.save``, zstd for "store-zstd") or a 2-D ``.npy``."""
    if kind == "npy":
        path = tmp_path / "table.npy"
        np.save(path, array)
        return str(path)
    if not hasattr(embstore, "save"):
        pytest.skip("the on-disk backend is not built yet")
    path = tmp_path / "table"
    compression = "zstd" if kind == "store-zstd" else "none"
    embstore.save(path, array, keys=keys, chunk_rows=16, shard_rows=64,
                  compression=compression).close()
    return str(path)


@pytest.fixture
def table_array(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture(params=["npy", "store"])
def table_path(request, tmp_path, table_array):
    return save_table(tmp_path, table_array, request.param)


@pytest.fixture(params=["npy", "store", "store-zstd"])
def any_table_path(request, tmp_path, table_array):
    """Also a compressed store (the job opens it with a row cache)."""
    return save_table(tmp_path, table_array, request.param)


@pytest.fixture
def runner():
    return CliRunner()


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".partial" in p.name
                  or ".old-" in p.name or ".tmp-" in p.name)


# -- ids in .npy ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dtype,batch_rows", [
    ((23, 4, 3), np.int64, 5), ((1000,), np.uint16, 64), ((7, 9), np.int32, None),
    ((), np.int64, None), ((0,), np.int64, 3), ((6, 0, 2), np.int8, 4),
], ids=["3d-int64", "1d-uint16", "2d-auto", "0d", "empty", "zero-inner"])
def test_npy_to_npy_cli_same_bytes_as_numpy(runner, tmp_path, any_table_path, table_array, rng,
                                            shape, dtype, batch_rows):
    table_path = any_table_path
    ids = rng.integers(0, min(V, np.iinfo(dtype).max), size=shape).astype(dtype)
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "out.npy"
    args = ["lookup", table_path, str(tmp_path / "ids.npy"), str(out), "--quiet"]
    if batch_rows:
        args += ["--batch-rows", str(batch_rows)]
    res = runner.invoke(cli, args)
    assert res.exit_code == 0, res.output
    expected = np.take(table_array, ids, axis=0)
    assert out.read_bytes() == npy_bytes(expected)  # header and data, byte for byte
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("threads", [True, False], ids=["pipeline", "sequential"])
def test_npy_to_zarr_cli_read_back_with_zarr(runner, tmp_path, any_table_path, table_array,
                                             rng, threads):
    table_path = any_table_path
    ids = rng.integers(0, V, size=(101, 6))
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "out.zarr"
    if threads:
        res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "ids.npy"), str(out),
                                  "--batch-rows", "16", "-q"])
        assert res.exit_code == 0, res.output
    else:
        lookup_file(table_path, tmp_path / "ids.npy", out, batch_rows=16, threads=False)
    z = zarr.open_array(out, mode="r")
    assert z.shape == (101, 6, D) and z.dtype == np.float32 and z.chunks == (16, 6, D)
    np.testing.assert_array_equal(z[:], np.take(table_array, ids, axis=0))
    assert sorted(os.listdir(out)) == ["c", "zarr.json"]  # no job markers left inside
    assert leftovers(tmp_path) == []


def test_fortran_order_and_table_object(tmp_path, table_array, rng):
    ids = np.asfortranarray(rng.integers(0, V, size=(30, 7)))
    np.save(tmp_path / "ids.npy", ids)
    summary = lookup_file(embstore.MemoryTable(table_array), tmp_path / "ids.npy",
                          tmp_path / "out.npy", batch_rows=4)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), table_array[ids])
    assert summary["shape"] == (30, 7, D) and summary["blocks"] == 8
    assert summary["ids"] == 210 and summary["resumed_blocks"] == 0


@pytest.mark.parametrize("bad,where,value", [
    (V, (3, 7), V), (-1, (0, 0), -1), (10**9, (11, 2), 10**9)], ids=["too-big", "negative", "huge"])
def test_bad_id_error_names_position_in_whole_input(runner, tmp_path, table_path, rng, bad,
                                                    where, value):
    ids = rng.integers(0, V, size=(12, 9))
    ids[where] = bad
    ids[11, 8] = V + 5  # a later bad id is not the one reported
    np.save(tmp_path / "ids.npy", ids)
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "ids.npy"),
                              str(tmp_path / "out.npy"), "--batch-rows", "2"])
    assert res.exit_code == 1
    assert (f"Error: {tmp_path / 'ids.npy'}: id {value} at position {where} is out of range "
            f"for a table of {V} rows (valid ids: 0..{V - 1})") in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "out.npy").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("oov", ["zero", "unk"])
def test_out_of_range_ids_with_oov(runner, tmp_path, table_path, table_array, rng, oov):
    ids = rng.integers(0, V, size=(40, 3)).astype(np.int32)
    ids[[0, 17, 39], [1, 0, 2]] = [V, -3, 2**31 - 1]
    np.save(tmp_path / "ids.npy", ids)
    args = ["lookup", table_path, str(tmp_path / "ids.npy"), str(tmp_path / "o.npy"),
            "--oov", oov, "--batch-rows", "7", "-q"]
    res = runner.invoke(cli, args + (["--unk-id", "5"] if oov == "unk" else []))
    assert res.exit_code == 0, res.output
    bad = (ids < 0) | (ids >= V)
    expected = table_array[np.where(bad, 5, ids)]
    if oov == "zero":
        expected[bad] = 0
    assert (tmp_path / "o.npy").read_bytes() == npy_bytes(expected)


def test_dask_job_needs_a_table_on_disk(tmp_path, table_array):
    np.save(tmp_path / "ids.npy", np.arange(4))
    with pytest.raises(ValueError, match="a Dask job needs a table on disk"):
        lookup_file(embstore.MemoryTable(table_array), tmp_path / "ids.npy",
                    tmp_path / "o.npy", scheduler="local")
    assert sorted(os.listdir(tmp_path)) == ["ids.npy"]


def test_non_integer_ids_and_non_npy_input(runner, tmp_path, table_path):
    np.save(tmp_path / "f.npy", np.zeros(3, np.float32))
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "f.npy"),
                              str(tmp_path / "o.npy")])
    assert res.exit_code == 1 and "ids must be integers, got an array of float32" in res.output
    (tmp_path / "t.txt").write_text("not an array\n")
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "t.txt"),
                              str(tmp_path / "o.npy")])
    assert res.exit_code == 1 and "not a .npy file of ids (it looks like text" in res.output
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "missing.npy"),
                              str(tmp_path / "o.npy")])
    assert res.exit_code == 2  # click's own usage error
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "f.npy"),
                              str(tmp_path / "o.txt")])
    assert res.exit_code == 1 and "must be a .npy file or a .zarr directory" in res.output


@pytest.mark.parametrize("name", ["out.npy", "out.zarr"])
def test_existing_output_needs_overwrite(runner, tmp_path, table_path, table_array, name):
    ids = np.arange(20).reshape(4, 5)
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / name
    if name.endswith(".zarr"):
        out.mkdir()
        (out / "old").write_text("x")
    else:
        out.write_bytes(b"old")
    args = ["lookup", table_path, str(tmp_path / "ids.npy"), str(out), "-q"]
    res = runner.invoke(cli, args)
    assert res.exit_code == 1
    assert res.output.strip() == f"Error: {out} already exists (pass --overwrite to replace it)"
    with pytest.raises(embstore.DestinationExistsError):
        lookup_file(table_path, tmp_path / "ids.npy", out)
    res = runner.invoke(cli, args + ["--overwrite"])
    assert res.exit_code == 0, res.output
    got = np.load(out) if name.endswith(".npy") else zarr.open_array(out, mode="r")[:]
    np.testing.assert_array_equal(got, table_array[ids])
    assert leftovers(tmp_path) == []


def test_usage_errors(runner, tmp_path, table_path):
    np.save(tmp_path / "ids.npy", np.arange(3))
    base = ["lookup", table_path, str(tmp_path / "ids.npy")]
    for extra, msg in [
        ([str(tmp_path / "o.npy"), "--resume"], "--resume needs a .zarr OUTPUT"),
        ([str(tmp_path / "o.npy"), "--keys", "--oov", "unk"], "--oov unk needs --unk-id"),
        ([str(tmp_path / "o.npy"), "--lengths", str(tmp_path / "l.npy")], "--lengths needs"),
        ([str(tmp_path / "o.npy"), "--batch-rows", "0"], "--batch-rows"),
    ]:
        res = runner.invoke(cli, base + extra)
        assert res.exit_code == 2 and msg in res.output, (extra, res.output)


def test_progress_counts_every_row(tmp_path, table_array):
    seen = []
    np.save(tmp_path / "ids.npy", np.zeros((45, 2), np.int64))
    np.save(tmp_path / "t.npy", table_array)
    lookup_file(tmp_path / "t.npy", tmp_path / "ids.npy", tmp_path / "o.npy", batch_rows=10,
                on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(10, 45), (20, 45), (30, 45), (40, 45), (45, 45)]


# -- keys text -------------------------------------------------------------------------------
KEYS = [f"w{i}" for i in range(V)]
KEY_TEXT = "w3 w1 w4\n\nw1 w5  w9 w2 w6\nw5\tw3 oops w5\n   w8   \n"


def key_reference(table_array, text, oov, unk_id=None):
    lines = text.splitlines()
    width = max(len(line.split()) for line in lines)
    out = np.zeros((len(lines), width, D), np.float32)
    for r, line in enumerate(lines):
        for c, k in enumerate(line.split()):
            if k in KEYS:
                out[r, c] = table_array[KEYS.index(k)]
            elif oov == "unk":
                out[r, c] = table_array[unk_id]
    return out, np.array([len(line.split()) for line in lines], np.int64)


@pytest.mark.parametrize("oov,unk_id", [("zero", None), ("unk", 7)], ids=["zero", "unk"])
@pytest.mark.parametrize("out_name", ["out.npy", "out.zarr"])
def test_keys_library_padding_and_lengths(tmp_path, table_array, oov, unk_id, out_name):
    (tmp_path / "text.txt").write_text(KEY_TEXT)
    table = embstore.MemoryTable(table_array, keys=KEYS)
    out = tmp_path / out_name
    lookup_file(table, tmp_path / "text.txt", out, keys=True, oov=oov, unk_id=unk_id,
                batch_rows=2, lengths=tmp_path / "len.npy")
    expected, lengths = key_reference(table_array, KEY_TEXT, oov, unk_id)
    got = np.load(out) if out_name.endswith(".npy") else zarr.open_array(out, mode="r")[:]
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.load(tmp_path / "len.npy"), lengths)
    assert lengths.tolist() == [3, 0, 5, 4, 1]
    assert not got[1].any() and not got[0, 3:].any()  # an empty line and padding are zero


def test_keys_cli_with_store(runner, tmp_path, table_array):
    path = save_table(tmp_path, table_array, "store", keys=KEYS)
    text = "w10 w11\nw12\n\u00e9t\u00e9 w13 w14\n"
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    res = runner.invoke(cli, ["lookup", path, str(tmp_path / "text.txt"),
                              str(tmp_path / "o.npy"), "--keys", "--oov", "zero", "--lengths",
                              str(tmp_path / "len.npy"), "--batch-rows", "1", "-q"])
    assert res.exit_code == 0, res.output
    expected, lengths = key_reference(table_array, text, "zero")
    assert (tmp_path / "o.npy").read_bytes() == npy_bytes(expected)
    np.testing.assert_array_equal(np.load(tmp_path / "len.npy"), lengths)


def test_keys_oov_error_names_line_and_cleans_up(runner, tmp_path, table_array):
    (tmp_path / "text.txt").write_text(KEY_TEXT)
    table = embstore.MemoryTable(table_array, keys=KEYS)
    with pytest.raises(embstore.KeyNotFoundError,
                       match=r"text.txt, line 4: key 'oops' \(token 3\) is not in the table"):
        lookup_file(table, tmp_path / "text.txt", tmp_path / "o.npy", keys=True, batch_rows=2,
                    lengths=tmp_path / "len.npy")
    assert sorted(os.listdir(tmp_path)) == ["text.txt"]  # no output, no lengths, no temp
    np.save(tmp_path / "t.npy", table_array)  # a table without keys
    res = runner.invoke(cli, ["lookup", str(tmp_path / "t.npy"), str(tmp_path / "text.txt"),
                              str(tmp_path / "o.npy"), "--keys"])
    assert res.exit_code == 1 and "has no keys" in res.output
    with pytest.raises(embstore.InvalidIdError, match="id 500 is out of range"):
        lookup_file(table, tmp_path / "text.txt", tmp_path / "o.npy", keys=True, oov="unk",
                    unk_id=V)


def test_keys_bad_utf8_names_line(tmp_path, table_array):
    (tmp_path / "text.txt").write_bytes(b"w1 w2\nw3 \xff\n")
    with pytest.raises(embstore.FormatError, match=r"text.txt, line 2: not UTF-8"):
        lookup_file(embstore.MemoryTable(table_array, keys=KEYS), tmp_path / "text.txt",
                    tmp_path / "o.npy", keys=True)


# -- resume ----------------------------------------------------------------------------------
KILLER = """
import os, signal, sys
import embstore.batch.io as bio
from embstore.batch import lookup_file

original = bio.ZarrSink.write
written = []

def write(self, i, block):
    original(self, i, block)
    written.append(i)
    if len(written) == 3:  # die mid-job, after three blocks are on disk
        os.kill(os.getpid(), signal.SIGKILL)

bio.ZarrSink.write = write
lookup_file(sys.argv[1], sys.argv[2], sys.argv[3], batch_rows=8)
"""


def test_killed_zarr_job_resumes_from_written_blocks(runner, tmp_path, table_path, table_array,
                                                     rng, monkeypatch):
    ids = rng.integers(0, V, size=(80, 3))  # 10 blocks of 8 rows
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "out.zarr"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", KILLER, table_path, str(tmp_path / "ids.npy"),
                           str(out)], env=env, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not out.exists()
    partial = tmp_path / ".out.zarr.partial"
    assert sorted(os.listdir(partial / ".embstore-lookup" / "done")) == ["0", "1", "2"]

    # a different job refuses to resume from this partial output
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "ids.npy"), str(out),
                              "--batch-rows", "4", "--resume", "-q"])
    assert res.exit_code == 1 and "cannot resume" in res.output
    st = os.stat(tmp_path / "ids.npy")  # so does the same job over an input changed since
    os.utime(tmp_path / "ids.npy", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "ids.npy"), str(out),
                              "--batch-rows", "8", "--resume", "-q"])
    assert res.exit_code == 1 and "cannot resume" in res.output
    os.utime(tmp_path / "ids.npy", ns=(st.st_atime_ns, st.st_mtime_ns))

    computed = []
    original = batch_io.ZarrSink.write

    def spy(self, i, block):
        computed.append(i)
        original(self, i, block)

    monkeypatch.setattr(batch_io.ZarrSink, "write", spy)
    res = runner.invoke(cli, ["lookup", table_path, str(tmp_path / "ids.npy"), str(out),
                              "--batch-rows", "8", "--resume"])
    assert res.exit_code == 0, res.output
    assert sorted(computed) == list(range(3, 10))  # only the missing blocks
    assert "10 blocks, 3 resumed" in res.output
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], table_array[ids])
    assert leftovers(tmp_path) == []


def test_without_resume_a_stale_partial_is_discarded(tmp_path, table_path, table_array,
                                                     monkeypatch):
    ids = np.arange(60).reshape(20, 3)
    np.save(tmp_path / "ids.npy", ids)
    calls = []

    def interrupted(self, i, block):
        calls.append(i)
        if len(calls) == 2:
            raise KeyboardInterrupt
        original(self, i, block)

    original = batch_io.ZarrSink.write
    monkeypatch.setattr(batch_io.ZarrSink, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lookup_file(table_path, tmp_path / "ids.npy", tmp_path / "o.zarr", batch_rows=4,
                    threads=False)
    assert (tmp_path / ".o.zarr.partial").is_dir()  # kept for --resume
    monkeypatch.setattr(batch_io.ZarrSink, "write", original)
    summary = lookup_file(table_path, tmp_path / "ids.npy", tmp_path / "o.zarr", batch_rows=4)
    assert summary["resumed_blocks"] == 0 and summary["blocks"] == 5
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "o.zarr", mode="r")[:],
                                  table_array[ids])
    assert leftovers(tmp_path) == []


def test_open_table_cache_auto(tmp_path, table_array):
    from embstore.batch import open_table

    plain = save_table(tmp_path / "a", table_array, "store")
    packed = save_table(tmp_path / "b", table_array, "store-zstd")
    with open_table(plain) as t:  # rows come straight from the mapped shards
        assert t.cache_info().capacity_bytes == 0
    with open_table(packed) as t:
        assert t.cache_info().capacity_bytes == 64 << 20
    with open_table(plain, cache_bytes="1MiB") as t:
        assert t.cache_info().capacity_bytes == 1 << 20
        np.testing.assert_array_equal(t.lookup([3, 499]), table_array[[3, 499]])

"""Hostile stores and systems: FIFOs and symlinks inside a table, huge metadata, descriptor
limits, full disks; every failure a clean error (CLI: one ``Error:`` line, exit 1)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import CorruptStoreError, ResourceLimitError

E = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
KEYS = [f"k{i}" for i in range(64)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def alarm():
    """Fail instead of hanging: SIGALRM interrupts a blocked ``open`` in the main thread."""
    def boom(*_):
        raise TimeoutError("hung")

    old = signal.signal(signal.SIGALRM, boom)
    yield lambda s: signal.alarm(s)
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _table(path, **kw):  # format 1: its live files are what readers read
    embstore.save(path, E, keys=KEYS, chunk_rows=8, shard_rows=16, format_version=1,
                  **kw).close()
    return path


FIFO_PLACES = ["vectors/c/1/0", "zarr.json", "vectors/zarr.json", "key_hash/c/0",
               "key_utf8/zarr.json", "keys/zarr.json", "keys/c/0"]


@pytest.mark.parametrize("rel", FIFO_PLACES)
def test_a_fifo_in_a_store_is_refused_without_blocking(tmp_path, alarm, rel):
    path = _table(tmp_path / "t")
    os.remove(path / rel)
    os.mkfifo(path / rel)
    alarm(20)  # each of these blocked forever
    report = embstore.verify(path)
    assert not report.ok and rel in str(report) and "regular file" in str(report)
    if rel != "keys/c/0":  # not read by lookups: the key index serves them
        with pytest.raises(CorruptStoreError, match="regular file"):
            with embstore.open(path) as t:
                t.lookup(np.arange(64))
                t.ids_of(KEYS)
    runner = CliRunner()
    for args in (["verify", str(path)], ["info", str(path)],
                 ["export", str(path), str(tmp_path / "out.txt"), "--format", "word2vec"]):
        res = runner.invoke(cli, args)  # done (some read no such file), or one Error line
        assert res.exit_code in (0, 1) and "Traceback" not in res.output, (args, res.output)
        if res.exit_code == 1:
            assert "regular file" in res.output and (args[0] == "verify" or len(
                res.output.strip().splitlines()) == 1), res.output
        else:
            assert args[0] != "verify"


def test_a_shard_symlinked_to_another_table_is_refused(tmp_path):
    a, b = _table(tmp_path / "a"), tmp_path / "b"
    embstore.save(b, E * 0 + 5, keys=KEYS, chunk_rows=8, shard_rows=16,
                  format_version=1).close()
    os.remove(a / "vectors/c/1/0")
    os.symlink(b / "vectors/c/1/0", a / "vectors/c/1/0")  # read silently before
    with embstore.open(a) as t:
        np.testing.assert_array_equal(t.lookup([0, 15]), E[[0, 15]])
        with pytest.raises(CorruptStoreError, match="symbolic link out of the table"):
            t.lookup([16])
    report = embstore.verify(a)
    assert not report.ok and "symbolic link" in str(report)


def test_a_link_to_the_table_is_fine(tmp_path):
    a = _table(tmp_path / "a")
    os.symlink(a, tmp_path / "link")
    with embstore.open(tmp_path / "link") as t:
        np.testing.assert_array_equal(t.lookup(np.arange(64)), E)
        assert t.ids_of(["k40"]).tolist() == [40]
    assert embstore.verify(tmp_path / "link").ok


def test_symlinks_inside_the_table_are_refused(tmp_path):
    # (issue 31: round 3 allowed them; a shard linked to another shard of the same table
    # gave that shard's rows: row 16 read as row 0, every checksum passing)
    a = _table(tmp_path / "a")
    os.remove(a / "vectors/c/1/0")
    os.symlink("../0/0", a / "vectors/c/1/0")
    with embstore.open(a) as t:
        np.testing.assert_array_equal(t.lookup([0, 15, 40]), E[[0, 15, 40]])
        with pytest.raises(CorruptStoreError, match="c/1/0: a symbolic link inside the table"):
            t.lookup([16])
    report = embstore.verify(a)
    assert not report.ok and "vectors/c/1/0: a symbolic link inside the table" in str(report)


def test_huge_metadata_is_refused(tmp_path):
    path = _table(tmp_path / "t")
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["padding"] = "x" * (17 << 20)
    (path / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(CorruptStoreError, match="more than the 16777216"):
        embstore.open(path)
    res = CliRunner().invoke(cli, ["info", str(path)])
    assert res.exit_code == 1 and res.output.startswith("Error:") and "16777216" in res.output


_MANY_SHARDS = textwrap.dedent("""
    import os, resource, sys
    import numpy as np
    import embstore, embstore.keys.mapped as mapped
    from embstore.errors import CorruptStoreError, ResourceLimitError
    path = sys.argv[1]
    n = 1200
    E = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    keys = [f"k{i}" for i in range(n)]
    mapped.CHUNK_BYTES = 256  # a key index of many chunk files too
    embstore.save(path, E, keys=keys, chunk_rows=1, shard_rows=1).close()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    for cache in (0, "1MiB"):
        with embstore.open(path, cache_bytes=cache) as t:  # 1,200 shards, 256 descriptors
            assert np.array_equal(t.lookup(np.arange(n)[::-1]), E[::-1])
            assert t.ids_of(keys).tolist() == list(range(n))
            assert np.array_equal(t.to_numpy(), E)
    t = embstore.open(path, cache_bytes=0)
    t.lookup([0])
    used = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir used
    resource.setrlimit(resource.RLIMIT_NOFILE, (used, hard))  # not one descriptor more
    try:
        t.lookup([5])
    except ResourceLimitError as exc:
        assert not isinstance(exc, CorruptStoreError), exc
        assert "ulimit -n" in str(exc) and exc.errno == 24, exc
        print("OK", exc)
    """)


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_many_shards_under_a_low_descriptor_limit(tmp_path):
    res = subprocess.run([sys.executable, "-c", _MANY_SHARDS, str(tmp_path / "t")],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]
    assert "too many open files (the limit is" in res.stdout


def test_out_of_descriptors_is_a_one_line_cli_error(tmp_path, monkeypatch):
    path = _table(tmp_path / "t")

    def no_fds(*a, **k):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", no_fds)
    res = CliRunner().invoke(cli, ["info", str(path)])
    assert res.exit_code == 1 and res.output.startswith("Error:")
    assert "ulimit -n" in res.output and len(res.output.strip().splitlines()) == 1
    assert not isinstance(res.exception, CorruptStoreError)


_FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from embstore.cli import main
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, resource.RLIM_INFINITY))
    sys.argv = ["embstore"] + sys.argv[1:]
    main()
    """)


@pytest.mark.parametrize("case", ["import", "export-npy", "export-word2vec",
                                  "export-safetensors", "lookup-npy", "lookup-zarr"])
def test_a_failing_write_is_a_one_line_error(tmp_path, case):
    """Writes that fail as on a full disk (here: past RLIMIT_FSIZE, EFBIG)."""
    big = np.random.default_rng(0).standard_normal((4096, 16)).astype(np.float32)
    path = tmp_path / "t"
    embstore.save(path, big, keys=[f"k{i}" for i in range(4096)]).close()
    np.save(tmp_path / "ids.npy", np.arange(4096).reshape(64, 64))
    np.save(tmp_path / "e.npy", big)
    args = {
        "import": ["import", str(tmp_path / "e.npy"), str(tmp_path / "new")],
        "export-npy": ["export", str(path), str(tmp_path / "o.npy")],
        "export-word2vec": ["export", str(path), str(tmp_path / "o.txt"), "--format",
                            "word2vec"],
        "export-safetensors": ["export", str(path), str(tmp_path / "o.safetensors")],
        "lookup-npy": ["lookup", str(path), str(tmp_path / "ids.npy"), str(tmp_path / "o.npy")],
        "lookup-zarr": ["lookup", str(path), str(tmp_path / "ids.npy"),
                        str(tmp_path / "o.zarr")],
    }[case]
    res = subprocess.run([sys.executable, "-c", _FULL_DISK, *args], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 1, res.stderr[-3000:]
    assert res.stderr.startswith("Error:") and "File too large" in res.stderr, res.stderr[-3000:]
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr[-3000:]
    dest = args[3] if args[0] == "lookup" else args[2]
    assert not os.path.exists(dest)  # no DEST that looks complete


def test_enospc_is_a_one_line_error(tmp_path, monkeypatch):
    path = _table(tmp_path / "t")
    import embstore.convert as convert

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "o.npy"))

    monkeypatch.setattr(convert, "export_table", full)
    monkeypatch.setattr("embstore.cli.files.export_table", full)
    res = CliRunner().invoke(cli, ["export", str(path), str(tmp_path / "o.npy")])
    assert res.exit_code == 1 and res.output == f"Error: {tmp_path / 'o.npy'}: No space left on device\n"


@pytest.mark.parametrize("bad", ["1XB", "-5", "99999999999999999999TiB"])
def test_bad_cache_bytes_on_the_command_line(tmp_path, bad):
    path = _table(tmp_path / "t")
    np.save(tmp_path / "ids.npy", np.arange(8))
    res = CliRunner().invoke(cli, ["lookup", str(path), str(tmp_path / "ids.npy"),
                                   str(tmp_path / "o.npy"), "--cache-bytes", bad])
    assert res.exit_code == 1 and res.output.startswith("Error:"), res.output
    assert "byte size" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_zarr_decode_failure_prints_one_line(tmp_path):
    """A foreign (unsharded, zstd) table with damaged chunks, read by zarr-python."""
    import zarr

    path = tmp_path / "foreign"
    g = zarr.open_group(path, mode="w")
    g.attrs["embstore"] = {"format": 1}
    a = g.create_array("vectors", shape=(4096, 8), chunks=(64, 8), dtype="float32",
                       compressors=[zarr.codecs.ZstdCodec()])
    a[:] = np.random.default_rng(0).standard_normal((4096, 8)).astype(np.float32)
    for i in range(0, 64, 3):
        f = path / "vectors" / "c" / str(i) / "0"
        b = bytearray(f.read_bytes())
        b[5:20] = b"x" * 15
        f.write_bytes(bytes(b))
    np.save(tmp_path / "ids.npy", np.arange(4096))
    for args in (["export", str(path), str(tmp_path / "o.npy")],
                 ["lookup", str(path), str(tmp_path / "ids.npy"), str(tmp_path / "o.zarr")]):
        res = subprocess.run([sys.executable, "-c", "from embstore.cli import main; main()",
                              *args], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": ROOT})
        assert res.returncode == 1
        assert res.stderr.startswith("Error:") and "cannot read rows" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]

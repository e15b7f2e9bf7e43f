"""Format 2 (docs/FORMAT.md §3a): rows at a fixed stride in plain Zarr
chunks, a crc32c per 4 KiB page in ``page_crc``; read back against NumPy, zarr-python and
the bytes on disk; damage found by lookups and ``verify``; writes, appends and ``upgrade``."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from google_crc32c import value as crc32c

import embstore
import forked
from embstore import CorruptStoreError, InvalidOptionError
from embstore.cli import cli
from embstore.dtypes import DTYPES
from refreshing import hammer

V, D = 5000, 48  # 192-byte rows: a row may straddle two pages


@pytest.fixture
def E(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture
def v2(tmp_path, E):
    return embstore.save(tmp_path / "t2", E, format_version=2, chunk_rows=1024)


def test_layout_is_rows_at_a_fixed_stride(v2, E, tmp_path):
    """Chunk k is rows k*1024.. back to back, nothing between them, the last one padded."""
    root = tmp_path / "t2"
    meta = json.loads((root / "vectors" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes"]
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [1024, D]
    assert json.loads((root / "zarr.json").read_text())["attributes"]["embstore"]["format"] == 2
    for k in range(5):
        raw = np.fromfile(root / "vectors" / "c" / str(k) / "0", dtype="<f4").reshape(-1, D)
        assert raw.shape == (1024, D)
        n = min(V, (k + 1) * 1024) - k * 1024
        np.testing.assert_array_equal(raw[:n], E[k * 1024: k * 1024 + n])
        assert not raw[n:].any()  # padding: zeros
    assert v2.info()["format"] == 2


def test_page_checksums_are_crc32c_of_each_page(v2, E, tmp_path):
    root = tmp_path / "t2"
    data = (root / "vectors" / "c" / "4" / "0").read_bytes()
    end = (V - 4 * 1024) * D * 4  # committed bytes of the last chunk
    crc_file = (root / "page_crc" / "c" / "4" / "0").read_bytes()
    body = crc_file[:-4]
    assert int.from_bytes(crc_file[-4:], "little") == crc32c(body)
    stored = np.frombuffer(body, "<u4")
    want = [crc32c(data[p * 4096: min((p + 1) * 4096, end)]) for p in range(-(-end // 4096))]
    np.testing.assert_array_equal(stored[: len(want)], want)
    assert not stored[len(want):].any()


@pytest.mark.parametrize("shape", [(), (0,), (7,), (32, 64), (2, 3, 4)], ids=str)
def test_lookups_equal_numpy(v2, E, rng, shape):
    ids = rng.integers(0, V, size=shape)
    np.testing.assert_array_equal(v2[ids], E[ids])
    np.testing.assert_array_equal(v2[100:3000], E[100:3000])
    np.testing.assert_array_equal(v2.to_numpy(), E)


def test_other_zarr_readers_read_it(v2, E, tmp_path):
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "t2" / "vectors", mode="r")[:], E)
    ts = pytest.importorskip("tensorstore")
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file",
                                                 "path": str(tmp_path / "t2" / "vectors")}}).result()
    np.testing.assert_array_equal(arr.read().result(), E)


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_every_storage_dtype_reads_as_format_1_does(tmp_path, E, name):
    """Format 2 stores the same codes: rows read back exactly as a format-1 table of the same
    storage dtype gives them (bfloat16 rounded, int8 quantised), and verify passes."""
    one = embstore.save(tmp_path / "one", E, dtype=name)
    two = embstore.save(tmp_path / "two", E, dtype=name, format_version=2)
    assert two.storage_dtype == name and two.info()["format"] == 2
    np.testing.assert_array_equal(two.to_numpy(), one.to_numpy())
    ids = np.array([0, 4999, 17, 17, 2500])
    np.testing.assert_array_equal(two[ids], one[ids])
    for a, b in zip(two.raw(ids), one.raw(ids)):
        np.testing.assert_array_equal(a, b)
    assert embstore.verify(tmp_path / "two").ok


def test_a_damaged_page_is_found_by_the_lookup_that_reads_it(v2, E, tmp_path):
    path = tmp_path / "t2" / "vectors" / "c" / "1" / "0"
    with open(path, "r+b") as f:  # a byte of page 3 of chunk 1 (rows 1088..1109)
        f.seek(3 * 4096 + 100)
        b = f.read(1)
        f.seek(3 * 4096 + 100)
        f.write(bytes([b[0] ^ 0x10]))
    v2.close()
    with embstore.open(tmp_path / "t2") as t:
        np.testing.assert_array_equal(t[[0, 1024, 4999]], E[[0, 1024, 4999]])  # other pages
        with pytest.raises(CorruptStoreError, match=r"c/1/0: crc32c mismatch in page 3 "
                                                    r"\(bytes 12288\.\.16383\)"):
            t[[1024 + 3 * 4096 // (D * 4) + 1]]
    report = embstore.verify(tmp_path / "t2")
    assert not report.ok and len(report.damaged) == 1
    assert "crc32c mismatch in 1 of its 48 pages (3)" in report.damaged[0].message
    res = CliRunner().invoke(cli, ["verify", str(tmp_path / "t2")])
    assert res.exit_code == 1 and "DAMAGED" in res.output


def test_damaged_checksums_and_short_chunks_are_refused(v2, tmp_path):
    v2.close()
    crc = tmp_path / "t2" / "page_crc" / "c" / "2" / "0"
    data = bytearray(crc.read_bytes())
    data[0] ^= 1
    crc.write_bytes(bytes(data))
    with embstore.open(tmp_path / "t2") as t:
        with pytest.raises(CorruptStoreError, match="page_crc/c/2/0: crc32c mismatch"):
            t[[2048]]
    chunk = tmp_path / "t2" / "vectors" / "c" / "3" / "0"
    with open(chunk, "r+b") as f:
        f.truncate(1000)
    with embstore.open(tmp_path / "t2") as t:
        with pytest.raises(CorruptStoreError, match=r"c/3/0: 1000 bytes, expected 196608"):
            t[[3072]]
    messages = " ".join(d.message for d in embstore.verify(tmp_path / "t2").damaged)
    assert "page_crc/c/2/0: crc32c mismatch" in messages and "1000 bytes" in messages


def test_writes_and_appends(v2, E, tmp_path, rng):
    v2.close()
    want = E.copy()
    with embstore.open(tmp_path / "t2", mode="r+") as t:
        ids = np.array([3, 1500, 1501, 4999])
        new = rng.standard_normal((4, D)).astype(np.float32)
        t.write(ids, new)
        want[ids] = new
        more = rng.standard_normal((2000, D)).astype(np.float32)  # fills chunk 4, adds 5, 6
        assert t.append(more).tolist() == list(range(V, V + 2000))
        want = np.concatenate([want, more])
        np.testing.assert_array_equal(t.to_numpy(), want)
    with embstore.open(tmp_path / "t2") as t:
        assert t.shape == (V + 2000, D)
        np.testing.assert_array_equal(t.to_numpy(), want)
    assert embstore.verify(tmp_path / "t2").ok
    with embstore.open(tmp_path / "t2", mode="r+") as t:  # the written rows are a delta:
        t.compact()                                        # other readers see them now
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "t2" / "vectors", mode="r")[:],
                                  want)


def test_create_makes_zeros_that_can_be_written(tmp_path):
    with embstore.create(tmp_path / "z", (3000, 16), format_version=2) as t:
        assert t.info()["format"] == 2
        np.testing.assert_array_equal(t.to_numpy(), np.zeros((3000, 16), np.float32))
        t.write([5], np.ones((1, 16), np.float32))
    assert embstore.verify(tmp_path / "z").ok
    with embstore.open(tmp_path / "z") as t:
        assert t[5].sum() == 16 and t[6].sum() == 0


def test_exact_search_reads_rows_in_place(v2, E):
    emb = embstore.Embedding(v2)
    ids, scores = emb.most_similar(E[9], k=5)
    En = E / np.linalg.norm(E, axis=1, keepdims=True)
    ref = np.argsort(-(En @ En[9]), kind="stable")[:5]
    np.testing.assert_array_equal(ids, ref)
    np.testing.assert_allclose(scores, (En @ En[9])[ref], rtol=1e-5)


def test_chunks_must_be_whole_pages(tmp_path, E):
    with pytest.raises(InvalidOptionError, match=r"chunk_rows=100 makes chunks of 19200 bytes: "
                                                 r"format 2 needs whole 4 KiB pages \(a "
                                                 r"multiple of 64 rows\)"):
        embstore.save(tmp_path / "bad", E, format_version=2, chunk_rows=100)
    with pytest.raises(InvalidOptionError, match="format_version must be one of"):
        embstore.save(tmp_path / "bad", E, format_version=3)


def test_upgrade_rewrites_a_format_1_table(tmp_path, E):
    keys = [f"w{i}" for i in range(V)]
    embstore.save(tmp_path / "t", E, keys=keys).close()
    with embstore.upgrade(tmp_path / "t") as t:
        assert t.info()["format"] == 2 and type(t.row_source).__name__ == "PagedSource"
        np.testing.assert_array_equal(t.to_numpy(), E)
        assert list(t.keys) == keys
        np.testing.assert_array_equal(t.lookup_keys(["w7", "w4999"]), E[[7, 4999]])
    assert embstore.verify(tmp_path / "t").ok
    res = CliRunner().invoke(cli, ["upgrade", str(tmp_path / "t")])
    assert res.exit_code == 0 and "format 2 (nothing to do)" in res.output


def test_upgrade_leaves_compressed_format2_tables_as_they_are(tmp_path, E):
    embstore.save(tmp_path / "z", E, compression="zstd").close()  # format 2 already
    res = CliRunner().invoke(cli, ["upgrade", str(tmp_path / "z")])
    assert res.exit_code == 0, res.output
    assert "format 2 (nothing to do)" in res.output
    with embstore.open(tmp_path / "z") as t:
        assert t.info()["format"] == 2 and t.info()["compression"] == "zstd"
        np.testing.assert_array_equal(t.to_numpy(), E)


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_refresh_under_readers_and_a_writer_never_breaks_a_lookup(tmp_path, E):
    """Three threads look rows up on one handle while a fourth refreshes it and another
    process appends: every lookup returns the right rows (refresh used to unmap the range a
    gather was reading: a segmentation fault)."""
    embstore.save(tmp_path / "t", E, format_version=2, chunk_rows=1024).close()
    code = ("import numpy as np, embstore\n"
            f"t = embstore.open({str(tmp_path / 't')!r}, mode='r+')\n"
            "for i in range(25):\n"
            "    t.append(np.full((40, 48), i, np.float32))\n")
    writer = forked.start(code)  # (a process of its own, forked: tests/forked.py)
    errors: list[str] = []
    with embstore.open(tmp_path / "t") as t:
        def read(seed: int, done: threading.Event) -> None:
            rng = np.random.default_rng(seed)
            while not done.is_set():
                ids = rng.integers(0, V, 300)
                try:
                    if not np.array_equal(t[ids], E[ids]):
                        errors.append("other rows")
                except Exception as exc:  # noqa: BLE001 - any failure is the finding
                    errors.append(f"{type(exc).__name__}: {exc}")
        hammer(t, read, lambda: writer.wait(timeout=120))
        assert writer.returncode == 0
        t.refresh()
        assert t.shape == (V + 1000, D)
    assert errors == []


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_four_writer_processes_at_once(tmp_path, E):
    """Four processes append and write to one format-2 table at the same time (the writer
    lock serialises them): every append's rows land whole at the ids it was given, every
    write's rows read back, and the table verifies."""
    embstore.save(tmp_path / "t", E, format_version=2, chunk_rows=1024).close()
    code = ("import sys, numpy as np, embstore\n"
            "w = int(sys.argv[1]); out = []\n"
            f"t = embstore.open({str(tmp_path / 't')!r}, mode='r+')\n"
            "for i in range(12):\n"
            "    ids = t.append(np.full((150, 48), 1000 * w + i, np.float32))\n"
            "    out.append(f'{int(ids[0])} {1000 * w + i}')\n"
            "    t.write([w * 100 + i], np.full((1, 48), -(1000 * w + i), np.float32))\n"
            "print(' '.join(out))\n")
    procs = [forked.start(code, w) for w in (1, 2, 3, 4)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    with embstore.open(tmp_path / "t") as t:
        assert t.shape == (V + 4 * 12 * 150, D)
        got = t.to_numpy()
    for out in outs:
        pairs = out.split()
        for first, value in zip(pairs[::2], pairs[1::2]):
            np.testing.assert_array_equal(got[int(first): int(first) + 150], float(value))
    for w in (1, 2, 3, 4):
        for i in range(12):
            assert (got[w * 100 + i] == -(1000 * w + i)).all()
    untouched = np.setdiff1d(np.arange(V), [w * 100 + i for w in (1, 2, 3, 4)
                                            for i in range(12)])
    np.testing.assert_array_equal(got[untouched], E[untouched])
    assert embstore.verify(tmp_path / "t").ok

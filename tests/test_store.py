"""The on-disk backend: layouts, other Zarr readers, writers, updates, concurrency."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import zarr

import embstore
import embstore.store.shard.arena
from embstore import DestinationExistsError, ReadOnlyError, ShapeMismatchError
from embstore import TableWriter

LAYOUTS = {
    "default": {},
    "small": {"chunk_rows": 4, "shard_rows": 16},
    "one-row-chunks": {"chunk_rows": 1, "shard_rows": 8},
    "zstd": {"compression": "zstd", "chunk_rows": 8, "shard_rows": 32},
    "blosc": {"compression": "blosc", "chunk_rows": 16, "shard_rows": 64},
}


@pytest.fixture
def E(rng):
    return rng.standard_normal((203, 6)).astype(np.float32)


@pytest.fixture
def keys():
    return [f"k{i}" for i in range(200)] + ["", "naïve", "東京"]


@pytest.mark.parametrize("layout", list(LAYOUTS.values()), ids=list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_round_trip_and_zarr_python(tmp_path, E, keys, layout, dtype):
    A = E.astype(dtype)
    t = embstore.save(tmp_path / "t", A, keys=keys, **layout)
    ids = np.random.default_rng(3).integers(0, len(A), size=(9, 11))
    np.testing.assert_array_equal(t[ids], A[ids])
    np.testing.assert_array_equal(t.to_numpy(), A)
    assert t.dtype == A.dtype and t.shape == A.shape and list(t.keys) == keys
    t.close()
    g = zarr.open_group(str(tmp_path / "t"), mode="r")
    np.testing.assert_array_equal(g["vectors"][:], A)
    assert list(g["keys"][:]) == keys
    assert g.attrs["embstore"]["format"] == 2  # every layout: format 2, versioned
    if layout:  # a sharded layout asked for: a crc32c per chunk
        codecs = [c["name"] for c in g["vectors"].metadata.to_dict()["codecs"][0][
            "configuration"]["codecs"]]
        assert codecs[-1] == "crc32c"
    else:  # by default: rows at a fixed stride, page checksums beside them
        assert [c["name"] for c in g["vectors"].metadata.to_dict()["codecs"]] == ["bytes"]
        assert "page_crc" in dict(g.members())


@pytest.mark.parametrize("layout", ["default", "small", "zstd", "blosc"])
def test_tensorstore_reads_vectors(tmp_path, E, layout):
    ts = pytest.importorskip("tensorstore")
    embstore.save(tmp_path / "t", E, **LAYOUTS[layout]).close()
    store = ts.open({"driver": "zarr3", "kvstore": {
        "driver": "file", "path": str(tmp_path / "t" / "vectors")}}, read=True).result()
    np.testing.assert_array_equal(store.read().result(), E)


def test_default_layout_is_documented(tmp_path, rng):
    E = rng.standard_normal((10, 16)).astype(np.float32)
    t = embstore.save(tmp_path / "t", E)  # format 2: one chunk of a page's worth of rows
    assert t.layout["format"] == 2 and t.layout["chunk_rows"] == 64
    t.close()
    t = embstore.save(tmp_path / "t1", E, format_version=1)
    assert t.layout["chunk_rows"] == 10 and t.layout["shard_rows"] == 10  # clipped to size
    from embstore.store.codecs import choose_layout
    assert choose_layout(256, "float32") == (1, 131072)  # docs/FORMAT.md §3b
    assert choose_layout(64, "float32") == (4, 524288)  # 1 KiB // 256 B -> 4 rows
    assert choose_layout(4096, "float32") == (1, 8192)  # at least one row
    assert choose_layout(300, "float32") == (1, 65536)
    assert choose_layout(16, "float32", 1000) == (16, 1008)  # shards of whole chunks
    assert choose_layout(4, "float64", shard_rows=48) == (16, 48)
    assert choose_layout(256, "float32", compression="zstd") == (1, 131072)
    assert choose_layout(64, "float32", compression="blosc") == (4, 524288)


def test_create_then_write_persists(tmp_path, rng):
    t = embstore.create(tmp_path / "t", shape=(50, 4), shard_rows=16, chunk_rows=4)
    assert t.writable and t.shape == (50, 4)
    np.testing.assert_array_equal(t.to_numpy(), np.zeros((50, 4), np.float32))
    v = rng.standard_normal((3, 4)).astype(np.float32)
    t.write([49, 0, 17], v)
    t.append(np.ones((2, 4)))
    t.close()
    ref = np.zeros((52, 4), np.float32)
    ref[[49, 0, 17]] = v
    ref[50:] = 1
    with embstore.open(tmp_path / "t") as r:
        np.testing.assert_array_equal(r.to_numpy(), ref)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "t" / "vectors"))[:], ref)


def test_create_with_keys_and_append(tmp_path):
    t = embstore.create(tmp_path / "t", shape=(3, 2), keys=["a", "b", "c"])
    t.append(np.full((1, 2), 7.0), keys=["d"])
    t.close()
    with embstore.open(tmp_path / "t") as r:
        assert list(r.keys) == ["a", "b", "c", "d"]
        np.testing.assert_array_equal(r.lookup_keys(["d", "a"]), [[7, 7], [0, 0]])
    with pytest.raises(ShapeMismatchError, match="'a' at row 2 repeats"):
        embstore.create(tmp_path / "u", shape=(3, 2), keys=["a", "b", "a"])
    assert not (tmp_path / "u").exists()


@pytest.mark.parametrize("layout", ["small", "zstd"])
def test_updates_persist_after_reopen(tmp_path, E, keys, layout):
    embstore.save(tmp_path / "t", E, keys=keys, **LAYOUTS[layout]).close()
    ref = E.copy()
    with embstore.open(tmp_path / "t", mode="r+") as t:
        t.write([[5, 100], [5, 202]], np.arange(24, dtype=np.float32).reshape(2, 2, 6))
        ref[100], ref[5], ref[202] = np.arange(6, 12), np.arange(12, 18), np.arange(18, 24)
        new = np.full((40, 6), 3.5, np.float32)
        np.testing.assert_array_equal(t.append(new, keys=[f"n{i}" for i in range(40)]),
                                      np.arange(203, 243))
        ref = np.concatenate([ref, new])
    with embstore.open(tmp_path / "t") as t:
        np.testing.assert_array_equal(t.to_numpy(), ref)
        assert t.ids_of("n39") == 242 and t.keys[202] == "東京"
    assert embstore.verify(tmp_path / "t").ok
    with embstore.open(tmp_path / "t", mode="r+") as t:  # other Zarr readers see the rows
        t.compact()  # as of the last compaction (deltas are embstore's: docs/FORMAT.md)
    g = zarr.open_group(str(tmp_path / "t"), mode="r")
    np.testing.assert_array_equal(g["vectors"][:], ref)
    assert g["keys"].shape == (243,)


def test_read_only_refuses_writes(tmp_path, E):
    embstore.save(tmp_path / "t", E).close()
    t = embstore.open(tmp_path / "t")
    with pytest.raises(ReadOnlyError, match="read-only"):
        t.write([1], np.zeros((1, 6)))
    with pytest.raises(ReadOnlyError):
        t.append(np.zeros((1, 6)))
    np.testing.assert_array_equal(embstore.open(tmp_path / "t").to_numpy(), E)
    with pytest.raises(ValueError, match="mode"):
        embstore.open(tmp_path / "t", mode="w")


def test_save_from_memmap_and_from_tables(tmp_path, E, keys):
    np.save(tmp_path / "e.npy", E)
    mm = np.load(tmp_path / "e.npy", mmap_mode="r")
    a = embstore.save(tmp_path / "a", mm, chunk_rows=8, shard_rows=64)
    np.testing.assert_array_equal(a.to_numpy(), E)
    b = embstore.save(tmp_path / "b", embstore.MemoryTable(E, keys=keys), compression="zstd")
    assert list(b.keys) == keys
    c = embstore.save(tmp_path / "c", b, chunk_rows=2, shard_rows=4, dtype="float64")
    assert c.dtype == np.float64 and list(c.keys) == keys
    np.testing.assert_array_equal(c.to_numpy(), E.astype(np.float64))


def test_save_streams_in_blocks(tmp_path, E, monkeypatch):
    import embstore.store.build as zt
    monkeypatch.setattr(zt, "_SAVE_BLOCK_BYTES", 24 * 10)  # 10 rows a block
    seen = []
    real_add = TableWriter.add

    def add(self, vectors, keys=None):
        seen.append(len(vectors))
        return real_add(self, vectors, keys)

    monkeypatch.setattr(TableWriter, "add", add)
    t = embstore.save(tmp_path / "t", E, chunk_rows=4, shard_rows=16)
    assert max(seen) == 10 and sum(seen) == len(E)
    np.testing.assert_array_equal(t.to_numpy(), E)


def test_writer_drops_duplicates_and_counts(tmp_path, rng):
    v = rng.standard_normal((6, 3)).astype(np.float32)
    with TableWriter(tmp_path / "t", dim=3, has_keys=True, attrs={"source": "x"}) as w:
        assert w.add(v[:4], ["a", "b", "a", "c"]) == 3
        assert w.add(v[4:], ["c", "d"]) == 1
        assert (w.rows, w.duplicates) == (4, 2)
    with embstore.open(tmp_path / "t") as t:
        np.testing.assert_array_equal(t.to_numpy(), v[[0, 1, 3, 5]])
        assert list(t.keys) == ["a", "b", "c", "d"]
        assert t.info()["attributes"] == {"source": "x", "created_by": "embstore 0.1.0"}


def test_writer_rejects_non_finite(tmp_path):
    w = TableWriter(tmp_path / "t", dim=2)
    w.add(np.ones((3, 2)))
    with pytest.raises(ShapeMismatchError, match="input row 4 \\(row 1 of this block\\)"):
        w.add(np.array([[1, 2], [np.inf, 0]]))
    w.abort()
    with pytest.raises(ShapeMismatchError, match="input row 0 .* after conversion to float16"):
        with TableWriter(tmp_path / "h", dim=1, dtype="float16") as h:
            h.add(np.array([[1e6]]))
    assert os.listdir(tmp_path) == []


def test_writer_abort_and_exception_leave_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with TableWriter(tmp_path / "t", dim=2) as w:
            w.add(np.ones((5, 2)))
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_writer_large_stream_spans_shards(tmp_path, rng):
    E = rng.standard_normal((1000, 3)).astype(np.float32)
    with TableWriter(tmp_path / "t", dim=3, chunk_rows=8, shard_rows=64) as w:
        for s in range(0, 1000, 77):
            w.add(E[s: s + 77])
    t = embstore.open(tmp_path / "t")
    np.testing.assert_array_equal(t.to_numpy(), E)
    assert len(os.listdir(tmp_path / "t" / "vectors" / "c")) == 16


def test_destination_exists_and_overwrite(tmp_path, E):
    embstore.save(tmp_path / "t", E).close()
    with pytest.raises(DestinationExistsError, match=str(tmp_path / "t")):
        embstore.save(tmp_path / "t", E)
    with pytest.raises(DestinationExistsError):
        embstore.create(tmp_path / "t", shape=(2, 2))
    w = TableWriter(tmp_path / "t", dim=6, overwrite=True)
    w.add(E[:5] * 2)
    # the old table is intact while the new one is being written
    np.testing.assert_array_equal(embstore.open(tmp_path / "t").to_numpy(), E)
    w.commit()
    np.testing.assert_array_equal(embstore.open(tmp_path / "t").to_numpy(), E[:5] * 2)
    assert sorted(os.listdir(tmp_path)) == ["t"]


def test_not_a_table(tmp_path):
    with pytest.raises(embstore.NotATableError, match="nothing: no such table"):
        embstore.open(tmp_path / "nothing")
    (tmp_path / "d").mkdir()
    with pytest.raises(embstore.NotATableError, match="is a directory but not an embstore "
                       "table \\(it has no zarr.json\\)"):
        embstore.open(tmp_path / "d")
    with pytest.raises(embstore.NotATableError, match="not an embstore table"):
        embstore.verify(tmp_path / "d")  # not "DAMAGED": there is nothing to verify
    np.save(tmp_path / "ref.npy", np.zeros((2, 2), np.float32))
    with pytest.raises(embstore.NotATableError, match=r"ref.npy: is a file, not an embstore "
                       r"table .*MemoryTable\(np.load"):
        embstore.open(tmp_path / "ref.npy")
    g = zarr.open_group(str(tmp_path / "v2"), mode="w", attributes={"embstore": {"format": 3}})
    g.create_array("vectors", shape=(1, 1), dtype="f4")
    with pytest.raises(embstore.FormatError, match=r"format 3 is not supported \(this version "
                       r"reads formats 1 and 2\)"):
        embstore.open(tmp_path / "v2")


@pytest.mark.parametrize("kind", ["unsharded", "sharded-no-crc", "big-endian"])
def test_foreign_layouts(tmp_path, E, kind):
    from zarr.codecs import BytesCodec
    g = zarr.open_group(str(tmp_path / "t"), mode="w")
    if kind == "unsharded":
        a = g.create_array("vectors", shape=E.shape, dtype="f4", chunks=(7, 3))
    elif kind == "sharded-no-crc":
        a = g.create_array("vectors", shape=E.shape, dtype="f4", chunks=(5, 6),
                           shards=(20, 6), compressors=None)
    else:
        a = g.create_array("vectors", shape=E.shape, dtype=">f4", chunks=(5, 6),
                           serializer=BytesCodec(endian="big"), compressors=None)
    a[:] = E
    t = embstore.open(tmp_path / "t", mode="r+")
    assert t.layout["fast_path"] == (kind == "sharded-no-crc")
    ids = np.random.default_rng(0).integers(0, len(E), (4, 9))
    np.testing.assert_array_equal(t[ids], E[ids])
    t.write([3], np.ones((1, 6)))
    t.append(np.full((2, 6), 2.0))
    ref = np.concatenate([E, np.full((2, 6), 2, np.float32)])
    ref[3] = 1
    np.testing.assert_array_equal(embstore.open(tmp_path / "t").to_numpy(), ref)


def test_reader_opened_before_append_keeps_old_size(tmp_path, E):
    embstore.save(tmp_path / "t", E, chunk_rows=4, shard_rows=16).close()
    reader = embstore.open(tmp_path / "t")
    before = reader[np.arange(len(E))]
    with embstore.open(tmp_path / "t", mode="r+") as w:
        w.append(np.ones((30, 6)))
        w.write([200], np.zeros((1, 6)))
    assert len(reader) == len(E)
    np.testing.assert_array_equal(reader[np.arange(len(E))], before)  # its cached rows
    reader.refresh()
    assert len(reader) == len(E) + 30
    assert (reader[200] == 0).all() and (reader[len(E) + 29] == 1).all()


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_threads_read_while_a_thread_writes(tmp_path):
    V, D = 256, 8
    base = np.repeat(np.arange(V, dtype=np.float32)[:, None], D, axis=1)
    embstore.save(tmp_path / "t", base, chunk_rows=4, shard_rows=32).close()
    t = embstore.open(tmp_path / "t", mode="r+", cache_bytes="8KiB")
    stop = threading.Event()
    bad = []

    def read(seed):
        r = np.random.default_rng(seed)
        while not stop.is_set():
            ids = r.integers(0, V, 64)
            rows = t[ids]
            whole = (rows == rows[:, :1]).all(axis=1)  # never a torn row
            ok = (rows[:, 0] == ids) | (rows[:, 0] == ids + 1000)
            if not (whole.all() and ok.all()):
                bad.append(rows)

    threads = [threading.Thread(target=read, args=(s,)) for s in range(3)]
    for th in threads:
        th.start()
    for s in range(0, V, 16):
        ids = np.arange(s, s + 16)
        t.write(ids, base[ids] + 1000)
    stop.set()
    for th in threads:
        th.join()
    assert bad == []
    np.testing.assert_array_equal(t.to_numpy(), base + 1000)  # no stale row after writes
    np.testing.assert_array_equal(t[np.arange(V)], base + 1000)


READER = textwrap.dedent("""
    import sys, time, numpy as np, embstore
    path, D, with_keys = sys.argv[1], int(sys.argv[2]), sys.argv[4] == "keys"
    sizes, deadline = [], time.time() + 30
    while time.time() < deadline:
        if len(sizes) == 1:
            print("ready", flush=True)  # the writer starts after our first snapshot
        with embstore.open(path, cache_bytes=0) as t:
            V = len(t)
            rows = t[np.arange(V)]
            assert (rows == np.arange(V, dtype=np.float32)[:, None]).all(), V
            if with_keys:
                assert len(t.keys) >= V and t.keys[V - 1] == f"k{V - 1}"
                assert t.ids_of(f"k{V - 1}") == V - 1
        sizes.append(V)
        if V >= int(sys.argv[3]):
            break
    assert sizes == sorted(sizes), sizes
    print(len(set(sizes)), flush=True)
""")


@pytest.mark.parametrize("with_keys", [False, True], ids=["vectors", "keys"])
def test_reader_process_while_writer_appends(tmp_path, with_keys):
    D, V0, step, n = 4, 50, 25, 24
    row = lambda a, b: np.repeat(np.arange(a, b, dtype=np.float32)[:, None], D, axis=1)  # noqa
    key = (lambda a, b: [f"k{j}" for j in range(a, b)]) if with_keys else (lambda a, b: None)
    embstore.save(tmp_path / "t", row(0, V0), keys=key(0, V0), chunk_rows=4,
                  shard_rows=32).close()
    final = V0 + step * n
    proc = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path / "t"), str(D),
                             str(final), "keys" if with_keys else "-"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    with embstore.open(tmp_path / "t", mode="r+") as t:
        for i in range(n):
            a = V0 + i * step
            t.append(row(a, a + step), keys=key(a, a + step))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert int(out) >= 2  # the reader saw the table grow while staying consistent


@pytest.mark.parametrize("joined", [True, False], ids=["joined-map", "per-shard-maps"])
def test_both_uncompressed_read_paths(tmp_path, rng, monkeypatch, joined):
    """The joined mapping (Linux) and the portable per-shard path give the same rows."""
    if not joined:
        monkeypatch.setattr(embstore.store.shard.arena, "available", lambda: False)
    E = rng.standard_normal((300, 5)).astype(np.float32)
    t = embstore.create(tmp_path / "t", shape=(300, 5), chunk_rows=4, shard_rows=32,
                        cache_bytes=0)
    t.write(np.arange(0, 200), E[:200])  # shards 7..9 stay absent files: zeros
    ref = E.copy()
    ref[200:] = 0
    assert (t.row_source.reader._jm_ok is joined) or not embstore.store.shard.arena.available()
    ids = rng.integers(0, 300, size=(7, 50))
    np.testing.assert_array_equal(t[ids], ref[ids])
    out = np.empty((7, 50, 5), np.float32)
    np.testing.assert_array_equal(t.lookup(ids, out=out), ref[ids])
    t.write([3, 250], np.ones((2, 5)))  # rewrites shards 0 and 7 under a live mapping
    ref[[3, 250]] = 1
    np.testing.assert_array_equal(t[ids], ref[ids])
    np.testing.assert_array_equal(t.to_numpy(), ref)
    t.close()
    with pytest.raises(embstore.EmbstoreError, match="closed"):
        t[0]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "int8", "float16"])
def test_save_refuses_non_finite_rows_and_keeps_huge_finite_ones(tmp_path, dtype):
    """Rows are checked through their norms, then exactly where a norm is not finite: a
    float64 row of 1e200 (its squares overflow, its norm is inf) is legal data."""
    big = 1e200 if dtype == "float64" else 6e4 if dtype == "float16" else 3e38
    rows = np.ones((300, 4), dtype="float64" if dtype == "float64" else "float32")
    rows[7] = big
    if dtype in ("float64", "float32", "int8"):
        with embstore.save(tmp_path / "ok", rows, dtype=dtype) as t:
            assert np.isfinite(t[7]).all() and t[7][0] == rows[7][0].astype(t.dtype) or \
                dtype == "int8"
    for bad in (np.nan, np.inf, -np.inf):
        r = rows.copy()
        r[7] = 1.0
        r[123, 2] = bad
        with pytest.raises(embstore.ShapeMismatchError, match=r"input row 123 \(row 123 of "
                                                              r"this block\) holds NaN or "
                                                              r"infinity"):
            embstore.save(tmp_path / f"bad{bad}", r, dtype=dtype)
        assert not (tmp_path / f"bad{bad}").exists()

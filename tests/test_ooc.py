"""The cold read path (issue 16): batches whose pages are not resident are prefetched
(embstore/store/shard/prefetch.py) and read exactly; results never differ from NumPy's.

Cold is forced by making the residency check say so (deterministic), and once for real
by evicting a table's pages and counting the bytes read (/proc/self/io).  No timing here:
timings live in benchmarks/ (scenario ``ooc``).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import embstore
from embstore.store.shard import prefetch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import evict, read_bytes  # noqa: E402

needs_linux = pytest.mark.skipif(not prefetch.available(), reason="prefetch needs Linux")


@pytest.fixture
def forced_cold(monkeypatch):
    """Every batch is found cold; counts the ranges asked for."""
    asked = []
    real = prefetch.willneed

    def spy(starts, stops):
        asked.append(int(starts.size))
        return real(starts, stops)

    monkeypatch.setattr(prefetch, "is_cold", lambda addrs, k=16: True)
    monkeypatch.setattr(prefetch, "willneed", spy)
    return asked


def _table(tmp_path, rows=5000, dim=24, **layout):
    E = np.random.default_rng(3).standard_normal((rows, dim)).astype(np.float32)
    embstore.save(tmp_path / "t", E, **layout).close()
    return tmp_path / "t", E


@needs_linux
@pytest.mark.parametrize("layout", [{}, {"chunk_rows": 4, "shard_rows": 64},
                                    {"chunk_rows": 1, "shard_rows": 512},
                                    {"compression": "zstd", "chunk_rows": 4, "shard_rows": 256}])
def test_cold_batches_equal_numpy(tmp_path, forced_cold, layout):
    path, E = _table(tmp_path, **layout)
    t = embstore.open(path, cache_bytes=0)
    rng = np.random.default_rng(0)
    for n in (1, 7, 100, 3000):
        ids = rng.integers(0, len(E), n)
        np.testing.assert_array_equal(t.lookup(ids), E[ids])
    np.testing.assert_array_equal(t[100:2100], E[100:2100])  # a scan: few long runs
    np.testing.assert_array_equal(t.to_numpy(), E)
    assert forced_cold, "the prefetch was never asked for"
    assert t._source.reads_cold()
    t.close()


@needs_linux
def test_mixed_resident_and_cold_batches(tmp_path, monkeypatch):
    """Alternate cold and warm verdicts over the same table: checked chunks, unchecked
    chunks, duplicates and rows of the same chunk all come back exact."""
    path, E = _table(tmp_path, chunk_rows=4, shard_rows=64)
    verdict = iter([True, False] * 50)
    monkeypatch.setattr(prefetch, "is_cold", lambda addrs, k=16: next(verdict))
    t = embstore.open(path, cache_bytes=0)
    rng = np.random.default_rng(1)
    for _ in range(20):
        ids = np.concatenate([rng.integers(0, len(E), 1200), rng.integers(0, 50, 30)])
        np.testing.assert_array_equal(t.lookup(ids), E[ids])
    t.close()


@needs_linux
def test_absent_shards_and_chunks_read_as_zeros_cold(tmp_path, forced_cold):
    t = embstore.create(tmp_path / "z", (4096, 8), chunk_rows=4, shard_rows=256, cache_bytes=0)
    want = np.zeros((4096, 8), dtype=np.float32)
    ids = np.array([3, 700, 701, 2050])
    vals = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    t.write(ids, vals)
    want[ids] = vals
    t.close()
    t = embstore.open(tmp_path / "z", cache_bytes=0)
    q = np.random.default_rng(2).integers(0, 4096, 2000)
    q[:4] = ids
    np.testing.assert_array_equal(t.lookup(q), want[q])
    t.close()


@needs_linux
def test_damaged_chunk_raises_on_the_cold_path(tmp_path, forced_cold):
    path, E = _table(tmp_path, rows=4096, dim=8, chunk_rows=4, shard_rows=1024)
    shard = path / "vectors" / "c" / "1" / "0"
    data = bytearray(shard.read_bytes())
    chunk = 5  # rows 1024 + 20 .. 1024 + 23
    data[chunk * (4 * 8 * 4 + 4) + 7] ^= 0x40
    shard.write_bytes(bytes(data))
    t = embstore.open(path, cache_bytes=0)
    ok = np.arange(0, 1000, 3)
    np.testing.assert_array_equal(t.lookup(ok), E[ok])  # shard 0 is fine
    bad = np.concatenate([np.arange(1100, 1200), [1024 + 21]])
    with pytest.raises(embstore.CorruptStoreError, match=r"chunk 5: crc32c mismatch") as ei:
        t.lookup(bad)
    assert str(shard) in str(ei.value)
    with pytest.raises(embstore.CorruptStoreError):  # still refused the second time
        t.lookup(bad)
    np.testing.assert_array_equal(t.lookup(np.arange(1100, 1200)), E[1100:1200])
    t.close()


@needs_linux
def test_threads_share_the_cold_path(tmp_path, forced_cold):
    path, E = _table(tmp_path, rows=20000, dim=16, chunk_rows=4, shard_rows=1024)
    t = embstore.open(path, cache_bytes="1MiB")
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(15):
                ids = rng.integers(0, len(E), 500)
                if not np.array_equal(t.lookup(ids), E[ids]):
                    errors.append(seed)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    t.close()


@needs_linux
def test_willneed_merges_ranges_into_page_runs():
    buf = np.zeros(16 * prefetch.PAGE, dtype=np.uint8)
    b = buf.ctypes.data - buf.ctypes.data % prefetch.PAGE + prefetch.PAGE
    p = prefetch.PAGE
    starts = np.array([b, b + 100, b + 2 * p + 5, b + p - 1, b + 6 * p])
    stops = np.array([b + 10, b + 200, b + 2 * p + 9, b + p + 1, b + 8 * p])
    # pages 0, 0, 2, 0-1, 6-7: runs 0-2 and 6-7
    assert prefetch.willneed(starts, stops) == 2
    assert prefetch.willneed(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == 0
    assert prefetch.is_cold(np.array([b])) is False  # our own touched memory is resident
    # a run longer than RUN_PAGES goes as pieces (the kernel reads one read-ahead window
    # per advice): 2.5 runs' worth of pages, 3 pieces
    run = prefetch.RUN_PAGES * p
    big = np.zeros(3 * run + p, dtype=np.uint8)
    c = big.ctypes.data - big.ctypes.data % p + p
    assert prefetch.willneed(np.array([c]), np.array([c + 5 * run // 2])) == 3


def test_row_cache_does_not_reread_hits_when_reads_are_cold(tmp_path):
    path, E = _table(tmp_path, rows=5000, dim=8, chunk_rows=4, shard_rows=1024)
    t = embstore.open(path, cache_bytes="1MiB")
    hot = np.arange(10)
    t[hot]
    t[hot]
    seen = []
    real = t._source.reader.take

    def take(ids):
        seen.append(ids.size)
        return real(ids)

    t._source.reader.take = take
    t._source.reader.cold_hint = True  # as after a batch found not resident
    ids = np.concatenate([hot, np.arange(100, 400)])
    real_gather = t._source.reader.gather

    def gather(ids, out):
        seen.append(ids.size)
        t._source.reader.cold_hint = True  # a real read would say so again
        return real_gather(ids, out)

    t._source.reader.gather = gather
    np.testing.assert_array_equal(t[ids], E[ids])
    assert seen == [300]  # only the misses were read
    t.close()


def _io_counts() -> bool:
    return read_bytes() is not None


def _cold_table(tmp_path, rows: int, dim: int, compression: str):
    """``(table, E, ids)``: a saved table of random rows opened without a row cache (shard
    indexes read, as in a live process), then its pages evicted; 1,000 uniform ids.  Skips
    where the file system does not count reads (tmpfs)."""
    E = np.random.default_rng(5).standard_normal((rows, dim)).astype(np.float32)
    embstore.save(tmp_path / "big", E, compression=compression).close()
    t = embstore.open(tmp_path / "big", cache_bytes=0)
    t.lookup(np.arange(0, rows, 4096))  # every shard index read once
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(1 << 20))
    evict([probe])
    before = read_bytes()
    probe.read_bytes()
    if read_bytes() - before < (1 << 19):
        t.close()
        pytest.skip("this file system does not count reads (tmpfs?)")
    ids = np.random.default_rng(6).integers(0, rows, 1000)
    evict([tmp_path / "big"])
    return t, E, ids


@needs_linux
@pytest.mark.skipif(not _io_counts(), reason="/proc/self/io is not available")
def test_cold_batch_reads_about_a_page_per_id(tmp_path):
    """64 MiB table (default layout), pages evicted, 1,000 uniform ids: about one page per
    id is read from disk (the whole table, or 8 MiB a fault, without the cold path)."""
    t, E, ids = _cold_table(tmp_path, 262144, 64, "none")
    before = read_bytes()
    out = t.lookup(ids)
    used = read_bytes() - before
    np.testing.assert_array_equal(out, E[ids])
    print(f"1,000 cold ids read {used / 2**20:.2f} MiB")
    assert used <= 1000 * 8192, f"{used / 2**20:.1f} MiB read for 1,000 ids"
    t.close()


@needs_linux
@pytest.mark.skipif(not _io_counts(), reason="/proc/self/io is not available")
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_cold_batch_faults_no_page_in_one_at_a_time(tmp_path, compression):
    """Pages evicted, 1,000 uniform ids: the batch's pages are all asked for before any is
    read, so reading them takes (almost) no major fault, one serial disk read each.  (The
    zstd path read each chunk's stored checksum before its prefetch: a fault per chunk.)"""
    import resource
    t, E, ids = _cold_table(tmp_path, 65536, 256, compression)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    out = t.lookup(ids)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - f0
    np.testing.assert_array_equal(out, E[ids])
    assert faults < 100, f"{faults} major faults for 1,000 cold ids"
    t.close()


def test_zstd_many_chunks_absent_and_damaged(tmp_path):
    """The batched zstd decode (>= 64 chunks a call): absent chunks are zeros, a damaged
    chunk raises CorruptStoreError naming its shard and chunk."""
    t = embstore.create(tmp_path / "z", (8192, 16), chunk_rows=4, shard_rows=1024,
                        compression="zstd", cache_bytes=0)
    rng = np.random.default_rng(4)
    want = np.zeros((8192, 16), dtype=np.float32)
    ids = np.unique(rng.integers(0, 3000, 1500))  # shards 0-2 written, 3-7 absent
    want[ids] = rng.standard_normal((ids.size, 16)).astype(np.float32)
    t.write(ids, want[ids])
    t.close()
    t = embstore.open(tmp_path / "z", cache_bytes=0)
    q = rng.integers(0, 8192, 4000)
    np.testing.assert_array_equal(t.lookup(q), want[q])
    t.close()
    shard = tmp_path / "z" / "vectors" / "c" / "1" / "0"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01  # inside the first stored chunks of shard 1
    shard.write_bytes(bytes(data))
    t = embstore.open(tmp_path / "z", cache_bytes=0)
    with pytest.raises(embstore.CorruptStoreError, match=r"chunk \d+: crc32c mismatch") as ei:
        t.lookup(np.arange(1024, 2048))
    assert str(shard) in str(ei.value)
    np.testing.assert_array_equal(t.lookup(np.arange(0, 1024)), want[:1024])
    t.close()


def test_zstd_chunks_are_checksummed_once_per_process(tmp_path, monkeypatch):
    """A warm zstd batch costs no crc32c call per chunk: each chunk's checksum is checked
    the first time it is read (as uncompressed chunks are), then never again."""
    from embstore.store.shard import codec as shardcodec
    path, E = _table(tmp_path, rows=4096, dim=16, compression="zstd", chunk_rows=2,
                     shard_rows=512)
    calls = []
    real = shardcodec.crc_value
    monkeypatch.setattr(shardcodec, "crc_value", lambda *a, **k: calls.append(1) or real(*a, **k))
    t = embstore.open(path, cache_bytes=0)
    ids = np.random.default_rng(5).integers(0, 4096, 1500)
    np.testing.assert_array_equal(t.lookup(ids), E[ids])
    assert len(calls) == np.unique(ids // 2).size
    np.testing.assert_array_equal(t.lookup(ids[::-1]), E[ids[::-1]])
    assert len(calls) == np.unique(ids // 2).size  # none more
    t.close()


@pytest.mark.parametrize("n", [1, 300], ids=["one chunk", "many chunks"])
def test_zstd_frame_damaged_under_a_valid_checksum_raises(tmp_path, n):
    """A stored frame that passes its crc32c but does not decode to one chunk (a writer's
    bug, or a checksum recomputed over damage) raises CorruptStoreError naming the chunk."""
    from embstore.fs.checksum import crc32c
    path, E = _table(tmp_path, rows=1024, dim=16, compression="zstd", chunk_rows=2,
                     shard_rows=1024)
    shard = path / "vectors" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    n_inner = 512
    index = np.frombuffer(bytes(data[-(16 * n_inner + 4): -4]), dtype="<u8").reshape(-1, 2)
    off, nb = (int(x) for x in index[7])
    frame = bytearray(data[off: off + nb - 4])
    frame[:4] = b"\0\0\0\0"  # no zstd magic number
    data[off: off + nb - 4] = frame
    data[off + nb - 4: off + nb] = crc32c(bytes(frame)).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    t = embstore.open(path, cache_bytes=0)
    ids = np.arange(14, 14 + 2 * n) if n > 1 else np.array([15])
    with pytest.raises(embstore.CorruptStoreError, match=r"chunk 7: cannot decode"):
        t.lookup(ids)
    np.testing.assert_array_equal(t.lookup(np.arange(16, 600)), E[16:600])
    t.close()

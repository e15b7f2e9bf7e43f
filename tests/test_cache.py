"""The LRU row cache: it hits, evicts within its budget, never serves stale rows."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import embstore
from embstore.cache.rows import CacheInfo, RowCache, parse_bytes


def zipf_ids(rng, a, rows, n):
    ids = rng.zipf(a, size=4 * n) - 1
    ids = ids[ids < rows][:n]
    return np.random.default_rng(99).permutation(rows)[ids]  # popular rows spread out


@pytest.fixture
def table(tmp_path, rng):
    E = rng.standard_normal((5000, 16)).astype(np.float32)
    embstore.save(tmp_path / "t", E, chunk_rows=8, shard_rows=512).close()
    return tmp_path / "t", E


@pytest.mark.parametrize("text, value", [
    (0, 0), (1234, 1234), ("0", 0), ("256MiB", 256 << 20), ("1GB", 10**9), ("1.5 KiB", 1536),
    ("512k", 512000), ("2gib", 2 << 30)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["lots", "-1MiB", -5, True, 1.5, "12 parsecs"])
def test_parse_bytes_refuses(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_counting_is_per_requested_id(table):
    path, E = table
    t = embstore.open(path, cache_bytes="1MiB")
    np.testing.assert_array_equal(t[[1, 2, 2]], E[[1, 2, 2]])
    assert t.cache_info()[:4] == (0, 3, 0, 2)
    np.testing.assert_array_equal(t[[[2, 1], [7, 1]]], E[[[2, 1], [7, 1]]])
    info = t.cache_info()
    assert (info.hits, info.misses, info.entries) == (3, 4, 3)
    assert info.bytes == 3 * 16 * 4 and info.capacity_bytes == 1 << 20
    t.cache_clear()
    assert t.cache_info() == CacheInfo(0, 0, 0, 0, 0, 1 << 20)
    t[[1]]
    assert t.cache_info().misses == 1  # cleared rows are read again


def test_zipf_traffic_hits_and_stays_in_budget(tmp_path):
    """Zipf(1.2) on 1,000,000 x 128 with a 16 MiB budget: hit rate >= 0.6 after warm-up."""
    t = embstore.create(tmp_path / "t", shape=(1_000_000, 128))
    t.close()
    t = embstore.open(tmp_path / "t", cache_bytes="16MiB")
    rng = np.random.default_rng(0)
    for _ in range(20):  # warm-up
        t.lookup(zipf_ids(rng, 1.2, 1_000_000, 16384))
    before = t.cache_info()
    for _ in range(10):
        t.lookup(zipf_ids(rng, 1.2, 1_000_000, 16384))
        info = t.cache_info()
        assert info.bytes <= info.capacity_bytes
    hits, misses = info.hits - before.hits, info.misses - before.misses
    assert hits + misses == 10 * 16384
    assert hits / (hits + misses) >= 0.6, info
    assert info.evictions > 0 and info.entries <= (16 << 20) // (128 * 4)


def test_evicts_past_budget_and_results_match(table, rng):
    path, E = table
    budget = 100 * (16 * 4 + 48)
    t = embstore.open(path, cache_bytes=budget)
    plain = embstore.open(path, cache_bytes=0)
    assert plain.cache_info() == CacheInfo()
    for _ in range(50):
        ids = rng.integers(0, len(E), size=rng.integers(1, 300))
        got = t[ids]
        np.testing.assert_array_equal(got, E[ids])
        np.testing.assert_array_equal(got, plain[ids])
        info = t.cache_info()
        assert info.bytes <= info.capacity_bytes and info.entries <= 100
    assert info.evictions > 0 and info.entries == t._cache.slots >= 80  # full, 88 slots


def test_lru_order(table):
    path, E = table
    t = embstore.open(path, cache_bytes=0)
    cache = RowCache(3 * (16 * 4 + 17) + 16 * 8 + 2 * 8, 16, np.float32)  # exactly 3 slots
    assert cache.slots == 3
    out = np.empty((1, 16), np.float32)
    for i in (1, 2, 3, 1, 4):  # 4 evicts 2, the least recently used
        cache.gather(np.array([i]), out, t._source.gather)
    cache.gather(np.array([1, 3, 4]), np.empty((3, 16), np.float32), t._source.gather)
    assert cache.info().hits == 1 + 3 and cache.info().evictions == 1
    cache.gather(np.array([2]), out, t._source.gather)
    assert cache.info().misses == 4 + 1


def test_warm(table):
    path, E = table
    t = embstore.open(path, cache_bytes=20 * (16 * 4 + 48))
    loaded = t.warm([5, 9, 5] + list(range(100, 200)))
    slots = t._cache.slots
    assert loaded == slots and t.cache_info()[:3] == (0, 0, 0)
    np.testing.assert_array_equal(t[[9, 5, 100]], E[[9, 5, 100]])
    assert t.cache_info().hits == 3  # the first (most important) ids were kept


def test_written_rows_are_never_stale(table, rng):
    path, E = table
    ref = E.copy()
    t = embstore.open(path, mode="r+", cache_bytes="64KiB")
    for _ in range(20):
        ids = rng.integers(0, len(E), 50)
        np.testing.assert_array_equal(t[ids], ref[ids])  # fills the cache
        w = rng.choice(ids, 5)
        vec = rng.standard_normal((5, 16)).astype(np.float32)
        t.write(w, vec)
        ref[w] = vec
        np.testing.assert_array_equal(t[ids], ref[ids])
    assert t.cache_info().hits > 0


def test_threads_share_the_cache(table):
    path, E = table
    t = embstore.open(path, cache_bytes=500 * 112)
    errors, n_ids = [], []

    def work(seed):
        r = np.random.default_rng(seed)
        for _ in range(30):
            ids = zipf_ids(r, 1.3, len(E), 256)
            n_ids.append(ids.size)
            if not np.array_equal(t[ids], E[ids]):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    info = t.cache_info()
    assert errors == [] and info.hits + info.misses == sum(n_ids) and info.hits > 0
    assert info.bytes <= info.capacity_bytes
    cached = np.flatnonzero(t._cache._slot_id >= 0)
    assert np.unique(t._cache._slot_id[cached]).size == info.entries == cached.size
    np.testing.assert_array_equal(t._cache._rows[cached], E[t._cache._slot_id[cached]])


def _anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    pytest.skip("no /proc/self/status")


def test_scan_16x_budget_memory_bounded(tmp_path):
    rows, dim, budget = 65536, 256, 4 << 20  # 64 MiB table, 4 MiB cache
    E = np.lib.format.open_memmap(tmp_path / "e.npy", mode="w+", dtype=np.float32,
                                  shape=(rows, dim))
    E[:] = np.arange(rows, dtype=np.float32)[:, None]
    E.flush()
    embstore.save(tmp_path / "t", np.load(tmp_path / "e.npy", mmap_mode="r")).close()
    del E
    t = embstore.open(tmp_path / "t", cache_bytes=budget)
    batch = 4096
    out = np.empty((batch, dim), np.float32)
    order = np.random.default_rng(0).permutation(rows)
    t.lookup(order[:batch], out=out)
    base = _anon_kib()
    for s in range(0, rows, batch):
        t.lookup(order[s: s + batch], out=out)
        assert (out[:, 0] == order[s: s + batch]).all()
    grown = (_anon_kib() - base) * 1024
    assert grown <= budget + 4 * batch * dim * 4, grown  # + transient result/miss buffers
    assert t.cache_info().evictions > 0  # the cache filled and kept turning over


def test_large_cold_batches_admit_rows_on_their_second_miss(table):
    """Doorkeeper: of a big batch of first-time misses read from memory only ADMIT_ALL_BELOW
    rows are copied into the cache; the rest enter when missed again, and hit the third time."""
    path, E = table
    from embstore.cache.rows import ADMIT_ALL_BELOW

    t = embstore.open(path, cache_bytes="16MiB")
    t._cache.reads_cold = lambda: False  # pages resident (cold reads: see the next tests)
    ids = np.random.default_rng(3).permutation(len(E))[: 3 * ADMIT_ALL_BELOW + 500]
    np.testing.assert_array_equal(t[ids], E[ids])
    info = t.cache_info()
    assert info.misses == ids.size and 0 < info.entries <= ADMIT_ALL_BELOW
    np.testing.assert_array_equal(t[ids], E[ids])
    info = t.cache_info()
    assert info.entries == ids.size and info.hits == ADMIT_ALL_BELOW - (
        ADMIT_ALL_BELOW - info.hits)  # the sampled rows hit
    assert 0 < info.hits <= ADMIT_ALL_BELOW
    np.testing.assert_array_equal(t[ids], E[ids])
    again = t.cache_info()
    assert again.hits - info.hits == ids.size and again.misses == info.misses
    t.close()


def test_small_batches_are_cached_on_first_miss(table):
    path, E = table
    t = embstore.open(path, cache_bytes="1MiB")
    t[[5, 6, 7]]
    t[[5, 6, 7]]
    assert t.cache_info()[:2] == (3, 3)
    t.close()


def test_mostly_missing_batches_read_through_and_keep_hits_recent(table):
    """Uncompressed stores: a batch that mostly misses is read whole from the store; its
    hits still count as hits and stay recently used, and results are exact."""
    path, E = table
    t = embstore.open(path, cache_bytes="1MiB")
    assert t._cache.cheap_reads
    hot = np.arange(10)
    t[hot]
    t[hot]  # cached
    before = t.cache_info()
    ids = np.concatenate([hot, np.arange(100, 4100)])
    np.testing.assert_array_equal(t[ids], E[ids])
    info = t.cache_info()
    assert info.hits - before.hits == 10 and info.misses - before.misses == 4000
    np.testing.assert_array_equal(t[hot], E[hot])
    assert t.cache_info().hits - info.hits == 10
    t.close()


@pytest.mark.parametrize("budget, whole", [("16MiB", True), ("300KiB", False)],
                         ids=["room for the batch", "no room"])
def test_cold_read_batches_are_cached_whole_while_there_is_room(table, budget, whole):
    """Rows read from disk (the store says its reads were cold) are all admitted while the
    cache has never-used slots for them: nothing is evicted, and a Zipf tail row that
    recurs is a hit instead of a page read.  Without room the doorkeeper rule stays."""
    path, E = table
    from embstore.cache.rows import ADMIT_ALL_BELOW

    t = embstore.open(path, cache_bytes=budget)
    t._cache.reads_cold = lambda: True
    ids = np.random.default_rng(3).permutation(len(E))[: 2 * ADMIT_ALL_BELOW + 300]
    np.testing.assert_array_equal(t[ids], E[ids])
    info = t.cache_info()
    if whole:
        assert info.entries == ids.size
        np.testing.assert_array_equal(t[ids[::-1]], E[ids[::-1]])
        assert t.cache_info().hits == ids.size
    else:
        assert 0 < info.entries <= ADMIT_ALL_BELOW
    t.close()


def test_the_default_row_cache_is_chosen_per_table(tmp_path):
    """``cache_bytes="auto"`` (the default): rows mapped from local files get no cache (a
    warm gather costs less than a hit: issue 33), compressed rows 256 MiB; a given budget
    is kept."""
    E = np.arange(4000 * 16, dtype=np.float32).reshape(4000, 16)
    embstore.save(tmp_path / "plain", E).close()
    embstore.save(tmp_path / "v2", E, format_version=2).close()
    embstore.save(tmp_path / "zstd", E, compression="zstd").close()
    for name, want in (("plain", 0), ("v2", 0), ("zstd", 256 << 20)):
        with embstore.open(tmp_path / name) as t:
            assert t.cache_info().capacity_bytes == want, name
            np.testing.assert_array_equal(t[[5, 3999, 5]], E[[5, 3999, 5]])
    with embstore.open(tmp_path / "plain", cache_bytes="1MiB") as t:
        assert t.cache_info().capacity_bytes == 1 << 20
    with embstore.open(tmp_path / "zstd", cache_bytes=0) as t:
        assert t.cache_info().capacity_bytes == 0


def test_the_row_cache_works_again_after_cache_clear(tmp_path):
    """cache_clear drops the rows, not the cache's tie to the table's version: the next
    lookups are cached again (they bypassed it for good once)."""
    E = np.arange(3000 * 16, dtype=np.float32).reshape(3000, 16)
    embstore.save(tmp_path / "t", E, format_version=2).close()
    with embstore.open(tmp_path / "t", cache_bytes="1MB") as t:
        t[[1, 2]]
        t.cache_clear()
        np.testing.assert_array_equal(t[[1, 2]], E[[1, 2]])
        np.testing.assert_array_equal(t[[1, 2]], E[[1, 2]])
        info = t.cache_info()
        assert (info.hits, info.misses, info.entries) == (2, 2, 2)


@pytest.mark.parametrize("n", [1, 100, 3000, 4096], ids=lambda n: f"{n}ids")
def test_the_index_rebuilt_at_once_finds_every_id(n):
    """The bulk placement of an empty index (growth, rebuilds) agrees with a dict, ids
    crowded at the last cells (wrapping around) included."""
    rng = np.random.default_rng(n)
    c = RowCache(1 << 30, 2, np.float32, rows=10 * n)
    c._allocate()
    pool = np.unique(rng.choice(1 << 40, size=200_000).astype(np.int64))
    last = pool[c._home(pool) >= (1 << c.bits) - 3][: max(1, n // 4)]  # run past the end
    rest = pool[c._home(pool) < (1 << c.bits) - 3]
    ids = np.concatenate([last, rest[: n - last.size]])
    assert ids.size == n
    slots = rng.permutation(n).astype(np.int64)
    c._hinsert(ids, slots)
    c._entries = n
    cell = c._probe(ids)
    assert (cell >= 0).all()
    want = dict(zip(ids.tolist(), slots.tolist()))
    assert [want[i] for i in ids.tolist()] == c._hv[cell].tolist()
    others = rng.choice(1 << 40, size=500).astype(np.int64)
    others = others[~np.isin(others, ids)]
    assert (c._probe(others) == -1).all()

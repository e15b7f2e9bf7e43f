"""Warming the row cache with the hottest rows: ``Table.warm``, hot files, ``lookup --warm``."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

import embstore
from embstore.cache.hotfile import hot_ids
from embstore.cache.rows import RowCache

ROW = 16 * 4


@pytest.fixture
def stored(tmp_path, rng):
    E = rng.standard_normal((5000, 16)).astype(np.float32)
    embstore.save(tmp_path / "t.emb", E, chunk_rows=8, shard_rows=512).close()
    return tmp_path / "t.emb", E


def _cached(t) -> set[int]:
    c = t._cache
    return set(c._slot_id[: c._filled][c._slot_id[: c._filled] >= 0].tolist())


def _ranked(sample) -> list[int]:
    """Independent reference: ids by count (descending), ties by first occurrence."""
    counts = collections.Counter(sample)
    first = {i: k for k, i in reversed(list(enumerate(sample)))}
    return sorted(counts, key=lambda i: (-counts[i], first[i]))


def test_warm_holds_exactly_the_hottest_rows_up_to_capacity(stored, rng):
    path, E = stored
    t = embstore.open(path, cache_bytes=100 * (ROW + 48))
    slots = t._cache.slots
    sample = (rng.zipf(1.3, 20_000) % len(E)).tolist()  # a sample of traffic, with repeats
    hottest = _ranked(sample)[:slots]
    assert len(_ranked(sample)) > slots
    assert t.warm(np.array(sample).reshape(40, -1)) == slots  # any shape
    info = t.cache_info()
    assert (info.hits, info.misses, info.evictions, info.entries) == (0, 0, 0, slots)
    assert _cached(t) == set(hottest)
    np.testing.assert_array_equal(t[hottest], E[hottest])
    assert t.cache_info()[:2] == (slots, 0)  # every one a hit
    nxt = _ranked(sample)[slots]
    np.testing.assert_array_equal(t[[nxt]], E[[nxt]])
    assert t.cache_info()[:2] == (slots, 1)


def test_warmed_rows_survive_traffic_which_gets_the_other_slots(stored, rng):
    path, E = stored
    t = embstore.open(path, cache_bytes=100 * (ROW + 48))
    slots = t._cache.slots
    held = rng.permutation(len(E))[: slots // 2]
    assert t.warm(held) == held.size
    for _ in range(30):  # traffic elsewhere, recurring so that it is admitted
        ids = rng.integers(0, len(E), 200)
        ids = ids[~np.isin(ids, held)]
        np.testing.assert_array_equal(t[ids], E[ids])
        np.testing.assert_array_equal(t[ids], E[ids])
    info = t.cache_info()
    assert info.entries == slots and info.evictions > 0  # the other half is an LRU
    assert set(held.tolist()) <= _cached(t)
    before = t.cache_info().hits
    np.testing.assert_array_equal(t[held], E[held])
    assert t.cache_info().hits - before == held.size


def test_a_full_warm_is_a_fixed_cache(stored, rng):
    path, E = stored
    t = embstore.open(path, cache_bytes=100 * (ROW + 48))
    slots = t._cache.slots
    hot = rng.permutation(len(E))[:slots]
    t.warm(hot)
    for _ in range(10):
        ids = rng.integers(0, len(E), 300)
        np.testing.assert_array_equal(t[ids], E[ids])
        np.testing.assert_array_equal(t[ids], E[ids])
    assert _cached(t) == set(hot.tolist()) and t.cache_info().evictions == 0


def test_warm_again_releases_the_rows_held_before(stored, rng):
    path, E = stored
    t = embstore.open(path, cache_bytes=100 * (ROW + 48))
    slots = t._cache.slots
    perm = rng.permutation(len(E))
    t.warm(perm[:slots])
    assert t.warm(perm[slots: 2 * slots]) == slots
    assert _cached(t) == set(perm[slots: 2 * slots].tolist())


def test_warm_keeps_rows_cached_already(stored):
    """A hot row cached (least recently used) before the warm is held, not evicted."""
    path, E = stored
    t = embstore.open(path, cache_bytes=100 * (ROW + 48))
    slots = t._cache.slots
    t[np.arange(slots)]  # fills the cache; row 0 is as old as any
    t[np.arange(1, slots)]  # row 0 is now the least recently used
    hot = np.concatenate([[0], np.arange(slots, 2 * slots - 1)])
    assert t.warm(hot) == slots
    assert _cached(t) == set(hot.tolist())


def test_a_write_to_a_warmed_row_is_read_back(tmp_path, rng):
    E = rng.standard_normal((300, 4)).astype(np.float32)
    embstore.save(tmp_path / "w.emb", E).close()
    with embstore.open(tmp_path / "w.emb", mode="r+", cache_bytes="1MiB") as t:
        assert t.warm(np.arange(50)) == 50
        new = rng.standard_normal((2, 4)).astype(np.float32)
        t.write([3, 7], new)
        E[[3, 7]] = new
        np.testing.assert_array_equal(t[np.arange(50)], E[:50])


def test_invalidated_warm_rows_are_released(rng):
    table = rng.standard_normal((1000, 4)).astype(np.float32)

    def fetch(ids, out):
        out[:] = table[ids]

    c = RowCache(1 << 20, 4, np.float32, 1000)
    assert c.warm(np.arange(100), fetch) == 100
    table[[3, 7]] += 1
    c.invalidate(np.array([3, 7, 500]))
    assert c.pinned == 98 and c.info().entries == 98
    np.testing.assert_array_equal(c.gather(np.arange(100), None, fetch), table[:100])
    assert c.info()[:2] == (98, 2)


@pytest.mark.parametrize("how", ["memory", "cache_bytes=0", "auto, uncompressed local"])
def test_warm_without_a_row_cache_checks_ids_and_loads_nothing(stored, how):
    path, E = stored
    t = embstore.MemoryTable(E) if how == "memory" else embstore.open(
        path, cache_bytes=0 if how == "cache_bytes=0" else "auto")
    assert t.warm([1, 2, 3]) == 0
    assert t.cache_info()[:4] == (0, 0, 0, 0)
    with pytest.raises(embstore.InvalidIdError, match="id 5000 at position"):
        t.warm([1, 5000])
    np.testing.assert_array_equal(t[[1, 2]], E[[1, 2]])


def test_warm_on_a_compressed_table_by_default(tmp_path, rng):
    E = rng.standard_normal((2000, 8)).astype(np.float32)
    embstore.save(tmp_path / "z.emb", E, compression="zstd").close()
    with embstore.open(tmp_path / "z.emb") as t:  # "auto": a cache, 256 MiB
        assert t.warm(np.arange(100, 0, -1)) == 100
        np.testing.assert_array_equal(t[np.arange(1, 101)], E[1:101])
        assert t.cache_info()[:2] == (100, 0)


# -- hot files -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, content, want", [
    ("a.npy", np.array([5, 3, 9]), [5, 3, 9]),  # distinct: hottest first, as given
    ("b.npy", np.array([[4, 1], [2, 1], [1, 2]]), [1, 4, 2]),  # a traffic sample: by count
    ("c.npy", np.array([[7, 3], [2, 10], [7, 8], [0, 5]]), [7, 2, 0]),  # (id, count): summed
    ("d.txt", "8\n\n2\n8\n4\n", [8, 2, 4]),
    ("e.txt", "1 10\n2 30\n3 20\n1 25\n", [1, 2, 3]),
], ids=["npy-ids", "npy-sample", "npy-counts", "txt-ids", "txt-counts"])
def test_hot_files(tmp_path, name, content, want):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    else:
        np.save(path, content)
    got = hot_ids(path, 10)
    assert got.dtype == np.int64 and got.tolist() == want


HOT_FILE_ERRORS = [
    ("bad.txt", "1\n2\nx\n", embstore.FormatError,
     r"bad.txt, line 3: expected an integer id or count, got 'x'"),
    ("cols.txt", "1 5\n2\n", embstore.FormatError,
     r"cols.txt, line 2: expected 2 fields as on line 1, got 1 field$"),
    ("three.txt", "\n1 2 3\n", embstore.FormatError,
     r"three.txt, line 2: expected one id, or 'id count', got 3 fields"),
    ("empty.txt", "", embstore.FormatError, r"empty.txt: expected ids, one a line"),
    ("neg.txt", "1 4\n2 -1\n", embstore.FormatError,
     r"neg.txt, line 2: expected a count >= 0, got -1 for id 2"),
    ("range.txt", "1\n\n10\n", embstore.InvalidIdError,
     r"range.txt, line 3: id 10 is out of range for a table of 10 rows"),
    ("float.npy", np.array([1.5]), embstore.FormatError,
     r"float.npy: expected integer ids \(or \(id, count\) rows\), got dtype float64"),
    ("obj.npy", np.array([1, "a"], dtype=object), embstore.FormatError,
     r"obj.npy: not a readable .npy of integer ids \(it holds Python objects"),
    ("range.npy", np.array([3, 11]), embstore.InvalidIdError,
     r"range.npy, position 1: id 11 is out of range"),
]


@pytest.mark.parametrize("name, content, error, match", HOT_FILE_ERRORS,
                         ids=[case[0] for case in HOT_FILE_ERRORS])
def test_hot_file_errors(tmp_path, name, content, error, match):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    else:
        np.save(path, content, allow_pickle=True)  # (the test writes one; never read so)
    with pytest.raises(error, match=match):
        hot_ids(path, 10)


# -- the batch job and the CLI ----------------------------------------------------------------
def _cli(*args):
    from click.testing import CliRunner

    from embstore.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def test_lookup_warm_end_to_end(stored, tmp_path, rng):
    path, E = stored
    ids = rng.integers(0, len(E), (40, 7))
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "hot.npy", ids.reshape(-1))  # the job's own traffic as the sample
    out = tmp_path / "out.npy"
    res = _cli("lookup", path, tmp_path / "ids.npy", out, "--warm", tmp_path / "hot.npy",
               "--cache-bytes", "1MiB", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["warmed_rows"] == np.unique(ids).size
    np.testing.assert_array_equal(np.load(out), E[ids])
    job = embstore.lookup_file(path, tmp_path / "ids.npy", tmp_path / "o2.npy",
                               cache_bytes="1MiB", warm=np.arange(30))
    assert job["warmed_rows"] == 30
    np.testing.assert_array_equal(np.load(tmp_path / "o2.npy"), E[ids])


def test_lookup_warm_errors(stored, tmp_path):
    path, E = stored
    np.save(tmp_path / "ids.npy", np.arange(10))
    (tmp_path / "bad.txt").write_text("1\n2\nx\n")
    (tmp_path / "hot.txt").write_text("1\n2\n")
    out = tmp_path / "out.npy"
    res = _cli("lookup", path, tmp_path / "ids.npy", out, "--warm", tmp_path / "bad.txt",
               "--cache-bytes", "1MiB")
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert res.output.startswith("Error: ") and "bad.txt, line 3: expected an integer id " \
        "or count, got 'x'" in res.output
    res = _cli("lookup", path, tmp_path / "ids.npy", out, "--warm", tmp_path / "hot.txt")
    assert res.exit_code == 1 and "Error: --warm needs a row cache" in res.output
    assert "give it one, e.g. --cache-bytes 2GiB" in res.output
    res = _cli("lookup", path, tmp_path / "ids.npy", out, "--warm", tmp_path / "nope.npy")
    assert res.exit_code == 2 and "'--warm': File" in res.output and "nope.npy' does not" \
        " exist" in res.output
    res = _cli("lookup", path, tmp_path / "ids.npy", out, "--warm", tmp_path / "hot.txt",
               "--cache-bytes", "1MiB", "--scheduler", "local")
    assert res.exit_code == 2 and "--warm with --scheduler" in res.output
    assert not out.exists()

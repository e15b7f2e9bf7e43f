"""The exact scan of embstore/search/exact.py over on-disk tables: every storage dtype and
layout (zero-copy views, chunked copies, compressed, without stored norms), batched queries,
exclusions and ties, against a NumPy reference on the table's own values."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import embstore
from embstore.search.stream import most_similar
from embstore.store.scan import scan_blocks

N, D = 2000, 32


def _ref(values: np.ndarray, q: np.ndarray, k: int, skip=()) -> tuple[np.ndarray, np.ndarray]:
    """NumPy on a pre-normalised float64 copy: ids by descending cosine (zero rows last)."""
    v = values.astype(np.float64)
    n = np.linalg.norm(v, axis=1)
    s = (v / np.where(n == 0, 1, n)[:, None]) @ (q / np.linalg.norm(q))
    s[n == 0] = -np.inf
    s[list(skip)] = -np.inf
    order = np.argsort(-s, kind="stable")[:k]
    return order, s[order]


@pytest.fixture(scope="module")
def rows():
    a = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32)
    a[[11, 1500]] = 0
    return a


LAYOUTS = {
    "one-row-chunks": dict(chunk_rows=1, shard_rows=512),  # strided views, blocks cross shards
    "chunks-of-8": dict(chunk_rows=8, shard_rows=256),    # 3-D views copied
    "default": {},
    "zstd": dict(compression="zstd"),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bfloat16", "int8"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_exact_equals_numpy(tmp_path, rows, dtype, layout):
    path = tmp_path / "t"
    embstore.save(path, rows, dtype=dtype, **LAYOUTS[layout]).close()
    qs = np.random.default_rng(1).standard_normal((5, D)).astype(np.float32)
    with embstore.open(path) as t:
        values = t.to_numpy()  # the stored values (rounded / quantised)
        ids, scores = most_similar(t, qs, k=15, block_rows=300)
        one, one_s = most_similar(t, qs[2], k=15)
    for j in range(5):
        want, want_s = _ref(values, qs[j], 15)
        np.testing.assert_array_equal(ids[j], want)
        np.testing.assert_allclose(scores[j], want_s, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(one, ids[2])
    np.testing.assert_allclose(one_s, scores[2], rtol=1e-6)


def test_blocks_are_views_of_the_mapped_shards(tmp_path, rows):
    path = tmp_path / "t"
    embstore.save(path, rows, chunk_rows=1, shard_rows=512).close()
    with embstore.open(path) as t:
        seen = 0
        for start, block, norms in scan_blocks(t, 700):
            assert block.base is not None and not block.flags.owndata  # no copy
            assert block.strides == (D * 4 + 4, 4)  # each row followed by its crc32c
            assert block.shape[0] <= 512 and start // 512 == (start + len(block) - 1) // 512
            np.testing.assert_array_equal(block, rows[start:start + len(block)])
            np.testing.assert_allclose(norms, np.linalg.norm(block, axis=1), rtol=1e-6)
            seen += len(block)
        assert seen == N


def test_a_damaged_chunk_is_found_by_the_scan(tmp_path, rows):
    path = tmp_path / "t"
    embstore.save(path, rows, chunk_rows=1, shard_rows=512).close()
    shard = path / "vectors" / "c" / "1" / "0"
    raw = bytearray(shard.read_bytes())
    raw[100 * (D * 4 + 4) + 5] ^= 0x10  # row 612
    shard.write_bytes(bytes(raw))
    with embstore.open(path) as t, pytest.raises(embstore.CorruptStoreError, match="crc32c"):
        most_similar(t, rows[0], k=3)


def test_without_stored_norms_and_in_memory(tmp_path, rows):
    path = tmp_path / "t"
    embstore.save(path, rows).close()
    shutil.rmtree(path / "norms")
    q = rows[40] + 0.1
    want, _ = _ref(rows, q, 10)
    with embstore.open(path) as t:
        np.testing.assert_array_equal(most_similar(t, q, k=10)[0], want)
    np.testing.assert_array_equal(most_similar(embstore.MemoryTable(rows), q, k=10)[0], want)


def test_exclusions_ties_zero_rows_and_k_beyond_the_table(tmp_path):
    a = np.zeros((40, 4), np.float32)
    a[:, 0] = 1.0  # 36 rows tie at cosine 1 with the query
    a[[3, 9, 20, 33]] = 0  # zero rows: NaN, ranked below every real neighbour
    a[25] = [-1, 0, 0, 0]  # cosine -1: still above the zero rows
    path = tmp_path / "t"
    embstore.save(path, a, chunk_rows=1, shard_rows=16).close()
    with embstore.open(path) as t:
        ids, scores = most_similar(t, 0, k=100, exclude=[1, 2], block_rows=7)
    assert ids.shape == (37,)  # 40 rows - itself - 2 excluded
    ties = [i for i in range(40) if i not in (0, 1, 2, 3, 9, 20, 33, 25)]
    np.testing.assert_array_equal(ids[:32], ties)  # lower ids first among ties
    assert ids[32] == 25 and scores[32] == pytest.approx(-1.0)
    np.testing.assert_array_equal(ids[33:], [3, 9, 20, 33])
    assert np.isnan(scores[33:]).all()
    with embstore.open(path) as t:
        z_ids, z_scores = most_similar(t, np.zeros(4), k=3)  # a zero query: all undefined
    np.testing.assert_array_equal(z_ids, [0, 1, 2])
    assert np.isnan(z_scores).all()


@pytest.fixture
def split_small(monkeypatch):
    """Blocks split between 3 threads in parts of 16 rows (the scan's parallel product
    runs on the small tables of these tests)."""
    import embstore.search.exact as se
    monkeypatch.setattr(se, "_MIN_PART_ROWS", 16)
    monkeypatch.setattr(se, "_PARTS", 3)


@pytest.mark.parametrize("layout", ["one-row-chunks", "chunks-of-8", "default"])
@pytest.mark.parametrize("n,k,block", [(1, 12, 250), (7, 12, 250), (8, 5, 2000)],
                         ids=["one", "batch", "first-block-from-its-head"])
def test_split_scan_equals_numpy(tmp_path, rows, split_small, layout, n, k, block):
    path = tmp_path / "t"
    embstore.save(path, rows, **LAYOUTS[layout]).close()
    qs = np.random.default_rng(3).standard_normal((n, D)).astype(np.float32)
    with embstore.open(path) as t:
        ids, scores = most_similar(t, qs, k=k, block_rows=block, exclude=[5, 1999])
    for j in range(n):
        want, want_s = _ref(rows, qs[j], k, skip=(5, 1999))
        np.testing.assert_array_equal(ids[j], want)
        np.testing.assert_allclose(scores[j], want_s, rtol=1e-5, atol=1e-6)


def test_batch_holds_blas_to_one_thread_and_restores_it(tmp_path, rows, split_small,
                                                        monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import embstore.search.exact as se
    def numpy_blas():  # the BLAS NumPy's products run on (faiss, when loaded, has its own)
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas" and "numpy" in i["filepath"]]
    before = numpy_blas()
    seen = []
    real = se._part

    def spy(*args):
        seen.extend(numpy_blas())
        real(*args)

    monkeypatch.setattr(se, "_part", spy)
    path = tmp_path / "t"
    embstore.save(path, rows).close()
    with embstore.open(path) as t:
        most_similar(t, rows[:4], k=3)
    assert seen and set(seen) == {1}
    assert before and numpy_blas() == before


def test_rising_scores_ties_across_blocks_and_odd_rows(tmp_path, split_small):
    """Rows in rising cosine order (every block beats the running threshold: the block is
    partitioned), runs of ties across block boundaries (lower ids win), zero rows (below
    every real neighbour), a row whose norm overflows float32 (stored as inf: still its
    true cosine), queries that are zero or NaN (every score undefined)."""
    n, d = 600, 8
    rng = np.random.default_rng(4)
    q = rng.standard_normal(d).astype(np.float32)
    q /= np.linalg.norm(q)
    base = rng.standard_normal(d).astype(np.float32)
    base -= (base @ q) * q  # orthogonal to q
    base /= np.linalg.norm(base)
    c = np.repeat(np.linspace(-0.9, 0.9, n // 20), 20).astype(np.float32)  # runs of 20 ties
    a = (c[:, None] * q + np.sqrt(1 - c[:, None] ** 2) * base).astype(np.float32)
    a[[590, 595, 597]] = 0
    a[593] = (q / np.abs(q).max() * 3e38).astype(np.float32)  # cosine 1, norm > f32 max
    path = tmp_path / "t"
    embstore.save(path, a, chunk_rows=1, shard_rows=128).close()
    with embstore.open(path) as t:
        stored = t.to_numpy().astype(np.float64)
        norm = np.linalg.norm(stored, axis=1)
        key = np.where(norm == 0, -np.inf, (stored @ q) / np.where(norm == 0, 1, norm))
        want = np.lexsort((np.arange(n), -key))  # descending score, lower id first
        assert want[0] == 593
        for k in (5, 30, 600):
            ids, scores = most_similar(t, np.stack([q, q]), k=k, block_rows=64)
            np.testing.assert_array_equal(ids[0], want[:k])
            np.testing.assert_array_equal(ids[1], want[:k])
        ids, scores = most_similar(t, q, k=600, block_rows=64)
        np.testing.assert_array_equal(ids, want)
        assert scores[0] == pytest.approx(1.0, abs=1e-6)
        np.testing.assert_array_equal(ids[-3:], [590, 595, 597])  # undefined, by id
        assert np.isnan(scores[-3:]).all() and np.isfinite(scores[:-3]).all()
        qs = np.stack([q, np.zeros(d, np.float32), np.full(d, np.nan, np.float32)])
        ids, scores = most_similar(t, qs, k=4, block_rows=64, exclude=[1])
        np.testing.assert_array_equal(ids[0], want[:4])
        np.testing.assert_array_equal(ids[1:], [[0, 2, 3, 4]] * 2)
        assert np.isnan(scores[1:]).all()


def test_concurrent_batches_restore_blas_threads(tmp_path, rows, split_small):
    """Overlapping scans in several threads share one BLAS limit: the last one to end
    restores the number of threads BLAS had before."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from concurrent.futures import ThreadPoolExecutor

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    before = blas_threads()
    path = tmp_path / "t"
    embstore.save(path, rows).close()
    qs = np.random.default_rng(9).standard_normal((6, D)).astype(np.float32)
    want = [_ref(rows, q, 7)[0] for q in qs]
    with embstore.open(path) as t, ThreadPoolExecutor(4) as ex:
        runs = [ex.submit(most_similar, t, qs, k=7, block_rows=100) for _ in range(12)]
        for r in runs:
            ids, _ = r.result()
            for j in range(6):
                np.testing.assert_array_equal(ids[j], want[j])
    assert blas_threads() == before


def test_blocks_of_rows_read_in_place_are_larger(tmp_path, rows):
    """Rows read in place (uncompressed one-row chunks) scan in blocks of VIEW_BLOCK_BYTES of
    rows, their scores held to SCAN_BLOCK_BYTES; rows copied in blocks of SCAN_BLOCK_BYTES."""
    import embstore.search.exact as se
    from embstore.store.scan import rows_in_place
    big = np.zeros((1, 1024), np.float32)
    for layout, in_place in [("one-row-chunks", True), ("chunks-of-8", False),
                             ("zstd", False)]:
        embstore.save(tmp_path / layout, big, **LAYOUTS[layout]).close()
        with embstore.open(tmp_path / layout) as t:
            assert rows_in_place(t) is in_place
    assert not rows_in_place(embstore.MemoryTable(rows))
    wide = embstore.MemoryTable(np.zeros((40_000, 1024), np.float32))  # more rows than a block
    assert se.scan_block_rows(wide, 1, in_place=True) == se.VIEW_BLOCK_BYTES // 4096
    assert se.scan_block_rows(wide, 4096, in_place=True) == se.SCAN_BLOCK_BYTES // 16384
    assert se.scan_block_rows(wide, 1) == se.SCAN_BLOCK_BYTES // 4100


def test_one_large_block_split_between_threads_equals_numpy(tmp_path):
    """A table scanned in one block of 20,000 rows read in place (the default block size),
    split between the threads in parts of at least 4,096 rows: ties across the parts' edges
    rank by the lower id, excluded ids and the query's own row left out."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((20000, 8)).astype(np.float32)
    a[[9998, 9999, 10000, 10001, 10002, 19999]] = a[4]  # ties with row 4 across the parts
    a[123] = 0
    embstore.save(tmp_path / "t", a, chunk_rows=1).close()
    with embstore.open(tmp_path / "t") as t:
        ids, scores = most_similar(t, 4, k=3, exclude=[10000])
        assert ids.tolist() == [9998, 9999, 10001]  # of six equal rows, the lowest ids
        np.testing.assert_allclose(scores, 1.0, rtol=1e-6)
        ids, scores = most_similar(t, 4, k=9)
        want, want_s = _ref(a, a[4], 10, skip=(4,))
        np.testing.assert_array_equal(ids, want[:9])
        qs = rng.standard_normal((3, 8)).astype(np.float32)
        got, _ = most_similar(t, qs, k=20)
        for j in range(3):
            np.testing.assert_array_equal(got[j], _ref(a, qs[j], 20)[0])

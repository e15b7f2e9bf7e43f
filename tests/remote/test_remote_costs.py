"""Reads by a cost model (store/place/costs.py) on format-2 tables in moto's S3 server:
requests and bytes of a batch as the model says (counted by the server and the client),
rows exact against NumPy, damage still caught, and the disk cache (``cache_dir=``)
serving a second process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import embstore
from embstore import CorruptStoreError
from embstore.errors import InvalidOptionError
from embstore.store.place.costs import DEFAULT, CostModel, merge_ranges, split_regions
from embstore.store.rows.layout import choose_chunk_rows

PAGE = 4096


# -- the model alone ----------------------------------------------------------------------------
def test_the_gap_read_through_is_latency_times_bandwidth():
    assert CostModel().gap_bytes == 2_500_000  # 25 ms x 100 MB/s: S3
    m = CostModel.from_options(0.002, "50MB", "1MiB")
    assert (m.gap_bytes, m.max_request_bytes) == (100_000, 1 << 20)
    assert m.cost(2, 100_000) == pytest.approx(0.006)
    with pytest.raises(InvalidOptionError):
        CostModel.from_options(request_latency=-1)
    with pytest.raises(InvalidOptionError):
        CostModel.from_options(request_bandwidth="fast")


def test_merge_and_split_match_a_plain_loop(rng):
    for _ in range(50):
        n = int(rng.integers(1, 40))
        group = np.sort(rng.integers(0, 3, n))
        start = np.zeros(n, np.int64)
        for g in np.unique(group):  # sorted, non-overlapping ranges per group
            sel = group == g
            start[sel] = np.cumsum(rng.integers(0, 50, sel.sum())) * 10
        stop = start + 5
        gap = int(rng.integers(0, 200))
        region, rs, re = merge_ranges(group, start, stop, gap)
        want = [[int(start[0]), int(stop[0])]]
        for i in range(1, n):
            if group[i] == group[i - 1] and start[i] - want[-1][1] <= gap:
                want[-1][1] = int(stop[i])
            else:
                want.append([int(start[i]), int(stop[i])])
        assert [list(x) for x in zip(rs.tolist(), re.tolist())] == want
        assert region[-1] == len(want) - 1
        lo, hi, reg = split_regions(rs, re, cap=64, step=16)
        for r, (a, b) in enumerate(want):  # parts tile each region, cut at multiples of 16
            parts = [(int(x), int(y)) for x, y, z in zip(lo, hi, reg) if z == r]
            assert parts[0][0] == a and parts[-1][1] == b
            assert all(p[1] == q[0] and p[1] % 16 == 0 for p, q in zip(parts, parts[1:]))
            assert all(y - x <= 64 for x, y in parts)


# -- format 2 on S3 ---------------------------------------------------------------------------
@pytest.fixture
def wide(s3, rng):
    """20,000 x 64 float32 (256-byte rows, 16 a page), chunks of 4,096 rows (1 MiB)."""
    E = rng.standard_normal((20_000, 64)).astype(np.float32)
    url = f"s3://{s3.bucket}/costs.emb"
    embstore.save(url, E, format_version=2, chunk_rows=4096).close()
    return url, E


def _model_requests(ids, row_bytes, chunk_rows, gap, cap):
    """Requests (chunk, start, stop) the cost model asks for, computed with plain loops."""
    pages = sorted({(int(i) // chunk_rows, (int(i) % chunk_rows * row_bytes + d) // PAGE)
                    for i in ids for d in (0, row_bytes - 1)})
    regions = []
    for k, q in pages:
        if regions and regions[-1][0] == k and q * PAGE - regions[-1][2] <= gap:
            regions[-1][2] = (q + 1) * PAGE
        else:
            regions.append([k, q * PAGE, (q + 1) * PAGE])
    step = np.lcm(row_bytes, PAGE)
    unit = max(step, cap // step * step)
    out = []
    for k, a, b in regions:
        cut = a
        while True:
            nxt = (cut // unit + 1) * unit
            if nxt >= b:
                out.append((k, cut, b))
                break
            out.append((k, cut, nxt))
            cut = nxt
    return out


@pytest.mark.parametrize("gap,cap", [(64 << 10, 8 << 20), (0, 8 << 20), (4 << 20, 192 << 10)])
def test_requests_and_bytes_of_a_batch_are_the_models(s3, wide, rng, gap, cap):
    url, E = wide
    ids = rng.integers(0, E.shape[0], size=300)
    with embstore.open(url, cache_bytes=0, request_latency=gap / 1e8, request_bandwidth=1e8,
                       max_request_bytes=cap) as t:
        t[[0]]  # loads chunk 0's page checksums
        t[np.arange(4096, 20_000, 4096)]  # and the others'
        client = t._objects.client
        got0 = client.received
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        want = _model_requests(ids, 256, 4096, gap, cap)
        assert s3.total() == len(want)
        assert client.received - got0 == sum(b - a for _, a, b in want)
        assert all(b - a <= max(cap, PAGE) for _, a, b in want)


def test_a_batch_costs_few_requests_by_default(s3, wide, rng):
    """16 KiB gaps on average: every chunk read through, one request per chunk (1 MiB)."""
    url, E = wide
    ids = rng.integers(0, E.shape[0], size=2048)
    with embstore.open(url, cache_bytes=0) as t:
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() == 5 + 5  # page checksums of 5 chunks, then a request per chunk
        assert t._objects.client.received < E.nbytes + 5 * 1028


@pytest.mark.parametrize("dim,dtype,cr", [(40, "float32", 1024), (1100, "float32", 1024),
                                          (7, "float16", 2048)])
def test_rows_at_request_cuts_are_exact(s3, rng, dim, dtype, cr):
    """Rows straddling pages (160-byte rows), wider than a page, or 14 bytes, with requests
    cut small: every row equals NumPy's, duplicates and 2-D ids too."""
    E = rng.standard_normal((3000, dim)).astype(dtype)
    url = f"s3://{s3.bucket}/cuts-{dim}.emb"
    embstore.save(url, E, format_version=2, chunk_rows=cr).close()
    ids = np.concatenate([rng.integers(0, 3000, 400), np.arange(900, 1200), [5, 5, 2999]])
    with embstore.open(url, cache_bytes=0, max_request_bytes="20KiB") as t:
        np.testing.assert_array_equal(t[ids], E[ids])
        np.testing.assert_array_equal(t[ids[:300].reshape(10, 30)], E[ids[:300]].reshape(
            10, 30, dim))
        np.testing.assert_array_equal(t.to_numpy(), E)


def _flip(s3, key: str, at: int) -> None:
    client = s3.client()
    body = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[at] ^= 0x10
    client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))


def test_a_flipped_byte_is_caught_and_gap_pages_never_fail_a_read(s3, wide):
    url, E = wide
    _flip(s3, "costs.emb/vectors/c/1/0", 10 * PAGE + 100)  # rows 4096 + 160..175
    with embstore.open(url, cache_bytes=0) as t:
        # page 10 is read through (a gap) for these rows but holds none of them
        np.testing.assert_array_equal(t[[4096, 4096 + 400]], E[[4096, 4096 + 400]])
        with pytest.raises(CorruptStoreError, match=r"vectors/c/1/0: crc32c mismatch in page 10"):
            t[[4096, 4096 + 165]]


# -- the default layout: chunks as large as requests want ---------------------------------------
def _ideal_requests(nbytes: int, cap: int = DEFAULT.max_request_bytes) -> int:
    """The fewest requests the cost model allows for ``nbytes`` read through (a dense batch),
    were the rows one object: whole requests of at most ``cap`` bytes."""
    return -(-nbytes // cap)


@pytest.mark.parametrize("rows,dim", [(100_000, 256), (1_000_000, 256), (300_000, 64),
                                      (400_000, 50)], ids=["100k-256", "1M-256", "300k-64",
                                                           "400k-50"])
def test_a_dense_batch_on_the_default_layout_costs_about_the_requests_of_one_object(rows, dim):
    """A table saved with its row count known: the chunks its writer chooses cost a dense batch
    at most 1.1x the requests the cost model asks for rows in one object (chunks smaller than
    a request cost a request each: 4 MiB chunks of a 100,000 x 256 table made 25 requests of
    a batch, not 13)."""
    row_bytes = dim * 4
    cr = choose_chunk_rows(row_bytes, rows)
    ids = np.arange(0, rows, 24)  # a row in every 24: every gap read through
    got = _model_requests(ids, row_bytes, cr, DEFAULT.gap_bytes, DEFAULT.max_request_bytes)
    assert sum(b - a for _, a, b in got) <= rows * row_bytes  # (no padding read)
    assert len(got) <= 1.1 * _ideal_requests(rows * row_bytes), (cr, len(got))


@pytest.mark.slow  # a 100 MB table uploaded
def test_a_dense_batch_on_s3_costs_the_requests_of_its_layout(s3, rng):
    """100,000 x 256 float32 saved at an s3:// URL with the default layout, 4,096 uniform
    ids: the server sees exactly the requests the cost model asks for that layout (computed
    with plain loops), and those are within 1.1x of the rows in one object."""
    rows, dim = 100_000, 256
    E = rng.standard_normal((rows, dim), dtype=np.float32)
    url = f"s3://{s3.bucket}/dense.emb"
    embstore.save(url, E).close()
    ids = rng.integers(0, rows, size=4096)
    with embstore.open(url, cache_bytes=0) as t:
        cr = t.layout["chunk_rows"]
        t[np.arange(0, rows, cr)]  # every chunk's page checksums loaded
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        want = _model_requests(ids, dim * 4, cr, DEFAULT.gap_bytes, DEFAULT.max_request_bytes)
        assert s3.total() == len(want)
    assert len(want) <= 1.1 * _ideal_requests(E.nbytes), (cr, len(want))


def _entries(root) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
            if "vectors_c_" in d]


def test_the_disk_cache_serves_a_second_process_without_a_chunk_request(s3, wide, rng,
                                                                         tmp_path):
    url, E = wide
    cache = tmp_path / "cache"
    ids = rng.integers(0, E.shape[0], size=500)
    with embstore.open(url, cache_bytes=0, cache_dir=cache) as t:
        np.testing.assert_array_equal(t[ids], E[ids])
    assert _entries(cache)
    np.save(tmp_path / "ids.npy", ids)
    code = textwrap.dedent(f"""
        import numpy as np, embstore
        t = embstore.open({url!r}, cache_bytes=0, cache_dir={str(cache)!r})
        np.save({str(tmp_path / 'out.npy')!r}, t[np.load({str(tmp_path / 'ids.npy')!r})])
    """)
    s3.reset()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    # the open (one LIST of the version manifests, two zarr.json): pages and rows cached
    assert s3.total() == 3
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), E[ids])
    with embstore.open(url, cache_bytes=0, cache_dir=cache) as t:  # rows between: cached too
        s3.reset()
        k = ids // 4096
        more = np.concatenate([rng.integers(ids[k == c].min(), ids[k == c].max() + 1, 40)
                               for c in np.unique(k)])
        np.testing.assert_array_equal(t[more], E[more])
        assert s3.total() == 0


def test_a_damaged_cache_entry_is_refetched(s3, wide, rng, tmp_path):
    url, E = wide
    cache = tmp_path / "cache"
    ids = np.array([3, 4100, 8200, 12300, 16400])
    with embstore.open(url, cache_bytes=0, cache_dir=cache) as t:
        np.testing.assert_array_equal(t[ids], E[ids])
    for path in _entries(cache):  # a flipped byte in every row's page of every entry
        raw = bytearray(open(path, "rb").read())
        lo = int(os.path.basename(path).split("-")[0])
        k = int(os.path.basename(os.path.dirname(path)).split("_")[2])
        for i in ids[ids // 4096 == k]:
            at = int(i) % 4096 * 256 - lo
            if 0 <= at < len(raw):
                raw[at] ^= 1
        open(path, "wb").write(bytes(raw))
    with embstore.open(url, cache_bytes=0, cache_dir=cache) as t:
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() == 5  # every row fetched again (the entries dropped)
        s3.reset()
        np.testing.assert_array_equal(t[ids], E[ids])
        assert s3.total() == 0  # and cached anew


def test_the_benchmarks_latency_proxy_adds_latency_and_caps_bandwidth(s3):
    """benchmarks/latencyproxy.py: every request 25 ms later to its first byte, responses at
    most 100 MB/s per connection (here 20 ms and 50 MB/s), the bytes unchanged."""
    import time

    from benchmarks.latencyproxy import LatencyProxy
    from embstore.store.place.objstore import ObjectClient

    data = os.urandom(4 << 20)
    s3.client().put_object(Bucket=s3.bucket, Key="p/o", Body=data)
    proxy = LatencyProxy(s3.endpoint, latency_s=0.02, bandwidth_Bps=50e6)
    client = ObjectClient(f"s3://{s3.bucket}/p", {"endpoint": proxy.endpoint})
    try:
        client.get_range("o", 0, 10)  # (connection open)
        t0 = time.perf_counter()
        assert bytes(client.get_range("o", 5, 4096)) == data[5:4096]
        small = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert bytes(client.get_range("o", 0, 4 << 20)) == data
        big = time.perf_counter() - t0
    finally:
        client.close()
        proxy.close()
    assert small >= 0.02 and big >= 0.02 + (4 << 20) / 50e6 * 0.9

"""Key lookups on tables on S3: the key index read by checked ranges, never whole."""

from __future__ import annotations

import numpy as np
import pytest

import embstore
from embstore import CorruptStoreError
from embstore.keys import mapped
from embstore.store.remote.ranged import BLOCK, block_sidecar, sidecar_name
from embstore.keys.writer import INDEX_ARRAYS

N = 200_000


@pytest.fixture(scope="module")
def big_keys():
    rng = np.random.default_rng(7)
    keys = [f"tok{i}-{'x' * int(n)}" for i, n in enumerate(rng.integers(0, 12, N))]
    return keys, rng.standard_normal((N, 4)).astype(np.float32)


@pytest.fixture
def big(s3, big_keys):
    keys, E = big_keys
    url = f"s3://{s3.bucket}/big.emb"
    embstore.save(url, E, keys=keys).close()
    sizes = {a: sum(o["Size"] for o in s3.client().list_objects_v2(
        Bucket=s3.bucket, Prefix=f"big.emb/{a}/c/")["Contents"]) for a in INDEX_ARRAYS}
    s3.reset()
    return url, keys, E, sizes


def _client(t):
    return t._objects.client


def test_a_batch_of_keys_reads_a_few_ranges_not_the_key_set(big, s3):
    url, keys, E, sizes = big
    rng = np.random.default_rng(1)
    pick = rng.choice(N, 100, replace=False)
    query = [keys[i] for i in pick] + ["absent", "tok5"]
    with embstore.open(url) as t:
        s3.reset()
        got = t.ids_of(query, missing=-1)
        expect = np.r_[pick, -1, -1 if "tok5" not in keys else keys.index("tok5")]
        np.testing.assert_array_equal(got, expect)
        received = _client(t).received
        # rounds: documents + sidecars, key_hash blocks (+ key_order with the next call),
        # key_order, key_offsets, key_utf8: a request per touched block region, not more
        assert s3.total() <= 5 + 4 + 4 * 102, s3.requests
        total = sum(sizes.values())
        # sidecars (~1% of the arrays) and ~4 blocks of BLOCK bytes per key
        assert received < total / 10, (received, total)
        assert received < 0.02 * total + 102 * 4 * 2 * BLOCK
        np.testing.assert_array_equal(t.lookup_keys(query[:100]), E[pick])
        s3.reset()
        before = _client(t).received
        np.testing.assert_array_equal(t.ids_of(query[:100]), pick)  # blocks held: 0 requests
        assert s3.total() == 0 and _client(t).received == before
        assert [t.keys[int(i)] for i in pick[:5]] == [keys[int(i)] for i in pick[:5]]
        assert t.keys[N - 3:] == keys[N - 3:]


def test_lookups_from_the_disk_cache_cost_no_request(big, s3, tmp_path):
    url, keys, E, _ = big
    query = [keys[i] for i in (0, 17, 99_999, N - 1)]
    with embstore.open(url, cache_dir=tmp_path / "c") as t:
        assert t.ids_of(query).tolist() == [0, 17, 99_999, N - 1]
    s3.reset()
    with embstore.open(url, cache_dir=tmp_path / "c") as t:
        opened = s3.total()
        assert t.ids_of(query).tolist() == [0, 17, 99_999, N - 1]
        assert s3.total() == opened  # only the open's documents went to the server


def test_many_key_chunks_and_local_lookups_agree(s3, monkeypatch, tmp_path):
    """Key arrays of several chunk files (as large tables have): ranged lookups equal local."""
    monkeypatch.setattr(mapped, "CHUNK_BYTES", 4096)
    keys = [f"k{i * 7919 % 5003}" for i in range(5003)]
    E = np.arange(5003 * 2, dtype=np.float32).reshape(-1, 2)
    url = f"s3://{s3.bucket}/m.emb"
    embstore.save(url, E, keys=keys).close()
    embstore.save(tmp_path / "m.emb", E, keys=keys).close()
    q = keys[::13] + ["zz", ""]
    with embstore.open(url) as r, embstore.open(tmp_path / "m.emb") as loc:
        np.testing.assert_array_equal(r.ids_of(q, missing=-1), loc.ids_of(q, missing=-1))
        assert r.keys[4990:] == loc.keys[4990:] == keys[4990:]
        assert list(r.keys) == keys


def _flip(s3, key: str, at: int) -> None:
    body = bytearray(s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[at] ^= 0x40
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))


@pytest.mark.parametrize("array", INDEX_ARRAYS)
def test_a_damaged_key_index_block_is_detected(s3, array):
    keys = [f"key{i}" for i in range(3000)]
    url = f"s3://{s3.bucket}/d.emb"
    embstore.save(url, np.zeros((3000, 2), np.float32), keys=keys).close()
    _flip(s3, f"d.emb/{array}/c/0", 5)  # the first block: read by a lookup of every key
    with embstore.open(url) as t:
        assert t.keys[2999] == "key2999"  # blocks elsewhere are fine
        with pytest.raises(CorruptStoreError, match=rf"d.emb/{array}/c/0: bytes 0\.\.1023 "
                           "fail their crc32c"):
            t.ids_of(keys)


def test_a_damaged_sidecar_is_detected(s3):
    url = f"s3://{s3.bucket}/d.emb"
    embstore.save(url, np.zeros((30, 2), np.float32), keys=[f"k{i}" for i in range(30)]).close()
    _flip(s3, f"d.emb/{sidecar_name('key_hash', 0)}", 40)
    with embstore.open(url) as t:
        with pytest.raises(CorruptStoreError, match="key_hash/blocks/0: block sidecar"):
            t.ids_of(["k1"])


@pytest.mark.parametrize("array", ["key_utf8", "key_hash", "key_order"])  # (key_offsets:
def test_a_key_chunk_of_another_table_with_its_sidecar_is_detected(s3, array):
    """The chunk pins of each key array's zarr.json are checked on S3 as on a local disk: a
    chunk file swapped, with its block sidecar, for another table's of the same size (every
    block matches that sidecar) is damage, not other ids."""
    keys = [f"key{i:04d}" for i in range(300)]
    c = s3.client()
    # the same for keys of the same lengths)
    for name, ks in (("d.emb", keys), ("e.emb", [f"kez{i:04d}" for i in range(300)])):
        embstore.save(f"s3://{s3.bucket}/{name}", np.zeros((300, 2), np.float32),
                      keys=ks).close()
    for rel in (f"{array}/c/0", sidecar_name(array, 0)):
        body = c.get_object(Bucket=s3.bucket, Key=f"e.emb/{rel}")["Body"].read()
        assert body != c.get_object(Bucket=s3.bucket, Key=f"d.emb/{rel}")["Body"].read()
        c.put_object(Bucket=s3.bucket, Key=f"d.emb/{rel}", Body=body)
    with embstore.open(f"s3://{s3.bucket}/d.emb") as t:
        with pytest.raises(CorruptStoreError, match=rf"d.emb/{array}/c/0: ends in crc32c "
                           r"0x[0-9a-f]{8}, its array's zarr.json records"):
            t.ids_of(keys)


def test_tables_without_sidecars_still_look_keys_up(s3):
    """A table uploaded by embstore 0.2.0 (no <array>/blocks/): the key arrays are downloaded."""
    url = f"s3://{s3.bucket}/old.emb"
    embstore.save(url, np.eye(3, dtype=np.float32), keys=["a", "b", "c"]).close()
    c = s3.client()
    for o in c.list_objects_v2(Bucket=s3.bucket, Prefix="old.emb/")["Contents"]:
        if "/blocks/" in o["Key"]:
            c.delete_object(Bucket=s3.bucket, Key=o["Key"])
    with embstore.open(url) as t:
        assert t.ids_of(["c", "a"]).tolist() == [2, 0]


def test_sidecar_layout():
    data = np.arange(300, dtype="<u8").tobytes() + b"\x01\x02\x03\x04"
    side = block_sidecar(data, fences=True, block=1024)
    nblocks = -(-len(data) // 1024)
    assert side[:8] == b"EMBKBLK1" and len(side) == 32 + nblocks * 12 + 4
    fences = np.frombuffer(side, "<u8", nblocks, 32 + 4 * nblocks)
    np.testing.assert_array_equal(fences, [0, 128, 256])


def test_zarr_python_reads_the_remote_table_and_sees_no_sidecar(s3):
    """The sidecars live inside the arrays' folders: a Zarr reader lists no stray member
    (filterwarnings=error turns zarr's 'not recognized' warning into a failure)."""
    zarr = pytest.importorskip("zarr")
    from obstore.store import S3Store

    keys = [f"k{i}" for i in range(50)]
    E = np.arange(100, dtype=np.float32).reshape(50, 2)
    embstore.save(f"s3://{s3.bucket}/z.emb", E, keys=keys).close()
    store = S3Store(s3.bucket, prefix="z.emb", endpoint=s3.endpoint, region="us-east-1",
                    client_options={"allow_http": True})
    g = zarr.open_group(zarr.storage.ObjectStore(store, read_only=True), mode="r")
    assert sorted(n for n, _ in g.members() if not n.endswith("page_crc")) == [  # (format 2)
        "key_hash", "key_offsets", "key_order", "key_utf8", "keys", "norms", "vectors"]
    np.testing.assert_array_equal(g["vectors"][:], E)
    assert list(g["keys"][:]) == keys


class _MemoryReader:
    """A RangeReader over in-memory objects (no server): counts ranged requests."""

    def __init__(self, objects: dict[str, bytes]):
        self.objects, self.requests = objects, 0

    def where(self, rel):
        return f"mem://{rel}"

    def get_objects(self, rels):
        return [self.objects.get(r) for r in rels]

    def get_ranges(self, reqs):
        self.requests += len(reqs)
        return [self.objects[r][a:b] for r, a, b in reqs]

    def cached(self, rel, name):
        return None

    def keep(self, rel, name, data):
        pass


def _ranged(values: np.ndarray, chunk: int):
    from embstore.fs.checksum import crc32c

    from embstore.store.remote.ranged import RangedArray

    objects = {}
    for c, a in enumerate(range(0, values.size, chunk)):
        part = np.zeros(chunk, "<u8")
        part[: min(chunk, values.size - a)] = values[a: a + chunk]
        body = part.tobytes()
        objects[f"key_hash/c/{c}"] = body + crc32c(body).to_bytes(4, "little")
        objects[sidecar_name("key_hash", c)] = block_sidecar(objects[f"key_hash/c/{c}"],
                                                             fences=True)
    meta = {"shape": [int(values.size)], "data_type": "uint64",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                       {"name": "crc32c"}]}
    reader = _MemoryReader(objects)
    return RangedArray(reader, "key_hash", meta), reader


@pytest.mark.parametrize("chunk", [1000, 300, 128], ids=["one-chunk", "chunks", "block-chunks"])
def test_ranged_searchsorted_equals_numpy_with_runs_across_blocks(chunk):
    rng = np.random.default_rng(3)
    # runs of equal values that straddle 128-element blocks and chunk boundaries
    values = np.sort(np.repeat(rng.integers(0, 2**63, 90, dtype=np.uint64),
                               rng.integers(1, 40, 90)))[:1000]
    arr, reader = _ranged(values, chunk)
    fences = values[::128]
    queries = np.concatenate([values[::7], fences, fences - np.uint64(1), fences + np.uint64(1),
                              np.array([0, 2**64 - 1], dtype=np.uint64)])
    np.testing.assert_array_equal(arr.searchsorted(queries),
                                  np.searchsorted(values, queries, side="left"))
    for f in fences:  # one fence alone: no other query fetches the block before it
        fresh, _ = _ranged(values, chunk)
        assert fresh.searchsorted(np.array([f])).tolist() == [np.searchsorted(values, f)]
    idx = rng.integers(0, values.size, 300)
    np.testing.assert_array_equal(arr.take(idx), values[idx])
    np.testing.assert_array_equal(arr.read(123, 901), values[123:901])

"""Damaged stores: lookups raise CorruptStoreError, verify() lists the damage."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import zarr

import embstore
import embstore.store.shard.arena
import embstore.store.shard.verify
from embstore import CorruptStoreError

LAYOUTS = {
    "raw": {"chunk_rows": 4, "shard_rows": 16},
    "zstd": {"compression": "zstd", "chunk_rows": 4, "shard_rows": 16},
    "blosc": {"compression": "blosc", "chunk_rows": 4, "shard_rows": 16},
}


@pytest.fixture
def E(rng):
    return rng.standard_normal((40, 8)).astype(np.float32)


def shard_index(path):
    data = path.read_bytes()
    n = 4  # shard_rows / chunk_rows
    return np.frombuffer(data[len(data) - 16 * n - 4: -4], dtype="<u8").reshape(n, 2)


def flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.fixture(params=list(LAYOUTS), ids=list(LAYOUTS))
def damaged(request, tmp_path, E):
    """A table whose shard 1 (rows 16..31) has a flipped byte in inner chunk 2 (rows 24..27)."""
    path = tmp_path / "t"
    embstore.save(path, E, **LAYOUTS[request.param]).close()
    shard = path / "vectors" / "c" / "1" / "0"
    off, nbytes = shard_index(shard)[2]
    flip(shard, int(off + nbytes // 2))
    return path, shard


@pytest.mark.parametrize("joined", [True, False], ids=["joined-map", "per-shard-maps"])
@pytest.mark.parametrize("cache", [0, "1MiB"])
def test_lookup_of_a_damaged_chunk_raises(damaged, E, cache, joined, monkeypatch):
    path, shard = damaged
    if not joined:
        monkeypatch.setattr(embstore.store.shard.arena, "available", lambda: False)
    t = embstore.open(path, cache_bytes=cache)
    np.testing.assert_array_equal(t[[0, 17, 23, 28, 39]], E[[0, 17, 23, 28, 39]])
    for ids in ([25], [1, 2, 26], np.arange(40)):
        with pytest.raises(CorruptStoreError, match="c/1/0, chunk 2") as info:
            t.lookup(ids)
        assert str(shard) in str(info.value)
    with pytest.raises(CorruptStoreError):
        t[20:30]
    np.testing.assert_array_equal(t[[16, 31]], E[[16, 31]])  # other chunks still read


def test_verify_reports_the_damaged_chunk(damaged):
    path, shard = damaged
    report = embstore.verify(path)
    assert not report.ok and not report
    assert [(d.file, d.chunk) for d in report.damaged] == [(str(shard), 2)]
    assert report.shards == 3 and report.chunks == 10
    text = str(report)
    assert text.startswith(f"DAMAGED {path}: 1 problem") and "chunk 2" in text


def test_zarr_python_also_detects_it(damaged):
    path, _ = damaged
    arr = zarr.open_array(str(path / "vectors"), mode="r")
    arr[:16]  # undamaged shard
    with pytest.raises(Exception, match="(?i)checksum|crc"):
        arr[16:32]


def test_verify_ok(tmp_path, E):
    embstore.save(tmp_path / "t", E, keys=[f"w{i}" for i in range(40)], **LAYOUTS["raw"])
    report = embstore.verify(tmp_path / "t")
    assert report.ok and report.damaged == []
    assert report.vocab_size == 40 and "keys" in report.arrays
    assert str(report).startswith(f"OK {tmp_path / 't'}: 40 rows")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_damaged_shard_index(tmp_path, E, layout):
    embstore.save(tmp_path / "t", E, **LAYOUTS[layout]).close()
    shard = tmp_path / "t" / "vectors" / "c" / "0" / "0"
    flip(shard, shard.stat().st_size - 20)
    t = embstore.open(tmp_path / "t")
    with pytest.raises(CorruptStoreError, match="shard index fails its crc32c"):
        t[3]
    np.testing.assert_array_equal(t[20], E[20])
    report = embstore.verify(tmp_path / "t")
    assert [(d.file, d.chunk) for d in report.damaged] == [(str(shard), None)]


@pytest.mark.parametrize("keep", [lambda n: n // 2, lambda n: 10], ids=["half", "ten-bytes"])
def test_truncated_shard(tmp_path, E, keep):
    embstore.save(tmp_path / "t", E, **LAYOUTS["raw"]).close()
    shard = tmp_path / "t" / "vectors" / "c" / "2" / "0"
    data = shard.read_bytes()
    shard.write_bytes(data[: keep(len(data))])
    t = embstore.open(tmp_path / "t")
    with pytest.raises(CorruptStoreError, match="c/2/0.*(truncated|index)"):
        t[35]
    assert not embstore.verify(tmp_path / "t").ok


def test_index_pointing_outside_the_file(tmp_path, E):
    from embstore.fs.checksum import crc32c
    embstore.save(tmp_path / "t", E, **LAYOUTS["raw"]).close()
    shard = tmp_path / "t" / "vectors" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-68:-4]), dtype="<u8").reshape(4, 2).copy()
    index[1, 0] = 10**9
    data[-68:-4] = index.tobytes()
    data[-4:] = crc32c(index.tobytes()).to_bytes(4, "little")  # a valid checksum, bad offset
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="chunk 1: index says offset 1000000000"):
        embstore.open(tmp_path / "t")[5]


@pytest.mark.parametrize("sep", ["/", "."])
def test_verify_walks_the_shards_that_exist(tmp_path, E, monkeypatch, sep):
    """A header declaring 10^15 rows (6.25 * 10^13 shards of 16 rows) is verified shard by
    shard over the shards stored (a directory listing), not over every declared one: a
    damaged shard far out is found, one past the declared rows and a stray name are not read."""
    path = tmp_path / "t"
    embstore.save(path, E, format_version=1, **LAYOUTS["raw"]).close()  # (no version pins)
    vec = path / "vectors"
    doc = json.loads((vec / "zarr.json").read_text())
    doc["shape"][0] = 10**15
    doc["chunk_key_encoding"]["configuration"]["separator"] = sep
    (vec / "zarr.json").write_text(json.dumps(doc))

    def shard(k: int):
        return vec / "c" / str(k) / "0" if sep == "/" else vec / f"c.{k}.0"

    far, beyond = 10**13, 10**15 // 16  # beyond: the first shard past the declared rows
    for k in (far, beyond):
        os.makedirs(shard(k).parent, exist_ok=True)
        shutil.copyfile(vec / "c" / "1" / "0", shard(k))
        off, nbytes = shard_index(shard(k))[2]
        flip(shard(k), int(off + nbytes // 2))
    if sep == ".":
        for k in range(3):
            os.replace(vec / "c" / str(k) / "0", shard(k))
        shutil.rmtree(vec / "c")
    (vec / ("c/junk" if sep == "/" else "c.junk.0")).mkdir(parents=True)
    walked = []
    real = embstore.store.shard.verify._shard

    def counted(place, name, L, k, codec):
        walked.append((name, k))
        assert len(walked) < 100, "verify walks every declared shard"
        return real(place, name, L, k, codec)
    monkeypatch.setattr(embstore.store.shard.verify, "_shard", counted)
    report = embstore.verify(path)
    assert [k for name, k in walked if name == "vectors"] == [0, 1, 2, far]
    shards = [(d.file, d.chunk) for d in report.damaged if "/vectors/" in d.file]
    assert shards == [(str(shard(far)), 2)], report
    assert report.chunks == 14 and not report.ok  # 10 chunks stored, and the far shard's 4


def test_damaged_keys_array_is_reported(tmp_path, E):
    keys = [f"w{i}" for i in range(40)]
    embstore.save(tmp_path / "t", E, keys=keys, **LAYOUTS["raw"]).close()
    chunk = next(p for p in (tmp_path / "t" / "keys").rglob("*") if p.is_file()
                 and p.name != "zarr.json")
    flip(chunk, chunk.stat().st_size // 2)
    report = embstore.verify(tmp_path / "t")
    assert not report.ok and any("keys" in d.message for d in report.damaged)


def test_broken_metadata(tmp_path, E):
    embstore.save(tmp_path / "t", E).close()
    (tmp_path / "t" / "vectors" / "zarr.json").write_text("{ not json")
    with pytest.raises(CorruptStoreError, match="broken JSON"):
        embstore.open(tmp_path / "t")
    report = embstore.verify(tmp_path / "t")
    assert not report.ok and "broken JSON" in str(report)

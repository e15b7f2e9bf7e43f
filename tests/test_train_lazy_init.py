"""Lazy initialisation (issue 40; docs/FORMAT.md §3e): ``embstore.create(..., init=...)``
writes no row; a row never written reads as the eager reference ``init_rows`` gives it,
the same every time (across versions, after writes, appends and compactions, on reopen,
in a fresh process); written rows override; norms, searches, exports and copies see the
same values; verify passes and damage is still detected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import embstore
from embstore.store.rows.norms import row_norms
from embstore.store.remote.transfer import copy_table
from embstore.store.rowinit import check_init, init_rows
from embstore.store.rows.pages import MARKER

V, D, C = 20_000, 32, 2048  # ten chunks of 2,048 rows (256 KiB each)
SPEC = {"kind": "normal", "seed": 11, "std": 0.5}


def _ref(v=V, d=D, spec=SPEC):
    """The eager reference: every row made by init_rows, as create used to write them."""
    return init_rows(check_init(spec, d), 0, v, d)


def _lazy(path, v=V, d=D, spec=SPEC, **kw):
    return embstore.create(path, shape=(v, d), init=spec, format_version=2, chunk_rows=C, **kw)


def _crc_files(path: Path, name="page_crc"):
    return sorted((path / name / "c").glob("*/0"), key=lambda p: int(p.parent.name))


def _never_written(path: Path) -> list[int]:
    return [int(p.parent.name) for p in _crc_files(path) if p.read_bytes() == MARKER]


def test_create_writes_no_row_and_reads_the_reference(tmp_path):
    t = _lazy(tmp_path / "t")
    ref = _ref()
    chunks = sorted((tmp_path / "t" / "vectors" / "c").glob("*/0"))
    assert len(chunks) == V // C + 1
    assert sum(os.stat(p).st_blocks for p in chunks) == 0  # holes: no row on disk
    assert _never_written(tmp_path / "t") == list(range(len(chunks)))
    ids = np.random.default_rng(0).integers(0, V, size=(64, 33))  # repeats, any shape
    np.testing.assert_array_equal(t[ids], ref[ids])
    np.testing.assert_array_equal(t[1000:5000], ref[1000:5000])  # across chunks
    np.testing.assert_array_equal(t.to_numpy(), ref)
    again = embstore.create(tmp_path / "u", shape=(V, D), init=SPEC)  # the default layout
    np.testing.assert_array_equal(again.to_numpy(), ref)  # the same every time
    np.testing.assert_array_equal(t[ids], ref[ids])
    t.close()
    again.close()
    assert embstore.verify(tmp_path / "t").ok


@pytest.mark.parametrize("dtype", ["float16", "float64", "bfloat16"])
def test_other_dtypes_equal_the_eager_table(tmp_path, dtype):
    """The same values as a table saved from the reference rows (the writer's own
    rounding), norms included."""
    ref = _ref(3000, 16)
    eager = embstore.save(tmp_path / "e", ref, dtype=dtype)
    lazy = embstore.create(tmp_path / "l", shape=(3000, 16), dtype=dtype, init=SPEC)
    assert _never_written(tmp_path / "l")
    np.testing.assert_array_equal(lazy.to_numpy(), eager.to_numpy())
    ids = np.array([2999, 0, 7, 7, 1500])
    np.testing.assert_array_equal(lazy[ids], eager[ids])
    np.testing.assert_array_equal(lazy.norms_source.read(0, 3000),
                                  eager.norms_source.read(0, 3000))
    lazy.close()
    eager.close()
    assert embstore.verify(tmp_path / "l").ok


def test_writes_appends_compaction_and_versions(tmp_path):
    path = tmp_path / "t"
    t = _lazy(path)
    ref = _ref()
    v1 = t.version
    rng = np.random.default_rng(1)
    ids = np.array([3, 2050, 2051, 9000, 19_999])
    new = rng.standard_normal((ids.size, D)).astype(np.float32)
    t.write(ids, new)
    want = ref.copy()
    want[ids] = new
    np.testing.assert_array_equal(t.to_numpy(), want)  # written rows override
    np.testing.assert_array_equal(t[[4, 2049, 18_000]], ref[[4, 2049, 18_000]])
    extra = rng.standard_normal((5000, D)).astype(np.float32)  # into the last chunk's
    got = t.append(extra)  # padding (never written: staged whole) and a new chunk
    np.testing.assert_array_equal(got, np.arange(V, V + 5000))
    want = np.vstack([want, extra])
    np.testing.assert_array_equal(t.to_numpy(), want)
    t.compact()
    np.testing.assert_array_equal(t.to_numpy(), want)
    # compaction stored only the touched chunks: 0, 1, 4 and the last ones (appended)
    assert _never_written(path) == [2, 3, 5, 6, 7, 8]
    t.close()
    old = embstore.open(path, version=v1)  # version 1 still reads the reference
    np.testing.assert_array_equal(old.to_numpy(), ref)
    old.close()
    with embstore.open(path) as r:
        np.testing.assert_array_equal(r.to_numpy(), want)
        np.testing.assert_array_equal(row_norms(want), r.norms_source.read(0, len(want)))
    report = embstore.verify(path)
    assert report.ok, report
    np.save(tmp_path / "want.npy", want)
    code = ("import sys, numpy as np, embstore\n"
            "t = embstore.open(sys.argv[1])\n"
            "w = np.load(sys.argv[2])\n"
            "ids = np.random.default_rng(5).integers(0, len(w), 4000)\n"
            "assert (t[ids] == w[ids]).all() and (t.to_numpy() == w).all()\n"
            "print('same')\n")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "want.npy")],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.stdout.strip() == "same"


def test_norms_search_export_and_copy_see_the_same_rows(tmp_path):
    path = tmp_path / "t"
    t = _lazy(path, keys=[f"w{i}" for i in range(V)])
    ref = _ref()
    np.testing.assert_array_equal(t.norms_source.read(0, V), row_norms(ref))
    q = ref[123] + 0.01
    ids, scores = embstore.Embedding(t).most_similar(q, k=8)
    cos = ref @ q / (np.linalg.norm(ref, axis=1) * np.linalg.norm(q))
    np.testing.assert_array_equal(ids, np.argsort(-cos, kind="stable")[:8])
    np.testing.assert_allclose(scores, cos[ids], rtol=1e-5)
    np.testing.assert_array_equal(t.lookup_keys(["w5", "w19999"]), ref[[5, 19_999]])
    t.close()
    embstore.export_table(path, tmp_path / "out.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), ref)
    copy_table(path, tmp_path / "copy")
    assert _never_written(tmp_path / "copy") == _never_written(path)  # holes and marks kept
    with embstore.open(tmp_path / "copy") as c:
        np.testing.assert_array_equal(c.to_numpy(), ref)
    assert embstore.verify(tmp_path / "copy").ok


def test_foreign_zarr_readers_see_zeros_where_never_written(tmp_path):
    """Documented (FORMAT.md §3e): other Zarr readers see the holes, zeros; stored chunks
    as they are."""
    zarr = pytest.importorskip("zarr")
    t = _lazy(tmp_path / "t")
    t.write([5], np.ones((1, D), np.float32))
    t.compact()
    want = t.to_numpy()
    t.close()
    z = zarr.open_array(tmp_path / "t" / "vectors", mode="r")[:]
    np.testing.assert_array_equal(z[:C], want[:C])  # chunk 0 is stored now
    assert not z[C:].any()


def _corrupt(path: Path, how: str) -> None:
    crc = _crc_files(path)[3]
    if how == "marker byte":
        data = bytearray(crc.read_bytes())
        data[2] ^= 1
        crc.write_bytes(bytes(data))
    elif how == "checksums removed":
        crc.unlink()
    elif how == "spec":
        meta = path / "vectors" / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["attributes"]["embstore_init"]["seed"] = -1
        meta.write_text(json.dumps(doc))
    elif how == "spec removed":
        meta = path / "vectors" / "zarr.json"
        doc = json.loads(meta.read_text())
        del doc["attributes"]["embstore_init"]
        meta.write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["marker byte", "checksums removed", "spec", "spec removed"])
def test_damage_is_detected(tmp_path, how):
    path = tmp_path / "t"
    _lazy(path).close()
    _corrupt(path, how)  # (the live files are version 1's too: the same inodes)
    if how == "checksums removed":
        (path / "vectors" / ".embstore" / "versions" / "1" / "page_crc" / "c" / "3" / "0"
         ).unlink()
    with pytest.raises(embstore.CorruptStoreError):
        with embstore.open(path) as t:
            t[[3 * C + 1]]
    assert not embstore.verify(path).ok


def test_damage_of_a_stored_chunk_is_still_detected(tmp_path):
    path = tmp_path / "t"
    t = _lazy(path)
    t.write([C + 1], np.ones((1, D), np.float32))
    t.compact()
    t.close()
    chunk = path / "vectors" / "c" / "1" / "0"
    with open(chunk, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(embstore.CorruptStoreError, match="crc32c"):
        with embstore.open(path) as r:
            r[[C]]
    assert not embstore.verify(path).ok


def test_compressed_and_int8_tables_are_written_with_the_same_values(tmp_path):
    """Where rows cannot be left unwritten (sharded layouts, int8 codes) they are written
    at creation: the same values as the lazy table's."""
    ref = _ref(3000, 16)
    z = embstore.create(tmp_path / "z", shape=(3000, 16), init=SPEC, compression="zstd")
    np.testing.assert_array_equal(z.to_numpy(), ref)
    q = embstore.create(tmp_path / "q", shape=(3000, 16), init=SPEC, dtype="int8")
    np.testing.assert_array_equal(q.to_numpy(), embstore.save(tmp_path / "e", ref,
                                                              dtype="int8").to_numpy())


def test_training_from_a_lazy_table_equals_training_from_the_eager_one(tmp_path):
    torch = pytest.importorskip("torch")
    import embstore.torch as et
    ref = _ref()
    tables = [_lazy(tmp_path / "l"), embstore.save(tmp_path / "e", ref, format_version=2,
                                                   chunk_rows=C)]
    tables[1].close()
    tables[1] = embstore.open(tmp_path / "e", mode="r+")
    rng = np.random.default_rng(3)
    batches = [torch.from_numpy(rng.integers(0, V, size=(16, 20))) for _ in range(12)]
    out = []
    for t in tables:  # a loop per table (two)
        emb = et.Embedding(t, optimizer="rowwise_adagrad", lr=0.1, row_cache_bytes=64 << 10)
        for i, b in enumerate(batches):  # a loop per step
            emb(b).pow(2).sum().backward()
            if i == 5:
                emb.checkpoint()
        emb.checkpoint()
        emb.close()
        out.append(t.to_numpy())
        t.close()
    np.testing.assert_array_equal(out[0], out[1])
    assert not np.array_equal(out[0], ref)
    assert embstore.verify(tmp_path / "l").ok


@pytest.mark.slow
def test_a_hundred_million_rows_take_no_row_on_disk(tmp_path):
    from embstore.fs.copytree import disk_usage
    t = embstore.create(tmp_path / "big", shape=(10 ** 8, 64), init=SPEC)
    assert disk_usage(tmp_path / "big") < 32 << 20  # folders and marks; 25.6 GB of rows
    ids = np.array([0, 10 ** 8 - 1, 54_321_123])
    spec = check_init(SPEC, 64)
    want = np.stack([init_rows(spec, i, i + 1, 64)[0] for i in ids.tolist()])
    np.testing.assert_array_equal(t[ids], want)
    t.close()

"""When deltas are compacted: a write past the threshold is the compaction (one commit, one
version), so that ``retain_versions`` counts the commits a user made; a trainer's
write-backs defer compaction to its checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.store import table as handle

V, D = 200, 8


def _log(path):
    out = CliRunner().invoke(cli, ["log", str(path), "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)["versions"]


@pytest.fixture
def path(tmp_path):
    w = np.random.default_rng(1).standard_normal((V, D)).astype(np.float32)
    embstore.save(tmp_path / "t", w).close()
    return tmp_path / "t"


def test_retention_keeps_the_last_user_writes_readable(path):
    """Each write of 10% of the rows passes the 5% threshold; every one of the last 8 stays
    readable as written (before: a compaction version after each, and 8 retained versions
    held only 4 of the writes)."""
    rng = np.random.default_rng(2)
    want = {}
    with embstore.open(path, "r+") as t:
        expect = t.to_numpy()
        for _ in range(12):  # a loop per write
            ids = rng.choice(V, size=V // 10, replace=False)
            expect[ids] = rng.standard_normal((ids.size, D)).astype(np.float32)
            t.write(ids, expect[ids])
            want[t.version] = expect.copy()
            assert t.info()["pending_rows"] == 0  # (folded into the chunks by the write)
    log = _log(path)
    assert [e["change"]["kind"] for e in log] == ["write"] * 8
    assert all(e["change"]["folded"] == "chunks" and e["deltas"] == 0 for e in log)
    versions = [e["version"] for e in log]
    assert versions == sorted(want)[-8:]
    for v in versions:  # a loop per retained version
        with embstore.open(path, version=v) as old:
            np.testing.assert_array_equal(old.to_numpy(), want[v])
    assert embstore.verify(path).ok


def test_small_writes_merge_their_delta_files_in_the_same_commit(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "big"
    embstore.save(path, rng.standard_normal((20 * V, D)).astype(np.float32)).close()
    with embstore.open(path, "r+") as t:
        expect = t.to_numpy()
        for i in range(handle.MAX_DELTA_FILES + 6):  # a loop per write (below 5% each)
            ids = np.array([i % V, (7 * i + 3) % V])
            expect[ids] = rng.standard_normal((2, D)).astype(np.float32)
            t.write(ids, expect[ids])
            assert t.version == i + 2  # one version a write
        np.testing.assert_array_equal(t.to_numpy(), expect)
    log = _log(path)
    assert {e["change"]["kind"] for e in log} == {"write"}
    assert max(e["deltas"] for e in log) <= handle.MAX_DELTA_FILES
    assert any(e["change"].get("folded") == "delta" for e in log)
    assert embstore.verify(path).ok


def test_appends_with_keys_fold_their_key_deltas_in_the_same_commit(tmp_path):
    w = np.random.default_rng(4).standard_normal((V, D)).astype(np.float32)
    keys = [f"k{i}" for i in range(V)]
    embstore.save(tmp_path / "t", w, keys=keys).close()
    rows = [w]
    with embstore.open(tmp_path / "t", "r+") as t:
        t.write([5], np.ones((1, D), np.float32))  # a delta the appends must keep
        rows[0] = rows[0].copy()
        rows[0][5] = 1
        for i in range(handle.MAX_KEY_DELTAS + 3):  # a loop per append
            new = np.full((3, D), i, np.float32)
            first = t.append(new, keys=[f"n{i}-{j}" for j in range(3)])
            keys += [f"n{i}-{j}" for j in range(3)]
            rows.append(new)
            assert first.tolist() == list(range(len(keys) - 3, len(keys)))
    log = _log(tmp_path / "t")
    assert [e["change"]["kind"] for e in log[-5:]] == ["append"] * 5
    assert any(e["change"].get("keys_folded") for e in log)
    with embstore.open(tmp_path / "t") as t:
        np.testing.assert_array_equal(t.to_numpy(), np.concatenate(rows))
        assert list(t.keys) == keys
        np.testing.assert_array_equal(t.ids_of(keys[::7]), np.arange(len(keys))[::7])
    assert embstore.verify(tmp_path / "t").ok


@pytest.mark.slow
def test_a_trainers_write_backs_defer_compaction_to_the_checkpoint(path):
    """A small row cache evicts every step (write-backs far past 5% of the rows): no
    commit between checkpoints rewrites a chunk; the checkpoint folds them in; the rows
    equal a run whose cache holds the table (no write-backs)."""
    torch = pytest.importorskip("torch")
    import embstore.torch as et
    rng = np.random.default_rng(5)
    batches = [torch.from_numpy(rng.integers(0, V, size=24)) for _ in range(16)]
    runs = {}
    for name, cache in (("small", 40 * (4 * (D + 1) + 17)), ("big", "auto")):
        p = path.parent / name
        embstore.save(p, embstore.open(path).to_numpy()).close()
        emb = et.Embedding(p, optimizer="rowwise_adagrad", lr=0.05, row_cache_bytes=cache)
        for ids in batches:  # a loop per step
            emb(ids).pow(2).sum().backward()
        between = _log(p)
        v = emb.checkpoint()
        runs[name] = (between, _log(p), v, emb.trainer.cache.stats["written"])
        emb.close()
        assert embstore.verify(p).ok
    between, after, v, written = runs["small"]
    assert written > handle.COMPACT_FRACTION * V * 5
    assert not any(e["change"].get("folded") == "chunks" for e in between)
    assert sum(e["change"]["kind"] == "write" for e in between) > 5
    assert after[-1]["version"] == v and after[-1]["deltas"] == 0
    assert after[-1]["change"].get("folded") == "dense"  # (the flush's one commit)
    with embstore.open(path.parent / "small", version=v) as a, \
            embstore.open(path.parent / "big", version=runs["big"][2]) as b:
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    with embstore.open(path.parent / "small", "r+") as t:
        assert t.compaction == "auto"  # (the handle the trainer had, as it was)


@pytest.mark.parametrize("layout", [{"chunk_rows": 1000}, {"shard_rows": 4096}],
                         ids=["chunks", "shards"])
def test_a_fold_past_one_block_rewrites_every_row_right(tmp_path, layout):
    """Pending rows are folded a block of whole chunks (or shards) at a time: more than one
    block, the pending rows and the write's own, newest wins."""
    import zarr
    rng = np.random.default_rng(6)
    n = 300_000
    w = rng.standard_normal((n, 4)).astype(np.float32)
    path = tmp_path / "t"
    embstore.save(path, w, **layout).close()
    expect = w.copy()
    with embstore.open(path, "r+") as t:
        for size in (12_000, 70_000):  # (3%: deltas; then past 5%: folded, 2 blocks)
            ids = np.sort(rng.choice(n, size=size, replace=False))
            expect[ids] = rng.standard_normal((size, 4)).astype(np.float32)
            t.write(ids, expect[ids])
        assert t.info()["pending_rows"] == 0
    np.testing.assert_array_equal(zarr.open_group(str(path), mode="r")["vectors"][:], expect)
    assert _log(path)[-1]["change"]["folded"] == "chunks"
    assert embstore.verify(path).ok


def _chunk_inodes(path):
    return {int(p.parent.name): p.stat().st_ino
            for p in (path / "vectors" / "c").glob("*/0")}


def test_a_checkpoint_rewrites_only_the_dense_chunks(tmp_path):
    """A checkpoint's compaction (train/persist.py compact_dense) rewrites the chunks dense
    in pending rows and leaves rows scattered thinly over the others in one delta file:
    bytes written follow the chunks worth rewriting, not every chunk a row touched."""
    from embstore.train.persist import compact_dense
    V2, C = 16_384, 256  # 64 chunks of 32 KiB
    ref = np.random.default_rng(3).standard_normal((V2, 32)).astype(np.float32)
    path = tmp_path / "t"
    embstore.save(path, ref, format_version=2, chunk_rows=C).close()
    t = embstore.open(path, mode="r+")
    t.compaction = "deferred"  # (as a trainer's write-backs: deltas only)
    dense = np.arange(0, 4 * C)  # chunks 0-3 whole
    thin = np.arange(4 * C + 7, V2, C)  # one row in each of the other 60 chunks
    new = np.random.default_rng(4).standard_normal((dense.size + thin.size, 32)).astype(
        np.float32)
    ids = np.r_[dense, thin]
    t.write(ids, new)
    ref[ids] = new
    before = _chunk_inodes(path)
    t.compaction = "auto"
    assert compact_dense(t) is not None
    after = _chunk_inodes(path)
    assert sorted(k for k in after if after[k] != before[k]) == [0, 1, 2, 3]
    np.testing.assert_array_equal(t.to_numpy(), ref)
    snap = path / "vectors" / ".embstore" / "versions" / str(t.version)
    manifest = json.loads((snap / "manifest.json").read_text())
    assert manifest["change"]["folded"] == "dense"
    assert "vectors" in [d["array"] for d in manifest["deltas"]]  # (norms: one chunk, dense)
    delta = [snap / "deltas" / d["name"] for d in manifest["deltas"] if d["array"] == "vectors"]
    assert delta[0].stat().st_size < thin.size * (8 + 128) + 4096  # the thin rows only
    assert compact_dense(t) is None  # (what is left is below the threshold)
    t.compact()  # an explicit compaction still folds everything
    assert not json.loads((path / "vectors" / ".embstore" / "versions" / str(t.version) /
                           "manifest.json").read_text())["deltas"]
    np.testing.assert_array_equal(t.to_numpy(), ref)
    t.close()
    assert embstore.verify(path).ok
    with embstore.open(path) as r:
        np.testing.assert_array_equal(r.to_numpy(), ref)


def test_a_checkpoint_holds_a_bounded_block_of_rows_whatever_the_table(tmp_path, monkeypatch):
    """A checkpoint's flush and fold (every row dirty, evicted rows pending in deltas, a
    dense fold) allocate at most a few blocks of rows (the blocks made small here) and a few
    dozen bytes per id, never a chunk's rows, a write-back's or the dirty set's: measured
    with tracemalloc (NumPy's buffers are traced; the mapped chunk and delta files, the
    page cache's, are not).  Before (2026-12-02): 20-42 MiB for a table of 8 MiB of rows
    (write-backs of 32,768 rows each folding every pending row again, blocks of 65,536
    merged rows, a 16 MiB read per file checksum).  The rows equal those trained in memory."""
    torch = pytest.importorskip("torch")
    import gc
    import tracemalloc

    import embstore.torch as et
    from embstore.store.norms import source as norms_source
    from embstore.store.rows import stage
    from embstore.store.versions import delta
    block = 128 << 10
    for mod, name in ((delta, "FOLD_BLOCK_BYTES"), (stage, "BLOCK_BYTES"),
                      (norms_source, "NORM_BLOCK_BYTES")):
        monkeypatch.setattr(mod, name, block)
    rows, dim = 32_768, 64  # 8 MiB of rows, 64 chunks of 128 KiB
    w = np.random.default_rng(8).standard_normal((rows, dim)).astype(np.float32)
    embstore.save(tmp_path / "t", w, format_version=2, chunk_rows=512).close()
    rng = np.random.default_rng(9)
    batches = [torch.from_numpy(rng.permutation(rows)[: rows // 2]) for _ in range(6)]
    ref = et.Embedding(embstore.MemoryTable(w.copy()), optimizer="rowwise_adagrad", lr=0.05)
    emb = et.Embedding(tmp_path / "t", optimizer="rowwise_adagrad", lr=0.05)
    for i, ids in enumerate(batches):  # a loop per step
        for m in (emb, ref):
            m(ids).pow(2).sum().backward()
        if i == 2:
            emb.flush()  # (rows written back as deltas, pending: as evictions leave them)
    t = emb.table
    pending = t.info()["pending_rows"]
    dirty = int(emb.trainer.cache.dirty.sum())
    assert pending > rows // 8 and dirty > rows // 2
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        version = emb.checkpoint()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    bound = 8 * block + 40 * (dirty + pending)  # (the ids: 8 bytes each, a few copies)
    assert peak < bound, (peak, bound)
    assert peak < rows * dim * 4 // 3  # (a third of the table's rows: not O(table))
    log = _log(tmp_path / "t")
    assert log[-1]["version"] == version and log[-1]["change"].get("folded") == "dense"
    ref.checkpoint()
    np.testing.assert_array_equal(t.to_numpy(), ref.table.to_numpy())
    np.testing.assert_array_equal(emb.optimizer_state(np.arange(rows)),
                                  ref.optimizer_state(np.arange(rows)))
    emb.close()
    assert embstore.verify(tmp_path / "t").ok


def test_sorted_union_equals_numpy():
    """The folds' union of sorted unique ids (two arrays placed, more sorted) against
    np.unique of their concatenation, empty and overlapping ones included."""
    from embstore.store.versions.framed import sorted_union
    rng = np.random.default_rng(10)
    for _ in range(200):  # a loop per case
        parts = [np.unique(rng.integers(0, 80, size=rng.integers(0, 40)))
                 for _ in range(rng.integers(1, 4))]
        got = sorted_union(*parts)
        np.testing.assert_array_equal(got, np.unique(np.concatenate(parts)))
        assert got.dtype == np.int64

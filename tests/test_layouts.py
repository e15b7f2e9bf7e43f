"""One table format, every array layout versioned (docs/FORMAT.md, "Array layouts").

A writer chooses a layout for speed or size (rows at a fixed stride with a crc32c per page;
sharded chunks with a codec and a crc32c per chunk; a compact storage dtype); what readers
see never depends on it: versions, deltas, snapshot reads, `log`, `compact`, `vacuum`,
`open(version=N)` and `upgrade` hold for each.  Expectations are NumPy models of the table
replayed from the operations made."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from refreshing import MixCounter, hammer

V, D = 4000, 16
DATA = Path(__file__).parent / "data"

#: the layouts a writer may choose (each a versioned format-2 table)
LAYOUTS = {
    "rows": dict(format_version=2, chunk_rows=1024),
    "zstd": dict(compression="zstd"),
    "blosc": dict(compression="blosc"),
    "sharded": dict(chunk_rows=16, shard_rows=256),
    "int8-zstd": dict(dtype="int8", compression="zstd"),
    "bfloat16-sharded": dict(dtype="bfloat16", chunk_rows=16, shard_rows=512),
}


def _stored(E: np.ndarray, layout: str) -> np.ndarray:
    """The rows as a table of ``layout`` returns them (int8 and bfloat16 round)."""
    dtype = LAYOUTS[layout].get("dtype")
    if dtype is None:
        return E
    from embstore.dtypes import DTYPES
    rec = DTYPES[dtype]
    codes, side = rec.encode(E)
    out = np.empty_like(E)
    rec.decode(codes, side, out)
    return out


@pytest.fixture
def E(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture(params=sorted(LAYOUTS), ids=sorted(LAYOUTS))
def layout(request):
    return request.param


@pytest.fixture
def table(tmp_path, E, layout):
    p = tmp_path / "t"
    embstore.save(p, E, keys=[f"k{i}" for i in range(V)], **LAYOUTS[layout]).close()
    return p


def _log(path) -> list[dict]:
    res = CliRunner().invoke(cli, ["log", str(path), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["versions"]


def test_every_layout_is_format_2_with_versions(table, layout):
    with embstore.open(table) as t:
        info = t.info()
        assert info["format"] == 2 and t.version == 1
    assert [e["change"]["kind"] for e in _log(table)] == ["save"]


def test_every_version_of_every_layout_reads_back(table, layout, E, rng):
    """Writes (deltas), appends with keys and a compaction, each a version; each version
    read back exactly as the model after its operation, keys included; vacuum keeps the
    retained ones; the compaction changes no row, and zarr-python then reads the newest."""
    cur = _stored(E, layout)
    keys = [f"k{i}" for i in range(V)]
    models = {1: (cur.copy(), list(keys))}
    with embstore.open(table, "r+") as t:
        for step in range(4):
            if step == 2:
                new = rng.standard_normal((30, D)).astype(np.float32)
                names = [f"a{i}" for i in range(30)]
                t.append(new, keys=names)
                cur, keys = np.concatenate([cur, _stored(new, layout)]), keys + names
            else:
                ids = rng.choice(len(cur), 50, replace=False)
                new = rng.standard_normal((50, D)).astype(np.float32)
                t.write(ids, new)
                cur[ids] = _stored(new, layout)
            models[t.version] = (cur.copy(), list(keys))
        assert t.info()["pending_rows"] > 0  # (small writes: deltas, not chunk rewrites)
        v = t.compact()
        models[v] = (cur.copy(), list(keys))
        assert t.info()["pending_rows"] == 0
    for n, (want, names) in models.items():
        with embstore.open(table, version=n) as r:
            np.testing.assert_array_equal(r.to_numpy(), want, err_msg=f"version {n}")
            assert list(r.keys[-3:]) == names[-3:]
            np.testing.assert_array_equal(r.ids_of(names[-3:]), np.arange(len(names) - 3,
                                                                          len(names)))
    kinds = [e["change"]["kind"] for e in _log(table)]
    assert kinds[0] == "save" and kinds[-1] == "compact" and "append" in kinds
    if "dtype" not in LAYOUTS[layout]:  # (zarr-python reads the codes of int8/bfloat16)
        np.testing.assert_array_equal(zarr.open_group(str(table), mode="r")["vectors"][:], cur)
    res = CliRunner().invoke(cli, ["vacuum", str(table), "--keep", "2"])
    assert res.exit_code == 0, res.output
    assert len(_log(table)) == 2
    assert embstore.verify(table).ok


def test_a_compressed_write_costs_the_rows_not_the_chunks(tmp_path, rng):
    """10,000 random updates of a zstd table write at most 2x the compressed bytes of the
    chunks they touch (a delta: the rows and their ids), and no chunk file is replaced."""
    n, d = 250_000, 16  # (4% of the rows: below the automatic compaction's 5%)
    p = tmp_path / "t"
    E = rng.standard_normal((n, d)).astype(np.float32)
    embstore.save(p, E, compression="zstd").close()
    shards = sorted((p / "vectors" / "c").rglob("*"))
    before = {s: s.stat().st_ino for s in shards if s.is_file()}
    ids = rng.choice(n, 10_000, replace=False)
    with embstore.open(p, "r+") as t:
        cr = t.layout["chunk_rows"]
        t.write(ids, np.ones((ids.size, d), np.float32))
        snap = p / "vectors" / ".embstore" / "versions" / str(t.version)
        written = sum(f.stat().st_size for f in (snap / "deltas").iterdir()
                      if f.name.startswith(f"{t.version}."))
    assert {s: s.stat().st_ino for s in before} == before
    touched = np.unique(ids // cr).size
    stored = sum(s.stat().st_size for s in before)  # every chunk's compressed bytes ...
    per_chunk = stored / -(-n // cr)  # ... on average
    assert written <= 2 * touched * per_chunk, (written, touched, per_chunk)
    with embstore.open(p) as t:
        want = E.copy()
        want[ids] = 1
        np.testing.assert_array_equal(t.to_numpy(), want)


@pytest.mark.slow  # over 5 CPU-s (2026-12-02 per-test CPU timings)
def test_threads_sharing_a_refreshing_handle_of_a_compressed_table(tmp_path, E):
    """Threads look rows up through a row cache of one handle while another refreshes it
    and a writer commits whole-table rewrites: every lookup is one version's rows."""
    p = tmp_path / "t"
    embstore.save(p, np.zeros((V, D), np.float32), compression="zstd").close()
    with embstore.open(p, cache_bytes="4MiB") as t:
        count = MixCounter(t, V, 256)

        def write():
            with embstore.open(p, "r+") as w:
                for k in range(1, 16):
                    w.write(np.arange(V), np.full((V, D), k, np.float32))
        hammer(t, count.read, write)
    assert count.errors == [] and count.mixed == 0 and count.lookups > 10


@pytest.mark.parametrize("golden", ["golden-v1-zstd", "golden-v1-none", "golden-v1-int8"])
def test_a_format1_table_is_versioned_by_its_first_commit(tmp_path, golden):
    """A table written as format 1 opens and reads exactly; its first commit (a write)
    makes version 1 in place, written as a delta (no live file replaced but the group's
    zarr.json, which says format 2 from then on); then every clause of versions holds."""
    p = tmp_path / "t"
    shutil.copytree(DATA / golden, p)
    with embstore.open(p) as t:
        before, k0, n = t.to_numpy(), t.keys[0], len(t)
        assert t.version == 0 and t.info()["format"] == 1
    with embstore.open(p, "r+") as t:
        t.write([0], np.full((1, before.shape[1]), 0.5, np.float32))
        assert t.version == 1 and t.info()["pending_rows"] == 1
        t.append(np.ones((2, before.shape[1]), np.float32), keys=["new-a", "new-b"])
        assert t.version == 2
    with embstore.open(p) as t:
        got = t.to_numpy()
        assert len(t) == n + 2 and got[0, 0] == pytest.approx(0.5, abs=0.01)
        np.testing.assert_array_equal(got[1:n], before[1:])
        assert t.ids_of(["new-b"]).tolist() == [n + 1] and t.keys[0] == k0
    with embstore.open(p, version=1) as t:
        assert len(t) == n and t.info()["format"] == 2  # (no reader takes its live files
    assert [e["change"]["kind"] for e in _log(p)] == ["write", "append"]  # for the table)
    assert embstore.verify(p).ok


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_upgrade_converts_every_format1_table(tmp_path, rng, compression):
    """``embstore upgrade`` rewrites a format-1 table, compressed included, as format 2 in
    one step: rows and keys the same, versions from then on; a compressed table keeps its
    codec and chunks."""
    E = rng.standard_normal((2000, 8)).astype(np.float32)
    p = tmp_path / "t"
    embstore.save(p, E, keys=[f"w{i}" for i in range(2000)], format_version=1,
                  compression=compression, chunk_rows=8, shard_rows=512).close()
    res = CliRunner().invoke(cli, ["upgrade", str(p)])
    assert res.exit_code == 0, res.output
    with embstore.open(p) as t:
        info = t.info()
        assert info["format"] == 2 and t.version == 1
        assert info["compression"] == compression
        if compression != "none":
            assert (info["chunk_rows"], info["shard_rows"]) == (8, 512)
        np.testing.assert_array_equal(t.to_numpy(), E)
        assert t.ids_of(["w1999"]).tolist() == [1999]
    assert embstore.verify(p).ok


def test_another_tools_layout_keeps_no_versions(tmp_path, rng):
    """A layout only zarr-python knows (written in place by it) reads and writes as before,
    without versions (versions share unchanged files, and zarr-python changes them)."""
    E = rng.standard_normal((300, 8)).astype(np.float32)
    g = zarr.open_group(str(tmp_path / "t"), mode="w")
    g.create_array("vectors", data=E, chunks=(50, 8))
    with embstore.open(tmp_path / "t", "r+") as t:
        t.write([3], np.zeros((1, 8), np.float32))
        assert t.version == 0
    assert not os.path.exists(tmp_path / "t" / "vectors" / ".embstore" / "versions")
    E[3] = 0
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "t" / "vectors"))[:], E)


def test_a_missing_checksum_is_damage_never_an_unchecked_read(tmp_path, E):
    """A format-2 table whose page checksums were removed, or whose sharded chunks lost
    their crc32c codec, is refused (CorruptStoreError) instead of read without checks."""
    rows, sharded = tmp_path / "rows", tmp_path / "sharded"
    embstore.save(rows, E, format_version=2, chunk_rows=1024).close()
    embstore.save(sharded, E, chunk_rows=16, shard_rows=256).close()
    for d in (rows, rows / "vectors" / ".embstore" / "versions" / "1"):
        shutil.rmtree(d / "page_crc")
    for d in (sharded, sharded / "vectors" / ".embstore" / "versions" / "1"):
        meta = json.loads((d / "vectors" / "zarr.json").read_text())
        inner = meta["codecs"][0]["configuration"]["codecs"]
        assert inner[-1]["name"] == "crc32c"
        del inner[-1]
        (d / "vectors" / "zarr.json").unlink()  # (a new file: the other name keeps its own)
        (d / "vectors" / "zarr.json").write_text(json.dumps(meta))
    for p, why in ((rows, "page checksums of vectors|page_crc/.*: missing \\(version's manifest"),
                   (sharded, "not a checksummed layout|another file in its place")):
        with pytest.raises(embstore.CorruptStoreError, match=why):
            with embstore.open(p) as t:
                t[[1]]

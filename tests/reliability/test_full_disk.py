"""A file system that runs full at every point of ``append``, ``write``, ``save``, import,
export and batch output (a 16 MiB tmpfs, filled to leave a little less room each time).

Each run fails with ENOSPC somewhere (or fits): the CLI prints one ``Error:`` line and
exits 1, the original table is intact and verifies, and nothing is left behind (an
append may also have committed whole: then the table is exactly the new one).  Needs
root to mount the tmpfs; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from relhelpers import TRIED, assert_clean_error, invoke, tmpfs

import embstore

ROWS, DIM = 3000, 32
SIZE = 16 << 20


@pytest.fixture
def small_fs(tmp_path):
    with tmpfs(tmp_path / "fs", SIZE) as mnt:
        yield mnt


def _vals(n, start=0) -> np.ndarray:
    return np.repeat(np.arange(start, start + n, dtype=np.float32)[:, None], DIM, 1)


def _fill(mnt: Path, leave: int) -> Path:
    """Take all the free space of ``mnt`` but ``leave`` bytes."""
    st = os.statvfs(mnt)
    filler = mnt / "filler"
    size = st.f_bavail * st.f_frsize - leave
    if size > 0:
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, size)
    return filler


def _tree(path: Path) -> dict:
    """Every file's bytes; of a format-2 chunk file (``vectors``, ``norms``, ``row_scale``),
    the bytes of its committed rows only (an append writes the padding past them in place:
    no version reads it, docs/FORMAT.md §3a)."""
    def committed(array_dir: str):  # (chunk rows, row bytes, rows) of a plain row array
        try:
            with open(os.path.join(array_dir, "zarr.json")) as f:
                meta = json.load(f)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if meta.get("node_type") != "array" or len(meta["shape"]) != 2 or \
                meta["codecs"][0]["name"] != "bytes" or len(meta["codecs"]) != 1:
            return None
        chunk = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
        dtype = "<u2" if meta["data_type"] == "bfloat16" else meta["data_type"]
        return chunk, meta["shape"][1] * np.dtype(dtype).itemsize, meta["shape"][0]

    out = {}
    for d, _, files in os.walk(path):
        for name in files:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, path)
            with open(p, "rb") as f:
                out[rel] = f.read()
            parts = rel.split(os.sep)
            if len(parts) >= 4 and parts[-3] == "c":
                geo = committed(os.path.join(d, "..", ".."))
                if geo is not None:
                    chunk, row, rows = geo
                    k = int(parts[-2])
                    out[rel] = out[rel][: max(0, min(chunk, rows - k * chunk)) * row]
    return out


def _leaves(n: int = 10) -> list[int]:
    return [int(x) for x in np.linspace(0, 900_000, n)]


@pytest.mark.parametrize("fmt", [1, 2], ids=["sharded", "rows"])
@pytest.mark.parametrize("op", ["append", "write"])
def test_append_and_write_on_a_full_disk(small_fs, op, fmt):
    table = small_fs / "t"
    failures = 0
    layout = {"chunk_rows": 16, "shard_rows": 1024} if fmt == 1 else {
        "chunk_rows": 1024, "format_version": 2}
    for leave in _leaves():
        if table.exists():
            shutil.rmtree(table)
        embstore.save(table, _vals(ROWS), keys=[f"k{i}" for i in range(ROWS)],
                      **layout).close()
        before = _tree(table)
        filler = _fill(small_fs, leave)
        try:
            with embstore.open(table, mode="r+") as t:
                if op == "append":
                    t.append(_vals(2000, 10_000), keys=[f"n{i}" for i in range(2000)])
                else:
                    t.write(np.arange(0, ROWS, 7), -_vals(len(range(0, ROWS, 7))))
                    t.compact()  # (the write is a delta; the compaction rewrites chunks)
            ok = True
        except OSError as exc:
            assert "No space left" in str(exc) or getattr(exc, "errno", None) == 28, exc
            ok = False
        failures += not ok
        report = embstore.verify(table)  # still full: reading needs no space
        assert report.ok, str(report)
        with embstore.open(table) as t:
            got, keys = t.to_numpy(), list(t.keys)
        if len(got) == ROWS and got[7, 0] == 7:  # the old table, byte for byte
            np.testing.assert_array_equal(got, _vals(ROWS))
            assert _tree(table) == before, "files left or changed by the failed operation"
        else:
            # failed after its commit point (an append, or the compaction after the
            # write): new and whole
            want = _vals(ROWS) if op == "write" else np.concatenate(
                [_vals(ROWS), _vals(2000, 10_000)])
            if op == "write":
                want[::7] = -_vals(len(range(0, ROWS, 7)))
            np.testing.assert_array_equal(got, want)
            assert len(keys) == len(want)
        filler.unlink()
        TRIED[f"full disk: {op}"] += 1
    assert failures >= 3


def test_save_and_import_on_a_full_disk(small_fs, tmp_path):
    src = tmp_path / "src.npy"
    np.save(src, _vals(20_000))
    for leave in _leaves():
        filler = _fill(small_fs, leave)
        try:
            embstore.save(small_fs / "saved", np.load(src)).close()
            shutil.rmtree(small_fs / "saved")
        except OSError as exc:
            assert getattr(exc, "errno", None) == 28, exc
        assert sorted(os.listdir(small_fs)) == ["filler"]
        try:
            embstore.save(small_fs / "saved2", np.load(src), format_version=2).close()
            shutil.rmtree(small_fs / "saved2")
        except OSError as exc:
            assert getattr(exc, "errno", None) == 28, exc
        assert sorted(os.listdir(small_fs)) == ["filler"]
        res = invoke(["import", src, small_fs / "imported", "-q"])
        if res.exit_code == 0:
            shutil.rmtree(small_fs / "imported")
        else:
            assert "space" in assert_clean_error(res, context=f"import, {leave} bytes free")
        assert sorted(os.listdir(small_fs)) == ["filler"]
        filler.unlink()
        TRIED["full disk: save and import"] += 1


@pytest.mark.parametrize("what", ["export-npy", "export-w2v", "lookup-npy", "lookup-zarr"])
def test_outputs_on_a_full_disk(small_fs, tmp_path, what):
    table = tmp_path / "t"
    embstore.save(table, _vals(20_000), keys=[f"k{i}" for i in range(20_000)]).close()
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(20_000).reshape(100, 200) % 20_000)
    before = _tree(table)
    for leave in _leaves(6):
        filler = _fill(small_fs, leave)
        if what.startswith("export"):
            out = small_fs / ("out.npy" if what == "export-npy" else "out.txt")
            res = invoke(["export", table, out] + (["--format", "word2vec"]
                                                    if what == "export-w2v" else []))
        else:
            out = small_fs / ("out.npy" if what == "lookup-npy" else "out.zarr")
            res = invoke(["lookup", table, ids, out, "-q"])
        partial = small_fs / ".out.zarr.partial"
        if res.exit_code != 0:
            assert "space" in assert_clean_error(res, context=f"{what}, {leave} bytes free")
        if what == "lookup-zarr" and partial.exists():  # kept for --resume (an I/O failure)
            assert sorted(os.listdir(small_fs)) == [".out.zarr.partial", "filler"]
            filler.unlink()
            res = invoke(["lookup", table, ids, out, "-q", "--resume"])
            assert res.exit_code == 0, res.output
            np.testing.assert_array_equal(zarr.open_array(str(out), mode="r")[...],
                                          _vals(20_000)[np.load(ids)])
        if res.exit_code == 0:
            (shutil.rmtree if out.is_dir() else os.remove)(out)
        expected = ["filler"] if filler.exists() else []
        assert sorted(os.listdir(small_fs)) == expected
        if filler.exists():
            filler.unlink()
        TRIED[f"full disk: {what}"] += 1
    assert _tree(table) == before
    assert embstore.verify(table).ok


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_index_build_on_a_full_disk(small_fs):
    """``build_index(overwrite=True)`` over an index that searches: on a full disk at any
    point it fails with ENOSPC and the old index files are untouched (no staging left), or
    it fits and the new one is whole; either way it opens and finds each query's own row
    and its exact neighbours."""
    pytest.importorskip("faiss")
    from embstore.search.ann import index_info, index_path
    rng = np.random.default_rng(5)
    centres = rng.standard_normal((20, DIM)).astype(np.float32)
    a = centres[rng.integers(0, 20, ROWS)] + 0.05 * rng.standard_normal((ROWS, DIM)).astype(
        np.float32)
    table = small_fs / "t"
    embstore.save(table, a).close()
    q = a[[5, 77, 2999]]
    failures = 0
    for leave in _leaves():
        embstore.build_index(table, nlist=8, overwrite=True)
        home = index_path(table).parent
        before = _tree(home)
        filler = _fill(small_fs, leave)
        try:
            embstore.build_index(table, nlist=16, overwrite=True)
            ok = True
        except OSError as exc:
            assert "No space left" in str(exc) or getattr(exc, "errno", None) == 28, exc
            ok = False
        failures += not ok
        meta = index_info(table)
        assert meta["nlist"] == (16 if ok else 8) and meta["stale"] is False
        if not ok:
            assert _tree(home) == before, "the failed build left or changed files"
        with embstore.open(table) as t:
            approx, _ = embstore.search.stream.most_similar(t, q, k=5, approx=True, ef=meta["nlist"])
            exact, _ = embstore.search.stream.most_similar(t, q, k=5)
        assert approx[:, 0].tolist() == [5, 77, 2999]  # every list probed
        assert all(len(set(x) & set(y)) >= 4 for x, y in zip(approx.tolist(), exact.tolist()))
        filler.unlink()
        TRIED["full disk: index build"] += 1
    assert failures >= 3

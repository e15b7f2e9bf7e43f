"""The stored row norms (``norms``, docs/FORMAT.md §3d): written by save/create/import, kept
right by write and append inside the same commit (also when killed at any commit step),
checked by verify; tables without them still search (and can get them later)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.store.versions.commit import Transaction
from embstore.store.norms.source import has_norms
from embstore.store.stored_norms import store_norms
from killchild import child_script, run_child

DTYPES = ["float32", "float16", "float64", "bfloat16", "int8"]


def _ref_norms(t) -> np.ndarray:
    """NumPy: the norms of the rows as the table returns them (float64)."""
    return np.linalg.norm(t.to_numpy().astype(np.float64), axis=1)


def _stored(t) -> np.ndarray:
    return t.norms_source.read(0, t.vocab_size)[:, 0].astype(np.float64)


def _rows(n=500, dim=12, seed=0):
    a = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    a[3] = 0
    return a


@pytest.mark.parametrize("dtype", DTYPES)
def test_save_write_append_keep_norms_right(tmp_path, dtype):
    path = tmp_path / "t"
    embstore.save(path, _rows(), dtype=dtype, shard_rows=128).close()
    with embstore.open(path, mode="r+") as t:
        assert t.norms_source.dtype == (np.float64 if dtype == "float64" else np.float32)
        np.testing.assert_allclose(_stored(t), _ref_norms(t), rtol=2e-7)
        assert _stored(t)[3] == 0
        t.write([0, 130, 499], np.full((3, 12), 3.0))
        t.append(np.arange(24, dtype=np.float32).reshape(2, 12))
        np.testing.assert_allclose(_stored(t), _ref_norms(t), rtol=2e-7)
        assert t.vocab_size == 502 and _stored(t)[130] == pytest.approx(np.sqrt(12 * 9.0))
    with embstore.open(path) as t:  # as another handle sees them
        np.testing.assert_allclose(_stored(t), _ref_norms(t), rtol=2e-7)
    assert embstore.verify(path).ok


def test_create_has_zero_norms_then_write(tmp_path):
    with embstore.create(tmp_path / "t", shape=(300, 4), keys=[f"k{i}" for i in range(300)],
                         shard_rows=64) as t:
        np.testing.assert_array_equal(_stored(t), np.zeros(300))
        t.write([5], [[3.0, 4.0, 0.0, 0.0]])
        t.append(np.ones((1, 4)), keys=["new"])
        assert _stored(t)[5] == 5.0 and _stored(t)[300] == 2.0
        np.testing.assert_array_equal(np.delete(_stored(t), [5, 300]), 0)
    assert embstore.verify(tmp_path / "t").ok


def test_import_writes_norms(tmp_path):
    src = tmp_path / "v.txt"
    src.write_text("2 3\na 1 2 2\nb 0 3 4\n")
    embstore.import_file(src, tmp_path / "t")
    with embstore.open(tmp_path / "t") as t:
        np.testing.assert_array_equal(_stored(t), [3.0, 5.0])


def _damage_norm(path, row: int, value: float) -> None:
    """Store a wrong norm with a valid checksum (through the norms' own writer)."""
    with embstore.open(path, mode="r+") as t:
        with t._versions.writing(t._handle):
            txn = Transaction(t.path)
            t.norms_source.write(np.array([row]), np.array([[value]], np.float32), txn)
            txn.commit()


def test_verify_detects_a_wrong_norm(tmp_path):
    path = tmp_path / "t"
    embstore.save(path, _rows()).close()
    good = embstore.verify(path)
    assert good.ok and "norms" in good.arrays
    _damage_norm(path, 42, 1.5)
    report = embstore.verify(path)
    assert not report.ok
    assert len(report.damaged) == 1 and "row 42 has stored norm 1.5" in report.damaged[0].message
    res = CliRunner().invoke(cli, ["verify", str(path)])
    assert res.exit_code == 1 and "row 42" in res.output


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_a_norm_past_float32_max_is_stored_as_inf_and_verifies(tmp_path, dtype):
    x = np.ones((10, 4), np.float32)
    x[3] = 3.3e38  # finite in every storage dtype, but its norm (6.6e38) is not in float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning out of save
        t = embstore.save(tmp_path / "t", x, dtype=dtype)
    assert np.isinf(_stored(t)[3]) and np.isfinite(np.delete(_stored(t), 3)).all()
    t.close()
    assert embstore.verify(tmp_path / "t").ok


def test_verify_flags_a_nan_norm(tmp_path):
    path = tmp_path / "t"
    embstore.save(path, _rows()).close()
    _damage_norm(path, 7, float("nan"))
    report = embstore.verify(path)
    assert not report.ok and "row 7 has stored norm nan" in report.damaged[0].message


@pytest.mark.parametrize("fmt,says", [
    (1, ("array norms", "checksum")),
    (2, ("norms/c/0/0: crc32c mismatch in 1 of its 1 pages (0): the stored norms are damaged",))])
def test_a_flipped_bit_in_norms_is_corruption(tmp_path, fmt, says):
    path = tmp_path / "t"
    embstore.save(path, _rows(), format_version=fmt).close()
    shard = path / "norms" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[8 if fmt == 1 else 1000] ^= 0x01  # (format 2: the 251st norm of the only chunk)
    shard.write_bytes(bytes(raw))
    report = embstore.verify(path)
    assert not report.ok and all(s in str(report) for s in says), str(report)


def test_tables_without_norms_search_and_get_them_later(tmp_path):
    a = _rows(400, 8)
    path = tmp_path / "t"
    embstore.save(path, a, format_version=1).close()
    shutil.rmtree(path / "norms")  # as an older embstore (or another Zarr tool) wrote it
    q = np.random.default_rng(3).standard_normal(8).astype(np.float32)
    with embstore.open(path, mode="r+") as t:
        assert t.norms_source is None
        ids_before, _ = embstore.Embedding(t).most_similar(q, k=5)
        t.append(np.ones((1, 8)))  # writes stay possible, no norms appear
        assert not has_norms(path)
    assert embstore.verify(path).ok
    res = CliRunner().invoke(cli, ["reindex", str(path), "--norms"])
    assert res.exit_code == 0, res.output
    with embstore.open(path) as t:
        np.testing.assert_allclose(_stored(t), _ref_norms(t), rtol=2e-7)
        ids_after, _ = embstore.Embedding(t).most_similar(q, k=5)
    np.testing.assert_array_equal(ids_before, ids_after)
    assert embstore.verify(path).ok
    assert store_norms(path) == 401  # rebuilt in place: still right
    assert embstore.verify(path).ok


CHILD = child_script("""
    if op == "append":
        t.append(np.full((150, 8), 7.0, np.float32))
    else:
        ids = np.arange(5, 300, 41)
        t.write(ids, np.repeat(ids[:, None].astype(np.float32), 8, 1) + 100)
""")


def _run(path, op, kill_at) -> subprocess.CompletedProcess:
    return run_child(CHILD, path, op, kill_at)


def _kill_points(steps: int, every: bool) -> list[int]:
    return list(range(1, steps + 1)) if every else sorted({1, steps // 2, steps - 1, steps})


@pytest.mark.parametrize("op,every", [
    ("write", False), ("append", False),
    pytest.param("write", True, marks=pytest.mark.slow),
    pytest.param("append", True, marks=pytest.mark.slow)])
def test_norms_survive_sigkill_at_commit_steps(tmp_path, op, every):
    base = tmp_path / "base"
    old = np.tile(np.arange(300, dtype=np.float32)[:, None], (1, 8))
    embstore.save(base, old, shard_rows=64).close()
    shutil.copytree(base, tmp_path / "probe")  # no kill: count the steps (on a copy)
    full = _run(tmp_path / "probe", op, 0)
    assert full.returncode == 0, full.stderr
    steps = int(full.stdout.strip())
    with embstore.open(tmp_path / "probe") as t:
        new = t.to_numpy()
    seen = set()
    for n in _kill_points(steps, every):  # a kill at (every) durable step
        path = tmp_path / f"k{n}"
        shutil.copytree(base, path)
        res = _run(path, op, n)
        assert res.returncode == -signal.SIGKILL, (n, res.stderr)
        with embstore.open(path) as t:
            rows = t.to_numpy()
            state = "old" if np.array_equal(rows, old) else "new"
            assert state == "old" or np.array_equal(rows, new), n
            np.testing.assert_allclose(_stored(t), _ref_norms(t), rtol=2e-7, err_msg=str(n))
            seen.add(state)
        assert embstore.verify(path).ok, n
        shutil.rmtree(path)
    assert seen == {"old", "new"}  # killed before and after the commit point


def test_norms_that_do_not_fit_are_left_aside_and_reported(tmp_path):
    path = tmp_path / "t"
    embstore.save(path, _rows(300, 4)).close()
    meta_path = path / "norms" / "zarr.json"
    import json
    doc = json.loads(meta_path.read_text())
    doc["shape"][0] = 100  # fewer norms than rows (as if another tool appended rows)
    meta_path.write_text(json.dumps(doc))
    with embstore.open(path) as t:  # still opens and searches (norms computed)
        assert t.norms_source is None
        ids, _ = embstore.Embedding(t).most_similar(5, k=3)
        want = np.argsort(-(_rows(300, 4) @ _rows(300, 4)[5]
                            / np.maximum(np.linalg.norm(_rows(300, 4), axis=1), 1e-30)))
        assert ids[0] == [i for i in want if i != 5][0]
    report = embstore.verify(path)
    assert not report.ok and "expected float32 of shape [>= 300, 1]" in str(report)
    store_norms(path)  # (a new version; the damaged one is still retained, and named)
    report = embstore.verify(path)
    assert not report.ok and all("versions/1/" in f"{d.file} {d.message}" or "version 1:" in d.message
                                 for d in report.damaged), str(report)
    with embstore.open(path, mode="r+") as t:
        assert t.vacuum(keep=1) == [1]
    assert embstore.verify(path).ok

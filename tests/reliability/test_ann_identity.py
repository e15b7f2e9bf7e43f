"""The approximate index is tied to its table: the table's id (``attributes.embstore.
table_id``, written at save, kept by commits, compaction and upgrade) and the version it
was built on are in the index's ``meta.json``.  Another table's ``ann/`` copied in (same
shape, neither written since save) is refused: a ``StaleIndexWarning`` and an exact search,
``verify`` exit 1.  An index ``verify`` cannot check (usearch not installed) is *not
verified*, exit 1."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from relhelpers import REPO, invoke

import embstore
from embstore.search.ann import StaleIndexWarning

faiss = pytest.importorskip("faiss")

ROWS, DIM = 2000, 8
ANN = Path("vectors") / ".embstore" / "ann"


def _rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((ROWS, DIM)).astype(np.float32)


def _attrs(path: Path) -> dict:
    return json.loads((path / "zarr.json").read_text())["attributes"]["embstore"]


def _exact(a: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    s = (a @ q) / np.linalg.norm(a, axis=1)
    return np.argsort(-s, kind="stable")[:k]


@pytest.fixture
def two(tmp_path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    for path, seed in ((a, 1), (b, 2)):
        embstore.save(path, _rows(seed)).close()
        embstore.build_index(path, nlist=16)
    return a, b


def test_each_table_has_its_own_id_and_its_index_records_it(two):
    a, b = two
    ida, idb = _attrs(a)["table_id"], _attrs(b)["table_id"]
    assert len(ida) == 32 and int(ida, 16) >= 0 and ida != idb
    meta = json.loads((a / ANN / "meta.json").read_text())
    assert meta["table_id"] == ida and meta["table_version"] == 1


def test_another_tables_index_copied_in_is_refused(two):
    a, b = two
    shutil.rmtree(b / ANN)
    shutil.copytree(a / ANN, b / ANN)
    q = _rows(9)[:3]
    with embstore.open(b) as t:
        with pytest.warns(StaleIndexWarning, match="not this table's"):
            ids, _ = embstore.Embedding(t).most_similar(q[0], k=5, approx=True)
    np.testing.assert_array_equal(ids, _exact(_rows(2), q[0], 5))  # b's rows, exactly
    res = invoke(["verify", b])
    assert res.exit_code == 1, res.output
    assert "not this table's index" in res.output and "Traceback" not in res.output
    with embstore.open(a) as t, warnings.catch_warnings():
        warnings.simplefilter("error")  # the original is still a's, up to date
        embstore.Embedding(t).most_similar(q[0], k=5, approx=True)
    assert invoke(["verify", a]).exit_code == 0


def test_the_id_survives_appends_and_compaction_and_the_index_goes_stale(two):
    a, _ = two
    tid = _attrs(a)["table_id"]
    with embstore.open(a, mode="r+") as t:
        t.append(np.ones((3, DIM), np.float32))
        t.compact()
    assert _attrs(a)["table_id"] == tid
    with embstore.open(a) as t:
        with pytest.warns(StaleIndexWarning, match="changed after"):
            embstore.Embedding(t).most_similar(np.ones(DIM), k=3, approx=True)
    embstore.build_index(a, nlist=16, overwrite=True)
    meta = json.loads((a / ANN / "meta.json").read_text())
    with embstore.open(a) as t:
        assert meta["table_id"] == tid and meta["table_version"] == t.version


def test_a_format_1_table_gets_an_id_at_upgrade_and_keeps_its_index(tmp_path):
    path = tmp_path / "g"
    shutil.copytree(REPO / "tests" / "data" / "golden-v1-none", path)
    assert "table_id" not in _attrs(path)  # (format 1: written before table ids)
    embstore.build_index(path, nlist=2)
    assert json.loads((path / ANN / "meta.json").read_text())["table_id"] is None
    with embstore.open(path) as t:
        a = t.to_numpy().astype(np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an id-less table's own index: up to date
            embstore.Embedding(t).most_similar(a[0], k=2, approx=True)
    embstore.upgrade(path).close()
    tid = _attrs(path)["table_id"]
    assert len(tid) == 32
    meta = json.loads((path / ANN / "meta.json").read_text())
    assert meta["table_id"] == tid and meta["table_version"] == 1
    with embstore.open(path) as t, warnings.catch_warnings():
        warnings.simplefilter("error")  # the carried index is the new table's
        embstore.Embedding(t).most_similar(a[0], k=2, approx=True)
    assert invoke(["verify", path]).exit_code == 0


def test_an_index_whose_library_is_missing_is_not_verified(two, monkeypatch):
    a, _ = two
    d = a / ANN
    meta = json.loads((d / "meta.json").read_text())
    for name in ("index.faiss", "lists.ivfdata", "lists.crc32c"):
        (d / name).unlink()
    (d / "index.usearch").write_bytes(b"\0" * 64)  # (an HNSW index of embstore <= 0.4)
    for k in ("checksums", "meta_crc32c"):
        meta.pop(k)
    meta["library"] = "usearch"
    (d / "meta.json").write_text(json.dumps(meta))
    monkeypatch.setitem(sys.modules, "usearch", None)  # not installed
    monkeypatch.setitem(sys.modules, "usearch.index", None)
    report = embstore.verify(a)
    assert not report.ok
    assert any("usearch is not installed" in d.message for d in report.damaged), report.damaged
    assert "not verified" in report.index

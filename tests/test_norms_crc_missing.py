"""Norms stored as a row array are checked by their page checksums: with
``norms_page_crc`` (or only its ``zarr.json``) removed, the table refuses to read them
(CorruptStoreError) and verify exits 1; they are never read unchecked or set aside."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import embstore
from embstore.errors import CorruptStoreError


@pytest.mark.parametrize("what", ["array", "zarr.json"])
def test_norms_without_their_page_checksums_are_damage(tmp_path, what):
    path = tmp_path / "t"
    rows = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    embstore.save(path, rows).close()
    versions = sorted((path / "vectors" / ".embstore" / "versions").iterdir())
    for base in [path] + versions:  # the live tree and every version's links
        crc = base / "norms_page_crc"
        assert crc.is_dir()
        if what == "array":
            shutil.rmtree(crc)
        else:
            (crc / "zarr.json").unlink()
    with pytest.raises(CorruptStoreError, match=r"norms_page_crc/(zarr.json|c/.*): missing"):
        with embstore.open(path) as t:
            embstore.Embedding(t).most_similar(rows[0], k=3)
    report = embstore.verify(path)
    assert not report.ok and any("norms_page_crc" in d.message for d in report.damaged)

"""The README's main job runs end to end (each demo step checks itself against NumPy)."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from embstore.cli import cli


def test_demo_runs_end_to_end(tmp_path):
    result = CliRunner().invoke(cli, ["demo", str(tmp_path), "--no-dask"])
    assert result.exit_code == 0, result.output
    assert "Demo finished" in result.output
    assert "failed" not in result.output
    # what it left behind is real: the batch output equals a lookup in the imported table
    import embstore

    ids = np.load(tmp_path / "ids.npy")
    with embstore.open(tmp_path / "lee.emb") as t:
        np.testing.assert_array_equal(np.load(tmp_path / "vectors.npy"), t.to_numpy()[ids])
        assert t.shape == (2747, 32) and t.keys[0] == "the"

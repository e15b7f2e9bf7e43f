"""``python -m embstore`` runs the same command line as the ``embstore`` script."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import embstore


def test_python_m_embstore_runs_the_cli(tmp_path):
    E = np.arange(12, dtype=np.float32).reshape(4, 3)
    embstore.save(tmp_path / "t.emb", E).close()
    res = subprocess.run([sys.executable, "-m", "embstore", "info", str(tmp_path / "t.emb"),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert '"vocab_size": 4' in res.stdout and '"dim": 3' in res.stdout
    bad = subprocess.run([sys.executable, "-m", "embstore", "nosuchcommand"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "No such command" in bad.stderr

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


def test_common_mistakes_get_helpful_errors(tmp_path):
    from click.testing import CliRunner

    from embstore.cli import cli

    words = tmp_path / "words.txt"
    words.write_text("2 2\na 1 2\nb 3 4\n", encoding="utf-8")
    run = CliRunner().invoke
    res = run(cli, ["info", str(words)])
    assert res.exit_code == 1
    assert res.output.strip() == (f"Error: {words}: is a file, not an embstore table (a table is "
                                  "a directory written by save, create or import_file); to "
                                  f"make a table of it: embstore import {words} TABLE")
    (tmp_path / "folder").mkdir()
    res = run(cli, ["verify", str(tmp_path / "folder")])
    assert res.exit_code == 1 and "DAMAGED" not in res.output
    assert "is a directory but not an embstore table" in res.output
    embstore.save(tmp_path / "t.emb", np.eye(3, dtype=np.float32), keys=["a", "b", "c"]).close()
    ids = tmp_path / "ids.txt"
    ids.write_text("a b\nc\n", encoding="utf-8")
    res = run(cli, ["lookup", str(tmp_path / "t.emb"), str(ids), str(tmp_path / "o.npy")])
    assert res.exit_code == 1 and "allow_pickle" not in res.output
    assert "not a .npy file of ids (it looks like text: a text file of keys is read with " \
        "keys=True)" in res.output

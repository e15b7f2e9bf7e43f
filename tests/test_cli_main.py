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


def _keyed(tmp_path):
    E = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    keys = ["the", "cat", "sät", "on", "##ing"]
    embstore.save(tmp_path / "k.emb", E, keys=keys).close()
    return E, keys


def test_keyless_exports_write_the_keys_beside(tmp_path):
    from click.testing import CliRunner

    from embstore.cli import cli

    E, keys = _keyed(tmp_path)
    for ext in ("npy", "safetensors"):
        out = tmp_path / f"out.{ext}"
        res = CliRunner().invoke(cli, ["export", str(tmp_path / "k.emb"), str(out)])
        assert res.exit_code == 0, res.output
        vocab = tmp_path / "out.vocab.txt"
        assert vocab.read_text(encoding="utf-8").splitlines() == keys
        assert f"keys in {vocab}" in res.output
        # and back: the vectors file plus its keys give the same table
        res = CliRunner().invoke(cli, ["import", str(out), str(tmp_path / f"back{ext}.emb"),
                                       "--vocab", str(vocab)])
        assert res.exit_code == 0, res.output
        with embstore.open(tmp_path / f"back{ext}.emb") as t:
            assert list(t.keys) == keys
            np.testing.assert_array_equal(t.to_numpy(), E)
        vocab.unlink()
    res = CliRunner().invoke(cli, ["export", str(tmp_path / "k.emb"), str(tmp_path / "x.npy"),
                                   "--no-vocab-out"])
    assert res.exit_code == 0 and "they were not written" in res.output
    assert not (tmp_path / "x.vocab.txt").exists()


def test_safetensors_export_loads_as_a_pytorch_checkpoint(tmp_path):
    import torch
    from safetensors.torch import load_file, safe_open

    E, _ = _keyed(tmp_path)
    out = tmp_path / "emb.safetensors"
    res = embstore.export_table(tmp_path / "k.emb", out, tensor="embed_tokens.weight",
                                vocab_out=False)
    assert res.rows == 5 and res.keys_dropped
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}  # Hugging Face's loaders refuse "np"
    loaded = load_file(str(out))
    assert list(loaded) == ["embed_tokens.weight"]
    torch.testing.assert_close(loaded["embed_tokens.weight"], torch.from_numpy(E))
    import pytest

    with pytest.raises(embstore.FormatError, match="tensor name applies to safetensors"):
        embstore.export_table(tmp_path / "k.emb", tmp_path / "e.npy", tensor="w")


def test_keys_that_cannot_be_one_per_line_are_refused(tmp_path):
    import pytest

    embstore.save(tmp_path / "b.emb", np.eye(2, dtype=np.float32), keys=["ok", "a\nb"]).close()
    with pytest.raises(embstore.FormatError, match=r"key 'a\\nb' at row 1 cannot be written"):
        embstore.export_table(tmp_path / "b.emb", tmp_path / "b.npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.emb"]  # nothing half-written

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
        "--keys)" in res.output  # the library says keys=True; the CLI names the flag


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


def _cli(*args, input=None):
    from click.testing import CliRunner

    from embstore.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def test_every_command_prints_json(tmp_path):
    import json

    E, keys = _keyed(tmp_path)
    t = tmp_path / "k.emb"
    np.save(tmp_path / "ids.npy", np.array([[0, 1], [4, 2]]))
    docs = {}
    for name, args in [
        ("info", ["info", t]),
        ("verify", ["verify", t]),
        ("similar", ["similar", t, "cat", "-k", "2"]),
        ("export", ["export", t, tmp_path / "e.txt"]),
        ("import", ["import", tmp_path / "e.txt", tmp_path / "i.emb"]),
        ("lookup", ["lookup", t, tmp_path / "ids.npy", tmp_path / "o.npy"]),
    ]:
        res = _cli(*args, "--json")
        assert res.exit_code == 0, (name, res.output)
        docs[name] = json.loads(res.stdout)
    assert docs["info"]["vocab_size"] == 5 and docs["verify"]["ok"] is True
    assert [n["key"] for n in docs["similar"][0]["neighbours"]] == \
        [keys[i] for i in np.argsort(-(E @ E[1] / np.linalg.norm(E, axis=1)))[1:3]]
    assert docs["export"]["rows"] == 5 and docs["import"]["rows"] == 5
    assert docs["lookup"]["shape"] == [2, 2, 4]
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), E[[[0, 1], [4, 2]]])


def test_quiet_everywhere_and_similar_by_id(tmp_path):
    E, keys = _keyed(tmp_path)
    t = tmp_path / "k.emb"
    for args in (["info", t], ["verify", t], ["similar", t, "cat"],
                 ["export", t, tmp_path / "q.txt"]):
        assert _cli(*args, "-q").exit_code == 0
    res = _cli("verify", t, "-q")
    assert res.output == ""
    by_key, by_id = _cli("similar", t, "cat", "--json"), _cli("similar", t, "--ids", "1", "--json")
    import json

    (a,), (b,) = json.loads(by_key.stdout), json.loads(by_id.stdout)
    assert b["query"] == 1 and a["neighbours"] == b["neighbours"]
    res = _cli("similar", t, "--ids", "cat")
    assert res.exit_code == 2 and "with --ids QUERY must be row ids" in res.output


def test_dash_streams_to_stdout_and_from_stdin(tmp_path):
    E, keys = _keyed(tmp_path)
    t = tmp_path / "k.emb"
    res = _cli("export", t, "-", "--format", "glove")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == keys
    np.testing.assert_array_equal(
        np.array([[float(v) for v in line.split()[1:]] for line in lines], np.float32), E)
    assert _cli("export", t, "-").exit_code == 2  # which format? it must be said
    res = _cli("import", "-", tmp_path / "from-stdin.emb", "--format", "glove",
               input=res.stdout)
    assert res.exit_code == 0, res.output
    with embstore.open(tmp_path / "from-stdin.emb") as back:
        assert list(back.keys) == keys
        np.testing.assert_array_equal(back.to_numpy(), E)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["from-stdin.emb", "k.emb"]


def test_help_summaries_are_whole_and_every_command_has_an_example():
    from embstore.cli import cli

    res = _cli("--help")
    listed = {line.split()[0]: line for line in res.output.splitlines()[1:]
              if line.startswith("  ") and line.split() and line.split()[0] in cli.commands}
    assert set(listed) == set(cli.commands)
    for name, line in listed.items():
        assert not line.rstrip().endswith("..."), line
        assert "Example" in _cli(name, "--help").output, name


def test_progress_display_units_rate_and_log_lines():
    import io

    from embstore.progress import Display

    now = [0.0]
    log = io.StringIO()
    d = Display("importing x.txt", unit="bytes", stream=log, tty=False, interval=10,
                clock=lambda: now[0])
    for t, done in ((1, 1_000_000), (11, 5_000_000), (12, 6_000_000), (25, 9_000_000)):
        now[0] = t
        d(done, 10_000_000)
    d.close()
    # one line per 10 s, never in between: a log is not flooded
    assert log.getvalue().splitlines() == [
        "importing x.txt: 5.0 MB of 10.0 MB (50%), 454.5 kB/s, 11 s left",
        "importing x.txt: 9.0 MB of 10.0 MB (90%), 360.0 kB/s, 3 s left"]
    term = io.StringIO()
    now[0] = 29.0
    d = Display("lookup", stream=term, tty=True, clock=lambda: now[0])
    now[0] = 30.0
    d(40, 45)
    now[0] = 31.0
    d(45, 45)
    d.close()
    assert term.getvalue() == ("\r\x1b[K" + "lookup: 40 rows of 45 rows (89%), 40 rows/s, 0 s left"
                               "\r\x1b[K" + "lookup: 45 rows of 45 rows (100%), 22 rows/s\n")

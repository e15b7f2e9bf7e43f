"""A newcomer's second hour: the smaller things a user trips on, each as the user expects it."""

from __future__ import annotations

import collections
import errno
import json
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import FormatError, NotATableError


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_opening_a_missing_table_is_a_file_not_found_error(tmp_path):
    for kind in (FileNotFoundError, OSError, NotATableError, ValueError):  # old clauses too
        with pytest.raises(kind, match="no such table"):
            embstore.open(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as got:
        embstore.open(tmp_path / "missing")
    assert got.value.errno == errno.ENOENT and got.value.filename == str(tmp_path / "missing")
    assert str(got.value) == f"{tmp_path / 'missing'}: no such table (no file or directory there)"
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(NotATableError) as other:  # a file: not a missing one
        embstore.open(tmp_path / "f.txt")
    assert not isinstance(other.value, FileNotFoundError)


@pytest.fixture
def model_file(tmp_path):
    """A checkpoint of four 2-D tensors, one of them the input embedding."""
    rng = np.random.default_rng(4)
    tensors = {"embeddings.position_embeddings.weight": rng.standard_normal((16, 8)),
               "embeddings.word_embeddings.weight": rng.standard_normal((50, 8)),
               "encoder.layer.0.attention.weight": rng.standard_normal((8, 8)),
               "pooler.dense.weight": rng.standard_normal((8, 8))}
    return {k: v.astype(np.float32) for k, v in tensors.items()}


def test_a_safetensors_import_finds_the_embedding_by_name(model_file, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    st.save_file(model_file, str(tmp_path / "m.safetensors"))
    res = invoke("import", tmp_path / "m.safetensors", tmp_path / "m.emb")
    assert res.exit_code == 0, res.output
    assert "tensor embeddings.word_embeddings.weight" in res.output
    with embstore.open(tmp_path / "m.emb") as t:
        np.testing.assert_array_equal(t[:], model_file["embeddings.word_embeddings.weight"])
    del model_file["embeddings.word_embeddings.weight"]  # no embedding name left: asked
    st.save_file(model_file, str(tmp_path / "n.safetensors"))
    res = invoke("import", tmp_path / "n.safetensors", tmp_path / "n.emb")
    assert res.exit_code == 1 and "choose one with --tensor" in res.output
    assert "a name ending in embed_tokens.weight, word_embeddings.weight" in res.output


def test_a_pt_import_finds_the_embedding_by_name_too(model_file, tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({k: torch.from_numpy(v) for k, v in model_file.items()}, tmp_path / "m.pt")
    res = embstore.import_file(tmp_path / "m.pt", tmp_path / "m.emb")
    assert res.tensor == "embeddings.word_embeddings.weight" and res.format == "torch"


def test_format_torch_on_a_safetensors_file_says_what_it_is(model_file, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    pytest.importorskip("torch")
    st.save_file(model_file, str(tmp_path / "m.safetensors"))
    res = invoke("import", tmp_path / "m.safetensors", tmp_path / "m.emb", "--format", "torch",
                 "--tensor", "pooler.dense.weight")
    assert res.exit_code == 1
    assert "expected a PyTorch file (torch.save), got a safetensors file" in res.output
    assert not (tmp_path / "m.emb").exists()


class Custom:  # a class torch's restricted loader refuses
    pass


def test_an_unsafe_pt_is_refused_with_the_whole_reason(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.zeros(3, 2), "c": collections.Counter(a=1), "x": Custom()},
               tmp_path / "bad.pt")
    with pytest.raises(FormatError) as got:
        embstore.import_file(tmp_path / "bad.pt", tmp_path / "bad.emb")
    msg = str(got.value)
    assert "Unsupported global" in msg and "Custom" in msg, msg  # what was refused
    assert "you have two options" not in msg and "\x1b[" not in msg  # not torch's preamble
    assert msg.endswith("torch.save(model.state_dict(), path), or as safetensors)")
    (tmp_path / "junk.pt").write_bytes(b"\x80\x02garbage")
    with pytest.raises(FormatError, match=r"weights_only=True, got: \S"):
        embstore.import_file(tmp_path / "junk.pt", tmp_path / "junk.emb")


def test_duplicate_keys_dropped_are_named(tmp_path):
    src = tmp_path / "d.txt"
    lines = [f"k{i % 40} {i} {i + 1}" for i in range(48)]  # k0..k7 repeat once
    src.write_text(f"48 2\n" + "\n".join(lines) + "\n")
    res = embstore.import_file(src, tmp_path / "d.emb")
    assert res.duplicates == 8 and res.duplicate_keys == ("k0", "k1", "k2", "k3", "k4")
    cli = invoke("import", src, tmp_path / "e.emb", "--json")
    assert json.loads(cli.stdout)["duplicate_keys"] == ["k0", "k1", "k2", "k3", "k4"]
    cli = invoke("import", src, tmp_path / "f.emb")
    assert ("8 duplicate keys dropped (the first occurrence wins): 'k0', 'k1', 'k2', 'k3', "
            "'k4', ...") in cli.stderr
    with embstore.open(tmp_path / "d.emb") as t:  # the first occurrence kept
        np.testing.assert_array_equal(t.lookup_keys(["k0", "k39"]), [[0, 1], [39, 40]])


@pytest.fixture
def small_table(tmp_path):
    E = np.random.default_rng(2).standard_normal((30, 4)).astype(np.float32)
    embstore.save(tmp_path / "s.emb", E, keys=[f"w{i}" for i in range(30)]).close()
    return tmp_path / "s.emb", E


def test_torch_modules_have_weight_and_refuse_a_missing_device(small_table):
    torch = pytest.importorskip("torch")
    from embstore.torch import Embedding, EmbeddingBag
    path, E = small_table
    for cls in (Embedding, EmbeddingBag):
        m = cls.from_table(path)
        ref = torch.nn.Embedding.from_pretrained(torch.from_numpy(E))
        assert m.weight.shape == ref.weight.shape and torch.equal(m.weight, ref.weight)
        assert m.to("cpu") is m and m.to(torch.float32) is m
        if not torch.cuda.is_available():  # a CPU-only build or machine: torch's own error
            for move in (lambda: m.to("cuda"), lambda: m.cuda(), lambda: m.to(
                    torch.device("cuda", 0))):
                with pytest.raises((AssertionError, RuntimeError), match="CUDA|cuda"):
                    move()
        m.close()


def test_info_on_a_foreign_zarr_group_says_what_it_is(tmp_path):
    zarr = pytest.importorskip("zarr")
    g = zarr.open_group(str(tmp_path / "f.zarr"), mode="w")
    g.create_array("vectors", shape=(10, 4), dtype="float32")[:] = np.ones((10, 4), np.float32)
    res = invoke("info", tmp_path / "f.zarr")
    assert res.exit_code == 0, res.output
    assert "format:        none (a Zarr group written by another tool, not by embstore)" in (
        res.output)
    assert "format:        None" not in res.output
    assert json.loads(invoke("info", tmp_path / "f.zarr", "--json").output)["format"] is None


def test_compression_that_saves_nothing_says_so_and_info_counts_the_rows(tmp_path):
    """Random float32 rows do not compress: the import says so, info's saved_bytes is 0;
    small whole numbers do, and saved_bytes is what the chunks of vectors saved."""
    rng = np.random.default_rng(9)
    for name, rows in (("noise", rng.standard_normal((3000, 64)).astype(np.float32)),
                       ("counts", rng.integers(0, 3, (3000, 64)).astype(np.float32))):
        src = tmp_path / f"{name}.txt"
        src.write_text("".join(f"w{i} " + " ".join(map(repr, r.tolist())) + "\n"
                               for i, r in enumerate(rows)))
        res = embstore.import_file(src, tmp_path / f"{name}.emb", compression="zstd")
        with embstore.open(tmp_path / f"{name}.emb") as t:
            np.testing.assert_array_equal(t[:], rows)
            info = t.info()
        du = subprocess.run(["du", "-s", "-B1", "--exclude=.embstore",
                             str(tmp_path / f"{name}.emb" / "vectors")],
                            capture_output=True, text=True, check=True).stdout
        assert info["saved_bytes"] == max(0, rows.nbytes - int(du.split()[0]))
        noted = [n for n in res.notes if "do not compress" in n]
        if name == "noise":
            assert info["saved_bytes"] == 0 and len(noted) == 1, res.notes
        else:
            assert info["saved_bytes"] > rows.nbytes // 2 and not noted, (info, res.notes)


def test_lookup_resume_on_a_complete_output_has_nothing_to_do(small_table, tmp_path):
    path, E = small_table
    ids = np.array([[0, 5, 7], [29, 1, 1]])
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "out.zarr"
    assert invoke("lookup", path, tmp_path / "ids.npy", out, "-q").exit_code == 0
    before = sorted(p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file())
    res = invoke("lookup", path, tmp_path / "ids.npy", out, "--resume")
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(f"nothing to do: {out} is complete (shape (2, 3, 4), float32)")
    assert sorted(p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()) == before
    zarr = pytest.importorskip("zarr")
    np.testing.assert_array_equal(zarr.open_array(str(out), mode="r")[:], E[ids])
    doc = json.loads(invoke("lookup", path, tmp_path / "ids.npy", out, "--resume",
                            "--json").stdout)
    assert doc["nothing_to_do"] is True and doc["resumed_blocks"] == doc["blocks"]
    np.save(tmp_path / "other.npy", ids[:, :2])  # another job's output is there: refused
    res = invoke("lookup", path, tmp_path / "other.npy", out, "--resume")
    assert res.exit_code == 1 and "is not this job's complete output" in res.output
    assert "pass --overwrite to replace it" in res.output

"""``embstore import/export/info/verify/similar`` through click's CliRunner."""

from __future__ import annotations

import json
import os
import subprocess
import struct

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli

DATA = os.path.join(os.path.dirname(__file__), "data")
KEYS = ["the", "of", "été", "naïve", "</s>"]
VALUES = np.load(os.path.join(DATA, "expected.npy"))


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return invoke


def d(name):
    return os.path.join(DATA, name)


def opened(path):
    t = embstore.open(path)
    try:
        return t.to_numpy(), (list(t.keys) if t.keys is not None else None), t.dtype
    finally:
        t.close()


@pytest.mark.parametrize("name,extra,keys,values", [
    ("gensim.txt", [], KEYS, VALUES),
    ("fasttext.vec", ["--format", "fasttext"], KEYS, VALUES),
    ("gensim.bin", [], KEYS, VALUES),
    ("float64.npy", ["--vocab", d("vocab.txt")], KEYS, VALUES.astype(np.float64)),
    ("float16.npy", ["--dtype", "float32"], None, VALUES.astype(np.float16).astype(np.float32)),
    ("one2d.safetensors", ["--vocab", d("vocab.txt"), "--compression", "zstd"], KEYS, VALUES),
    ("nested.pt", ["--tensor", "model.emb.weight", "--chunk-rows", "2", "--shard-rows", "4"],
     None, VALUES),
], ids=lambda v: v if isinstance(v, str) else None)
def test_import(run, tmp_path, name, extra, keys, values):
    dest = tmp_path / "t"
    res = run("import", d(name), dest, "--quiet", *extra)
    assert res.exit_code == 0, res.output
    vecs, got_keys, dtype = opened(dest)
    assert dtype == values.dtype
    np.testing.assert_array_equal(vecs, values)
    assert got_keys == keys


def test_import_matches_gensim(run, tmp_path):
    KeyedVectors = pytest.importorskip("gensim.models").KeyedVectors
    kv = KeyedVectors.load_word2vec_format(d("c_crlf.txt"))
    assert run("import", d("c_crlf.txt"), tmp_path / "t", "-q").exit_code == 0
    vecs, keys, _ = opened(tmp_path / "t")
    np.testing.assert_array_equal(vecs, kv.vectors)
    assert keys == list(kv.index_to_key)


def test_import_summary_limit_and_duplicates(run, tmp_path):
    src = tmp_path / "dup.txt"
    src.write_text("4 2\na 1 2\nb 3 4\na 5 6\nc 7 8\n")
    res = run("import", src, tmp_path / "t")
    assert res.exit_code == 0
    assert "1 duplicate key dropped (the first occurrence wins)" in res.stderr
    vecs, keys, _ = opened(tmp_path / "t")
    assert keys == ["a", "b", "c"]
    np.testing.assert_array_equal(vecs, [[1, 2], [3, 4], [7, 8]])
    res = run("import", src, tmp_path / "t2", "--limit", "2", "-q")
    assert res.exit_code == 0 and res.stderr == ""
    assert opened(tmp_path / "t2")[1] == ["a", "b"]


# each: source bytes, then the exact error line (after "Error: <file>")
BAD = [
    ("truncated.txt", b"3 2\na 1 2\nb 1 2\n", ", line 4: the header promises 3 rows, the file has 2"),
    ("ragged.txt", b"2 3\na 1 2 3\nb 1 2\n", ", line 3: expected 3 values, got 2"),
    ("wrong_count.txt", b"1 2\na 1 2\nb 1 2\n",
     ", line 3: the header promises 1 rows, the file has more"),
    ("nonnumeric.txt", b"1 3\na 1 two 3\n", ", line 2: value 2: expected a number, got 'two'"),
    ("nan.txt", b"2 2\na 1 2\nb NaN 2\n", ", line 3: value 1: expected a finite number, got 'NaN'"),
    ("badutf8.txt", b"1 2\n\xc3( 1 2\n", ", line 2: expected a UTF-8 key, got b'\\xc3(' (invalid "
     "byte at offset 0; --unicode-errors replace accepts it)"),
    ("huge.txt", b"999999999999 2\na 1 2\n",
     ", line 3: the header promises 999999999999 rows, the file has 1"),
    ("empty.txt", b"", ": the file is empty; expected a 'COUNT DIM' header"),
    ("glove.txt", b"a 1 2\nb 1\n", ", line 2: expected 2 values, got 1"),
    ("trunc.bin", b"2 2\na " + struct.pack("<2f", 1, 2) + b"\nb \x00",
     ": row 2: expected 8 bytes of vector after the key, got 1 (the file is truncated)"),
    ("bomb.safetensors", struct.pack("<Q", 10 ** 15) + b"{}",
     ": header length 1000000000000000 exceeds the file (10 bytes) or 104857600 bytes; not a "
     "safetensors file"),
]


@pytest.mark.parametrize("name,content,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input(run, tmp_path, name, content, message):
    src = tmp_path / name
    src.write_bytes(content)
    fmt = ["--format", "glove"] if name == "glove.txt" else []
    fmt = ["--format", "word2vec"] if name == "empty.txt" else fmt
    res = run("import", src, tmp_path / "t", *fmt)
    assert res.exit_code == 1
    assert res.stderr == f"Error: {src}{message}\n"
    assert "Traceback" not in res.output
    assert not (tmp_path / "t").exists()
    assert os.listdir(tmp_path) == [name]  # nothing left beside DEST either


def test_unicode_errors_replace(run, tmp_path):
    src = tmp_path / "u.txt"
    src.write_bytes(b"1 2\n\xc3( 1 2\n")
    assert run("import", src, tmp_path / "t", "--unicode-errors", "replace", "-q").exit_code == 0
    assert opened(tmp_path / "t")[1] == ["\ufffd("]


@pytest.mark.parametrize("lines,message", [
    (KEYS[:3], ", line 4: expected 5 keys (one per row of float64.npy), got 3: the file ends here"),
    (KEYS + ["extra"], ", line 6: expected 5 keys (one per row of float64.npy), got more"),
], ids=["short", "long"])
def test_vocab_count_mismatch(run, tmp_path, lines, message):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = run("import", d("float64.npy"), tmp_path / "t", "--vocab", vocab)
    assert res.exit_code == 1
    assert res.stderr == f"Error: {vocab}{message}\n"
    assert not (tmp_path / "t").exists()


def test_vocab_for_keyed_format_and_tensor_misuse(run, tmp_path):
    res = run("import", d("gensim.txt"), tmp_path / "t", "--vocab", d("vocab.txt"))
    assert res.exit_code == 1 and "--vocab gives keys to formats without them" in res.stderr
    res = run("import", d("gensim.txt"), tmp_path / "t", "--format", "word2vec", "--tensor", "x")
    assert res.exit_code == 2
    res = run("import", d("two2d.safetensors"), tmp_path / "t")
    assert res.exit_code == 1
    assert res.stderr == (f"Error: {d('two2d.safetensors')}: expected exactly one 2-D float "
                          "tensor, or one named as an input embedding (a name ending in "
                          "embed_tokens.weight, word_embeddings.weight, wte.weight, "
                          "shared.weight, embed_in.weight, tok_embeddings.weight), got 2 "
                          "(decoder.weight [5, 4], encoder.weight [5, 4]); choose one with "
                          "--tensor\n")


def test_overwrite(run, tmp_path):
    dest = tmp_path / "t"
    assert run("import", d("gensim.txt"), dest, "-q").exit_code == 0
    res = run("import", d("gensim.bin"), dest, "-q")
    assert res.exit_code == 1
    assert res.stderr == f"Error: {dest} already exists (pass --overwrite to replace it)\n"
    # a failing import with --overwrite leaves the old table intact
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"2 4\nx 1 2 3 4\ny 1 2\n")
    assert run("import", bad, dest, "--overwrite", "-q").exit_code == 1
    assert opened(dest)[1] == KEYS
    assert run("import", d("c_space.bin"), dest, "--overwrite", "-q").exit_code == 0
    assert opened(dest)[1][-1] == "new york"
    # exports: the same rules
    out = tmp_path / "o.npy"
    assert run("export", dest, out, "-q").exit_code == 0
    res = run("export", dest, out)
    assert res.exit_code == 1 and res.stderr == f"Error: {out} already exists (pass --overwrite to replace it)\n"
    assert run("export", dest, out, "--overwrite", "--limit", "2", "-q").exit_code == 0
    np.testing.assert_array_equal(np.load(out), VALUES[:2])


def test_export_round_trips(run, tmp_path):
    KeyedVectors = pytest.importorskip("gensim.models").KeyedVectors
    from safetensors.numpy import load_file
    assert run("import", d("gensim.txt"), tmp_path / "t", "-q").exit_code == 0
    for name, fmt in [("o.npy", []), ("o.safetensors", ["--vocab-out", tmp_path / "st.txt"]),
                      ("o.txt", []), ("o.bin", []),
                      ("o.glove", ["--format", "glove"]), ("o.vec", [])]:
        res = run("export", tmp_path / "t", tmp_path / name, *fmt)
        assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy", allow_pickle=False), VALUES)
    np.testing.assert_array_equal(load_file(str(tmp_path / "o.safetensors"))["weight"], VALUES)
    for vocab in ("o.vocab.txt", "st.txt"):  # keyless formats: the keys beside
        assert (tmp_path / vocab).read_text(encoding="utf-8").splitlines() == KEYS
    for name, binary, no_header in [("o.txt", False, False), ("o.bin", True, False),
                                    ("o.glove", False, True), ("o.vec", False, False)]:
        kv = KeyedVectors.load_word2vec_format(str(tmp_path / name), binary=binary,
                                               no_header=no_header)
        assert list(kv.index_to_key) == KEYS
        np.testing.assert_array_equal(kv.vectors, VALUES)
    res = run("export", tmp_path / "t", tmp_path / "o.xyz")
    assert res.exit_code == 1 and "cannot tell the format from the extension '.xyz'" in res.stderr


def test_export_keyless_table_to_text_fails_cleanly(run, tmp_path):
    assert run("import", d("float16.npy"), tmp_path / "t", "-q").exit_code == 0
    res = run("export", tmp_path / "t", tmp_path / "o.txt")
    assert res.exit_code == 1 and "the table has no keys" in res.stderr
    assert sorted(os.listdir(tmp_path)) == ["t"]


def test_info_json_and_verify(run, tmp_path):
    dest = tmp_path / "t"
    assert run("import", d("gensim.bin"), dest, "-q", "--dtype", "float16", "--chunk-rows", "2",
               "--shard-rows", "4", "--compression", "blosc").exit_code == 0
    res = run("info", dest, "--json")
    assert res.exit_code == 0
    info = json.loads(res.stdout)
    assert info["format"] == 2 and info["vocab_size"] == 5 and info["dim"] == 4
    assert info["dtype"] == "float16" and info["has_keys"] is True
    assert (info["chunk_rows"], info["shard_rows"], info["compression"]) == (2, 4, "blosc")
    assert info["nbytes"] == 5 * 4 * 2
    du = subprocess.run(["du", "-s", "-B1", str(dest)], capture_output=True, text=True,
                        check=True).stdout  # (a file of many links once, holes free)
    assert info["stored_bytes"] == int(du.split()[0])
    assert info["attributes"]["source"] == {"format": "word2vec-binary", "file": "gensim.bin"}
    res = run("info", dest)
    assert res.exit_code == 0 and "vocab_size:    5" in res.stdout
    res = run("verify", dest)
    assert res.exit_code == 0 and res.stdout.startswith("OK ")
    shard = next(os.path.join(r, f) for r, _, fs in os.walk(dest / "vectors") for f in fs
                 if f != "zarr.json")
    raw = bytearray(open(shard, "rb").read())
    raw[3] ^= 0xFF
    open(shard, "wb").write(bytes(raw))
    res = run("verify", dest)
    assert res.exit_code == 1 and "DAMAGED" in res.stderr


def test_similar(run, tmp_path):
    if not hasattr(embstore, "Embedding"):
        pytest.skip("the embedding layer is not built yet")
    assert run("import", d("gensim.txt"), tmp_path / "t", "-q").exit_code == 0
    res = run("similar", tmp_path / "t", "the", "-k", "2", "--json")
    assert res.exit_code == 0
    (out,) = json.loads(res.stdout)  # a list, one entry per query
    unit = VALUES / np.linalg.norm(VALUES, axis=1, keepdims=True)
    cos = unit @ unit[0]
    order = [i for i in np.argsort(-cos, kind="stable") if i != 0][:2]
    assert out["query"] == "the"
    assert [n["key"] for n in out["neighbours"]] == [KEYS[i] for i in order]
    np.testing.assert_allclose([n["score"] for n in out["neighbours"]], cos[order], rtol=1e-5)
    res = run("similar", tmp_path / "t", "nope")
    assert res.exit_code == 1 and res.stderr.startswith("Error: ")

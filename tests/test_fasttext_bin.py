"""fastText ``.bin`` models: import (word vectors and the n-gram matrix), subword vectors of
unknown words, errors.

References: gensim's ``load_facebook_vectors`` on every fastText model of gensim's test
data (skipped without gensim), and an independent pure-Python port of fastText's
``computeSubwords``/``hash`` on models written by the tests themselves.
"""

from __future__ import annotations

import glob
import json
import os
import random
import struct

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import FormatError, InvalidOptionError, KeyNotFoundError
from embstore.formats import READ_FORMATS, detect
from embstore.store.subword.hashing import ngram_hashes

MAGIC = 793712314


# -- an independent reference: fastText's dictionary.cc, byte by byte ----------------------
def ref_ngrams(word: str, minn: int, maxn: int) -> list[bytes]:
    b = ("<" + word + ">").encode("utf-8")
    out = []
    for i in range(len(b)):
        if (b[i] & 0xC0) == 0x80:
            continue
        j, n = i, 1
        while j < len(b) and n <= maxn:
            j += 1
            while j < len(b) and (b[j] & 0xC0) == 0x80:
                j += 1
            if n >= minn and not (n == 1 and (i == 0 or j == len(b))):
                out.append(b[i:j])
            n += 1
    return out


def ref_hash(data: bytes) -> int:
    h = 2166136261
    for x in data:
        h ^= (x - 256 if x >= 128 else x) & 0xFFFFFFFF  # int8_t, sign-extended to uint32
        h = (h * 16777619) & 0xFFFFFFFF
    return h


def ref_vector(word: str, own_row, ngrams: np.ndarray, minn: int, maxn: int) -> np.ndarray:
    """gensim's order: own row (known words) then n-gram rows, float32, then the mean."""
    ids = [ref_hash(g) % ngrams.shape[0] for g in ref_ngrams(word, minn, maxn)] \
        if ngrams.shape[0] else []
    acc = np.zeros(ngrams.shape[1], np.float32) if own_row is None else own_row.copy()
    for i in ids:
        acc += ngrams[i]
    n = len(ids) + (own_row is not None)
    return acc / np.float32(n) if n else acc


def write_model(path, words, vocab_rows, ngram_rows, *, minn=3, maxn=6, old=False,
                quant=False, version=12, encoding="utf-8", out_rows=None):
    """A fastText .bin as fastText/gensim write it (see embstore/formats/fasttext/bin.py)."""
    n, dim = vocab_rows.shape
    bucket = ngram_rows.shape[0]
    out_rows = n if out_rows is None else out_rows
    with open(path, "wb") as f:
        if not old:
            f.write(struct.pack("<2i", MAGIC, version))
        f.write(struct.pack("<12id", dim, 5, 5, 1, 5, 1, 2, 2, bucket, minn, maxn, 100, 1e-4))
        f.write(struct.pack("<3iq", n, n, 0, 1000))
        if not old:
            f.write(struct.pack("<q", -1))
        for i, w in enumerate(words):
            f.write(w.encode(encoding) + b"\0" + struct.pack("<qb", 100 - i, 0))
        if not old:
            f.write(b"\x01" if quant else b"\x00")
        f.write(struct.pack("<2q", n + bucket, dim))
        f.write(np.ascontiguousarray(vocab_rows, "<f4").tobytes())
        f.write(np.ascontiguousarray(ngram_rows, "<f4").tobytes())
        if not old:
            f.write(b"\x00")
        f.write(struct.pack("<2q", out_rows, dim))
        f.write(np.zeros((out_rows, dim), "<f4").tobytes())


WORDS = ["the", "of", "été", "naïve", "日本語", "a", "königsberg", "привет", "😀smile", "x y"]


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(7)
    vocab = rng.standard_normal((len(WORDS), 6)).astype(np.float32)
    ngrams = rng.standard_normal((97, 6)).astype(np.float32)
    path = tmp_path / "model.bin"
    write_model(path, WORDS, vocab, ngrams, minn=2, maxn=5)
    return path, vocab, ngrams


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# -- hashing -------------------------------------------------------------------------------
@pytest.mark.parametrize("minn,maxn", [(3, 6), (1, 1), (0, 2), (2, 5), (5, 3), (1, 8)],
                         ids=lambda v: str(v))
def test_ngram_hashes_equal_fasttext_reference(minn, maxn):
    rng = random.Random(minn * 10 + maxn)
    alphabet = "abcz é日😀ñßЖ\u0301"
    words = ["", "a", "<>", "naïve", "x" * 40] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(500)]
    hashes, counts = ngram_hashes(words, minn, maxn)
    ref = [[ref_hash(g) for g in ref_ngrams(w, minn, maxn)] for w in words]
    assert counts.tolist() == [len(r) for r in ref]
    assert hashes.tolist() == [h for r in ref for h in r]


def test_sign_extension_quirk():
    # byte 0xC3 is -61 as fastText's char: the XOR flips the high bits too
    assert ngram_hashes(["é"], 1, 1)[0].tolist() == [ref_hash("é".encode())]
    assert ref_hash(b"\xc3") != (((2166136261 ^ 0xC3) * 16777619) & 0xFFFFFFFF)


# -- models written here: no gensim needed ---------------------------------------------------
@pytest.mark.parametrize("old", [False, True], ids=["new-format", "old-format"])
def test_import_composes_word_vectors(tmp_path, old):
    rng = np.random.default_rng(3)
    vocab = rng.standard_normal((len(WORDS), 4)).astype(np.float32)
    ngrams = rng.standard_normal((31, 4)).astype(np.float32)
    src = tmp_path / "m.bin"
    write_model(src, WORDS, vocab, ngrams, minn=3, maxn=6, old=old)
    assert detect(src) == "fasttext-bin"
    res = embstore.import_file(src, tmp_path / "t.emb")
    assert (res.format, res.rows, res.dim) == ("fasttext-bin", len(WORDS), 4)
    with embstore.open(tmp_path / "t.emb") as t:
        assert list(t.keys) == WORDS
        want = np.stack([ref_vector(w, vocab[i], ngrams, 3, 6) for i, w in enumerate(WORDS)])
        np.testing.assert_array_equal(t.to_numpy(), want)
        sub = t.subwords
        assert (sub.minn, sub.maxn, sub.bucket) == (3, 6, 31)
        info = t.info()
        assert info["ngrams"]["rows"] == 31
        assert info["attributes"]["subwords"]["hash"] == "fasttext-fnv1a32-signed-bytes"
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "t.emb" / "ngrams"))[:],
                                      ngrams)  # any Zarr reader reads the n-gram matrix


def test_oov_subword_lookup(model):
    path, vocab, ngrams = model
    dest = path.parent / "t.emb"
    embstore.import_file(path, dest, format="fasttext-bin")
    unknown = ["thee", "", "o", "été!", "日本", "😀", "königsberger", "naive"]
    with embstore.open(dest) as t:
        keys = np.array([["the", unknown[0]], [unknown[1], "naïve"]] + [[u, "a"] for u in
                                                                          unknown[2:]],
                        dtype=object)
        got = t.lookup_keys(keys, oov="subword")
        assert got.shape == keys.shape + (6,)
        for (r, c), k in np.ndenumerate(keys):
            i = WORDS.index(k) if k in WORDS else None
            want = t.to_numpy()[i] if i is not None else ref_vector(k, None, ngrams, 2, 5)
            np.testing.assert_allclose(got[r, c], want, rtol=0, atol=1e-6)
        with pytest.raises(KeyNotFoundError, match="'thee'"):
            t.lookup_keys(["thee"])
        emb = embstore.Embedding(t, oov="subword", max_norm=1.0)
        rows = emb(keys)
        norms = np.linalg.norm(got, axis=-1, keepdims=True)
        np.testing.assert_allclose(rows, np.where(norms > 1, got / (norms + 1e-7), got),
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(emb([0, 1]), t.lookup([0, 1]))  # ids still work


@pytest.mark.parametrize("dtype", [None, "float16", "int8"])
def test_save_copies_ngrams(model, dtype):
    """A saved copy of a fastText table keeps its n-grams: unknown words still get vectors."""
    path, _, ngrams = model
    src, copy = path.parent / "t.emb", path.parent / "copy.emb"
    embstore.import_file(path, src, format="fasttext-bin")
    unknown = ["thee", "königsberger", "naive", "o"]
    with embstore.open(src) as t, embstore.save(copy, t, dtype=dtype, shard_rows=8) as c:
        assert c.subwords is not None and c.subwords.bucket == 97
        assert list(c.keys) == list(t.keys)
        want = np.stack([ref_vector(u, None, ngrams, 2, 5) for u in unknown])
        tol = 2e-3 if dtype == "float16" else 1e-6  # int8 rows: n-grams stay float32
        np.testing.assert_allclose(c.lookup_keys(unknown, oov="subword"), want, atol=tol)
        np.testing.assert_allclose(c.subwords.vectors(unknown), want, atol=tol)
    assert embstore.verify(copy).ok and "ngrams" in embstore.verify(copy).arrays


def test_subword_needs_ngrams(tmp_path):
    mem = embstore.MemoryTable(np.ones((2, 3), np.float32), keys=["a", "b"])
    with pytest.raises(InvalidOptionError, match="subword n-grams"):
        mem.lookup_keys(["zz"], oov="subword")
    with pytest.raises(InvalidOptionError, match="subword n-grams"):  # even known keys
        mem.lookup_keys(["a"], oov="subword")
    with pytest.raises(InvalidOptionError, match="subword n-grams"):
        embstore.Embedding(mem, oov="subword")
    with embstore.save(tmp_path / "p.emb", np.ones((2, 3), np.float32), keys=["a", "b"]) as t:
        assert t.subwords is None
        with pytest.raises(InvalidOptionError, match="subword n-grams"):
            t.lookup_keys(["zz"], oov="subword")


def test_model_without_buckets(tmp_path):
    vocab = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_model(tmp_path / "m.bin", ["ab", "cd"], vocab, np.zeros((0, 3), np.float32),
                minn=0, maxn=0)
    embstore.import_file(tmp_path / "m.bin", tmp_path / "t.emb")
    with embstore.open(tmp_path / "t.emb") as t:
        np.testing.assert_array_equal(t.to_numpy(), vocab)  # gensim: vectors_vocab as is
        with pytest.raises(KeyNotFoundError, match="no n-gram buckets"):
            t.lookup_keys(["zz"], oov="subword")


def test_limit_and_float64(model):
    path, vocab, ngrams = model
    embstore.import_file(path, path.parent / "t.emb", limit=3, dtype="float64")
    with embstore.open(path.parent / "t.emb") as t:
        assert list(t.keys) == WORDS[:3] and t.dtype == np.float64 and t.subwords.bucket == 97
        want = np.stack([ref_vector(w, vocab[i], ngrams, 2, 5) for i, w in enumerate(WORDS[:3])])
        np.testing.assert_allclose(t.to_numpy(), want, rtol=1e-6)
    with pytest.raises(FormatError, match="float16, float32, float64"):
        embstore.import_file(path, path.parent / "q.emb", dtype="int8")


def test_verify_checks_ngrams(model):
    path, _, _ = model
    dest = path.parent / "t.emb"
    embstore.import_file(path, dest)
    report = embstore.verify(dest)
    assert report.ok and "ngrams" in report.arrays
    shard = next(p for p in glob.glob(str(dest / "ngrams" / "c" / "**"), recursive=True)
                 if os.path.isfile(p))
    with open(shard, "r+b") as f:
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0xFF]))
    report = embstore.verify(dest)
    assert not report.ok
    assert any("ngrams" in d.file for d in report.damaged)


# -- bad files -------------------------------------------------------------------------------
def _cuts(path):
    """Offsets inside the header, the dictionary, the input matrix and the output matrix."""
    size = os.path.getsize(path)
    return [6, 40, 90, 200, size - 30, size - 1]


def test_truncated_files_name_the_offset(model, tmp_path):
    path, _, _ = model
    data = path.read_bytes()
    for cut in _cuts(path):
        bad = tmp_path / f"cut{cut}.bin"
        bad.write_bytes(data[:cut])
        with pytest.raises(FormatError, match=r"at byte offset \d+") as exc:
            embstore.import_file(bad, tmp_path / "t.emb", format="fasttext-bin")
        assert "truncated" in str(exc.value) or "ends" in str(exc.value)
        assert not os.path.exists(tmp_path / "t.emb")
        r = invoke("import", bad, tmp_path / "t.emb", "--format", "fasttext-bin")
        assert r.exit_code == 1
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:") and "byte offset" in lines[0]
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in tmp_path.iterdir()
                                                  if p.suffix == ".bin")  # nothing left


def test_corrupted_files(model, tmp_path):
    path, vocab, ngrams = model
    data = bytearray(path.read_bytes())
    dict_end = data.index("x y".encode()) + 3 + 1 + 9
    bad = bytearray(data)
    bad[dict_end] = 7  # the quantisation flag
    (tmp_path / "flag.bin").write_bytes(bad)
    with pytest.raises(FormatError, match=f"at byte offset {dict_end}: expected the input "
                       "matrix's quantisation flag 0 or 1, got 7"):
        embstore.import_file(tmp_path / "flag.bin", tmp_path / "t.emb")
    bad = bytearray(data)
    bad[dict_end - 1] = 1  # the last entry's type: a label
    (tmp_path / "type.bin").write_bytes(bad)
    with pytest.raises(FormatError, match="expected entry type 0"):
        embstore.import_file(tmp_path / "type.bin", tmp_path / "t.emb")
    (tmp_path / "long.bin").write_bytes(bytes(data) + b"\0\0")
    with pytest.raises(FormatError, match="has more bytes"):
        embstore.import_file(tmp_path / "long.bin", tmp_path / "t.emb")
    nan = ngrams.copy()
    nan[5, 2] = np.nan
    write_model(tmp_path / "nan.bin", WORDS, vocab, nan, minn=2, maxn=5)
    with pytest.raises(FormatError, match="expected a finite number"):
        embstore.import_file(tmp_path / "nan.bin", tmp_path / "t.emb")
    assert not os.path.exists(tmp_path / "t.emb")


def test_quantised_model_refused(model, tmp_path):
    path, vocab, ngrams = model
    write_model(tmp_path / "m.ftz", WORDS, vocab, ngrams, quant=True)
    assert detect(tmp_path / "m.ftz") == "fasttext-bin"
    r = invoke("import", tmp_path / "m.ftz", tmp_path / "t.emb")
    assert r.exit_code == 1
    assert "a quantised fastText model (.ftz" in r.output and "not decode" in r.output
    assert not os.path.exists(tmp_path / "t.emb")


def test_format_name_and_cli(model):
    path, _, _ = model
    assert "fasttext-bin" in READ_FORMATS
    assert "fasttext-bin" in invoke("import", "--help").output
    dest = path.parent / "t.emb"
    r = invoke("import", path, dest, "--format", "fasttext-bin", "--json")
    assert r.exit_code == 0, r.output
    r = invoke("info", dest)
    assert "ngrams:" in r.output and "97 rows" in r.output
    r = invoke("verify", dest)
    assert r.exit_code == 0 and "ngrams" in r.output
    # the .vec text reader on a .bin: refused, one line (not a traceback)
    r = invoke("import", path, path.parent / "v.emb", "--format", "fasttext")
    assert r.exit_code == 1 and r.output.startswith("Error:")


def test_cli_lookup_and_similar(model):
    path, _, ngrams = model
    dest = path.parent / "t.emb"
    embstore.import_file(path, dest)
    (path.parent / "keys.txt").write_text("the thee xyz\nnaïve\n", encoding="utf-8")
    out = path.parent / "out.npy"
    r = invoke("lookup", dest, path.parent / "keys.txt", out, "--keys", "--oov", "subword")
    assert r.exit_code == 0, r.output
    got = np.load(out)
    with embstore.open(dest) as t:
        np.testing.assert_array_equal(got[0], t.lookup_keys(["the", "thee", "xyz"],
                                                            oov="subword"))
        np.testing.assert_array_equal(got[1, 0], t.lookup_keys("naïve"))
        np.testing.assert_array_equal(got[1, 1:], 0)  # padding
        rows = t.to_numpy()
    r = invoke("lookup", dest, path.parent / "keys.txt", out, "--oov", "subword", "--overwrite")
    assert r.exit_code == 2 and "--oov subword needs --keys" in r.output
    # similar: the unknown query is its subword vector, nothing left out
    q = ref_vector("thee", None, ngrams, 2, 5)
    cos = rows @ q / (np.linalg.norm(rows, axis=1) * np.linalg.norm(q))
    order = np.argsort(-cos, kind="stable")[:3]
    r = invoke("similar", dest, "thee", "the", "-k", "3", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert [n["key"] for n in res[0]["neighbours"]] == [WORDS[i] for i in order]
    np.testing.assert_allclose([n["score"] for n in res[0]["neighbours"]], cos[order],
                               rtol=1e-5)
    assert "the" not in [n["key"] for n in res[1]["neighbours"]]  # a known key: left out


# -- gensim's test data ----------------------------------------------------------------------
def _gensim_data() -> str:
    pytest.importorskip("gensim")
    from gensim.test.utils import datapath
    return os.path.dirname(datapath("lee_fasttext.bin"))


FASTTEXT_MODELS = ["lee_fasttext.bin", "lee_fasttext_new.bin", "toy-model.bin",
                   "toy-model-pretrained.bin", "non_ascii_fasttext.bin", "cp852_fasttext.bin",
                   "crime-and-punishment.bin"]
ENCODING = {"cp852_fasttext.bin": "cp852"}


def test_detects_every_fasttext_model_of_gensim(tmp_path):
    data = _gensim_data()
    found = {}
    for p in sorted(glob.glob(os.path.join(data, "*.bin"))):
        with open(p, "rb") as f:
            head = f.read(8)
        if head[:4] == struct.pack("<i", MAGIC) or os.path.basename(p) in FASTTEXT_MODELS:
            found[os.path.basename(p)] = detect(p)
        else:
            assert detect(p) != "fasttext-bin", p
    assert set(FASTTEXT_MODELS) <= set(found)
    assert found == {name: "fasttext-bin" for name in found}
    # the one left: a supervised classifier, refused by gensim too
    assert set(found) - set(FASTTEXT_MODELS) == {"pang_lee_polarity_fasttext.bin"}
    with pytest.raises(FormatError, match="supervised"):
        embstore.import_file(os.path.join(data, "pang_lee_polarity_fasttext.bin"),
                             tmp_path / "t.emb")
    assert not os.path.exists(tmp_path / "t.emb")


def _misspellings(words: list[str], known: set[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: set[str] = set()
    letters = "aeiourstnxzéüñ日Ж"
    for _ in range(50 * n):
        if len(out) >= n:
            break
        w = rng.choice(words)
        i = rng.randrange(len(w) + 1)
        op = rng.randrange(5)
        if op == 0 and len(w) > 1:
            w = w[:i] + w[i + 1:]  # drop a letter
        elif op == 1 and len(w) > 2:
            j = min(i, len(w) - 2)
            w = w[:j] + w[j + 1] + w[j] + w[j + 2:]  # swap two
        elif op == 2:
            w = w[:i] + rng.choice(letters) + w[i:]  # insert one
        elif op == 3:
            w = w + rng.choice(["s", "ed", "ing", "ness", "ly", "ów"])  # rare forms
        else:
            w = w.upper() if rng.random() < .5 else w + w[:3]
        if w not in known:
            out.add(w)
    return sorted(out) + ["", "a", "é", "日本語テキスト", "Ω≈ç√∫"]


@pytest.mark.parametrize("name", FASTTEXT_MODELS)
def test_gensim_models(name, tmp_path):
    data = _gensim_data()
    from gensim.models.fasttext import load_facebook_vectors
    src = os.path.join(data, name)
    enc = ENCODING.get(name)
    kv = load_facebook_vectors(src, encoding=enc or "utf-8")
    res = embstore.import_file(src, tmp_path / "t.emb", **({"encoding": enc} if enc else {}))
    assert res.format == "fasttext-bin" and res.rows == len(kv.index_to_key)
    with embstore.open(tmp_path / "t.emb") as t:
        assert list(t.keys) == kv.index_to_key
        np.testing.assert_allclose(t.to_numpy(), kv.vectors, rtol=0, atol=1e-6)
        if kv.min_n >= 3:  # "<>" is too short: no n-grams, the zero vector (as gensim)
            np.testing.assert_array_equal(t.lookup_keys([""], oov="subword"), 0)
        assert (t.subwords.minn, t.subwords.maxn, t.subwords.bucket) == (kv.min_n, kv.max_n,
                                                                         kv.bucket)
        oov = _misspellings(kv.index_to_key, set(kv.key_to_index), 1000, seed=len(name))
        assert len(oov) >= 1000
        got = t.lookup_keys(np.array(oov, dtype=object), oov="subword")
        want = np.stack([kv[w] for w in oov])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        # similar with an unknown query vs gensim's most_similar of the same vector (a model
        # with a zero row: its cosine is undefined, NaN in gensim, ranked last here)
        if not np.linalg.norm(kv.vectors, axis=1).all():
            return
        sims = embstore.Embedding(t, oov="subword").most_similar(oov[:5], k=5)
        for q, ids, scores in zip(oov[:5], *sims):
            if not np.any(kv[q]):
                continue  # no n-grams: a zero query has no cosine
            ref = kv.most_similar(positive=[kv[q]], topn=5)
            np.testing.assert_allclose(scores, [s for _, s in ref], rtol=0, atol=1e-5)
            ref_keys = [k for k, _ in ref]
            got_keys = list(t.keys[ids])
            assert got_keys == ref_keys or np.ptp(scores) < 1e-5  # ties may reorder


def test_gensim_cli_lookup(tmp_path):
    data = _gensim_data()
    from gensim.models.fasttext import load_facebook_vectors
    src = os.path.join(data, "lee_fasttext_new.bin")
    kv = load_facebook_vectors(src)
    r = invoke("import", src, tmp_path / "t.emb")  # auto-detected from the magic
    assert r.exit_code == 0, r.output
    oov = _misspellings(kv.index_to_key, set(kv.key_to_index), 60, seed=1)
    lines = [oov[i:i + 6] + [kv.index_to_key[i]] for i in range(0, 60, 6)]
    (tmp_path / "k.txt").write_text("\n".join(" ".join(x for x in line if x and " " not in x)
                                              for line in lines) + "\n", encoding="utf-8")
    toks = [ln.split() for ln in (tmp_path / "k.txt").read_text(encoding="utf-8").splitlines()]
    r = invoke("lookup", tmp_path / "t.emb", tmp_path / "k.txt", tmp_path / "o.npy", "--keys",
               "--oov", "subword")
    assert r.exit_code == 0, r.output
    got = np.load(tmp_path / "o.npy")
    for i, line in enumerate(toks):
        np.testing.assert_allclose(got[i, :len(line)], np.stack([kv[w] for w in line]),
                                   rtol=0, atol=1e-5)
    # similar with unknown queries vs gensim's most_similar of the same vectors
    queries = [w for w in oov[:8] if w and " " not in w and np.any(kv[w])][:4]
    r = invoke("similar", tmp_path / "t.emb", *queries, "-k", "5", "--json")
    assert r.exit_code == 0, r.output
    for entry, q in zip(json.loads(r.output), queries):
        ref = kv.most_similar(positive=[kv[q]], topn=5)
        assert entry["query"] == q
        np.testing.assert_allclose([n["score"] for n in entry["neighbours"]],
                                   [s for _, s in ref], rtol=0, atol=1e-5)
        assert [n["key"] for n in entry["neighbours"]] == [k for k, _ in ref]

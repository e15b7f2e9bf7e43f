"""The format readers and writers against the reference loaders (gensim, NumPy, safetensors,
PyTorch), on golden files written the way each real tool writes them (tools/make_fixtures.py)."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import embstore
from embstore.errors import FormatError
from embstore.formats import FORMATS, detect, get
from embstore.formats.word2vec import TextReader

DATA = os.path.join(os.path.dirname(__file__), "data")
KEYS = ["the", "of", "été", "naïve", "</s>"]
VALUES = np.load(os.path.join(DATA, "expected.npy"))
LF = np.array([[float("%lf" % v) for v in r] for r in VALUES.tolist()], dtype=np.float32)


def d(name: str) -> str:
    return os.path.join(DATA, name)


def read_all(fmt: str, path, **kw):
    with get(fmt).read(path, **kw) as r:
        blocks = list(r)
        meta = (r.dim, r.count, r.dtype)
    vecs = np.concatenate([b for b, _ in blocks]) if blocks else np.empty((0, meta[0]))
    keys = None if blocks and blocks[0][1] is None else [k for _, ks in blocks for k in ks]
    return vecs, keys, meta


GOLDEN = [  # file, format, keys, values, options
    ("gensim.txt", "word2vec", KEYS, VALUES, {}),
    ("c_crlf.txt", "word2vec", KEYS, LF, {}),
    ("fasttext.vec", "fasttext", KEYS, VALUES, {}),
    ("glove.txt", "glove", KEYS[:4] + [". . ."], LF, {}),
    ("gensim.bin", "word2vec-binary", KEYS, VALUES, {}),
    ("c_space.bin", "word2vec-binary", KEYS[:4] + ["new york"], VALUES, {}),
    ("float16.npy", "npy", None, VALUES.astype(np.float16), {}),
    ("float64.npy", "npy", None, VALUES.astype(np.float64), {}),
    ("one2d.safetensors", "safetensors", None, VALUES, {}),
    ("nested.pt", "torch", None, VALUES, {"tensor": "model.emb.weight"}),
]


@pytest.mark.parametrize("name,fmt,keys,values,kw", GOLDEN, ids=[g[0] for g in GOLDEN])
@pytest.mark.parametrize("block_rows", [1, 2, 65536], ids=lambda b: f"block{b}")
def test_golden_files(name, fmt, keys, values, kw, block_rows):
    assert detect(d(name)) == fmt
    vecs, got_keys, (dim, _, dtype) = read_all(fmt, d(name), block_rows=block_rows, **kw)
    assert dim == 4 and dtype == values.dtype and vecs.dtype == values.dtype
    np.testing.assert_array_equal(vecs, values)
    assert got_keys == keys


@pytest.mark.parametrize("name,binary,no_header", [
    ("gensim.txt", False, False), ("c_crlf.txt", False, False), ("fasttext.vec", False, False),
    ("gensim.bin", True, False)])
def test_same_as_gensim(name, binary, no_header):
    KeyedVectors = pytest.importorskip("gensim.models").KeyedVectors
    kv = KeyedVectors.load_word2vec_format(d(name), binary=binary, no_header=no_header)
    fmt = detect(d(name))
    vecs, keys, _ = read_all(fmt, d(name))
    assert keys == list(kv.index_to_key)
    np.testing.assert_array_equal(vecs, kv.vectors)


def test_gensim_cannot_read_spaced_binary_keys_but_we_do():
    """The C tool writes a key holding a space as is; gensim cuts it at the space."""
    KeyedVectors = pytest.importorskip("gensim.models").KeyedVectors
    try:
        kv = KeyedVectors.load_word2vec_format(d("c_space.bin"), binary=True)
        assert "new york" not in kv.key_to_index
    except (ValueError, EOFError):
        pass
    _, keys, _ = read_all("word2vec-binary", d("c_space.bin"))
    assert keys[-1] == "new york"


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1 << 20])
def test_text_block_boundaries(tmp_path, rng, block_bytes):
    vals = rng.standard_normal((37, 3)).astype(np.float32)
    lines = [f"k{i} " + " ".join(repr(float(v)) for v in r) for i, r in enumerate(vals)]
    p = tmp_path / "v.txt"
    p.write_bytes(("37 3\r\n" + "\r\n".join(lines) + "\r\n\r\n  \n").encode())
    with TextReader(p, header=True, format="word2vec", block_rows=5,
                    block_bytes=block_bytes) as r:
        blocks = list(r)
    assert max(len(b) for b, _ in blocks) <= 5
    np.testing.assert_array_equal(np.concatenate([b for b, _ in blocks]), vals)
    assert [k for _, ks in blocks for k in ks] == [f"k{i}" for i in range(37)]


def test_text_limit_and_dtype(tmp_path):
    vecs, keys, _ = read_all("word2vec", d("gensim.txt"), limit=2, dtype="float64")
    assert keys == KEYS[:2] and vecs.dtype == np.float64
    np.testing.assert_array_equal(vecs, VALUES[:2].astype(np.float64).round(7))


def _bad(tmp_path, content: bytes, name="bad.txt"):
    p = tmp_path / name
    p.write_bytes(content)
    return p


BAD_TEXT = [
    ("short row", b"2 3\na 1 2 3\nb 1 2\n", 3, "expected 3 values, got 2"),
    ("long row", b"2 3\na 1 2 3\nb 1 2 3 4\n", 3, "expected 3 values, got 4"),
    ("compensating rows", b"3 2\n1990 1 2\n1991 1\n1992 1 2 3\n", 3, "expected 2 values, got 1"),
    ("non-numeric", b"2 3\na 1 2 3\nb 1 x 3\n", 3, "value 2: expected a number, got 'x'"),
    ("nan", b"2 3\na 1 2 3\nb 1 nan 3\n", 3, "value 2: expected a finite number, got 'nan'"),
    ("inf", b"1 2\na 1e999 3\n", 2, "value 1: expected a finite number, got '1e999'"),
    ("float32 overflow", b"1 2\na 1e39 3\n", 2, "does not fit in float32"),
    ("bad utf-8", b"2 2\na 1 2\n\xff\xfe 1 2\n", 3, "expected a UTF-8 key"),
    ("empty line", b"3 2\na 1 2\n\nb 1 2\n", 3, "got an empty line"),
    ("too few rows", b"3 2\na 1 2\nb 1 2\n", 4, "the header promises 3 rows, the file has 2"),
    ("too many rows", b"1 2\na 1 2\nb 1 2\n", 3, "the header promises 1 rows, the file has more"),
    ("huge header", b"1000000000000 2\na 1 2\n", 3, "promises 1000000000000 rows, the file has 1"),
    ("not a header", b"a 1 2\nb 1 2\n", 1, "expected a header 'COUNT DIM', got 'a 1 2'"),
]


@pytest.mark.parametrize("content,line,message", [b[1:] for b in BAD_TEXT],
                         ids=[b[0] for b in BAD_TEXT])
def test_bad_text(tmp_path, content, line, message):
    p = _bad(tmp_path, content)
    with pytest.raises(FormatError, match=f"^{p}, line {line}: ") as info:
        read_all("word2vec", p)
    assert message in str(info.value)
    assert info.value.line == line and info.value.path == str(p)


def test_unicode_errors_replace(tmp_path):
    p = _bad(tmp_path, b"1 2\n\xffa 1 2\n")
    _, keys, _ = read_all("word2vec", p, unicode_errors="replace")
    assert keys == ["\ufffda"]


def test_empty_file(tmp_path):
    p = _bad(tmp_path, b"")
    with pytest.raises(FormatError, match="the file is empty"):
        read_all("word2vec", p)
    with pytest.raises(FormatError, match="the file is empty"):
        detect(p)


def test_huge_header_is_only_a_hint(tmp_path):
    p = _bad(tmp_path, b"1000000000000 2\na 1 2\n")
    with get("word2vec").read(p) as r:
        assert r.size_hint() <= 100
    p = _bad(tmp_path, b"1000000000000 2\na \x00\x00\x80?\x00\x00\x80?\n", "b.bin")
    with get("word2vec-binary").read(p) as r:
        assert r.size_hint() <= 100
        with pytest.raises(FormatError, match="promises 1000000000000 rows, the file has 1"):
            list(r)


BAD_BINARY = [
    ("truncated", b"2 2\na " + struct.pack("<2f", 1, 2) + b"\nb " + b"\x00\x00", "row 2: expected"),
    ("too many", b"1 2\na " + struct.pack("<2f", 1, 2) + b"\nb " + struct.pack("<2f", 1, 2),
     "the file has more"),
    ("nan", b"1 2\na " + struct.pack("<2f", 1, float("nan")) + b"\n",
     "row 1, column 2: expected a finite number, got"),
    ("bad utf-8", b"1 2\n\xff " + struct.pack("<2f", 1, 2) + b"\n", "row 1: expected a UTF-8 key"),
]


@pytest.mark.parametrize("content,message", [b[1:] for b in BAD_BINARY],
                         ids=[b[0] for b in BAD_BINARY])
def test_bad_binary(tmp_path, content, message):
    p = _bad(tmp_path, content, "bad.bin")
    with pytest.raises(FormatError, match=f"^{p}: ") as info:
        read_all("word2vec-binary", p)
    assert message in str(info.value)


def test_safetensors_choice_and_errors(tmp_path):
    vecs, _, _ = read_all("safetensors", d("two2d.safetensors"), tensor="decoder.weight")
    np.testing.assert_array_equal(vecs, VALUES[::-1])
    with pytest.raises(FormatError, match=r"expected exactly one 2-D float tensor, or one "
                       r"named as an input embedding \(a name ending in embed_tokens.weight, .*"
                       r"\), got 2 \(decoder.weight \[5, 4\], encoder.weight \[5, 4\]\); "
                       r"choose one"):
        get("safetensors").read(d("two2d.safetensors"))
    with pytest.raises(FormatError, match="expected a 2-D float tensor, got I64"):
        get("safetensors").read(d("two2d.safetensors"), tensor="ids")
    with pytest.raises(FormatError, match="expected a tensor named 'nope', got only"):
        get("safetensors").read(d("two2d.safetensors"), tensor="nope")
    bomb = _bad(tmp_path, struct.pack("<Q", 1 << 60) + b"{}", "bomb.safetensors")
    with pytest.raises(FormatError, match="header length 1152921504606846976 exceeds the file"):
        get("safetensors").read(bomb)
    raw = b'{"w":{"dtype":"F32","shape":[1000,4],"data_offsets":[0,16000]}}'
    lying = _bad(tmp_path, struct.pack("<Q", len(raw)) + raw + b"\x00" * 16, "lie.safetensors")
    with pytest.raises(FormatError, match="expected 16000 bytes for F32 \\[1000, 4\\] inside"):
        get("safetensors").read(lying)


def test_safetensors_bf16(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    t = torch.from_numpy(VALUES).to(torch.bfloat16)
    save_file({"w": t}, str(tmp_path / "b.safetensors"))
    vecs, _, (_, _, dtype) = read_all("safetensors", tmp_path / "b.safetensors")
    assert dtype == np.float32
    np.testing.assert_array_equal(vecs, t.float().numpy())


class Evil:
    """Not a tensor: weights_only=True refuses to build it."""


def test_torch_files(tmp_path):
    torch = pytest.importorskip("torch")
    vecs, _, (_, _, dtype) = read_all("torch", d("bf16.pt"))
    ref = torch.load(d("bf16.pt"), weights_only=True)["embedding.weight"].float().numpy()
    assert dtype == np.float32
    np.testing.assert_array_equal(vecs, ref)
    with pytest.raises(FormatError, match=r"got 2 \(model.emb.weight \[5, 4\], "
                       r"model.proj.weight \[2, 4\]\)"):
        get("torch").read(d("nested.pt"))
    p = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, p)
    with pytest.raises(FormatError, match="readable with weights_only=True"):
        get("torch").read(p)


def test_npy_refuses_non_float_and_pickles(tmp_path):
    np.save(tmp_path / "i.npy", np.arange(6).reshape(2, 3))
    with pytest.raises(FormatError, match="expected a float16, float32 or float64 array, got int64"):
        get("npy").read(tmp_path / "i.npy")
    np.save(tmp_path / "o.npy", np.array([[None]], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match="expected a .npy array of floats"):
        get("npy").read(tmp_path / "o.npy")
    np.save(tmp_path / "n.npy", np.array([[1.0, np.nan]]))
    with pytest.raises(FormatError, match="row 1, column 2: expected a finite number, got"):
        read_all("npy", tmp_path / "n.npy")


# --- writers, read back by the reference loaders ------------------------------------------

@pytest.fixture(params=["float32", "float16", "float64"])
def table(request, rng):
    span = 3 if request.param == "float16" else 8
    scale = 10.0 ** rng.integers(-span, span, (23, 1))
    vals = (rng.standard_normal((23, 6)) * scale).astype(request.param)
    return embstore.MemoryTable(vals, keys=[f"w{i}" for i in range(22)] + ["ünï"])


def test_write_npy(tmp_path, table):
    get("npy").write(tmp_path / "o.npy", table, block_rows=5)
    got = np.load(tmp_path / "o.npy", allow_pickle=False)
    assert got.dtype == table.dtype
    np.testing.assert_array_equal(got, table.to_numpy())
    get("npy").write(tmp_path / "l.npy", table, limit=3)
    np.testing.assert_array_equal(np.load(tmp_path / "l.npy"), table.to_numpy()[:3])


def test_write_safetensors(tmp_path, table):
    from safetensors.numpy import load_file
    get("safetensors").write(tmp_path / "o.safetensors", table, block_rows=5)
    got = load_file(str(tmp_path / "o.safetensors"))
    assert list(got) == ["weight"] and got["weight"].dtype == table.dtype
    np.testing.assert_array_equal(got["weight"], table.to_numpy())


@pytest.mark.parametrize("fmt,binary,no_header", [("word2vec", False, False),
                                                  ("fasttext", False, False),
                                                  ("glove", False, True),
                                                  ("word2vec-binary", True, False)])
def test_write_text_and_binary_read_by_gensim(tmp_path, table, fmt, binary, no_header):
    KeyedVectors = pytest.importorskip("gensim.models").KeyedVectors
    p = tmp_path / "o.out"
    assert get(fmt).write(p, table, block_rows=4) == 23
    kv = KeyedVectors.load_word2vec_format(str(p), binary=binary, no_header=no_header)
    assert list(kv.index_to_key) == list(table.keys)
    np.testing.assert_array_equal(kv.vectors, table.to_numpy().astype(np.float32))
    # and our own reader gets the table back (float64 exactly, through the text formats too)
    vecs, keys, _ = read_all(fmt, p, dtype=table.dtype if fmt != "word2vec-binary" else None)
    assert keys == list(table.keys)
    np.testing.assert_array_equal(vecs, table.to_numpy().astype(vecs.dtype))


def test_text_export_formats_a_bounded_number_of_values_at_once(tmp_path, monkeypatch, rng):
    """Each value is a Python object while its row is formatted: 65,536 rows of 100 values
    held 1.1 GB.  The export formats at most TEXT_VALUES values at once, whatever
    ``block_rows``, and writes the same bytes."""
    import embstore.formats.word2vec as w2v

    vals = rng.standard_normal((50, 6)).astype(np.float32)
    t = embstore.MemoryTable(vals, keys=[f"w{i}" for i in range(50)])
    get("word2vec").write(tmp_path / "all.txt", t, block_rows=65536)
    seen = []
    real = w2v.shortest_digits
    monkeypatch.setattr(w2v, "shortest_digits", lambda x: seen.append(x.size) or real(x))
    monkeypatch.setattr(w2v, "TEXT_VALUES", 24)  # 4 rows of 6
    get("word2vec").write(tmp_path / "few.txt", t, block_rows=65536)
    assert max(seen) == 24 and sum(seen) == vals.size
    assert (tmp_path / "few.txt").read_bytes() == (tmp_path / "all.txt").read_bytes()


def test_text_writers_refuse_unwritable_keys(tmp_path):
    t = embstore.MemoryTable(np.ones((2, 2), np.float32), keys=["a", "b c"])
    with pytest.raises(FormatError, match="row 1: key 'b c' is empty or holds whitespace"):
        get("word2vec").write(tmp_path / "o.txt", t)
    with pytest.raises(FormatError, match="the table has no keys"):
        get("glove").write(tmp_path / "o.txt", embstore.MemoryTable(np.ones((2, 2), np.float32)))


def test_registry():
    assert set(FORMATS) == {"npy", "word2vec", "fasttext", "glove", "word2vec-binary",
                            "safetensors", "torch", "hf", "fasttext-bin", "parquet"}
    for name in FORMATS:
        assert callable(FORMATS[name].read)
    with pytest.raises(FormatError, match="unknown format 'csv'"):
        get("csv")

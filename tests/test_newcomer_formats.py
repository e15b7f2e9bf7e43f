"""Issue 34, "Formats both ways" and "Hand-written where a library does better"."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import DestinationExistsError, FormatError

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, input=input)


@pytest.fixture
def keyed(tmp_path):
    rng = np.random.default_rng(3)
    arr = rng.standard_normal((30, 6)).astype(np.float32)
    keys = [f"w{i}" for i in range(30)]
    embstore.save(tmp_path / "t.emb", arr, keys=keys).close()
    return tmp_path / "t.emb", arr, keys


def opened(path):
    with embstore.open(path) as t:
        return t.to_numpy(), None if t.keys is None else list(t.keys)


# -- PyTorch export ---------------------------------------------------------------------------
def test_torch_export_is_a_state_dict_torch_loads(keyed, tmp_path):
    torch = pytest.importorskip("torch")
    path, arr, keys = keyed
    res = invoke("export", path, tmp_path / "g.pt")
    assert res.exit_code == 0, res.output
    state = torch.load(tmp_path / "g.pt", weights_only=True)
    assert list(state) == ["weight"] and state["weight"].dtype == torch.float32
    np.testing.assert_array_equal(state["weight"].numpy(), arr)
    assert (tmp_path / "g.vocab.txt").read_text().split("\n")[:-1] == keys
    # what nn.Embedding takes, and the table again (keys from the sidecar)
    emb = torch.nn.Embedding(30, 6)
    emb.load_state_dict(state)
    embstore.import_file(tmp_path / "g.pt", tmp_path / "back.emb")
    got, got_keys = opened(tmp_path / "back.emb")
    np.testing.assert_array_equal(got, arr)
    assert got_keys == keys


def test_torch_export_names_the_tensor_and_keeps_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    ref = torch.randn(5, 4).to(torch.bfloat16)
    embstore.save(tmp_path / "b.emb", ref.float().numpy(), dtype="bfloat16").close()
    assert invoke("export", tmp_path / "b.emb", tmp_path / "b.pth", "--tensor",
                  "embed.weight").exit_code == 0
    state = torch.load(tmp_path / "b.pth", weights_only=True)
    assert list(state) == ["embed.weight"] and state["embed.weight"].dtype == torch.bfloat16
    assert torch.equal(state["embed.weight"], ref)
    assert not (tmp_path / "b.vocab.txt").exists()  # no keys, no sidecar


# -- keys beside keyless formats ------------------------------------------------------------
def test_npy_round_trip_keeps_the_keys(keyed, tmp_path):
    path, arr, keys = keyed
    assert invoke("export", path, tmp_path / "x.npy").exit_code == 0
    res = invoke("import", tmp_path / "x.npy", tmp_path / "x.emb")
    assert res.exit_code == 0
    assert f"Note: keys from {tmp_path / 'x.vocab.txt'}, found beside x.npy" in res.stderr
    got, got_keys = opened(tmp_path / "x.emb")
    np.testing.assert_array_equal(got, np.load(tmp_path / "x.npy"))
    assert got_keys == keys
    # --vocab still wins; --no-vocab reads none
    other = tmp_path / "other.txt"
    other.write_text("".join(f"k{i}\n" for i in range(30)))
    assert invoke("import", tmp_path / "x.npy", tmp_path / "y.emb", "--vocab", other).exit_code == 0
    assert opened(tmp_path / "y.emb")[1] == [f"k{i}" for i in range(30)]
    assert invoke("import", tmp_path / "x.npy", tmp_path / "z.emb", "--no-vocab").exit_code == 0
    assert opened(tmp_path / "z.emb")[1] is None
    assert json.loads(invoke("info", tmp_path / "x.emb", "--json").stdout)["has_keys"] is True


def test_npy_then_safetensors_share_the_same_keys_file(keyed, tmp_path):
    path, arr, keys = keyed
    for ext in ("npy", "safetensors", "pt"):
        res = invoke("export", path, tmp_path / f"model.{ext}")
        assert res.exit_code == 0, res.output
    assert "keys in " in res.stderr and "(already there, the same keys)" in res.stderr
    assert (tmp_path / "model.vocab.txt").read_text() == "".join(k + "\n" for k in keys)
    # other keys there: refused, unless --overwrite
    embstore.save(tmp_path / "u.emb", arr, keys=[f"u{i}" for i in range(30)]).close()
    with pytest.raises(DestinationExistsError, match=r"model.vocab.txt exists and holds other "
                                                     r"keys than this export's; pass overwrite"):
        embstore.export_table(tmp_path / "u.emb", tmp_path / "model2.npy",
                              vocab_out=tmp_path / "model.vocab.txt")
    assert not (tmp_path / "model2.npy").exists()
    res = invoke("export", tmp_path / "u.emb", tmp_path / "model.safetensors", "--overwrite")
    assert res.exit_code == 0
    assert (tmp_path / "model.vocab.txt").read_text().startswith("u0\nu1\n")


# -- text exports: the shortest round-trip form -----------------------------------------------
def _digits(s: str) -> int:
    mant = s.lstrip("-").split("e")[0].replace(".", "").lstrip("0")
    return max(1, len(mant.rstrip("0")) if "e" in s or "." in s else len(mant.rstrip("0")))


def test_text_export_writes_the_shortest_round_trip_floats(tmp_path):
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2 ** 32, size=20000, dtype=np.uint64).astype(np.uint32)
    vals = bits.view(np.float32)
    vals = vals[np.isfinite(vals)][:19000].reshape(-1, 10)
    vals[0, :4] = [0.418, 0.24968, -0.41242, 0.0]
    keys = [f"w{i}" for i in range(len(vals))]
    embstore.save(tmp_path / "t.emb", vals, keys=keys).close()
    embstore.export_table(tmp_path / "t.emb", tmp_path / "t.txt")
    lines = (tmp_path / "t.txt").read_text().splitlines()
    toks = [line.split()[1:] for line in lines[1:]]
    assert toks[0][:4] == ["0.418", "0.24968", "-0.41242", "0.0"]
    back = np.array(toks, dtype=np.float64).astype(np.float32)
    assert np.array_equal(back.view(np.uint32), vals.view(np.uint32))  # bit for bit
    ref = [[np.format_float_positional(v, unique=True, trim="-") for v in row] for row in vals]
    assert [[_digits(t) for t in row] for row in toks] == [[_digits(r) for r in row] for row in ref]
    # gensim reads it back to the same values
    gensim = pytest.importorskip("gensim")
    kv = gensim.models.KeyedVectors.load_word2vec_format(str(tmp_path / "t.txt"))
    assert np.array_equal(kv.vectors.view(np.uint32), vals.view(np.uint32))


def _gensim_text(vals, path):
    gensim = pytest.importorskip("gensim")
    kv = gensim.models.KeyedVectors(vals.shape[1])
    kv.add_vectors([f"w{i}" for i in range(len(vals))], vals)
    kv.save_word2vec_format(str(path))
    return path.read_text().splitlines()


@pytest.mark.parametrize("fmt", ["word2vec", "glove"])
def test_text_export_writes_whole_numbers_as_gensim_does(tmp_path, fmt):
    """Count vectors, one-hot rows, hand-made values: every whole number token as gensim's
    save_word2vec_format writes it (10.0, -30.0, 0.0, 1e+06), the rest shortest; exact back."""
    rng = np.random.default_rng(3)
    counts = rng.integers(-40, 40, size=(300, 12)).astype(np.float32)
    onehot = np.eye(12, dtype=np.float32)[rng.integers(0, 12, 200)]
    mixed = rng.standard_normal((300, 12)).astype(np.float32)
    mixed[:, ::3] = np.round(mixed[:, ::3] * 1000)  # whole numbers among other values
    special = np.array([[10, -30, 0.0, -0.0, 999999, 1e6, 1234567, -2 ** 24, 3e10, 0.5, 1.5, 7]],
                       dtype=np.float32)
    vals = np.concatenate([special, counts, onehot, mixed])
    keys = [f"w{i}" for i in range(len(vals))]
    embstore.save(tmp_path / "t.emb", vals, keys=keys).close()
    embstore.export_table(tmp_path / "t.emb", tmp_path / "t.txt", format=fmt)
    ours = (tmp_path / "t.txt").read_text().splitlines()
    theirs = _gensim_text(vals, tmp_path / "g.txt")
    ours = ours[1:] if fmt == "word2vec" else ours
    assert ours[0] == theirs[1] == ("w0 10.0 -30.0 0.0 -0.0 999999.0 1e+06 1.234567e+06 "
                                    "-1.6777216e+07 3e+10 0.5 1.5 7.0")
    mine = np.array([line.split()[1:] for line in ours])
    ref = np.array([line.split()[1:] for line in theirs[1:]])
    whole = vals == np.round(vals)
    assert np.array_equal(mine[whole], ref[whole])  # whole numbers: gensim's very tokens
    back = mine.astype(np.float64).astype(np.float32)
    assert np.array_equal(back.view(np.uint32), vals.view(np.uint32))  # every value exact
    size = (tmp_path / "t.txt").stat().st_size
    assert size <= 1.05 * (tmp_path / "g.txt").stat().st_size


def test_text_export_of_trained_like_rows_stays_within_gensims_size(tmp_path):
    vals = np.random.default_rng(8).standard_normal((2000, 50)).astype(np.float32) / 3
    vals[::7, 0] = 0.0
    embstore.save(tmp_path / "t.emb", vals, keys=[f"w{i}" for i in range(len(vals))]).close()
    embstore.export_table(tmp_path / "t.emb", tmp_path / "t.txt")
    theirs = _gensim_text(vals, tmp_path / "g.txt")
    ours = (tmp_path / "t.txt").read_text().splitlines()
    assert ours == theirs  # here NumPy's str and the shortest %g agree token for token
    kv = pytest.importorskip("gensim").models.KeyedVectors.load_word2vec_format(
        str(tmp_path / "t.txt"))
    assert np.array_equal(kv.vectors.view(np.uint32), vals.view(np.uint32))


def test_txt_gz_export_goes_through_isal(keyed, tmp_path, monkeypatch):
    isal = pytest.importorskip("isal.igzip")
    from embstore.formats import source
    path, arr, keys = keyed
    with open(tmp_path / "raw", "wb") as f:
        out = source.open_compressed_output(f, "gzip")
        assert isinstance(out, isal.IGzipFile)
        out.close()
    embstore.export_table(path, tmp_path / "t.txt")
    embstore.export_table(path, tmp_path / "t.txt.gz")
    assert gzip.open(tmp_path / "t.txt.gz").read() == (tmp_path / "t.txt").read_bytes()
    monkeypatch.setattr(source, "_isal_gzip", lambda: None)  # without the extra: the stdlib
    embstore.export_table(path, tmp_path / "s.txt.gz")
    assert gzip.open(tmp_path / "s.txt.gz").read() == (tmp_path / "t.txt").read_bytes()


# -- zip archives of several members -------------------------------------------------------
@pytest.fixture
def glove_zip(tmp_path):
    """A four-member zip like glove.6B.zip (dimensions 2, 3, 4, 5)."""
    rng = np.random.default_rng(5)
    arrays = {}
    with zipfile.ZipFile(tmp_path / "glove.6B.zip", "w") as z:
        for d in (2, 3, 4, 5):
            a = rng.standard_normal((7, d)).astype(np.float32)
            arrays[d] = a
            z.writestr(f"glove.6B.{d}d.txt", "".join(
                f"w{i} " + " ".join(repr(float(v)) for v in row) + "\n" for i, row in enumerate(a)))
    return tmp_path / "glove.6B.zip", arrays


def test_a_zip_of_several_members_lists_them_and_member_picks_one(glove_zip, tmp_path):
    src, arrays = glove_zip
    want = (r"glove.6B.zip: the zip archive holds 4 members \(glove.6B.2d.txt, glove.6B.3d.txt, "
            r"glove.6B.4d.txt, glove.6B.5d.txt\); choose one with member=")
    with pytest.raises(FormatError, match=want):
        embstore.import_file(src, tmp_path / "a.emb")
    res = invoke("import", src, tmp_path / "a.emb")
    assert res.exit_code == 1 and "choose one with --member" in res.stderr
    res = invoke("import", src, tmp_path / "a.emb", "--member", "glove.6B.4d.txt")
    assert res.exit_code == 0, res.output
    got, keys = opened(tmp_path / "a.emb")
    np.testing.assert_array_equal(got, arrays[4])
    assert keys == [f"w{i}" for i in range(7)]
    with pytest.raises(FormatError, match=r"expected a member named 'nope.txt' in the zip "
                                          r"archive, got glove.6B.2d.txt, "):
        embstore.import_file(src, tmp_path / "b.emb", member="nope.txt")
    with pytest.raises(FormatError, match=r"member= picks a member of a zip archive; expected "
                                          r"one, got an uncompressed file"):
        embstore.import_file(ROOT / "tests" / "data" / "glove.txt", tmp_path / "c.emb",
                             member="x")


# -- sources given as URLs ----------------------------------------------------------------------
@pytest.fixture
def http_dir(tmp_path):
    """A local HTTP server over ``tmp_path / "www"``: yields (directory, base URL)."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(www)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_import_from_https_url_streams_it(http_dir, tmp_path, glove_zip):
    www, base = http_dir
    data = (ROOT / "tests" / "data" / "gensim.txt").read_bytes()
    (www / "vectors.txt.gz").write_bytes(gzip.compress(data))
    res = invoke("import", f"{base}/vectors.txt.gz", tmp_path / "h.emb")
    assert res.exit_code == 0, res.output
    embstore.import_file(ROOT / "tests" / "data" / "gensim.txt", tmp_path / "ref.emb")
    got, keys = opened(tmp_path / "h.emb")
    ref, ref_keys = opened(tmp_path / "ref.emb")
    np.testing.assert_array_equal(got, ref)
    assert keys == ref_keys
    (www / "g.zip").write_bytes(glove_zip[0].read_bytes())
    embstore.import_file(f"{base}/g.zip", tmp_path / "z.emb", member="glove.6B.3d.txt")
    np.testing.assert_array_equal(opened(tmp_path / "z.emb")[0], glove_zip[1][3])
    with pytest.raises(embstore.EmbstoreError, match=rf"{base}/missing.vec: HTTP 404"):
        embstore.import_file(f"{base}/missing.vec", tmp_path / "m.emb")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") or "tmp" in p.name]


def test_unknown_url_scheme_is_a_clear_error(tmp_path):
    res = invoke("import", "ftp://host/vectors.vec", tmp_path / "f.emb")
    assert res.exit_code == 2
    assert "cannot read ftp://host/vectors.vec: expected a local path, s3:// (gs://, az://) or " \
        "http(s)://" in res.stderr
    with pytest.raises(FormatError, match=r"cannot read a source from a ftp:// URL"):
        embstore.import_file("ftp://host/vectors.vec", tmp_path / "f.emb")


# -- Parquet of words and vectors ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fixed", "list"])
def test_parquet_words_and_vectors_import(tmp_path, kind):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(2)
    arr = rng.standard_normal((50, 4)).astype(np.float32)
    words = [f"w{i}" for i in range(50)]
    vec = pa.FixedSizeListArray.from_arrays(pa.array(arr.ravel()), 4) if kind == "fixed" \
        else pa.array(arr.tolist(), type=pa.list_(pa.float32()))
    pq.write_table(pa.table({"doc": list(range(50)), "word": words, "vector": vec}),
                   tmp_path / "wv.parquet", row_group_size=16)
    res = invoke("import", tmp_path / "wv.parquet", tmp_path / "p.emb")
    assert res.exit_code == 0, res.output
    got, keys = opened(tmp_path / "p.emb")
    np.testing.assert_array_equal(got, arr)
    assert keys == words
    embstore.import_file(tmp_path / "wv.parquet", tmp_path / "q.emb", limit=20, block_rows=7)
    np.testing.assert_array_equal(opened(tmp_path / "q.emb")[0], arr[:20])


def test_parquet_words_and_vectors_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"word": ["a", "b"], "v": [[1.0, 2.0], [3.0]]}), tmp_path / "r.parquet")
    with pytest.raises(FormatError, match=r"r.parquet: row 2: expected 2 values, got 1"):
        embstore.import_file(tmp_path / "r.parquet", tmp_path / "r.emb")
    pq.write_table(pa.table({"word": ["a"], "v": [[1.0]], "w": [[2.0]]}), tmp_path / "two.parquet")
    with pytest.raises(FormatError, match=r"expected exactly one column of float vectors, got 2 "
                                          r"among word \(string\), v \(list<element: double>\), w "):
        embstore.import_file(tmp_path / "two.parquet", tmp_path / "t.emb")
    embstore.import_file(tmp_path / "two.parquet", tmp_path / "t.emb", tensor="w")
    assert opened(tmp_path / "t.emb")[0].tolist() == [[2.0]]


# -- lookup: ids from standard input, Parquet without --column, an s3 table -------------------
def test_lookup_reads_ids_from_stdin(keyed, tmp_path):
    path, arr, keys = keyed
    ids = np.array([[3, 1], [29, 0]], dtype=np.int64)
    np.save(tmp_path / "ids.npy", ids)
    res = invoke("lookup", path, "-", tmp_path / "o.npy",
                 input=(tmp_path / "ids.npy").read_bytes())
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), arr[ids])
    res = invoke("lookup", path, "-", tmp_path / "k.npy", "--keys", "--oov", "zero",
                 input="w2 w5 zz\nw7\n")
    assert res.exit_code == 0, res.output
    want = np.zeros((2, 3, 6), np.float32)
    want[0, 0], want[0, 1], want[1, 0] = arr[2], arr[5], arr[7]
    np.testing.assert_array_equal(np.load(tmp_path / "k.npy"), want)
    assert not [p for p in tmp_path.iterdir() if "stdin" in p.name]


def test_parquet_input_needs_no_column_for_input_ids(keyed, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path, arr, _ = keyed
    ids = [[1, 2, 3], [4], [0, 29]]
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids],
                             "label": [0, 1, 0]}), tmp_path / "hf.parquet")
    res = invoke("lookup", path, tmp_path / "hf.parquet", tmp_path / "v.parquet")
    assert res.exit_code == 0, res.output
    got = pq.read_table(tmp_path / "v.parquet").column("vector").to_pylist()
    for row, want in zip(got, ids):
        np.testing.assert_array_equal(np.array(row, np.float32), arr[want])
    pq.write_table(pa.table({"a": [1, 2], "b": [3, 4]}), tmp_path / "ab.parquet")
    res = invoke("lookup", path, tmp_path / "ab.parquet", tmp_path / "w.parquet")
    assert res.exit_code == 1
    assert "expected --column naming the column of ids or keys: 2 columns of integer ids among " \
        "a (int64), b (int64)" in res.stderr
    pq.write_table(pa.table({"doc": ["x", "y"], "tok": [5, 6]}), tmp_path / "one.parquet")
    embstore.lookup_file(path, tmp_path / "one.parquet", tmp_path / "one_v.parquet")
    got = pq.read_table(tmp_path / "one_v.parquet").column("vector").to_pylist()
    np.testing.assert_array_equal(np.array(got, np.float32), arr[[5, 6]])


# -- hand-written where a library does better ------------------------------------------------
def test_info_separator_scan_agrees_with_the_regex():
    from embstore.formats._textparse import has_info_separator
    rng = np.random.default_rng(0)
    rx = re.compile(rb"[\x1c-\x1f]")
    for n in (0, 1, 10, 1000):
        for _ in range(200):
            data = bytes(rng.integers(0x18, 0x24, size=n, dtype=np.uint8))
            assert has_info_separator(data) == (rx.search(data) is not None)


def test_one_crc32c_library(tmp_path):
    """embstore runs with the LGPL ``crc32c`` package absent; pyproject does not install it."""
    deps = "\n".join(re.findall(r'^\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M))
    assert not re.search(r"^crc32c\b", deps, re.M) and re.search(r"^google-crc32c\b", deps, re.M)
    code = ("import sys; sys.modules['crc32c'] = None\n"  # import crc32c -> ImportError
            "import numpy as np, embstore\n"
            f"t = embstore.save({str(tmp_path / 'c.emb')!r}, np.eye(40, 8, dtype=np.float32), "
            "chunk_rows=4, shard_rows=16)\n"
            "t.close(); t = embstore.open(t.path); assert (t[[3, 39]] == np.eye(40, 8)[[3, 39]]).all()\n"
            "assert embstore.verify(t.path).ok\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_checksum_matches_the_crc32c_reference():
    from embstore.fs.checksum import crc32c
    # RFC 3720 (iSCSI) test vectors of CRC-32C
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA and crc32c(b"\xff" * 32) == 0x62A8AB43
    data = bytes(range(256)) * 40
    assert crc32c(memoryview(data)[7:1031]) == crc32c(data[7:1031])
    assert crc32c(data[100:], crc32c(data[:100])) == crc32c(data)
    assert crc32c(bytearray(data)) == crc32c(np.frombuffer(data, np.uint8)) == crc32c(data)

"""Compressed sources (gzip, bz2, xz, zstd, one-member zip), pipes, compressed exports.

Every compressed copy of the test files must import to exactly the table the plain
file gives; the copies are made with the standard library (and ``zstandard``), the
references are the plain imports, gensim and NumPy.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import lzma
import os
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

import embstore
from embstore.cli import cli
from embstore.errors import FormatError
from embstore.formats import detect, source as source_mod

DATA = os.path.join(os.path.dirname(__file__), "data")
FILES = ["gensim.txt", "glove.txt", "fasttext.vec", "gensim.bin", "c_space.bin", "c_crlf.txt",
         "float16.npy", "float64.npy", "one2d.safetensors", "bf16.pt"]
RANDOM_ACCESS = {"one2d.safetensors", "bf16.pt"}  # decompressed to a file beside DEST
KINDS = ["gz", "bz2", "xz", "zst", "zip"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compress(data: bytes, kind: str, member: str = "data") -> bytes:
    """``data`` compressed at each tool's fastest level (the readers are what is tested;
    xz at its default level took 6.3 CPU-s for big_text(), at preset 0 0.4 s)."""
    if kind == "gz":
        return gzip.compress(data, compresslevel=1, mtime=0)
    if kind == "bz2":
        return bz2.compress(data, compresslevel=1)
    if kind == "xz":
        return lzma.compress(data, preset=0)
    if kind == "zst":
        return zstandard.ZstdCompressor(level=1).compress(data)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr(member, data)
    return buf.getvalue()


def packed(tmp_path, name: str, kind: str, data: bytes | None = None) -> str:
    """``name`` from tests/data (or ``data``) compressed as ``<name>.<kind>``."""
    if data is None:
        with open(os.path.join(DATA, name), "rb") as f:
            data = f.read()
    out = tmp_path / f"{name}.{kind}"
    out.write_bytes(compress(data, kind, member=name))
    return str(out)


def table(path):
    with embstore.open(path) as t:
        keys = None if t.keys is None else list(t.keys)
        return t.to_numpy(), keys, t.dtype


def same(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    assert a[0].dtype == b[0].dtype and a[1] == b[1] and a[2] == b[2]


@pytest.fixture(scope="module")
def plain_import(tmp_path_factory):
    """``name -> (import result, table)`` of the plain file, imported once per module."""
    made: dict = {}

    def get(name):
        if name not in made:
            dest = tmp_path_factory.mktemp("plain") / "plain.emb"
            made[name] = embstore.import_file(os.path.join(DATA, name), dest), table(dest)
        return made[name]
    return get


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FILES)
def test_compressed_copy_imports_to_the_same_table(tmp_path, plain_import, name, kind):
    plain, plain_table = plain_import(name)
    res = embstore.import_file(packed(tmp_path, name, kind), tmp_path / "packed.emb")
    assert res.format == plain.format
    assert res.compression == {"gz": "gzip", "zst": "zstd"}.get(kind, kind)
    same(table(tmp_path / "packed.emb"), plain_table)
    if name in RANDOM_ACCESS:
        assert any("needs random access" in n for n in res.notes)
    assert sorted(os.listdir(tmp_path)) == sorted([f"{name}.{kind}", "packed.emb"])


@functools.lru_cache(maxsize=4)
def big_text(rows=20000, dim=16, seed=3):
    """A word2vec text file of ``rows`` random rows and its rows (made once per size)."""
    v = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    v.flags.writeable = False
    lines = [f"{rows} {dim}"] + [f"w{i} " + " ".join("%.9g" % x for x in r)
                                 for i, r in enumerate(v.tolist())]
    return ("\n".join(lines) + "\n").encode(), v


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_across_many_blocks(tmp_path, kind):
    data, v = big_text()
    res = embstore.import_file(packed(tmp_path, "big.txt", kind, data), tmp_path / "t.emb",
                               block_rows=999)
    assert res.rows == len(v)
    arr, keys, _ = table(tmp_path / "t.emb")
    np.testing.assert_array_equal(arr, v)
    assert keys == [f"w{i}" for i in range(len(v))]


def test_gzip_with_several_members_and_zlib_fallback(tmp_path, monkeypatch):
    data, v = big_text(rows=3000)
    cut = data.index(b"\nw1500 ") + 1
    src = tmp_path / "two.txt.gz"
    src.write_bytes(gzip.compress(data[:cut]) + gzip.compress(data[cut:]))  # as pigz/bgzip
    embstore.import_file(src, tmp_path / "a.emb")
    np.testing.assert_array_equal(table(tmp_path / "a.emb")[0], v)
    monkeypatch.setattr(source_mod, "_gzip_module", lambda: zlib)  # without isal
    embstore.import_file(src, tmp_path / "b.emb")
    same(table(tmp_path / "a.emb"), table(tmp_path / "b.emb"))


def test_detected_from_magic_bytes_not_extension(tmp_path):
    # no compression extension: the magic bytes say gzip, the header says word2vec
    src = tmp_path / "vectors.dat"
    src.write_bytes(compress(open(os.path.join(DATA, "gensim.txt"), "rb").read(), "gz"))
    assert detect(src) == "word2vec"
    # the inner name decides .vec -> fasttext, as for the plain file
    assert detect(packed(tmp_path, "fasttext.vec", "gz")) == "fasttext"
    # a .gz name on a plain file: read as plain
    plain = tmp_path / "plain.txt.gz"
    shutil.copy(os.path.join(DATA, "gensim.txt"), plain)
    res = embstore.import_file(plain, tmp_path / "p.emb")
    assert res.compression is None and res.rows == 5


def test_gensim_reads_the_same_gz(tmp_path):
    gensim_models = pytest.importorskip("gensim.models")
    test_data = os.path.join(os.path.dirname(gensim_models.__file__), "..", "test", "test_data")
    vec = os.path.join(test_data, "lee_fasttext.vec")
    if not os.path.exists(vec):
        pytest.skip("gensim's test data is not installed")
    src = packed(tmp_path, "lee_fasttext.vec", "gz", open(vec, "rb").read())
    ref = gensim_models.KeyedVectors.load_word2vec_format(src)
    embstore.import_file(src, tmp_path / "t.emb")
    arr, keys, _ = table(tmp_path / "t.emb")
    assert keys == ref.index_to_key
    np.testing.assert_array_equal(arr, ref.vectors)


def test_progress_counts_compressed_bytes(tmp_path):
    data, _ = big_text(rows=5000)
    src = packed(tmp_path, "big.txt", "gz", data)
    seen = []
    embstore.import_file(src, tmp_path / "t.emb", on_progress=lambda d, t: seen.append((d, t)))
    size = os.path.getsize(src)
    assert seen and all(t == size for _, t in seen)
    assert seen[-1][0] == size and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_unknown_inner_format(tmp_path):
    src = tmp_path / "blob.gz"
    src.write_bytes(gzip.compress(bytes(range(256)) * 64))
    with pytest.raises(FormatError, match=r"blob.gz: gzip-compressed, inner format unknown: "
                                          r"cannot tell the format"):
        embstore.import_file(src, tmp_path / "t.emb")
    assert not (tmp_path / "t.emb").exists()


def test_zip_needs_exactly_one_member(tmp_path):
    src = tmp_path / "two.zip"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("a.txt", "1 1\na 1\n")
        z.writestr("b.txt", "1 1\nb 1\n")
    with pytest.raises(FormatError, match=r"the zip archive holds 2 members \(a.txt, b.txt\); "
                                          r"choose one with member="):
        embstore.import_file(src, tmp_path / "t.emb")
    # a PyTorch zip checkpoint is not a compressed file
    assert detect(os.path.join(DATA, "nested.pt")) == "torch"


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz", "zst"])
def test_truncated_data_is_an_error(tmp_path, kind):
    data, _ = big_text(rows=3000)
    whole = compress(data, kind)
    src = tmp_path / f"cut.txt.{kind}"
    src.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(FormatError, match=r"cut.txt.*(compressed|promises|expected)"):
        embstore.import_file(src, tmp_path / "t.emb")
    assert not (tmp_path / "t.emb").exists()


def test_fasttext_bin_given_as_vec_format(tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(struct.pack("<ii", 0x2F4F16BA, 12) + bytes(200))
    for fmt in ("fasttext", "word2vec", "word2vec-binary"):
        with pytest.raises(FormatError, match=r"model.bin: this is a fastText binary model "
                                              r"\(.bin, magic number 0x2F4F16BA\), not the .* "
                                              r"format; read it with format 'fasttext-bin'"):
            embstore.import_file(src, tmp_path / "t.emb", format=fmt)
    r = CliRunner().invoke(cli, ["import", str(src), str(tmp_path / "t.emb"), "--format",
                                 "fasttext"])
    assert r.exit_code == 1 and "fastText binary model" in r.output and "fasttext-bin" in r.output


@pytest.mark.parametrize("ext,open_", [("gz", gzip.open), ("bz2", bz2.open), ("xz", lzma.open),
                                       ("zst", None)])
@pytest.mark.parametrize("fmt,name", [("word2vec", "v.txt"), ("npy", "v.npy"),
                                      ("word2vec-binary", "v.bin")])
def test_export_compressed(tmp_path, ext, open_, fmt, name):
    embstore.import_file(os.path.join(DATA, "gensim.txt"), tmp_path / "t.emb")
    plain = embstore.export_table(tmp_path / "t.emb", tmp_path / name, format=fmt,
                                  vocab_out=False)
    res = embstore.export_table(tmp_path / "t.emb", tmp_path / f"{name}.{ext}", vocab_out=False)
    assert res.format == plain.format == fmt
    raw = (tmp_path / f"{name}.{ext}").read_bytes()
    if open_ is None:
        back = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    else:
        with open_(tmp_path / f"{name}.{ext}", "rb") as f:
            back = f.read()
    assert back == (tmp_path / name).read_bytes()
    embstore.import_file(tmp_path / f"{name}.{ext}", tmp_path / "again.emb")
    np.testing.assert_array_equal(table(tmp_path / "again.emb")[0], table(tmp_path / "t.emb")[0])


def test_export_gz_keys_file_named_after_the_inner_name(tmp_path):
    embstore.import_file(os.path.join(DATA, "gensim.txt"), tmp_path / "t.emb")
    res = embstore.export_table(tmp_path / "t.emb", tmp_path / "v.npy.gz")
    assert res.vocab_path == str(tmp_path / "v.vocab.txt")
    with pytest.raises(FormatError, match="cannot write a zip archive"):
        embstore.export_table(tmp_path / "t.emb", tmp_path / "v.npy.zip")


def cli_run(args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "embstore", *map(str, args)], input=stdin,
                          capture_output=True, env=env, timeout=300)


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_stdin_and_stdout_through_pipes(tmp_path):
    gz = open(packed(tmp_path, "gensim.txt", "gz"), "rb").read()
    embstore.import_file(os.path.join(DATA, "gensim.txt"), tmp_path / "ref.emb")
    # compressed standard input, format detected from the first decompressed bytes
    r = cli_run(["import", "-", tmp_path / "a.emb"], stdin=gz)
    assert r.returncode == 0, r.stderr
    assert b"gzip-compressed word2vec" in r.stderr
    same(table(tmp_path / "a.emb"), table(tmp_path / "ref.emb"))
    # plain text with --format, and word2vec-binary
    r = cli_run(["import", "-", tmp_path / "g.emb", "--format", "glove", "-q"],
                stdin=open(os.path.join(DATA, "glove.txt"), "rb").read())
    assert r.returncode == 0, r.stderr
    embstore.import_file(os.path.join(DATA, "glove.txt"), tmp_path / "gref.emb")
    same(table(tmp_path / "g.emb"), table(tmp_path / "gref.emb"))
    # table -> stdout (word2vec binary) -> stdin: a round trip through pipes
    out = cli_run(["export", tmp_path / "a.emb", "-", "--format", "word2vec-binary", "-q"])
    assert out.returncode == 0, out.stderr
    r = cli_run(["import", "-", tmp_path / "b.emb", "-q"], stdin=out.stdout)
    assert r.returncode == 0, r.stderr
    same(table(tmp_path / "b.emb"), table(tmp_path / "ref.emb"))
    # npy to stdout, read by NumPy; and back in through zstd-compressed stdin
    out = cli_run(["export", tmp_path / "a.emb", "-", "--format", "npy", "-q"])
    np.testing.assert_array_equal(np.load(io.BytesIO(out.stdout)), table(tmp_path / "ref.emb")[0])
    r = cli_run(["import", "-", tmp_path / "n.emb", "-q"],
                stdin=zstandard.ZstdCompressor().compress(out.stdout))
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(table(tmp_path / "n.emb")[0], table(tmp_path / "ref.emb")[0])
    # safetensors needs random access: copied beside DEST, said so, nothing left behind
    r = cli_run(["import", "-", tmp_path / "s.emb"],
                stdin=gzip.compress(open(os.path.join(DATA, "one2d.safetensors"), "rb").read()))
    assert r.returncode == 0, r.stderr
    assert b"needs random access" in r.stderr
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_stdin_errors_are_one_line(tmp_path):
    r = cli_run(["import", "-", tmp_path / "z.emb"], stdin=compress(b"1 1\na 1\n", "zip"))
    assert r.returncode == 1
    assert r.stderr.decode().strip().splitlines()[-1].startswith(
        "Error: <stdin>: a zip archive cannot be read from a stream")
    r = cli_run(["import", "-", tmp_path / "e.emb"], stdin=b"")
    assert r.returncode == 1 and "Error: <stdin>: the file is empty" in r.stderr.decode()
    assert not (tmp_path / "z.emb").exists() and not (tmp_path / "e.emb").exists()


@pytest.mark.parametrize("header,fmt", [(b"1 999999999999\nx 1\n", "word2vec"),
                                        (b"1 999999999999\nx \x00\x00\x80?\n", "word2vec-binary")])
def test_hostile_dimension_in_compressed_data(tmp_path, header, fmt):
    src = tmp_path / "h.gz"
    src.write_bytes(gzip.compress(header))
    with pytest.raises(FormatError, match=r"h.gz, line 1: the header's dimension 999999999999 "
                                          r"cannot fit: expected at most \d+ \(a (line|row) holds"):
        embstore.import_file(src, tmp_path / "t.emb", format=fmt)
    assert not (tmp_path / "t.emb").exists()

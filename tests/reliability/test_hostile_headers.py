"""Hostile headers and attributes give one ``Error:`` line (exit 1), never a traceback.

JSON nested 100,000 deep raised ``RecursionError`` from every JSON file embstore reads in
a model folder; each case below printed a traceback before.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from relhelpers import assert_clean_error, invoke, run_cli_subprocess, tmpfs

import embstore

DEEP = b"[" * 100_000 + b"]" * 100_000
ROWS, DIM = 6, 4
E = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
TENSOR = "embeddings.word_embeddings.weight"


def _folder(path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    st_numpy.save_file({TENSOR: E}, str(path / "model.safetensors"))
    (path / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(ROWS)))
    return path


def _deep_config(p):
    (p / "config.json").write_bytes(DEEP)
    return p / "config.json"


def _deep_tokenizer(p):
    (p / "vocab.txt").unlink()
    (p / "tokenizer.json").write_bytes(b'{"model": {"vocab": ' + DEEP + b"}}")
    return p / "tokenizer.json"


def _deep_index(p):
    (p / "model.safetensors.index.json").write_bytes(b'{"weight_map": ' + DEEP + b"}")
    return p / "model.safetensors.index.json"


def _deep_header(p):
    raw = b'{"x": ' + DEEP + b"}"
    (p / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return p / "model.safetensors"


DEEP_FILES = {"config.json": _deep_config, "tokenizer.json": _deep_tokenizer,
              "model.safetensors.index.json": _deep_index, "safetensors-header": _deep_header}


@pytest.mark.parametrize("case", list(DEEP_FILES))
def test_json_nested_100000_deep_is_one_error_line(tmp_path, case):
    folder = _folder(tmp_path / "model")
    bad = DEEP_FILES[case](folder)
    line = assert_clean_error(invoke(["import", folder, tmp_path / "t.emb", "--quiet"]),
                              context=case)
    assert line.startswith(f"Error: {bad}: expected ") and line.endswith(
        "got a document nested too deep to parse (more than ~1,000 levels of arrays and "
        "objects)"), line
    assert not (tmp_path / "t.emb").exists()
    with pytest.raises(embstore.FormatError, match="nested too deep to parse"):
        embstore.import_file(folder, tmp_path / "t2.emb")


def test_a_folder_without_hostile_json_imports(tmp_path):
    folder = _folder(tmp_path / "model")
    res = invoke(["import", folder, tmp_path / "t.emb", "--quiet"])
    assert res.exit_code == 0, res.output
    with embstore.open(tmp_path / "t.emb") as t:
        np.testing.assert_array_equal(t[np.arange(ROWS)], E)
        assert list(t.keys) == [f"t{i}" for i in range(ROWS)]


@pytest.fixture
def full_fs(tmp_path):
    """A 1 MiB tmpfs (needs root; skipped otherwise)."""
    with tmpfs(tmp_path / "fs", 1 << 20) as mnt:
        yield mnt


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_a_dask_job_on_a_full_disk_prints_one_error_line(tmp_path, full_fs):
    pytest.importorskip("dask.distributed")
    embstore.save(tmp_path / "t.emb", np.ones((1000, 64), np.float32)).close()
    np.save(tmp_path / "ids.npy", np.arange(20000) % 1000)  # 5 MB of output on 1 MiB
    res = run_cli_subprocess(["lookup", tmp_path / "t.emb", tmp_path / "ids.npy",
                              full_fs / "out.zarr", "--scheduler", "local", "--batch-rows",
                              "2000", "--quiet"], timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    # the workers' "Compute Failed" tracebacks came first, pages of them
    assert res.stderr == f"Error: {full_fs / '.out.zarr.partial'}: No space left on device\n"


def test_lookup_keep_vector_is_a_usage_error(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    embstore.save(tmp_path / "t.emb", E).close()
    pq.write_table(pa.table({"ids": [1, 2], "vector": [3, 4]}), tmp_path / "in.parquet")
    res = invoke(["lookup", tmp_path / "t.emb", tmp_path / "in.parquet", tmp_path / "o.parquet",
                  "--column", "ids", "--keep", "vector"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.strip().endswith(
        "Error: --keep vector: the output's vector column is named 'vector'; an input column "
        "of that name cannot be kept")
    with pytest.raises(embstore.InvalidOptionError, match="the output's vector column is "
                                                          "named 'vector'"):
        embstore.lookup_file(tmp_path / "t.emb", tmp_path / "in.parquet",
                             tmp_path / "o2.parquet", column="ids", keep=["vector"])


# -- compressed inputs: an encrypted zip member, an xz dictionary of 3 GiB ----------------
VEC = b"2 2\na 1 2\nb 3 4\n"


def _encrypted_zip(path):
    """A zip whose member is flagged encrypted (bit 0 of both its headers' flags)."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("v.vec", VEC)
    raw = bytearray(buf.getvalue())
    raw[6] |= 1  # the local file header's general purpose flags
    central = raw.index(b"PK\x01\x02")
    raw[central + 8] |= 1
    path.write_bytes(bytes(raw))
    return path


def _huge_dictionary_xz(path):
    """An xz stream whose LZMA2 filter asks for a 3 GiB dictionary (block header patched,
    its CRC32 fixed): decoding it allocated 3 GiB."""
    import lzma
    import zlib

    raw = bytearray(lzma.compress(VEC, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32,
                                  filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 20}]))
    size = (raw[12] + 1) * 4  # the block header after the 12-byte stream header
    hdr = raw[12:12 + size]
    at = hdr.index(b"\x21\x01")  # filter id LZMA2, one byte of properties
    hdr[at + 2] = 39  # dictionary (2 | 1) << (39 // 2 + 11) = 3 GiB
    struct.pack_into("<I", hdr, size - 4, zlib.crc32(bytes(hdr[:size - 4])))
    raw[12:12 + size] = hdr
    path.write_bytes(bytes(raw))
    return path


def test_an_encrypted_zip_member_is_one_error_line(tmp_path):
    src = _encrypted_zip(tmp_path / "v.zip")
    line = assert_clean_error(invoke(["import", src, tmp_path / "t.emb"]), context="zip")
    assert line == (f"Error: {src}: zip member 'v.vec': cannot read it: it is encrypted "
                    "(password-protected); unzip it and import the file itself")


def test_an_xz_dictionary_of_3_gib_is_refused_naming_the_limit(tmp_path):
    src = _huge_dictionary_xz(tmp_path / "v.vec.xz")
    res = run_cli_subprocess(["import", src, tmp_path / "t.emb", "--quiet"],
                             address_space=2 << 30)
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr == (f"Error: {src}: cannot read xz-compressed data: its header asks for "
                          "more than the 1073741824 bytes of memory (its dictionary) embstore "
                          "decompresses with (recompress it, e.g. xz -6)\n")
    plain = tmp_path / "ok.vec.xz"  # the same bytes with a 1 MiB dictionary import
    import lzma

    plain.write_bytes(lzma.compress(VEC, format=lzma.FORMAT_XZ))
    embstore.import_file(plain, tmp_path / "ok.emb")
    with embstore.open(tmp_path / "ok.emb") as t:
        np.testing.assert_array_equal(t[[0, 1]], [[1, 2], [3, 4]])


# -- hostile attributes of the index and of the subwords --------------------------------
def test_an_index_whose_expansion_search_is_not_a_number_is_one_error_line(tmp_path):
    pytest.importorskip("faiss")
    rows = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    path = tmp_path / "t.emb"
    embstore.save(path, rows, keys=[f"k{i}" for i in range(300)]).close()
    embstore.build_index(path)
    meta_path = path / "vectors" / ".embstore" / "ann" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["expansion_search"] = "x"  # int("x") raised ValueError in every search
    meta_path.write_text(json.dumps(meta))
    line = assert_clean_error(invoke(["similar", path, "k5", "--approx"]), context="ef")
    assert line.startswith(f"Error: {meta_path}: expected embstore index metadata, got ")


def test_subwords_claiming_2_40_buckets_are_one_error_line(tmp_path):
    from test_hostile_sizes import _fasttext_bin

    src = _fasttext_bin(tmp_path / "m.bin", words=("hello", "world"), bucket=50)
    path = tmp_path / "t.emb"
    embstore.import_file(src, path)
    for rel in ("zarr.json", "ngrams/zarr.json"):  # both agree: a 2**40-row n-gram matrix
        doc = json.loads((path / rel).read_text())
        if rel == "zarr.json":
            doc["attributes"]["embstore"]["subwords"]["bucket"] = 2**40
        else:
            doc["shape"][0] = 2**40
        (path / rel).write_text(json.dumps(doc))
    line = assert_clean_error(invoke(["similar", path, "helo"]), context="bucket")
    assert line == (f"Error: {path / 'zarr.json'}: expected embstore.subwords bucket <= "
                    "2147483647 and maxn <= 64, got bucket 1099511627776, maxn 6")


def test_a_codec_asking_for_a_huge_dictionary_is_refused_before_decoding(tmp_path):
    """An lzma codec (numcodecs) in ``vectors/zarr.json`` whose filter asks for a 3.5 GiB
    dictionary: refused when the table opens, naming the field and the limit (the decoder
    would allocate it before reading a byte)."""
    import json

    import numpy as np

    import embstore

    embstore.save(tmp_path / "t", np.ones((10, 4), np.float32), format_version=1).close()
    meta_path = tmp_path / "t" / "vectors" / "zarr.json"  # (format 1: sharded codecs)
    meta = json.loads(meta_path.read_text())
    meta["codecs"][0]["configuration"]["codecs"].insert(1, {
        "name": "numcodecs.lzma",
        "configuration": {"format": 1, "check": -1, "preset": None,
                          "filters": [{"id": 33, "dict_size": 3758096384}]}})
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(embstore.CorruptStoreError,
                       match=r"a codec asks for 3758096384 bytes of dict_size \(at most "
                             r"1073741824 bytes"):
        embstore.open(tmp_path / "t")
    assert not embstore.verify(tmp_path / "t").ok

"""The shared ground: storage dtypes, validators, the OOV mapping, write-beside-and-rename,
TableWriter's public options, the format registry, and the CLI's flag hints."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import embstore
from embstore.fs import atomic, beside
from embstore.cli import flag_terms
from embstore.convert import import_file
from embstore.dtypes import (FLOAT_DTYPES, STORAGE_DTYPES, check_dtype, check_storage,
                             is_float_dtype, storage_name)
from embstore.errors import DestinationExistsError, FormatError, ShapeMismatchError
from embstore.formats import (FORMATS, READ_FORMATS, SPECS, WRITE_FORMATS, Reader, detect,
                              export_extensions, export_format_for, spec)
from embstore.ids import non_negative_int, one_of, positive_int
from embstore.oov import check_oov, map_oov
from embstore.store.writer import TableWriter

DATA = os.path.join(os.path.dirname(__file__), "data")


# -- dtypes and validators ---------------------------------------------------------------
def test_storage_dtypes():
    assert FLOAT_DTYPES == ("float16", "float32", "float64")
    assert STORAGE_DTYPES == FLOAT_DTYPES + ("bfloat16", "int8")
    assert [storage_name(d) for d in ("bfloat16", "int8", np.float64, "int16")] == [
        "bfloat16", "int8", "float64", None]
    assert check_storage("int8") == "int8"
    with pytest.raises(ShapeMismatchError, match="dtype must be one of"):
        check_storage("uint8")
    assert [is_float_dtype(d) for d in ("float32", np.float16, np.dtype("<f8"), "int8",
                                          "bfloat16x", object)] == [True] * 3 + [False] * 3
    assert check_dtype("float16") == np.float16
    with pytest.raises(ShapeMismatchError, match="dtype must be one of .* got int32"):
        check_dtype(np.int32)


@pytest.mark.parametrize("value", [0, -1, 1.0, True, "3", None], ids=repr)
def test_positive_int_refuses(value):
    with pytest.raises(ValueError, match=f"n must be a positive int, got {value!r}"):
        positive_int(value, "n")


def test_validators_accept():
    assert positive_int(np.int64(3), "n") == 3 and type(positive_int(np.int64(3), "n")) is int
    assert non_negative_int(0, "limit") == 0
    with pytest.raises(ValueError, match="limit must be an int >= 0, got -1"):
        non_negative_int(-1, "limit")
    with pytest.raises(ShapeMismatchError, match="dim must be a positive int"):
        positive_int(0, "dim", error=ShapeMismatchError)
    assert one_of("zero", "oov", ("error", "zero")) == "zero"
    with pytest.raises(ValueError, match="oov must be one of 'error', 'zero', got 'clip'"):
        one_of("clip", "oov", ("error", "zero"))


# -- the OOV mapping ---------------------------------------------------------------------
def test_map_oov_against_numpy():
    ids = np.array([[0, -3, 5], [9, 2, 12]])
    bad = (ids < 0) | (ids >= 10)
    np.testing.assert_array_equal(map_oov(ids, bad, "unk", unk_id=1), [[0, 1, 5], [9, 2, 1]])
    np.testing.assert_array_equal(map_oov(ids, bad, "zero"), [[0, -1, 5], [9, 2, -1]])
    np.testing.assert_array_equal(map_oov(ids, bad, "clip", low=ids < 0, vocab_size=10),
                                  np.clip(ids, 0, 9))
    np.testing.assert_array_equal(ids, [[0, -3, 5], [9, 2, 12]])  # not modified
    with pytest.raises(embstore.InvalidIdError, match="table of 0 rows"):
        map_oov(ids, bad, "clip", vocab_size=0)
    with pytest.raises(ValueError, match="needs unk_id"):
        check_oov("unk", None)
    with pytest.raises(ValueError, match="oov must be one of"):
        check_oov("clip", None)


def test_the_three_users_of_the_oov_mapping_agree():
    table = embstore.MemoryTable(np.arange(12, dtype=np.float32).reshape(4, 3),
                                 keys=["a", "b", "c", "d"])
    got = table.lookup_keys(["a", "zz", "d"], oov="unk", unk_id=1)
    np.testing.assert_array_equal(got, table.to_numpy()[[0, 1, 3]])
    got = table.lookup_keys(["a", "zz", "d"], oov="zero")
    np.testing.assert_array_equal(got, np.vstack([table[0], np.zeros(3), table[3]]))
    emb = embstore.Embedding(table, oov="unk", unk_id=1)
    np.testing.assert_array_equal(emb([0, 7, 3]), table.to_numpy()[[0, 1, 3]])


# -- write beside, then rename -----------------------------------------------------------
def test_write_beside_names_and_renames(tmp_path):
    dest = tmp_path / "out.bin"
    with atomic.write_beside(dest) as tmp:
        name = os.path.basename(tmp)
        # the owner is named (host, pid, start time: see embstore.fs.beside), then 8 random hex
        assert name.startswith(".out.bin.tmp-") and f"-{os.getpid()}." in name
        assert len(name.rsplit("-", 1)[1]) == 8
        assert os.path.dirname(tmp) == str(tmp_path) and not dest.exists()
        with open(tmp, "wb") as f:
            f.write(b"new")
    assert dest.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.bin"]
    with pytest.raises(DestinationExistsError,
                       match="out.bin already exists \\(pass overwrite=True to replace it\\)"):
        with atomic.write_beside(dest):
            pass


def test_write_beside_failure_leaves_dest(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "old").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic.write_beside(dest, overwrite=True, directory=True) as tmp:
            assert os.path.isdir(tmp)
            raise RuntimeError
    assert os.listdir(tmp_path) == ["d"] and (dest / "old").read_text() == "old"
    with atomic.write_beside(dest, overwrite=True, directory=True) as tmp:  # dir over dir
        with open(os.path.join(tmp, "new"), "w") as f:
            f.write("new")
    assert os.listdir(tmp_path) == ["d"] and os.listdir(dest) == ["new"]


def test_replace_a_file_with_a_directory(tmp_path):
    dest = tmp_path / "x"
    dest.write_text("file")
    tmp = atomic.temp_dir(dest)
    atomic.replace(tmp, dest)
    assert dest.is_dir() and os.listdir(tmp_path) == ["x"]


def test_replace_keep_existing_loses_to_a_copy_already_there(tmp_path):
    """``keep_existing=True``: one rename, which fails when another process's (non-empty)
    directory is at the destination first; that copy is left as it was."""
    dest = tmp_path / "key-index"
    dest.mkdir()
    (dest / "zarr.json").write_text("theirs")
    tmp = atomic.temp_dir(dest)
    (Path(tmp) / "zarr.json").write_text("ours")
    with pytest.raises(OSError, match="Directory not empty"):
        atomic.replace(tmp, dest, keep_existing=True)
    assert (dest / "zarr.json").read_text() == "theirs" and os.path.isdir(tmp)
    fresh = tmp_path / "fresh"
    atomic.replace(tmp, fresh, keep_existing=True)
    assert (fresh / "zarr.json").read_text() == "ours" and not os.path.lexists(tmp)


@pytest.mark.parametrize("fail", [False, True], ids=["renamed", "second-rename-fails"])
def test_replace_without_an_exchange_goes_through_aside(tmp_path, monkeypatch, fail):
    """Where the system cannot exchange, two renames through the caller's ``aside`` name; a
    failure of the second puts the old directory back at the destination."""
    monkeypatch.setattr(beside, "_exchange", lambda a, b: False)
    dest, tmp, aside = tmp_path / "keys", tmp_path / "keys.__tmp__", tmp_path / "keys.__old__"
    dest.mkdir()
    (dest / "f").write_text("old")
    tmp.mkdir()
    (tmp / "f").write_text("new")
    seen = []
    real = os.rename

    def rename(a, b):
        seen.append((os.path.basename(a), os.path.basename(b)))
        if fail and len(seen) == 2:
            raise OSError(28, "No space left on device")
        real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    if fail:
        with pytest.raises(OSError, match="No space left"):
            atomic.replace(tmp, dest, aside=aside)
        assert (dest / "f").read_text() == "old"
        assert seen == [("keys", "keys.__old__"), ("keys.__tmp__", "keys"),
                        ("keys.__old__", "keys")]
        return
    atomic.replace(tmp, dest, aside=aside)
    assert seen == [("keys", "keys.__old__"), ("keys.__tmp__", "keys")]
    assert (dest / "f").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["keys"]


# -- TableWriter's public options --------------------------------------------------------
def test_table_writer_duplicate_keys(tmp_path):
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    with TableWriter(tmp_path / "drop", dim=2, has_keys=True) as w:
        assert w.add(rows, ["a", "b", "a"]) == 2
    assert w.duplicates == 1
    with embstore.open(tmp_path / "drop") as t:
        np.testing.assert_array_equal(t.to_numpy(), rows[:2])
    with pytest.raises(ShapeMismatchError, match="key 'a' at row 2 repeats an earlier key"):
        with TableWriter(tmp_path / "err", dim=2, has_keys=True, duplicate_keys="error") as w:
            w.add(rows, ["a", "b", "a"])
    assert not (tmp_path / "err").exists()
    with pytest.raises(ValueError, match="duplicate_keys must be one of 'drop', 'error'"):
        TableWriter(tmp_path / "x", dim=2, duplicate_keys="keep")


def test_table_writer_add_zeros(tmp_path):
    with TableWriter(tmp_path / "z", dim=3, has_keys=True, chunk_rows=2, shard_rows=4) as w:
        w.add_zeros(5, ["a", "b", "c", "d", "e"])
        with pytest.raises(ValueError, match="nothing can be added"):
            w.add(np.ones((1, 3)), ["f"])
    with embstore.open(tmp_path / "z") as t:
        np.testing.assert_array_equal(t.to_numpy(), np.zeros((5, 3), np.float32))
        assert list(t.keys) == ["a", "b", "c", "d", "e"]
    assert not os.path.exists(tmp_path / "z" / "vectors" / "c")  # no shard file written
    with TableWriter(tmp_path / "y", dim=3) as w:
        w.add(np.ones((1, 3)))
        with pytest.raises(ValueError, match="needs an empty writer"):
            w.add_zeros(2)


# -- the format registry -----------------------------------------------------------------
def test_registry_is_the_one_source():
    assert READ_FORMATS == tuple(s.name for s in SPECS)
    assert WRITE_FORMATS == tuple(s.name for s in SPECS if s.can_write)
    for s in SPECS:
        module = FORMATS[s.name]
        assert callable(module.read) and hasattr(module, "write") == s.can_write, s.name
    assert export_extensions() == {".npy": "npy", ".txt": "word2vec", ".w2v": "word2vec",
                                   ".vec": "fasttext", ".bin": "word2vec-binary",
                                   ".safetensors": "safetensors", ".pt": "torch", ".pth": "torch",
                                   ".ckpt": "torch"}
    assert export_format_for("x/y.VEC") == "fasttext" and export_format_for("y.pt") == "torch"
    with pytest.raises(FormatError, match="pass format= \\(npy, word2vec"):
        export_format_for("y.h5")
    with pytest.raises(FormatError, match="unknown format 'csv'"):
        spec("csv")


@pytest.mark.parametrize("fixture,name", [("float16.npy", "npy"), ("nested.pt", "torch"),
                                          ("bf16.pt", "torch"),
                                          ("one2d.safetensors", "safetensors"),
                                          ("gensim.bin", "word2vec-binary"),
                                          ("fasttext.vec", "fasttext"),
                                          ("glove.txt", "glove")])
def test_detection_from_the_records(fixture, name):
    assert detect(os.path.join(DATA, fixture)) == name


def test_a_reader_declares_what_import_uses():
    for attr in ("format", "dim", "dtype", "has_keys", "count", "tensor", "progress_done",
                 "progress_total", "progress_unit"):
        assert hasattr(Reader, attr), attr
    for method in ("size_hint", "close", "__iter__", "blocks"):
        assert callable(getattr(Reader, method)), method
    reader = FORMATS["glove"].read(os.path.join(DATA, "glove.txt"))
    try:
        assert reader.tensor is None and reader.has_keys
    finally:
        reader.close()


# -- parameters in the library, flags on the command line --------------------------------
def test_library_errors_name_parameters(tmp_path):
    with pytest.raises(FormatError, match="tensor= applies to safetensors, torch, hf and parquet files"):
        import_file(os.path.join(DATA, "gensim.txt"), tmp_path / "t", tensor="x")
    with pytest.raises(FormatError, match="vocab= gives keys to formats without them"):
        import_file(os.path.join(DATA, "gensim.txt"), tmp_path / "t",
                    vocab=os.path.join(DATA, "vocab.txt"))


@pytest.mark.parametrize("message,shown", [
    ("x already exists (pass overwrite=True to replace it)",
     "x already exists (pass --overwrite to replace it)"),
    ("key 'a' is not in the table (use oov='zero' or oov='unk')",
     "key 'a' is not in the table (use --oov zero or --oov unk)"),
    ("choose one with tensor=", "choose one with --tensor"),
    ("unicode_errors='replace' accepts it", "--unicode-errors replace accepts it"),
    ("keys=True needs a table with keys", "--keys needs a table with keys"),
    ("a row of 3 values", "a row of 3 values"),
])
def test_the_cli_shows_flags(message, shown):
    assert flag_terms(message) == shown

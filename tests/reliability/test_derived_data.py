"""Derived data that the checksums pass but nobody can use: the subword n-grams of a table
imported from a fastText ``.bin`` (embstore/store/ngrams.py, docs/FORMAT.md §5).

A deleted or misshapen ``ngrams`` array, ``subwords.minn = -1``, ``subwords.hash = "md5"``,
a non-integer ``bucket``, NaN or infinite n-gram rows (written with valid checksums):
``verify`` exits 1 naming the array or the attribute; plain lookups still work; subword
vectors raise a ``CorruptStoreError`` naming it (CLI: one ``Error:`` line), never a
traceback or NaN vectors.  The clean table's subword vectors equal an independent
pure-Python port of fastText's ``computeSubwords`` and hash.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from relhelpers import assert_clean_error, invoke, table_dirs

import embstore
from embstore.errors import CorruptStoreError

WORDS = ["the", "of", "été", "naïve", "日本語", "a", "königsberg", "привет"]
DIM, BUCKET, MINN, MAXN = 6, 97, 2, 5
RNG = np.random.default_rng(11)
VOCAB = RNG.standard_normal((len(WORDS), DIM)).astype(np.float32)
NGRAMS = RNG.standard_normal((BUCKET, DIM)).astype(np.float32)
UNKNOWN = ["unknownword", "zzq", "théâtre"]


def write_model(path: Path) -> None:
    """A fastText .bin (version 12) as fastText writes it: args, dictionary, input matrix
    (words then n-grams), output matrix."""
    n = len(WORDS)
    with open(path, "wb") as f:
        f.write(struct.pack("<2i", 793712314, 12))
        f.write(struct.pack("<12id", DIM, 5, 5, 1, 5, 1, 2, 2, BUCKET, MINN, MAXN, 100, 1e-4))
        f.write(struct.pack("<3iq", n, n, 0, 1000) + struct.pack("<q", -1))
        for i, w in enumerate(WORDS):
            f.write(w.encode() + b"\0" + struct.pack("<qb", 100 - i, 0))
        f.write(b"\x00" + struct.pack("<2q", n + BUCKET, DIM))
        f.write(VOCAB.tobytes() + NGRAMS.tobytes())
        f.write(b"\x00" + struct.pack("<2q", n, DIM) + bytes(4 * n * DIM))


def ref_vector(word: str) -> np.ndarray:
    """fastText's dictionary.cc, byte by byte: the mean of the word's n-gram rows."""
    b = ("<" + word + ">").encode()
    ids = []
    for i in range(len(b)):
        if (b[i] & 0xC0) == 0x80:
            continue
        j, n = i, 1
        while j < len(b) and n <= MAXN:
            j += 1
            while j < len(b) and (b[j] & 0xC0) == 0x80:
                j += 1
            if n >= MINN and not (n == 1 and (i == 0 or j == len(b))):
                h = 2166136261
                for x in b[i:j]:
                    h = ((h ^ ((x - 256 if x >= 128 else x) & 0xFFFFFFFF)) * 16777619) \
                        & 0xFFFFFFFF
                ids.append(h % BUCKET)
            n += 1
    acc = np.zeros(DIM, np.float32)
    for i in ids:
        acc += NGRAMS[i]
    return acc / np.float32(len(ids))


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("derived")
    write_model(d / "model.bin")
    # the damage below is done to the live files and to the newest version's (its snapshot
    # directory, which readers read: docs/FORMAT.md §6a), as the two share their files
    res = invoke(["import", d / "model.bin", d / "good.emb", "--quiet", "--shard-rows", "4096"])
    assert res.exit_code == 0, res.output
    return d / "good.emb"


def edit_attrs(path: Path, **fields) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["embstore"]["subwords"].update(fields)
    (path / "zarr.json").write_text(json.dumps(doc))


def misshape(path: Path) -> None:
    doc = json.loads((path / "ngrams" / "zarr.json").read_text())
    doc["shape"] = [BUCKET - 40, DIM]
    (path / "ngrams" / "zarr.json").write_text(json.dumps(doc))


def rewrite_rows(value: float, rows: list[int]):
    def edit(path: Path) -> None:
        import zarr
        arr = zarr.open_array(str(path / "ngrams"), mode="r+")  # valid checksums
        x = arr[:]
        x[rows] = value
        arr[:] = x
    return edit


CASES = {
    "deleted": (lambda p: shutil.rmtree(p / "ngrams"), "ngrams: missing \\(the table's "
                "attribute embstore.subwords names the array 'ngrams'"),
    "misshapen": (misshape, r"ngrams/zarr.json: expected float16, float32, float64 of shape "
                            r"\[97, 6\] \(bucket x dim\), got float32 \[57, 6\]"),
    "minn-negative": (lambda p: edit_attrs(p, minn=-1), "attribute embstore.subwords.minn: "
                                                        "expected an integer >= 0, got -1"),
    "maxn-float": (lambda p: edit_attrs(p, maxn=2.5), "attribute embstore.subwords.maxn: "
                                                      "expected an integer >= 0, got 2.5"),
    "bucket-string": (lambda p: edit_attrs(p, bucket="97"), "embstore.subwords.bucket: "
                                                            "expected an integer >= 0, got '97'"),
    "hash-md5": (lambda p: edit_attrs(p, hash="md5"), "attribute embstore.subwords.hash: "
                 "expected 'fasttext-fnv1a32-signed-bytes' .*, got 'md5'"),
    "nan-rows": (rewrite_rows(np.nan, [3, 40, 41]), r"ngrams: n-gram row (3|40|41) holds NaN "
                                                    "or infinite values"),
    "inf-rows": (rewrite_rows(np.inf, list(range(BUCKET))), r"ngrams: n-gram row \d+ holds NaN "
                                                            "or infinite values"),
}


def test_the_clean_table_verifies_and_composes_as_fasttext(imported):
    res = invoke(["verify", imported])
    assert res.exit_code == 0 and "ngrams" in res.output, res.output
    with embstore.open(imported) as t:
        got = t.lookup_keys(UNKNOWN, oov="subword")
    np.testing.assert_allclose(got, np.stack([ref_vector(w) for w in UNKNOWN]), rtol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES), ids=sorted(CASES))
def test_unusable_ngrams_are_reported_and_refused(imported, tmp_path, case):
    damage, pattern = CASES[case]
    path = tmp_path / "t.emb"
    shutil.copytree(imported, path)
    for root in table_dirs(path):
        damage(root)
    res = invoke(["verify", path])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    assert re.search(pattern, res.output), res.output
    if case == "deleted":  # a file its version's manifest names is missing: no open at all
        with pytest.raises(CorruptStoreError, match=r"ngrams/c/0/0: missing"):
            embstore.open(path)
        return
    with embstore.open(path) as t:
        np.testing.assert_array_equal(t.ids_of(WORDS), np.arange(len(WORDS)))  # words: fine
        assert np.isfinite(t[np.arange(len(WORDS))]).all()
        # (a shard rewritten by zarr-python carries no shard tag: its version's pin of the
        # tag finds the rewrite first, before the values are read)
        rewritten = "no shard tag before its index, though the version's manifest pins one"
        with pytest.raises(CorruptStoreError, match=pattern if case not in (
                "nan-rows", "inf-rows") else f"{pattern}|{rewritten}"):
            t.lookup_keys(UNKNOWN, oov="subword")
    assert_clean_error(invoke(["similar", path, "unknownword"]))


def test_rows_from_a_hostile_key_index_are_bounds_checked(tmp_path):
    """The key index is derived data too: a row out of range in ``key_order`` (written with
    valid checksums) is damage, never a row read (keys/hashing.py ``probe``'s row limit)."""
    import zarr
    path = tmp_path / "k.emb"
    rows = np.arange(400, dtype=np.float32).reshape(100, 4)
    embstore.save(path, rows, keys=[f"k{i}" for i in range(100)], format_version=1).close()
    order = zarr.open_array(str(path / "key_order"), mode="r+")
    order[:] = np.full(100, 10**12, np.int64)
    # (a hostile writer re-pins the chunk in the array's zarr.json too, keys/mapped.py)
    meta = json.loads((path / "key_order" / "zarr.json").read_text())
    meta["attributes"]["embstore_chunk_crc32c"] = [
        int.from_bytes((path / "key_order" / "c" / "0").read_bytes()[-4:], "little")]
    (path / "key_order" / "zarr.json").write_text(json.dumps(meta))
    with embstore.open(path) as t:
        with pytest.raises(CorruptStoreError, match="row 1000000000000 out of range 0..99 in "
                                                    "key_order"):
            t.lookup_keys(["k5"])
    assert invoke(["verify", path]).exit_code == 1

"""Damaged and hostile stores: broken ``zarr.json`` files, truncated shards, flipped bytes.

The table under attack has distinctive rows (row ``i`` is ``i * 10 + [0, 1, 2, 3]``) and
keys, so any row that comes back can be checked exactly: a lookup either raises a clean
:class:`embstore.EmbstoreError` (``CorruptStoreError`` for damaged bytes) or returns the
true row, never garbage; ``embstore verify`` exits 1 and names the damaged shard file; no
command shows a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from relhelpers import FUZZ, TRIED, assert_clean_error, invoke, time_limit

import embstore
from embstore.errors import CorruptStoreError, EmbstoreError

ROWS, DIM, CHUNK, SHARD = 40, 4, 4, 16
ARR = (np.arange(ROWS, dtype=np.float32)[:, None] * 10 + np.arange(DIM, dtype=np.float32))
KEYS = [f"k{i}" for i in range(ROWS)]
LAYOUTS = {"raw": {}, "zstd": {"compression": "zstd"}}


@pytest.fixture(scope="module", params=sorted(LAYOUTS), ids=sorted(LAYOUTS))
def store(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("good") / "t"
    # format 1 (tables written before format 2, unversioned until their first commit):
    # its live files are what readers read, and they must stay safe to open
    embstore.save(path, ARR, keys=KEYS, chunk_rows=CHUNK, shard_rows=SHARD, format_version=1,
                  **LAYOUTS[request.param]).close()
    return path


def copy_of(store: Path, scratch) -> Path:
    d = scratch.new() / "t"
    shutil.copytree(store, d)
    return d


def read_everything(path: Path, *, cache_bytes="1MiB") -> str:
    """Open and read every row (and a few keys) under a time limit.

    Returns ``"ok"`` when all came back exact, or the clean error's class name; anything
    else (a wrong row, a foreign exception) fails the test.
    """
    with time_limit(20, f"reading {path}"):
        try:
            with embstore.open(path, cache_bytes=cache_bytes) as t:
                n = len(t)
                ids = np.arange(min(n, ROWS))
                rows = t[ids]
                np.testing.assert_array_equal(rows, ARR[ids], err_msg="garbage rows")
                if n > ROWS:  # rows beyond the stored ones: the format says zeros
                    np.testing.assert_array_equal(t[[ROWS, n - 1]], 0)
                if t.keys is not None:
                    assert len(t.keys) == n, "keys and rows disagree"
                    got = t.ids_of(["k0", "k17", "k39"][: 3 if n >= ROWS else 1])
                    np.testing.assert_array_equal(got, [0, 17, 39][: got.size])
                    assert list(t.keys[ids]) == [KEYS[i] for i in ids]
                np.testing.assert_array_equal(t.to_numpy()[:ROWS], ARR[:n])
                return "ok"
        except EmbstoreError as exc:
            assert str(exc), "an error without a message"
            return type(exc).__name__


def assert_cli_clean(path: Path, *, verify_fails: bool, names: str | None = None) -> None:
    res = invoke(["verify", path])
    if verify_fails:
        msg = assert_clean_error(res, context=f"verify {path}") if res.exit_code == 1 and \
            res.output.startswith("Error:") else res.output
        assert res.exit_code == 1, res.output
        assert "Traceback" not in res.output
        if names is not None:
            assert names in msg or names in res.output, res.output
    for args in (["info", path], ["info", path, "--json"], ["similar", path, "k1", "-k", "2"],
                 ["export", path, path.parent / "out.npy"]):
        res = invoke(args)
        if res.exit_code == 2 and args[0] == "similar":  # a table without keys: usage error
            assert "has no keys" in res.output and "Traceback" not in res.output
        elif res.exit_code != 0:
            assert_clean_error(res, context=" ".join(map(str, args)))
            assert not (path.parent / "out.npy").exists()


# -- hostile metadata -----------------------------------------------------------------------
def _set(*keys, value):
    def edit(doc):
        obj = doc
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value
    return edit


def _del(*keys):
    def edit(doc):
        obj = doc
        for k in keys[:-1]:
            obj = obj[k]
        del obj[keys[-1]]
    return edit


_S = ("codecs", 0, "configuration")
VECTOR_EDITS = {  # name -> (edit of vectors/zarr.json, must refuse)
    "rows-negative": (_set("shape", 0, value=-5), True),
    "rows-huge": (_set("shape", 0, value=10**15), True),
    "rows-2**63": (_set("shape", 0, value=2**63 - 1), True),
    "rows-2**64": (_set("shape", 0, value=2**64 + 1), True),
    "rows-float": (_set("shape", 0, value=40.5), True),
    "rows-string": (_set("shape", 0, value="40"), True),
    "rows-bool": (_set("shape", 0, value=True), True),
    # fewer rows than keys: what a reader sees while an append is in flight (keys are
    # written first): the first 20 rows and keys, exact
    "rows-fewer": (_set("shape", 0, value=20), False),
    "dim-zero": (_set("shape", 1, value=0), True),
    "dim-huge": (_set("shape", 1, value=10**12), True),
    "dim-other": (_set("shape", 1, value=3), True),
    "shape-3d": (_set("shape", value=[40, 4, 1]), True),
    "shape-1d": (_set("shape", value=[40]), True),
    "shape-null": (_set("shape", value=None), True),
    "dtype-int32": (_set("data_type", value="int32"), True),
    "dtype-float64": (_set("data_type", value="float64"), True),
    "dtype-bogus": (_set("data_type", value="float9"), True),
    "dtype-object": (_set("data_type", value={"name": "x"}), True),
    "dtype-pickle": (_set("data_type", value="object"), True),
    "codec-unknown": (_set(*_S, "codecs", 1, "name", value="evil"), True),
    "codec-top-unknown": (_set("codecs", 0, "name", value="evil"), True),
    "codecs-empty": (_set(*_S, "codecs", value=[]), True),
    "index-codec-unknown": (_set(*_S, "index_codecs", 1, "name", value="evil"), True),
    "index-at-start": (_set(*_S, "index_location", value="start"), True),
    "inner-zero": (_set(*_S, "chunk_shape", 0, value=0), True),
    "inner-negative": (_set(*_S, "chunk_shape", 0, value=-4), True),
    "inner-huge": (_set(*_S, "chunk_shape", 0, value=2**40), True),
    "inner-other": (_set(*_S, "chunk_shape", 0, value=8), True),
    "shard-zero": (_set("chunk_grid", "configuration", "chunk_shape", 0, value=0), True),
    "shard-negative": (_set("chunk_grid", "configuration", "chunk_shape", 0, value=-16), True),
    "shard-huge": (_set("chunk_grid", "configuration", "chunk_shape", 0, value=2**40), True),
    "shard-other": (_set("chunk_grid", "configuration", "chunk_shape", 0, value=32), True),
    "grid-irregular": (_set("chunk_grid", "name", value="rectilinear"), True),
    "separator-traversal": (_set("chunk_key_encoding", "configuration", "separator",
                                 value="/../../../"), True),
    "separator-absolute": (_set("chunk_key_encoding", "configuration", "separator",
                                value="/etc/"), True),
    "key-encoding-v2": (_set("chunk_key_encoding", "name", value="v2"), True),
    "fill-string": (_set("fill_value", value="abc"), False),
    "fill-nan": (_set("fill_value", value="NaN"), False),
    "storage-transformer": (_set("storage_transformers", value=[{"name": "evil"}]), True),
    "node-group": (_set("node_type", value="group"), True),
    "zarr-format-2": (_set("zarr_format", value=2), True),
    "no-codecs": (_del("codecs"), True),
    "no-shape": (_del("shape"), True),
    "no-data-type": (_del("data_type"), True),
}

GROUP_EDITS = {
    "format-3": (_set("attributes", "embstore", "format", value=3), True),  # 1 and 2 are read
    "format-string": (_set("attributes", "embstore", "format", value="1"), True),
    "attributes-list": (_set("attributes", value=[1]), True),
    "embstore-string": (_set("attributes", "embstore", value="x"), True),
    "node-array": (_set("node_type", value="array"), True),
    "has-keys-false": (_set("attributes", "embstore", "has_keys", value=False), False),
    "dim-lies": (_set("attributes", "embstore", "dim", value=7), False),
}

FILE_DAMAGE = {
    "vectors-json-missing": lambda d: os.remove(d / "vectors" / "zarr.json"),
    "vectors-missing": lambda d: shutil.rmtree(d / "vectors"),
    "keys-missing": lambda d: shutil.rmtree(d / "keys"),
    "vectors-json-garbage": lambda d: (d / "vectors" / "zarr.json").write_bytes(b"\x00{ga"),
    "vectors-json-list": lambda d: (d / "vectors" / "zarr.json").write_text("[1, 2]"),
    "vectors-json-empty": lambda d: (d / "vectors" / "zarr.json").write_bytes(b""),
    "vectors-json-utf16": lambda d: (d / "vectors" / "zarr.json").write_bytes(
        (d / "vectors" / "zarr.json").read_text().encode("utf-16")),
    "vectors-json-deep": lambda d: (d / "vectors" / "zarr.json").write_text("[" * 100000),
    "group-json-garbage": lambda d: (d / "zarr.json").write_bytes(b"{{"),
    "group-json-missing": lambda d: os.remove(d / "zarr.json"),
    "vectors-json-is-dir": lambda d: (os.remove(d / "vectors" / "zarr.json"),
                                      os.mkdir(d / "vectors" / "zarr.json")),
    "shard-is-dir": lambda d: (os.remove(d / "vectors" / "c" / "1" / "0"),
                               os.mkdir(d / "vectors" / "c" / "1" / "0")),
    "shard-symlink-outside": lambda d: (os.remove(d / "vectors" / "c" / "1" / "0"),
                                        os.symlink("/etc/passwd", d / "vectors" / "c" / "1" / "0")),
}


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("name", sorted(VECTOR_EDITS), ids=sorted(VECTOR_EDITS))
def test_hostile_vectors_metadata(store, scratch, name):
    edit, must_refuse = VECTOR_EDITS[name]
    d = copy_of(store, scratch)
    _edit_json(d / "vectors" / "zarr.json", edit)
    TRIED["store: hostile vectors/zarr.json"] += 1
    outcome = read_everything(d)
    if must_refuse:
        assert outcome != "ok", f"{name}: opened and read a hostile store"
    assert_cli_clean(d, verify_fails=must_refuse)


@pytest.mark.parametrize("name", sorted(GROUP_EDITS), ids=sorted(GROUP_EDITS))
def test_hostile_group_metadata(store, scratch, name):
    edit, must_refuse = GROUP_EDITS[name]
    d = copy_of(store, scratch)
    _edit_json(d / "zarr.json", edit)
    TRIED["store: hostile group zarr.json"] += 1
    outcome = read_everything(d)
    if must_refuse:
        assert outcome != "ok", f"{name}: opened and read a hostile store"
    assert_cli_clean(d, verify_fails=must_refuse)


@pytest.mark.parametrize("name", sorted(FILE_DAMAGE), ids=sorted(FILE_DAMAGE))
def test_missing_or_broken_files(store, scratch, name):
    d = copy_of(store, scratch)
    FILE_DAMAGE[name](d)
    TRIED["store: missing or broken files"] += 1
    assert read_everything(d) != "ok", name
    assert_cli_clean(d, verify_fails=True)


# -- damaged shard bytes ----------------------------------------------------------------------
def shard_file(d: Path, k: int) -> Path:
    return d / "vectors" / "c" / str(k) / "0"


def _check_rows(d: Path, *, bad_shard: int, cache_bytes) -> None:
    """Rows outside ``bad_shard`` exact; rows inside exact or CorruptStoreError."""
    with embstore.open(d, cache_bytes=cache_bytes) as t:
        for k in range(-(-ROWS // SHARD)):
            for i in range(k * SHARD, min(ROWS, (k + 1) * SHARD), CHUNK):
                ids = np.arange(i, min(ROWS, i + CHUNK))
                if k != bad_shard:
                    np.testing.assert_array_equal(t[ids], ARR[ids])
                    continue
                try:
                    got = t[ids]
                except CorruptStoreError as exc:
                    assert str(d) in str(exc) or "shard" in str(exc)
                    continue
                np.testing.assert_array_equal(got, ARR[ids], err_msg="garbage rows")
        with pytest.raises(CorruptStoreError):
            t.to_numpy()


def _verify_names(d: Path, k: int) -> None:
    report = embstore.verify(d)
    assert not report.ok
    shard = os.path.join("vectors", "c", str(k), "0")
    assert any(shard in dmg.file or shard in dmg.message for dmg in report.damaged), report
    res = invoke(["verify", d])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and shard in res.output, res.output


@FUZZ
@given(data=st.data())
@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_flipped_bytes_anywhere_in_a_shard(store, scratch, data):
    k = data.draw(st.integers(0, 2), label="shard")
    d = copy_of(store, scratch)
    try:
        f = shard_file(d, k)
        raw = bytearray(f.read_bytes())
        pos = data.draw(st.integers(0, len(raw) - 1), label="byte")
        raw[pos] ^= data.draw(st.integers(1, 255), label="xor")
        f.write_bytes(bytes(raw))
        TRIED["store: flipped shard byte"] += 1
        _check_rows(d, bad_shard=k, cache_bytes=data.draw(st.sampled_from([0, "1MiB"])))
        _verify_names(d, k)
    finally:
        scratch.drop(d.parent)


@FUZZ
@given(data=st.data())
@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_truncated_or_extended_shard(store, scratch, data):
    k = data.draw(st.integers(0, 2), label="shard")
    d = copy_of(store, scratch)
    try:
        f = shard_file(d, k)
        raw = f.read_bytes()
        how = data.draw(st.sampled_from(["truncate", "append", "empty", "prepend"]))
        if how == "truncate":
            raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
        elif how == "append":
            raw += data.draw(st.binary(min_size=1, max_size=64))
        elif how == "prepend":
            raw = data.draw(st.binary(min_size=1, max_size=64)) + raw
        else:
            raw = b""
        f.write_bytes(raw)
        TRIED["store: truncated/extended shard"] += 1
        _check_rows(d, bad_shard=k, cache_bytes=data.draw(st.sampled_from([0, "1MiB"])))
        _verify_names(d, k)
    finally:
        scratch.drop(d.parent)


def test_shard_index_damage_is_named(store, scratch):
    """A flipped byte inside the index itself (the last 16 * n + 4 bytes)."""
    n_inner = SHARD // CHUNK
    for k in range(3):
        for back in (1, 4, 5, 16 * n_inner + 4):
            d = copy_of(store, scratch)
            f = shard_file(d, k)
            raw = bytearray(f.read_bytes())
            raw[-back] ^= 0x40
            f.write_bytes(bytes(raw))
            TRIED["store: flipped shard-index byte"] += 1
            with embstore.open(d) as t, pytest.raises(CorruptStoreError, match="index"):
                t[k * SHARD]
            _verify_names(d, k)
            scratch.drop(d.parent)


def test_a_shard_index_that_points_elsewhere_with_a_valid_crc(store, scratch):
    """A re-checksummed index that points at another chunk's bytes or outside the file."""
    from embstore.fs.checksum import crc32c

    n_inner = SHARD // CHUNK
    for case in ("swap", "outside", "huge", "overlap-index"):
        d = copy_of(store, scratch)
        f = shard_file(d, 0)
        raw = bytearray(f.read_bytes())
        body = np.frombuffer(bytes(raw[-(16 * n_inner + 4):-4]), "<u8").reshape(n_inner, 2).copy()
        if case == "swap":
            body[[0, 1]] = body[[1, 0]]
        elif case == "outside":
            body[2, 0] = len(raw)
        elif case == "huge":
            body[1] = (2**63, 2**63)
        else:
            body[3, 0] = len(raw) - 16 * n_inner - 4 - 8
        new = body.astype("<u8").tobytes()
        raw[-(16 * n_inner + 4):] = new + crc32c(new).to_bytes(4, "little")
        f.write_bytes(bytes(raw))
        TRIED["store: re-checksummed hostile index"] += 1
        with embstore.open(d) as t:
            for i in range(0, SHARD, CHUNK):
                ids = np.arange(i, i + CHUNK)
                try:
                    got = t[ids]
                except CorruptStoreError:
                    continue
                # a swapped index is a valid (if odd) shard: chunks may be anywhere
                want = ARR[ids] if case != "swap" else ARR[ids ^ (CHUNK if i < 2 * CHUNK else 0)]
                np.testing.assert_array_equal(got, want, err_msg=case)
        if case != "swap":
            _verify_names(d, 0)
        scratch.drop(d.parent)


# -- damaged key index ---------------------------------------------------------------------
def _key_files(d: Path) -> list[Path]:
    return sorted(p for p in (d).rglob("*") if p.is_file() and p.parts[-1] != "zarr.json"
                  and "vectors" not in p.relative_to(d).parts)


@FUZZ
@given(data=st.data())
def test_damaged_key_index(store, scratch, data):
    d = copy_of(store, scratch)
    try:
        files = _key_files(d)
        f = data.draw(st.sampled_from(files), label="file")
        raw = bytearray(f.read_bytes())
        how = data.draw(st.sampled_from(["flip", "truncate"]))
        if how == "flip":
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
        else:
            raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
        f.write_bytes(bytes(raw))
        TRIED["store: damaged key index"] += 1
        with time_limit(20, "key lookups"):
            try:
                with embstore.open(d) as t:
                    np.testing.assert_array_equal(t.ids_of(KEYS), np.arange(ROWS))
                    assert list(t.keys[:ROWS]) == KEYS
                    np.testing.assert_array_equal(t.lookup_keys(["k5", "k33"]), ARR[[5, 33]])
            except EmbstoreError:  # CorruptStoreError, or a key the damage hides
                pass
        res = invoke(["verify", d])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        assert f.relative_to(d).parts[0] in res.output, res.output
    finally:
        scratch.drop(d.parent)

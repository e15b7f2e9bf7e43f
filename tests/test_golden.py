"""The golden format-v1 stores in tests/data/ (written by ``tools/make_fixtures.py --golden``).

They freeze the on-disk format: each must read back exactly (through embstore and through
zarr-python, as any Zarr v3 reader), and ``embstore.save`` of the same data with the same
layout must write the same bytes: every shard and key-index file byte for byte, every
``zarr.json`` as the same JSON apart from ``created_by`` (the writer's version).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

import embstore
from embstore.dtypes import DTYPES
from embstore.fs.checksum import crc32c
from embstore.store.codecs import Layout
from embstore.store.shard.tag import MAGIC, tag_len

DATA = Path(__file__).parent / "data"
LAYOUT = {"chunk_rows": 16, "shard_rows": 64}


def golden_data() -> tuple[np.ndarray, list[str]]:
    """The same formula as tools/make_fixtures.py: multiples of 1/8, exact in float32."""
    values = np.empty((100, 8), dtype=np.float32)
    for r in range(100):  # an independent (loop) spelling of the tool's vectorised formula
        for c in range(8):
            i = r * 8 + c
            values[r, c] = ((i * 37) % 101 - 50) / 8
    keys = [f"w{r}" for r in range(100)]
    keys[3], keys[7] = "été", "naïve"
    return values, keys


def _files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def _untagged(rel: str, path: Path, root: Path) -> bytes:
    """The bytes of file ``rel`` of the table ``root`` as the golden stores (which predate
    shard tags) hold them: a checksummed shard's tag (docs/FORMAT.md §3b), which must list
    each stored chunk's crc32c and the index's, left out."""
    data = path.read_bytes()
    parts = rel.split("/")
    if not (len(parts) == 4 and parts[1] == "c" and parts[3] == "0"):
        return data
    layout = Layout.from_metadata(json.loads((root / parts[0] / "zarr.json").read_text()))
    if layout is None or not (layout.has_crc and layout.index_crc):
        return data
    n = layout.n_inner
    at, t = len(data) - 16 * n - 4, tag_len(n)
    tag, index = data[at - t: at], data[at: at + 16 * n]
    assert tag[:8] == MAGIC and int.from_bytes(tag[8:12], "little") == n, rel
    assert int.from_bytes(tag[12:16], "little") == crc32c(index), rel
    assert int.from_bytes(tag[-4:], "little") == crc32c(tag[:-4]), rel
    off, nb = np.frombuffer(index, "<u8").reshape(n, 2).T
    want = [0 if o == 2**64 - 1 else int.from_bytes(data[o + m - 4: o + m], "little")
            for o, m in zip(off.tolist(), nb.tolist())]
    assert np.frombuffer(tag[16:-4], "<u4").tolist() == want, rel
    return data[: at - t] + data[at:]


def _json_without_created_by(path: Path) -> dict:
    """A zarr.json without what differs between two saves: ``created_by``, and the table's
    random ``table_id`` (format 2; the golden stores predate ids: 32 hex digits checked)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    attrs = doc.get("attributes", {}).get("embstore", {})
    attrs.pop("created_by", None)
    tid = attrs.pop("table_id", None)
    assert tid is None or re.fullmatch("[0-9a-f]{32}", tid), tid
    # the key index arrays' chunk pins (the golden stores predate them): each the crc32c
    # its chunk file ends in
    pins = doc.get("attributes", {}).pop("embstore_chunk_crc32c", None)
    for i, crc in enumerate(pins or []):
        assert (path.parent / "c" / str(i)).read_bytes()[-4:] == crc.to_bytes(4, "little")
    return doc


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_golden_store_reads_back_exactly(compression):
    values, keys = golden_data()
    path = DATA / f"golden-v1-{compression}"
    with embstore.open(path) as t:
        assert t.shape == (100, 8) and t.dtype == np.float32
        np.testing.assert_array_equal(t.to_numpy(), values)
        np.testing.assert_array_equal(t[[99, 0, 63, 64]], values[[99, 0, 63, 64]])
        assert list(t.keys) == keys
        np.testing.assert_array_equal(t.ids_of(["naïve", "été", "w99"]), [7, 3, 99])
        info = t.info()
        assert (info["chunk_rows"], info["shard_rows"], info["compression"]) == (
            16, 64, compression)
    np.testing.assert_array_equal(zarr.open_array(path / "vectors", mode="r")[:], values)
    assert embstore.verify(path).ok


def _want_rows(name: str, values: np.ndarray, path: Path) -> np.ndarray:
    """The rows a golden store of storage dtype ``name`` holds, computed without embstore:
    the values are multiples of 1/8 below 7 (exact in float16 and bfloat16); int8 rows are
    ``code * scale + offset`` in float32 from the codes and scales zarr-python reads."""
    if name != "int8":
        return values.astype(np.float16) if name == "float16" else values.astype(name) \
            if name != "bfloat16" else values
    codes = zarr.open_array(path / "vectors", mode="r")[:]
    rs = zarr.open_array(path / "row_scale", mode="r")[:]
    want = codes.astype(np.float32) * rs[:, :1] + rs[:, 1:]
    step = rs[:, :1]
    assert (np.abs(want - values) <= step / 2 * (1 + 1e-6) + 1e-7).all()  # half a step
    return want


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_golden_store_of_each_storage_dtype(name):
    """One golden store per storage dtype (its record's ``golden``): the rows, the storage
    dtype and the keys read back, and verify passes."""
    record = DTYPES[name]
    values, keys = golden_data()
    path = DATA / record.golden
    with embstore.open(path) as t:
        assert t.storage_dtype == name and t.dtype == record.logical
        got = t.to_numpy()
        np.testing.assert_array_equal(got, _want_rows(name, values, path))
        np.testing.assert_array_equal(t[[99, 0, 63, 64]], got[[99, 0, 63, 64]])
        assert list(t.keys) == keys
    assert embstore.verify(path).ok


GOLDEN_WRITES = [("none", None)] + [("none", n) for n in sorted(DTYPES) if n != "float32"] + [
    ("zstd", None)]


@pytest.mark.parametrize("compression,dtype", GOLDEN_WRITES,
                         ids=[f"{c}-{d or 'float32'}" for c, d in GOLDEN_WRITES])
def test_save_writes_the_golden_bytes(tmp_path, compression, dtype, monkeypatch):
    import json

    import embstore.keys.writer

    values, keys = golden_data()
    golden = DATA / (DTYPES[dtype].golden if dtype else f"golden-v1-{compression}")
    fresh = tmp_path / "t"
    # new tables key their hash at random: write this one with the golden store's key
    info = json.loads((golden / "key_hash" / "zarr.json").read_text())["attributes"]
    hex_key = info["embstore_key_index"]["key"]
    monkeypatch.setattr(embstore.keys.writer, "new_hash_key",
                        lambda: (int(hex_key[:16], 16), int(hex_key[16:], 16)))
    embstore.save(fresh, values, keys=keys, compression=compression, dtype=dtype,
                  format_version=1, **LAYOUT).close()  # (the legacy format, as it was)
    want, got = _files(golden), _files(fresh)
    assert sorted(got) == sorted(want)
    assert any(name.startswith("vectors/c/") for name in want)  # shard files are compared
    assert any(name.startswith("key") and "/c/" in name for name in want)  # and the key index
    for name, path in want.items():
        if path.name == "zarr.json":
            assert _json_without_created_by(got[name]) == _json_without_created_by(path), name
        else:
            assert _untagged(name, got[name], fresh) == path.read_bytes(), name


def test_every_storage_dtype_is_offered_and_documented():
    """The CLI's ``--dtype`` choices and docs/FORMAT.md derive from the records: a storage
    dtype added to ``DTYPES`` shows up in both (or this fails)."""
    from click.testing import CliRunner

    from embstore.cli import cli

    help_text = CliRunner().invoke(cli, ["import", "--help"]).output
    spec = (Path(__file__).parents[1] / "docs" / "FORMAT.md").read_text(encoding="utf-8")
    for name in DTYPES:
        assert name in help_text, name
        assert f'"{name}"' in spec, name
        assert (DATA / DTYPES[name].golden / "zarr.json").is_file(), name


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_golden_format_2_store_reads_back_and_is_rewritten_byte_for_byte(tmp_path, name,
                                                                         monkeypatch):
    """The format-2 golden stores (``golden-v2-<dtype>``, ``tools/make_fixtures.py
    --golden``) freeze format 2: rows, keys and verify as the format-1 ones, and ``save``
    with ``format_version=2`` writes the same bytes."""
    import embstore.keys.writer

    record = DTYPES[name]
    values, keys = golden_data()
    golden = DATA / f"golden-v2-{name}"
    with embstore.open(golden) as t:
        assert t.info()["format"] == 2 and t.storage_dtype == name
        np.testing.assert_array_equal(t.to_numpy(), _want_rows(name, values, golden))
        assert list(t.keys) == keys and t.dtype == record.logical
    assert embstore.verify(golden).ok
    info = json.loads((golden / "key_hash" / "zarr.json").read_text())["attributes"]
    hex_key = info["embstore_key_index"]["key"]
    monkeypatch.setattr(embstore.keys.writer, "new_hash_key",
                        lambda: (int(hex_key[:16], 16), int(hex_key[16:], 16)))
    fresh = tmp_path / "t"
    embstore.save(fresh, values, keys=keys, dtype=name, format_version=2).close()
    want, got = _files(golden), _files(fresh)
    # the private area: version 1 (docs/FORMAT.md §6a), hard links to the live files
    private = {rel: p for rel, p in got.items() if rel.startswith("vectors/.embstore/")}
    snap = "vectors/.embstore/versions/1/"
    assert {rel[len(snap):] for rel in private} == set(want) | {"manifest.json"}
    for rel, p in private.items():
        if not rel.endswith("manifest.json"):
            assert p.stat().st_ino == got[rel[len(snap):]].stat().st_ino, rel
    got = {rel: p for rel, p in got.items() if rel not in private}
    with embstore.open(golden) as t, embstore.open(fresh) as f:
        assert (t.version, f.version) == (0, 1)  # (the golden stores predate versions)
    assert sorted(got) == sorted(want)
    assert "page_crc/c/0/0" in want and "vectors/c/0/0" in want
    for rel, path in want.items():
        if path.name == "zarr.json":
            assert _json_without_created_by(got[rel]) == _json_without_created_by(path), rel
        else:
            assert _untagged(rel, got[rel], fresh) == path.read_bytes(), rel


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_early_format_2_store_with_format_1_norms_keeps_reading_and_changing(tmp_path, name):
    """``golden-v2-early-<dtype>``: the first format-2 stores, whose ``norms`` (and int8's
    ``row_scale``) were format-1 sharded arrays.  They read back exactly, their norms serve
    searches, they verify, and a copy takes appends and writes that read back."""
    import shutil

    values, keys = golden_data()
    golden = DATA / f"golden-v2-early-{name}"
    assert not (golden / "norms_page_crc").exists()  # (what makes them early)
    want = _want_rows(name, values, golden)
    with embstore.open(golden) as t:
        np.testing.assert_array_equal(t.to_numpy(), want)
        assert list(t.keys) == keys
        assert type(t._source.norms).__name__ == "ShardSource"  # their own norms, read
        scores = want.astype(np.float64) @ want[5].astype(np.float64) / (
            np.linalg.norm(want.astype(np.float64), axis=1) * np.linalg.norm(want[5]))
        ids, _ = embstore.Embedding(t).most_similar(want[5], k=3)
        assert list(ids) == list(np.argsort(-scores, kind="stable")[:3])
    assert embstore.verify(golden).ok
    copy = tmp_path / "t"
    shutil.copytree(golden, copy)
    extra = np.full((3, 8), 0.5, dtype=np.float32)
    with embstore.open(copy, "r+") as t:
        t.append(extra, keys=["x", "y", "z"])
        t.write([0], extra[:1])
    with embstore.open(copy) as t:
        rows = t.to_numpy()
        assert rows.shape == (103, 8) and t.lookup_keys(["y"])[0].tolist() == rows[101].tolist()
        np.testing.assert_array_equal(rows[1:100], want[1:])
    assert embstore.verify(copy).ok


#: format 2 in the sharded layouts (tools/make_fixtures.py GOLDEN_V2_SHARDED): name -> layout
V2_SHARDED = {"sharded-zstd": {"compression": "zstd", **LAYOUT},
              "sharded-none": dict(LAYOUT),
              "sharded-int8-blosc": {"compression": "blosc", "dtype": "int8", **LAYOUT}}


@pytest.mark.parametrize("name", sorted(V2_SHARDED))
def test_golden_format_2_sharded_store_reads_back_and_is_rewritten_byte_for_byte(
        tmp_path, name, monkeypatch):
    """``golden-v2-sharded-*`` freeze format 2's sharded layouts (a codec and a crc32c per
    chunk): rows (zarr-python's codes decoded independently for int8), keys and verify;
    ``save`` with the same layout writes the same bytes, its version 1 hard links to them."""
    import embstore.keys.writer

    layout = V2_SHARDED[name]
    values, keys = golden_data()
    golden = DATA / f"golden-v2-{name}"
    want_rows = _want_rows(layout.get("dtype", "float32"), values, golden)
    with embstore.open(golden) as t:
        info = t.info()
        assert info["format"] == 2 and t.version == 0  # (frozen without its private area)
        assert (info["chunk_rows"], info["shard_rows"]) == (16, 64)
        assert info["compression"] == layout.get("compression", "none")
        np.testing.assert_array_equal(t.to_numpy(), want_rows)
        assert list(t.keys) == keys
    assert embstore.verify(golden).ok
    hex_key = json.loads((golden / "key_hash" / "zarr.json").read_text())[
        "attributes"]["embstore_key_index"]["key"]
    monkeypatch.setattr(embstore.keys.writer, "new_hash_key",
                        lambda: (int(hex_key[:16], 16), int(hex_key[16:], 16)))
    fresh = tmp_path / "t"
    embstore.save(fresh, values, keys=keys, **layout).close()
    want, got = _files(golden), _files(fresh)
    snap = "vectors/.embstore/versions/1/"
    private = {rel[len(snap):]: p for rel, p in got.items() if rel.startswith(snap)}
    assert set(private) == set(want) | {"manifest.json"}
    assert all(private[rel].stat().st_ino == got[rel].stat().st_ino for rel in want)
    assert any(rel.startswith("vectors/c/") for rel in want)
    for rel, path in want.items():
        if path.name == "zarr.json":
            assert _json_without_created_by(got[rel]) == _json_without_created_by(path), rel
        else:
            assert _untagged(rel, got[rel], fresh) == path.read_bytes(), rel

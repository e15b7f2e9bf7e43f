"""A damaged or foreign approximate index (embstore/store/annfiles.py, docs/FORMAT.md §10) is
reported, never trusted: flipped bits, another table's ``index.faiss``, an edited row id,
truncated files, a flipped header byte, a ``meta.json`` with the wrong dim or garbage.

Each case runs on an index as this embstore builds it (checksums in ``meta.json``) and,
where the damage is one the layout shows, on one as embstore built it before the checksums
(*legacy*: no ``meta_crc32c``/``checksums``, no ``lists.crc32c``), which still opens and
searches.  ``verify`` exits 1 naming the file; a search raises ``CorruptStoreError`` (or, on
a legacy index whose bytes cannot be checked, returns cosines no larger than 1); a
truncated ``lists.ivfdata`` never kills the process with SIGBUS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from relhelpers import REPO, assert_clean_error, invoke

import embstore
from embstore.errors import CorruptStoreError, EmbstoreError

faiss = pytest.importorskip("faiss")

ROWS, DIM, NLIST = 4000, 16, 40
ANN = Path("vectors") / ".embstore" / "ann"


def _rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((25, DIM)).astype(np.float32)
    return (centres[rng.integers(0, 25, ROWS)] + 0.3 * rng.standard_normal((ROWS, DIM))
            ).astype(np.float32)


A = _rows(0)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ann-integrity")
    out = {}
    for name, seed in (("t", 0), ("other", 5)):
        path = base / name
        embstore.save(path, _rows(seed), keys=[f"w{i}" for i in range(ROWS)]).close()
        embstore.build_index(path, nlist=NLIST)
        out[name] = path
    legacy = base / "legacy"
    shutil.copytree(out["t"], legacy)
    meta = json.loads((legacy / ANN / "meta.json").read_text())
    for field in ("checksums", "meta_crc32c"):  # as embstore wrote it before the checksums
        meta.pop(field, None)
    (legacy / ANN / "meta.json").write_text(json.dumps(meta, indent=2))
    (legacy / ANN / "lists.crc32c").unlink(missing_ok=True)
    out["legacy"] = legacy
    return out


@pytest.fixture(params=["checksums", "legacy"])
def kind(request) -> str:
    return request.param


def copy(built, which: str, tmp_path) -> Path:
    dest = tmp_path / which
    shutil.copytree(built["t" if which == "checksums" else which], dest)
    return dest


def true_cosines(ids: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Independent reference: the cosine of each query with each returned row (NumPy)."""
    rows = A[ids]
    return (rows @ q[:, :, None])[..., 0] / np.linalg.norm(rows, axis=-1) / np.linalg.norm(
        q, axis=-1)[:, None]


def search(path: Path, q: np.ndarray = A[::10]):
    with embstore.open(path) as t, warnings.catch_warnings():
        warnings.simplefilter("error")  # a stale index would search exactly: not this test
        return embstore.Embedding(t).most_similar(q, k=5, approx=True)


def assert_verify_names(path: Path, file: str, pattern: str) -> str:
    res = invoke(["verify", path])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    line = next((ln for ln in res.output.splitlines() if file in ln and "approximate" in ln),
                None)
    assert line is not None, res.output
    assert re.search(pattern, line), line
    return line


def header_of(path: Path):
    """``(sizes, offsets)`` of the lists, read from ``index.faiss`` as FORMAT.md §10 lays it
    out (independently of embstore's parser)."""
    raw = (path / ANN / "index.faiss").read_bytes()
    at = raw.index(b"ilod")
    nlist, code = struct.unpack_from("<QQ", raw, at + 4)
    table = np.frombuffer(raw, "<u8", 3 * nlist, at + 28).reshape(nlist, 3)
    return table[:, 0].astype(int), table[:, 2].astype(int), code


# -- clean indexes ---------------------------------------------------------------------------
def test_a_clean_index_verifies_and_searches_exactly_scored(built):
    res = invoke(["verify", built["t"]])
    assert res.exit_code == 0 and "approximate index: 4000 rows, cos, up to date" in res.output
    assert "unverified" not in res.output
    ids, scores = search(built["t"])
    np.testing.assert_allclose(scores, true_cosines(ids, A[::10]), atol=1e-5)
    np.testing.assert_array_equal(ids[:, 0], np.arange(0, ROWS, 10))  # each row finds itself


def test_a_legacy_index_opens_searches_and_is_not_verified(built):
    res = invoke(["verify", built["legacy"]])
    assert res.exit_code == 1, res.output  # what verify cannot check is not OK
    assert "not verified: built without checksums" in res.output
    ids, scores = search(built["legacy"])
    np.testing.assert_allclose(scores, true_cosines(ids, A[::10]), atol=1e-5)


def test_meta_json_records_the_checksums(built):
    meta = json.loads((built["t"] / ANN / "meta.json").read_text())
    d = built["t"] / ANN
    from google_crc32c import value as crc32c  # the library zarr itself requires
    for name in ("index.faiss", "lists.ivfdata", "lists.crc32c"):
        data = (d / name).read_bytes()
        assert meta["checksums"][name] == {"bytes": len(data), "crc32c": crc32c(data)}
    sizes, offsets, code = header_of(built["t"])
    data = (d / "lists.ivfdata").read_bytes()
    per_list = np.frombuffer((d / "lists.crc32c").read_bytes(), "<u4")
    want = [crc32c(data[o:o + s * (code + 8)]) for s, o in zip(sizes, offsets)]
    assert per_list.tolist() == want
    body = {k: v for k, v in meta.items() if k != "meta_crc32c"}
    assert meta["meta_crc32c"] == crc32c(json.dumps(body, sort_keys=True,
                                                    separators=(",", ":")).encode())
    assert (meta["dim"], meta["metric"], meta["nlist"], meta["table_rows"]) == (
        DIM, "cos", NLIST, ROWS)


# -- damage ------------------------------------------------------------------------------------
def test_flipped_bits_in_the_lists(built, tmp_path, kind):
    path = copy(built, kind, tmp_path)
    f = path / ANN / "lists.ivfdata"
    data = bytearray(f.read_bytes())
    rng = np.random.default_rng(3)
    for bit in rng.choice(len(data) * 8, 2000, replace=False).tolist():
        data[bit // 8] ^= 1 << (bit % 8)
    f.write_bytes(bytes(data))
    if kind == "legacy":  # bytes without checksums: never a cosine above 1, never garbage ids
        try:
            ids, scores = search(path)
        except CorruptStoreError as exc:
            assert "lists.ivfdata" in str(exc)
        else:
            assert (np.abs(scores[ids >= 0]) <= 1.001).all() and ids.max() < ROWS
        return
    assert_verify_names(path, "lists.ivfdata", r"lists [\d, ]+.* \(\d+ of 40\) fail their crc32c")
    with pytest.raises(CorruptStoreError, match=r"lists.ivfdata: list \d+ \(bytes \d+\.\.\d+\) "
                                                r"fails its crc32c .*embstore index --overwrite"):
        search(path)
    assert_clean_error(invoke(["similar", path, "w1", "w2", "w3", "--approx"]))


def test_another_tables_index_faiss(built, tmp_path, kind):
    path = copy(built, kind, tmp_path)
    shutil.copy(built["other"] / ANN / "index.faiss", path / ANN / "index.faiss")
    want = "crc32c" if kind == "checksums" else "lies outside|lists hold|another build|hold row ids outside"
    assert_verify_names(path, "index.faiss" if kind == "checksums" else "ivf", want)
    with pytest.raises(CorruptStoreError, match="the approximate index is damaged"):
        search(path)


def _edit_an_id(path: Path, value: int) -> int:
    """Put ``value`` as the first row id of the largest list; returns the row it replaced."""
    sizes, offsets, code = header_of(path)
    j = int(np.argmax(sizes))
    at = offsets[j] + sizes[j] * code
    with open(path / ANN / "lists.ivfdata", "r+b") as f:
        f.seek(at)
        row = struct.unpack("<q", f.read(8))[0]
        f.seek(at)
        f.write(struct.pack("<q", value))
    return row


def test_an_edited_row_id(built, tmp_path, kind):
    path = copy(built, kind, tmp_path)
    row = _edit_an_id(path, 10**12)
    want = "crc32c" if kind == "checksums" else r"hold row ids outside 0\.\.3999"
    assert_verify_names(path, "lists.ivfdata", want)
    pattern = ("fails its crc32c" if kind == "checksums" else
               "the index returned row id 1000000000000 for a table of 4000 rows")
    with pytest.raises(CorruptStoreError, match=pattern):
        search(path, A[[row]])
    res = invoke(["similar", path, f"w{row}", "--approx"])
    assert "1000000000000" not in res.output.split("Error:")[0]
    assert_clean_error(res)


def test_a_truncated_lists_file_never_raises_sigbus(built, tmp_path, kind):
    path = copy(built, kind, tmp_path)
    f = path / ANN / "lists.ivfdata"
    os.truncate(f, f.stat().st_size // 2)
    code = ("import sys, embstore\n"
            "t = embstore.open(sys.argv[1])\n"
            "try:\n"
            "    embstore.Embedding(t).most_similar(t[::7], k=5, approx=True)\n"
            "except embstore.CorruptStoreError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])  # SIGBUS: -7
    assert "refused:" in out.stdout and "lists.ivfdata" in out.stdout, out.stdout
    assert "index.faiss says" in out.stdout and "truncated" in out.stdout
    assert_verify_names(path, "lists.ivfdata", "truncated")


def test_a_truncated_index_file(built, tmp_path, kind):
    path = copy(built, kind, tmp_path)
    f = path / ANN / "index.faiss"
    os.truncate(f, f.stat().st_size - 100)
    want = "bytes, meta.json records" if kind == "checksums" else "not an index as embstore"
    assert_verify_names(path, "index.faiss", want)
    with pytest.raises(CorruptStoreError, match="index.faiss: .*damaged"):
        search(path)


@pytest.mark.parametrize("offset", [0, 4, 10, 40, 60], ids=["magic", "dim", "rows", "nlist",
                                                            "quantizer"])
def test_a_flipped_header_byte(built, tmp_path, kind, offset):
    path = copy(built, kind, tmp_path)
    f = path / ANN / "index.faiss"
    raw = bytearray(f.read_bytes())
    raw[offset] ^= 0x10
    f.write_bytes(bytes(raw))
    assert_verify_names(path, "index.faiss", "crc32c" if kind == "checksums" else
                        "not an index as embstore writes it|another build")
    with pytest.raises(CorruptStoreError, match="index.faiss: .*the approximate index is "
                                                "damaged"):
        search(path)


def test_meta_json_with_the_wrong_dim(built, tmp_path, kind):
    path = copy(built, kind, tmp_path)
    f = path / ANN / "meta.json"
    meta = json.loads(f.read_text())
    meta["dim"] = DIM + 1
    f.write_text(json.dumps(meta))
    if kind == "checksums":
        line = assert_verify_names(path, "meta.json", "its content has crc32c 0x[0-9a-f]{8}, "
                                                      "it records 0x")
    else:
        line = assert_verify_names(path, "index.faiss", r"another build: dim 16 \(meta.json "
                                                        r"says 17\)")
    assert "damaged" in line
    with pytest.raises(CorruptStoreError, match="the approximate index is damaged"):
        search(path)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe" * 10,
                                     b'{"embstore_ann": 1, "metric": "cos", "dim": "x"}'],
                         ids=["broken", "list", "binary", "wrong-types"])
def test_meta_json_garbage(built, tmp_path, content):
    path = copy(built, "checksums", tmp_path)
    (path / ANN / "meta.json").write_bytes(content)
    assert_verify_names(path, "meta.json", "unreadable index metadata|expected embstore index")
    with pytest.raises(EmbstoreError, match="meta.json: (unreadable|expected embstore)"):
        search(path)
    assert_clean_error(invoke(["similar", path, "w1", "--approx"]))


def test_a_missing_list_checksum_file(built, tmp_path):
    path = copy(built, "checksums", tmp_path)
    (path / ANN / "lists.crc32c").unlink()
    assert_verify_names(path, "lists.crc32c", "")
    with pytest.raises(embstore.IndexNotFoundError, match="lists.crc32c"):
        search(path)

"""Nothing read from a file is ever executed: pickles are refused, not run.

Each hostile file carries a payload whose ``__reduce__`` would create a marker file when
unpickled; the import must fail cleanly (``Error:``, exit 1, no DEST) and the marker must
never appear.  Also: ``.npy`` object arrays, safetensors header bombs and overlapping or
out-of-bounds offsets, and a store whose metadata names a pickle-based dtype.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from relhelpers import TRIED, assert_clean_error, assert_nothing_left, invoke

import embstore


class _Payload:
    """Unpickling this creates the file ``marker`` (through ``pathlib.Path.touch``)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _import(src: Path, fmt: str, *extra) -> str:
    TRIED[f"no pickle: {fmt}"] += 1
    res = invoke(["import", src, src.parent / "dest", "--format", fmt, "-q", *extra])
    msg = assert_clean_error(res, context=f"{fmt} {src.name}")
    assert_nothing_left(src.parent, keep={src.name})
    return msg


def test_payload_really_runs_when_unpickled(tmp_path):
    """The payload is live: plain pickle.loads does create the marker (so absence means
    something)."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


def test_npy_object_array_is_refused(tmp_path):
    marker = tmp_path / "ran"
    src = tmp_path / "obj.npy"
    arr = np.empty((2, 2), dtype=object)
    arr[0, 0] = _Payload(marker)
    np.save(src, arr, allow_pickle=True)
    msg = _import(src, "npy")
    assert "object" in msg.lower() or "pickle" in msg.lower() or "float" in msg.lower(), msg
    assert not marker.exists()


def test_npy_object_array_with_auto_format(tmp_path):
    marker = tmp_path / "ran"
    src = tmp_path / "obj.npy"
    arr = np.array([[_Payload(marker), 1.0]], dtype=object)
    np.save(src, arr, allow_pickle=True)
    TRIED["no pickle: npy (auto)"] += 1
    res = invoke(["import", src, tmp_path / "dest", "-q"])
    assert_clean_error(res)
    assert not marker.exists()


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_torch_pickled_callable_is_refused(tmp_path, torch):
    marker = tmp_path / "ran"
    src = tmp_path / "evil.pt"
    torch.save({"weight": torch.ones(3, 2), "hook": _Payload(marker)}, src)
    assert not marker.exists()
    msg = _import(src, "torch")
    assert "weights_only" in msg, msg
    assert not marker.exists()
    # the same through the Python API
    from embstore.formats.torch import load_tensors
    with pytest.raises(embstore.FormatError):
        load_tensors(src)
    assert not marker.exists()


def test_torch_legacy_pickle_file_is_refused(tmp_path, torch):
    """The old non-zip format is a bare pickle stream: still only the restricted loader."""
    marker = tmp_path / "ran"
    src = tmp_path / "legacy.pt"
    torch.save({"weight": torch.ones(3, 2), "x": _Payload(marker)}, src,
               _use_new_zipfile_serialization=False)
    _import(src, "torch")
    assert not marker.exists()


def test_torch_zip_with_a_raw_pickle_inside(tmp_path, torch):
    """A zip laid out like a torch file whose data.pkl is a plain pickle of the payload."""
    marker = tmp_path / "ran"
    src = tmp_path / "zip.pt"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(_Payload(marker), protocol=2))
        z.writestr("archive/version", "3\n")
    _import(src, "torch")
    assert not marker.exists()


def test_bare_pickle_with_auto_format(tmp_path):
    marker = tmp_path / "ran"
    for ext in (".pt", ".bin", ".pkl", ".npy", ""):
        src = tmp_path / f"p{ext}"
        src.write_bytes(pickle.dumps(_Payload(marker), protocol=2))
        TRIED["no pickle: auto"] += 1
        res = invoke(["import", src, tmp_path / "dest", "-q"])
        assert_clean_error(res, context=ext)
        assert not os.path.exists(tmp_path / "dest")
        assert not marker.exists()
        src.unlink()


def _st(header: dict, payload: bytes, *, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + payload


SAFETENSORS = {
    "header-bomb-2**63": _st({}, b"", length=2**63),
    "header-bomb-2**64-1": _st({}, b"", length=2**64 - 1),
    "header-longer-than-file": _st({"w": {"dtype": "F32", "shape": [1, 1],
                                          "data_offsets": [0, 4]}}, b"\0" * 4, length=10**6),
    "overlapping": _st({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                        "b": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}},
                       b"\0" * 24),
    "overlapping-same-bytes": _st({"a": {"dtype": "F32", "shape": [2, 2],
                                         "data_offsets": [0, 16]},
                                   "b": {"dtype": "F32", "shape": [1, 4],
                                         "data_offsets": [0, 16]}}, b"\0" * 16),
    "out-of-bounds": _st({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
                         b"\0" * 8),
    "offsets-past-2**64": _st({"w": {"dtype": "F32", "shape": [2, 2],
                                     "data_offsets": [2**64 - 8, 2**64 + 8]}}, b"\0" * 16),
    "negative-offsets": _st({"w": {"dtype": "F32", "shape": [2, 2],
                                   "data_offsets": [-16, 0]}}, b"\0" * 16),
    "shape-overflows-int64": _st({"w": {"dtype": "F32", "shape": [2**32, 2**32],
                                        "data_offsets": [0, 0]}}, b""),
    "negative-shape": _st({"w": {"dtype": "F32", "shape": [-2, -2],
                                 "data_offsets": [0, 16]}}, b"\0" * 16),
}


@pytest.mark.parametrize("case", sorted(SAFETENSORS), ids=sorted(SAFETENSORS))
def test_safetensors_hostile_headers_are_refused(tmp_path, case):
    src = tmp_path / "x.safetensors"
    src.write_bytes(SAFETENSORS[case])
    extra = ["--tensor", "a"] if case.startswith("overlapping") else []
    _import(src, "safetensors", *extra)


def test_store_with_an_object_dtype_is_refused(tmp_path):
    """A store whose vectors/zarr.json names a pickle-based dtype never reaches a decoder."""
    path = tmp_path / "t"
    embstore.save(path, np.ones((4, 2), np.float32)).close()
    meta_file = path / "vectors" / "zarr.json"
    meta = json.loads(meta_file.read_text())
    for dtype in ("object", "|O", {"name": "object"}):
        meta["data_type"] = dtype
        meta_file.write_text(json.dumps(meta))
        TRIED["no pickle: store dtype"] += 1
        with pytest.raises(embstore.EmbstoreError):
            embstore.open(path)
        res = invoke(["info", path])
        assert_clean_error(res)


def test_lookup_never_unpickles_ids(tmp_path):
    """``embstore lookup`` reads ids with allow_pickle=False: an object .npy is refused."""
    marker = tmp_path / "ran"
    table = tmp_path / "t"
    embstore.save(table, np.ones((4, 2), np.float32)).close()
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([_Payload(marker), 1], dtype=object), allow_pickle=True)
    TRIED["no pickle: lookup ids"] += 1
    res = invoke(["lookup", table, ids, tmp_path / "out.npy", "--quiet"])
    assert_clean_error(res)
    assert not marker.exists()
    assert not (tmp_path / "out.npy").exists()


def test_no_pickle_in_the_source():
    """No module of embstore calls pickle.load(s), allow_pickle=True, or torch.load without
    weights_only=True (np.load's default is allow_pickle=False)."""
    import re

    root = Path(embstore.__file__).parent
    bad = []
    for f in root.rglob("*.py"):
        text = f.read_text()
        for m in re.finditer(r"pickle\.loads?\(|allow_pickle\s*=\s*True|"
                             r"weights_only\s*=\s*False|torch\.load\((?![^)]*weights_only=True)",
                             text):
            bad.append(f"{f.relative_to(root)}: {m.group(0)}")
    assert not bad, bad

"""Malformed files for every importer, through ``embstore import`` (click's CliRunner).

Each test builds a valid file of its format from hypothesis data, damages it (truncation,
wrong header counts, ragged rows, non-numeric values, NaN/inf, huge declared sizes, random
bytes, wrong encodings, header edits) and imports it (hand-made cases, huge declared
sizes among them: test_hostile_import_cases.py).  The outcome must be one of:

- exit 1 with one ``Error: ...`` line, no traceback, and nothing left in the directory but
  the source (no DEST, no ``DEST.tmp-*``);
- exit 0 (the damage left a valid file) with a table equal to what an independent reader
  (:mod:`refparse`: plain Python, NumPy, ``torch.load(weights_only=True)``) finds in the
  same bytes.
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import refparse
from hypothesis import given
from hypothesis import strategies as st
from relhelpers import FUZZ, TRIED, assert_clean_error, assert_nothing_left, invoke

import embstore

# -- building valid files -------------------------------------------------------------------
_KEY_CHARS = st.characters(codec="utf-8", exclude_categories=("Z", "C"))
_VALUES = st.integers(-4000, 4000).map(lambda i: i / 8)  # exact in float32 and in text


@st.composite
def keyed_rows(draw, *, max_rows: int = 6):
    dim = draw(st.integers(1, 5))
    keys = draw(st.lists(st.text(_KEY_CHARS, min_size=1, max_size=6), max_size=max_rows,
                         unique=True))
    rows = [[draw(_VALUES) for _ in range(dim)] for _ in keys]
    return keys, np.array(rows, dtype=np.float32).reshape(len(keys), dim)


def text_bytes(keys, arr, *, header: bool, trailing_space: bool = False) -> bytes:
    out = [f"{len(keys)} {arr.shape[1]}"] if header else []
    for k, row in zip(keys, arr.tolist()):
        out.append(k + " " + " ".join(repr(v) for v in row) + (" " if trailing_space else ""))
    return ("\n".join(out) + "\n").encode("utf-8")


def binary_bytes(keys, arr) -> bytes:
    parts = [f"{len(keys)} {arr.shape[1]}\n".encode()]
    for k, row in zip(keys, arr):
        parts += [k.encode("utf-8"), b" ", row.astype("<f4").tobytes(), b"\n"]
    return b"".join(parts)


# -- damage ---------------------------------------------------------------------------------
_JUNK = [b"abc", b"1.2.3", b"--1", b"0x1F", b"1_000", b"nan", b"NaN", b"inf", b"-inf",
         b"1e999", b"-1e400", b"\xff\xfe", b"\x00", b"1e", b".", b"+", b"\xd9\xa1",
         b"1,5", b"\t", b"\x0b", b"\x0c", b"3.4e38", b"1e39"]


@st.composite
def damaged_text(draw, data: bytes, *, header: bool):
    """One kind of damage to a text file (word2vec/fastText/GloVe)."""
    lines = data.split(b"\n")
    kind = draw(st.sampled_from(["truncate", "count", "dim", "ragged", "junk", "random",
                                 "encoding", "empty", "crlf_mix", "blank_line"]))
    if kind == "truncate" and data:
        return kind, data[:draw(st.integers(0, len(data) - 1))]
    if kind in ("count", "dim") and header:
        count, dim = (int(x) for x in lines[0].split())
        big = st.sampled_from([0, 1, 10**12, 2**63, 2**64 + 5, 10**30])
        new = draw(st.one_of(st.integers(0, count + 3), big))
        lines[0] = (f"{new} {dim}" if kind == "count" else f"{count} {new}").encode()
        return kind, b"\n".join(lines)
    body = range(1 if header else 0, len(lines) - 1)
    if kind in ("ragged", "junk") and len(body):
        i = draw(st.sampled_from(body))
        toks = lines[i].split(b" ")
        j = draw(st.integers(1, max(1, len(toks) - 1)))
        if kind == "ragged":
            toks = toks[:j] + toks[j + 1:] if draw(st.booleans()) else toks[:j] + [b"7"] + toks[j:]
        else:
            toks[min(j, len(toks) - 1)] = draw(st.sampled_from(_JUNK))
        lines[i] = b" ".join(toks)
        return kind, b"\n".join(lines)
    if kind == "encoding" and len(body):
        i = draw(st.sampled_from(body))
        codec = draw(st.sampled_from(["latin-1", "utf-16", "cp1252", "utf-32"]))
        lines[i] = lines[i].decode("utf-8").encode(codec, "replace")
        return kind, b"\n".join(lines)
    if kind == "empty":
        return kind, draw(st.sampled_from([b"", b"\n", b"\n\n", b" ", b"\r\n"]))
    if kind == "crlf_mix":
        return kind, data.replace(b"\n", b"\r\n", draw(st.integers(1, 3)))
    if kind == "blank_line" and len(lines) > 2:
        i = draw(st.integers(1, len(lines) - 1))
        return kind, b"\n".join(lines[:i] + [b""] + lines[i:])
    return "random", _random_damage(draw, data)


def _random_damage(draw, data: bytes) -> bytes:
    how = draw(st.sampled_from(["overwrite", "insert", "replace_all", "flip"]))
    junk = draw(st.binary(min_size=1, max_size=16))
    if how == "replace_all" or not data:
        return draw(st.binary(max_size=200))
    i = draw(st.integers(0, len(data) - 1))
    if how == "overwrite":
        return data[:i] + junk + data[i + len(junk):]
    if how == "insert":
        return data[:i] + junk + data[i:]
    return data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1:]


# -- running an import and judging it ---------------------------------------------------------
def _table(dest):
    with embstore.open(dest) as t:
        return t.to_numpy(), (list(t.keys) if t.keys is not None else None), t.info()


def check_import(scratch, data: bytes, name: str, fmt: str, reference, *, extra=()):
    """Import ``data`` as ``fmt``; judge the outcome (see the module docstring)."""
    d = scratch.new()
    try:
        src = d / name
        src.write_bytes(data)
        TRIED[f"import {fmt}"] += 1
        res = invoke(["import", src, d / "dest", "--format", fmt, "-q", *extra])
        if res.exit_code != 0:
            assert_clean_error(res, context=f"{fmt} {data[:80]!r}")
            assert_nothing_left(d, keep={name})
            return None
        TRIED[f"import {fmt} (accepted)"] += 1
        assert res.exception is None or isinstance(res.exception, SystemExit), res.output
        assert_nothing_left(d, keep={name, "dest"})
        got, keys, info = _table(d / "dest")
        try:
            want_keys, want = reference(src, info)
        except refparse.Refused as exc:
            pytest.fail(f"{fmt}: embstore accepted a file the reference refuses ({exc}): "
                        f"{data[:200]!r}")
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        assert keys == want_keys
        return got
    finally:
        scratch.drop(d)


def _ref_text(header):
    return lambda src, info: refparse.text(src.read_bytes(), header=header)


def _ref_binary(src, info):
    return refparse.word2vec_binary(src.read_bytes())


def _ref_npy(src, info):
    return None, refparse.npy(src.read_bytes())


def _ref_safetensors(src, info):
    return None, refparse.safetensors(src.read_bytes(), info["attributes"]["source"]["tensor"])


def _ref_torch(src, info):
    return None, refparse.torch_tensor(src, info["attributes"]["source"]["tensor"])


# -- the fuzz tests -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,header,trailing", [("word2vec", True, False),
                                                 ("fasttext", True, True),
                                                 ("glove", False, False)])
@FUZZ
@given(data=st.data())
def test_text_formats_fuzzed(scratch, data, fmt, header, trailing):
    keys, arr = data.draw(keyed_rows())
    raw = text_bytes(keys, arr, header=header, trailing_space=trailing)
    _, bad = data.draw(damaged_text(raw, header=header))
    check_import(scratch, bad, "vecs.txt", fmt, _ref_text(header))


@FUZZ
@given(data=st.data())
def test_word2vec_binary_fuzzed(scratch, data):
    keys, arr = data.draw(keyed_rows())
    raw = binary_bytes(keys, arr)
    kind = data.draw(st.sampled_from(["truncate", "count", "dim", "random", "nonfinite",
                                      "encoding", "no_newlines"]))
    head_end = raw.index(b"\n")
    if kind == "truncate":
        bad = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind in ("count", "dim"):
        count, dim = len(keys), arr.shape[1]
        new = data.draw(st.one_of(st.integers(0, count + 3),
                                  st.sampled_from([10**12, 2**63, 10**30])))
        head = f"{new} {dim}" if kind == "count" else f"{count} {new}"
        bad = head.encode() + raw[head_end:]
    elif kind == "nonfinite" and keys:
        arr = arr.copy()
        arr[data.draw(st.integers(0, len(keys) - 1)), 0] = data.draw(
            st.sampled_from([np.nan, np.inf, -np.inf]))
        bad = binary_bytes(keys, arr)
    elif kind == "encoding" and keys:
        keys = list(keys)
        keys[0] = keys[0].encode("utf-8").decode("latin-1") + "\udcff"
        bad = binary_bytes([k.encode("utf-8", "surrogateescape").decode("latin-1")
                            for k in keys], arr).replace(b"\xc3\xbf", b"\xff", 1)
    elif kind == "no_newlines":  # gensim writes no "\n" after vectors: a valid variant
        bad = raw[:head_end + 1] + b"".join(
            k.encode() + b" " + r.astype("<f4").tobytes() for k, r in zip(keys, arr))
    else:
        bad = _random_damage(data.draw, raw)
    check_import(scratch, bad, "vecs.bin", "word2vec-binary", _ref_binary)


def _npy_bytes(arr, *, fortran: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(arr) if fortran else arr, allow_pickle=False)
    return buf.getvalue()


_NPY_DESCR = ["'<f4'", "'>f4'", "'<f2'", "'<f8'", "'|O'", "'<i4'", "'<c8'", "'|V8'",
              "'<M8[s]'", "[('a', '<f4')]", "'<U2'", "'|b1'", "'x'", "5"]
_NPY_SHAPE = ["()", "(3,)", "(1000000000000, 4)", "(-2, 3)", "(2, 3, 4)", "(0, 3)", "(3, 0)",
              "(2**62, 2**62)", "(99999999999999999999999, 1)", "'a'", "(1.5, 2)"]


@FUZZ
@given(data=st.data())
def test_npy_fuzzed(scratch, data):
    n, dim = data.draw(st.integers(0, 5)), data.draw(st.integers(1, 4))
    dtype = data.draw(st.sampled_from(["<f2", "<f4", ">f4", "<f8"]))
    arr = (np.arange(n * dim, dtype=np.float64).reshape(n, dim) / 4).astype(dtype)
    raw = _npy_bytes(arr, fortran=data.draw(st.booleans()))
    kind = data.draw(st.sampled_from(["truncate", "descr", "shape", "fortran", "random",
                                      "nonfinite", "magic"]))
    end = raw.index(b"\n") + 1
    head = raw[:end].decode("latin-1")
    if kind == "truncate":
        bad = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind in ("descr", "shape", "fortran"):
        d = head.index("'descr': ") + 9
        s = head.index("'shape': ") + 9
        f = head.index("'fortran_order': ") + 17
        if kind == "descr":
            new = head[:d] + data.draw(st.sampled_from(_NPY_DESCR)) + head[head.index(",", d):]
        elif kind == "shape":
            new = head[:s] + data.draw(st.sampled_from(_NPY_SHAPE)) + head[head.index(")", s) + 1:]
        else:
            new = head[:f] + data.draw(st.sampled_from(["True", "False", "1", "'x'"])) + \
                head[head.index(",", f):]
        new = new.rstrip("\n").rstrip(" ")
        new += " " * (-(len(new) + 1) % 64) + "\n"
        hb = new.encode("latin-1")
        bad = hb[:8] + struct.pack("<H", len(hb) - 10) + hb[10:] + raw[end:]
    elif kind == "nonfinite" and n:
        arr = arr.copy()
        arr.flat[data.draw(st.integers(0, arr.size - 1))] = np.nan
        bad = _npy_bytes(arr)
    elif kind == "magic":
        bad = data.draw(st.sampled_from([b"\x93NUMPY\x03\x00", b"\x93NUMPY\x01\x00\xff\xff",
                                         b"\x93NUMPY\x02\x00" + b"\xff" * 4])) + raw[10:]
    else:
        bad = _random_damage(data.draw, raw)
    check_import(scratch, bad, "vecs.npy", "npy", _ref_npy)


def _st_bytes(header: dict, payload: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + payload


_ST_EDITS = {
    "shape": lambda d: [[-2, -2], [2**32, 2**32], [2**62, 2], [10**12, 4], [], [3], "x",
                        [1.5, 2], [2, 2, 2], [0, 4], [4, 0], None, [True, 2]],
    "dtype": lambda d: ["F64", "F16", "BF16", "I32", "U8", "BOOL", "F8_E4M3", "Q", ["F32"],
                        None, 5, {"a": 1}],
    "data_offsets": lambda d: [[0, 0], [-8, 8], [0, 2**64], [2**63, 2**63 + 16], [4, 2],
                               [0], [0, 1, 2], "0,16", [0.0, 16.0], None, [1, 17]],
}


@FUZZ
@given(data=st.data())
def test_safetensors_fuzzed(scratch, data):
    n, dim = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4))
    arr = (np.arange(n * dim, dtype=np.float32).reshape(n, dim) - 3) / 2
    header = {"weight": {"dtype": "F32", "shape": [n, dim], "data_offsets": [0, arr.nbytes]},
              "bias": {"dtype": "F32", "shape": [dim], "data_offsets": [arr.nbytes,
                                                                        arr.nbytes + 4 * dim]},
              "__metadata__": {"format": "np"}}
    payload = arr.tobytes() + np.ones(dim, "<f4").tobytes()
    raw = _st_bytes(header, payload)
    kind = data.draw(st.sampled_from(["edit", "edit", "overlap", "header_len", "truncate",
                                      "random", "json", "metadata", "nonfinite"]))
    if kind == "edit":
        field = data.draw(st.sampled_from(sorted(_ST_EDITS)))
        target = data.draw(st.sampled_from(["weight", "bias"]))
        header[target][field] = data.draw(st.sampled_from(_ST_EDITS[field](dim)))
        bad = _st_bytes(header, payload)
    elif kind == "overlap":  # a second 2-D tensor sharing the weight's bytes
        header["alias"] = {"dtype": "F32", "shape": [1, dim],
                           "data_offsets": [4 * dim * (n - 1), 4 * dim * n]}
        bad = _st_bytes(header, payload)
    elif kind == "header_len":
        new = data.draw(st.sampled_from([0, 1, 7, 2**63, 2**64 - 1, 100 << 20, 10**12]))
        bad = struct.pack("<Q", new) + raw[8:]
    elif kind == "truncate":
        bad = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "json":
        bad = _st_bytes({}, b"")[:8] + raw[8:].replace(b"}", b"", 1)
    elif kind == "metadata":
        header["__metadata__"] = data.draw(st.sampled_from([5, [1], {"x": 1}, None, "s"]))
        bad = _st_bytes(header, payload)
    elif kind == "nonfinite":
        bad = _st_bytes(header, np.full(n * dim, np.inf, "<f4").tobytes() + payload[arr.nbytes:])
    else:
        bad = _random_damage(data.draw, raw)
    extra = ["--tensor", "weight"] if data.draw(st.booleans()) else []
    check_import(scratch, bad, "vecs.safetensors", "safetensors", _ref_safetensors, extra=extra)


@pytest.fixture(scope="module")
def torch_file_bytes():
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"emb": {"weight": torch.arange(12, dtype=torch.float32).reshape(4, 3) / 4},
                "step": torch.tensor(3)}, buf)
    return buf.getvalue()


@FUZZ
@given(data=st.data())
def test_torch_fuzzed(scratch, torch_file_bytes, data):
    raw = torch_file_bytes
    kind = data.draw(st.sampled_from(["truncate", "random", "random", "prefix"]))
    if kind == "truncate":
        bad = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "prefix":
        bad = data.draw(st.sampled_from([b"\x80\x02", b"PK\x03\x04", b"\x80\x04\x95"])) + \
            data.draw(st.binary(max_size=100))
    else:
        bad = _random_damage(data.draw, raw)
    check_import(scratch, bad, "vecs.pt", "torch", _ref_torch)


_FORMATS_REF = {"word2vec": _ref_text(True), "fasttext": _ref_text(True),
                "glove": _ref_text(False), "word2vec-binary": _ref_binary, "npy": _ref_npy,
                "safetensors": _ref_safetensors, "torch": _ref_torch}


@FUZZ
@given(raw=st.binary(max_size=300), ext=st.sampled_from([".txt", ".vec", ".bin", ".npy",
                                                          ".safetensors", ".pt", ""]))
def test_random_bytes_auto_format(scratch, raw, ext):
    d = scratch.new()
    try:
        src = d / f"f{ext}"
        src.write_bytes(raw)
        TRIED["import auto (random bytes)"] += 1
        res = invoke(["import", src, d / "dest", "-q"])
        if res.exit_code != 0:
            assert_clean_error(res, context=repr(raw[:80]))
            assert_nothing_left(d, keep={src.name})
            return
        got, keys, info = _table(d / "dest")
        fmt = info["attributes"]["source"]["format"]
        try:
            want_keys, want = _FORMATS_REF[fmt](src, info)
        except refparse.Refused as exc:
            pytest.fail(f"auto ({fmt}) accepted what the reference refuses ({exc}): {raw!r}")
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        assert keys == want_keys
    finally:
        scratch.drop(d)

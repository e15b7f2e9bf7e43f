"""Hand-made hostile import files: huge declared sizes (in a subprocess limited to 2 GiB of
address space: refused from the header, quickly, not by running out of memory) and the
regression cases found by fuzzing.  The generated ones are in test_hostile_imports.py."""

from __future__ import annotations

import os
import struct
import time

import numpy as np
import pytest
import refparse
from relhelpers import TRIED, assert_clean_error, assert_nothing_left, invoke, run_cli_subprocess
from test_hostile_imports import _npy_bytes, _st_bytes, _table


# -- explicit cases ---------------------------------------------------------------------------
def _st_header_only(header: dict, data_bytes: int = 16) -> bytes:
    return _st_bytes(header, b"\0" * data_bytes)


HOSTILE = {
    # name -> (file name, bytes, format)
    "w2v-text-rows-1e12": ("a.txt", b"1000000000000 3\na 1 2 3\n", "word2vec"),
    "w2v-text-dim-1e12": ("a.txt", b"2 1000000000000\na 1 2 3\n", "word2vec"),
    "w2v-text-dim-2e64": ("a.txt", b"1 36893488147419103232\na 1\n", "word2vec"),
    "fasttext-dim-1e12": ("a.vec", b"1 1000000000000\na 1 \n", "fasttext"),
    "w2v-bin-rows-1e12": ("a.bin", b"1000000000000 2\na " + struct.pack("<2f", 1, 2),
                          "word2vec-binary"),
    "w2v-bin-dim-1e12": ("a.bin", b"2 1000000000000\na " + struct.pack("<2f", 1, 2),
                         "word2vec-binary"),
    "w2v-bin-dim-2e60": ("a.bin", b"1 " + str(2**60).encode() + b"\na " + b"\0" * 64,
                         "word2vec-binary"),
    "npy-shape-1e12": ("a.npy", _npy_bytes(np.zeros((2, 3), "<f4")).replace(
        b"(2, 3)", b"(1000000000000, 3)")[:-8], "npy"),
    "safetensors-shape-1e12": ("a.st", _st_header_only(
        {"w": {"dtype": "F32", "shape": [10**12, 4], "data_offsets": [0, 16 * 10**12]}}),
        "safetensors"),
    "safetensors-shape-overflow": ("a.st", _st_header_only(
        {"w": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}}),
        "safetensors"),
    "safetensors-negative-shape": ("a.st", _st_header_only(
        {"w": {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]}}), "safetensors"),
    "safetensors-header-bomb": ("a.st", struct.pack("<Q", 2**63) + b"{}" + b" " * 64,
                                "safetensors"),
    "safetensors-header-1e12": ("a.st", struct.pack("<Q", 10**12) + b"{" + b" " * 64,
                                "safetensors"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE), ids=sorted(HOSTILE))
def test_huge_declared_sizes_fail_fast_without_allocating(tmp_path, case):
    """In a subprocess limited to 2 GiB of address space: refused from the header, fast."""
    name, raw, fmt = HOSTILE[case]
    (tmp_path / name).write_bytes(raw)
    TRIED["huge declared sizes (subprocess, 2 GiB)"] += 1
    t0 = time.monotonic()
    proc = run_cli_subprocess(["import", tmp_path / name, tmp_path / "dest", "--format", fmt,
                               "-q"], timeout=60, address_space=2 << 30)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: "), proc.stderr
    assert "out of memory" not in proc.stderr, f"{case}: allocated before refusing: {proc.stderr}"
    assert elapsed < 30
    assert sorted(os.listdir(tmp_path)) == [name]


def test_hostile_cases_in_process_are_clean(scratch):
    """The same files through the in-process CLI: clean errors, nothing left behind."""
    for case, (name, raw, fmt) in sorted(HOSTILE.items()):
        d = scratch.new()
        (d / name).write_bytes(raw)
        res = invoke(["import", d / name, d / "dest", "--format", fmt, "-q"])
        msg = assert_clean_error(res, context=case)
        assert "out of memory" not in msg, case
        assert_nothing_left(d, keep={name})
        scratch.drop(d)


@pytest.mark.parametrize("raw", [b"1 1\na\n\xff " + struct.pack("<f", 1.0),
                                 b"2 1\nab\ncd " + struct.pack("<f", 1.0) + b"e " +
                                 struct.pack("<f", 2.0)],
                         ids=["bad-utf8-after-newline", "newline-inside-key"])
def test_word2vec_binary_key_with_a_line_break(scratch, raw):
    """Found by tools/fuzz_import.py (atheris): a binary key holding "\\n" followed by an
    invalid UTF-8 byte raised IndexError in decode_keys."""
    d = scratch.new()
    (d / "a.bin").write_bytes(raw)
    res = invoke(["import", d / "a.bin", d / "dest", "--format", "word2vec-binary", "-q"])
    if res.exit_code == 0:  # the reference may read it (a key may hold "\n" after the first byte)
        got, keys, _ = _table(d / "dest")
        want_keys, want = refparse.word2vec_binary(raw)
        assert keys == want_keys
        np.testing.assert_array_equal(got, want)
    else:
        assert_clean_error(res)
        assert_nothing_left(d, keep={"a.bin"})
    scratch.drop(d)

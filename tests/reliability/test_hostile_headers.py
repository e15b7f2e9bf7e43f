"""Hostile headers and attributes give one ``Error:`` line (exit 1), never a traceback.

JSON nested 100,000 deep raised ``RecursionError`` from every JSON file embstore reads in
a model folder; each case below printed a traceback before.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from relhelpers import assert_clean_error, invoke

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

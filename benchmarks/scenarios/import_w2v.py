"""import: word2vec files (1,000,000 x 100: about 0.9 GB of text, 0.41 GB binary) into a
table and out again, against gensim.

- Import: ``embstore import SRC DEST`` against gensim ``KeyedVectors.load_word2vec_format``
  (which holds the whole matrix and a dict of every key) of the same file: the text file,
  and the same vectors and keys as binary files in both layouts (the C tool's, a ``\\n``
  after each vector, and gensim's own, without).
- Export: ``embstore export TABLE DEST`` of a table holding those vectors and keys against
  gensim ``save_word2vec_format`` of a ``KeyedVectors`` holding them (loaded from the
  binary file before its clock starts), binary and text.

Each run is a fresh process: time of the work after the imports (embstore's command line:
its whole ``main()``, lazy imports included) and peak RSS of the process.  Input files
are in the page cache.  Every output is checked: the imported table's rows and keys
against the values the files hold, each binary export byte for byte against the file of
its layout, each text export's first rows and line count.
"""

from __future__ import annotations

import filecmp
import shutil

import numpy as np

import embstore

from .. import data
from ..children import child_method_runs, run_child
from ..common import Warmer, absolute, compare

NAME = "import"
TITLE = "Import and export word2vec files (text and binary)"

EMB = "embstore import"
GENSIM = "gensim load_word2vec_format"
EMB_OUT = "embstore export"
GENSIM_OUT = "gensim save_word2vec_format"
BIN_FORMAT = "word2vec-binary"


def run(ctx, res) -> None:
    cfg = ctx.cfg["import"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    txt, npy = data.w2v_text(ctx.data_dir, rows, dim)
    c_bin = data.w2v_binary(ctx.data_dir, rows, dim, newline=True)
    g_bin = data.w2v_binary(ctx.data_dir, rows, dim, newline=False)
    table = data.store(ctx.data_dir, npy, with_keys=True)
    res.params = {"rows": rows, "dim": dim, "reps": reps, "text_bytes": txt.stat().st_size,
                  "binary_bytes": c_bin.stat().st_size}
    dest = ctx.scratch / "import.embstore"
    size = f"{rows:,} x {dim}"
    f = res.find

    def clean():
        if dest.is_dir():
            shutil.rmtree(dest)
        elif dest.exists():
            dest.unlink()

    def import_case(case, src, fmt, gensim_kind):
        runs = {
            EMB: ("embstore", lambda: run_child("cli", "import", src, dest, "--format", fmt,
                                                "--quiet", "--overwrite")),
            GENSIM: ("peer", lambda: run_child(gensim_kind, src)),
        }

        def check(name, out):
            if name == EMB:
                _check_store(dest, npy, rows)
            elif out.get("rows") != rows:
                raise AssertionError(f"gensim read {out.get('rows')} rows, expected {rows}")

        try:
            child_method_runs(res, case, runs, reps=reps, warmer=Warmer([src]), before=clean,
                              check=check)
        finally:
            clean()

    def export_case(case, fmt, kind, expected, max_reps=None):
        runs = {
            EMB_OUT: ("embstore", lambda: run_child("cli", "export", table, dest, "--format",
                                                    fmt, "--overwrite")),
            GENSIM_OUT: ("peer", lambda: run_child("gensim-save", c_bin, kind, dest)),
        }

        def check(name, out):
            if kind == "binary":
                if not filecmp.cmp(dest, expected[name], shallow=False):
                    raise AssertionError(f"{name} wrote other bytes than {expected[name].name}")
            else:
                _check_text(dest, npy, rows)

        try:
            child_method_runs(res, case, runs, reps=reps, warmer=Warmer([table, c_bin]),
                              before=clean, check=check, max_reps=max_reps)
        finally:
            clean()

    import_case(f"{size} text", txt, "word2vec", "gensim-w2v")
    import_case(f"{size} binary, C tool layout", c_bin, BIN_FORMAT, "gensim-w2v-bin")
    import_case(f"{size} binary, gensim layout", g_bin, BIN_FORMAT, "gensim-w2v-bin")
    export_case(f"{size} binary export", BIN_FORMAT, "binary",
                {EMB_OUT: c_bin, GENSIM_OUT: g_bin})
    export_case(f"{size} text export", "word2vec", "text", None,
                max_reps={GENSIM_OUT: cfg.get("gensim_text_export_reps", reps)})

    case = f"{size} text"
    compare(res, "import word2vec text: embstore vs gensim", f(case, EMB), f(case, GENSIM),
            target=("faster", 3))
    absolute(res, "import word2vec text: peak RSS", f(case, EMB + " [peak RSS]"), at_most=300)
    compare(res, "import word2vec text: peak RSS, embstore vs gensim", f(case, EMB + " [peak RSS]"),
            f(case, GENSIM + " [peak RSS]"))
    for layout in ("C tool layout", "gensim layout"):
        case = f"{size} binary, {layout}"
        compare(res, f"import word2vec binary ({layout}): embstore vs gensim", f(case, EMB),
                f(case, GENSIM), target=("faster", 2))
        absolute(res, f"import word2vec binary ({layout}): peak RSS",
                 f(case, EMB + " [peak RSS]"), at_most=300)
    case = f"{size} binary export"
    compare(res, "export word2vec binary: embstore vs gensim", f(case, EMB_OUT),
            f(case, GENSIM_OUT), target=("faster", 2))
    case = f"{size} text export"
    compare(res, "export word2vec text: embstore vs gensim", f(case, EMB_OUT),
            f(case, GENSIM_OUT), target=("faster", None))


def _check_store(dest, npy, rows) -> None:
    """The imported table holds the file's exact values and keys (a random sample of rows)."""
    es = embstore
    values = np.load(npy, mmap_mode="r", allow_pickle=False)
    sample = np.sort(np.random.default_rng(5).choice(rows, size=min(rows, 10_000), replace=False))
    with es.open(dest, mode="r") as t:
        if tuple(t.shape) != values.shape:
            raise AssertionError(f"imported shape {t.shape}, expected {values.shape}")
        if not np.array_equal(t.lookup(sample), values[sample]):
            raise AssertionError("imported rows differ from the file's values")
        if hasattr(t, "ids_of") and not np.array_equal(
                t.ids_of(data.keys(rows)[sample].tolist()), sample):
            raise AssertionError("imported keys do not map to their rows")


def _check_text(path, npy, rows, head: int = 1000) -> None:
    """A text export: its header, its first ``head`` rows (keys and exact values) and its
    line count."""
    values = np.load(npy, mmap_mode="r", allow_pickle=False)
    with open(path, "rb") as fh:
        lines = [fh.readline() for _ in range(min(rows, head) + 1)]
        n = len(lines) - 1 + sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 24), b""))
    if lines[0].split() != [str(rows).encode(), str(values.shape[1]).encode()] or n != rows:
        raise AssertionError(f"expected a '{rows} {values.shape[1]}' header and {rows} rows")
    keys = data.keys(rows, 0, len(lines) - 1).tolist()
    for i, line in enumerate(lines[1:]):
        parts = line.split()
        if parts[0].decode() != keys[i] or not np.array_equal(
                np.array([float(x) for x in parts[1:]], dtype=np.float32), values[i]):
            raise AssertionError(f"text export row {i} differs from the table's")

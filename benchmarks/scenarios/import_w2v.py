"""import: a 1,000,000 x 100 word2vec text file (about 1 GB) into a table.

``embstore import SRC DEST --format word2vec`` against gensim
``KeyedVectors.load_word2vec_format`` (which holds the whole matrix and a dict
of every key), each in a fresh process: time of the work after the imports and
peak RSS of the process.  The text file is in the page cache.
"""

from __future__ import annotations

import shutil

import numpy as np

import embstore

from .. import data
from ..children import child_method_runs, run_child
from ..common import Warmer, absolute, compare

NAME = "import"
TITLE = "Import a word2vec text file"

EMB = "embstore import"
GENSIM = "gensim load_word2vec_format"


def run(ctx, res) -> None:
    cfg = ctx.cfg["import"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    txt, npy = data.w2v_text(ctx.data_dir, rows, dim)
    res.params = {"rows": rows, "dim": dim, "file_bytes": txt.stat().st_size, "reps": reps}
    dest = ctx.scratch / "import.embstore"

    def clean():
        if dest.exists():
            shutil.rmtree(dest)

    runs = {
        EMB: ("embstore", lambda: run_child("cli", "import", txt, dest, "--format", "word2vec",
                                            "--quiet", "--overwrite")),
        GENSIM: ("peer", lambda: run_child("gensim-w2v", txt)),
    }

    def check(name, out):
        if name == EMB:
            _check_store(dest, npy, rows)
        elif out.get("rows") != rows:
            raise AssertionError(f"gensim read {out.get('rows')} rows, expected {rows}")

    case = f"{rows:,} x {dim}"
    try:
        child_method_runs(res, case, runs, reps=reps, warmer=Warmer([txt]), before=clean,
                          check=check)
    finally:
        clean()
    f = res.find
    compare(res, "import word2vec text: embstore vs gensim", f(case, EMB), f(case, GENSIM),
            target=("faster", 3))
    absolute(res, "import word2vec text: peak RSS", f(case, EMB + " [peak RSS]"), at_most=300)
    compare(res, "import word2vec text: peak RSS, embstore vs gensim", f(case, EMB + " [peak RSS]"),
            f(case, GENSIM + " [peak RSS]"))


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

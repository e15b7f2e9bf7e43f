"""open: a fresh process opens a keyed table and looks up three words.

embstore ``open`` + ``ids_of`` + ``lookup`` against gensim loading the same
vectors and keys from the word2vec text file and from its native format
(``KeyedVectors.load(mmap="r")``: pickled keys + a memory-mapped ``.npy``,
files this benchmark wrote itself).  Each run is a new interpreter; the time is
the work after the imports; page cache warm.
"""

from __future__ import annotations

import numpy as np

from .. import data
from ..children import child_method_runs, run_child
from ..common import Skip, Warmer, absolute, compare

NAME = "open"
TITLE = "Open a keyed table and look up three keys (fresh process)"

EMB = "embstore open + 3 key lookups"
W2V = "gensim load_word2vec_format + 3 keys"
NATIVE = "gensim KeyedVectors.load(mmap='r') + 3 keys"


def run(ctx, res) -> None:
    cfg = ctx.cfg["open"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    slow = cfg.get("slow_reps", reps)
    res.params = {"rows": rows, "dim": dim, "keys": rows, "reps": reps, "reps_gensim_text": slow}
    txt, npy = data.w2v_text(ctx.data_dir, rows, dim)
    query_rows = np.array([1, rows // 2, rows - 1])
    query = data.keys(rows)[query_rows].tolist()
    values = np.load(npy, mmap_mode="r", allow_pickle=False)
    expected = float(np.asarray(values[query_rows], dtype=np.float64).sum())
    runs, files = {}, [txt]
    try:
        store = data.store(ctx.data_dir, npy, with_keys=True)
        runs[EMB] = ("embstore", lambda: run_child("embstore-open", store, *query))
        files.append(store)
    except Skip as exc:
        res.notes.append(f"{EMB}: skipped: {exc}")
    runs[W2V] = ("peer", lambda: run_child("gensim-w2v", txt, *query))
    try:
        native = data.gensim_native(ctx.data_dir, rows, dim)
        runs[NATIVE] = ("peer", lambda: run_child("gensim-native", native, *query))
        files += data.gensim_files(native)
    except Skip as exc:
        res.notes.append(f"{NATIVE}: skipped: {exc}")

    def check(name, out):
        if out.get("rows") != rows or abs(out.get("checksum", np.nan) - expected) > 1e-3:
            raise AssertionError(f"{name} returned other vectors (checksum {out.get('checksum')}, "
                                 f"expected {expected})")

    case = f"{rows:,} keys"
    child_method_runs(res, case, runs, reps=reps, warmer=Warmer(files), check=check,
                      max_reps={W2V: slow})
    emb, f = res.find(case, EMB), res.find
    compare(res, "open + 3 lookups: embstore vs gensim word2vec text", emb, f(case, W2V),
            target=("faster", None))
    compare(res, "open + 3 lookups: embstore vs gensim native mmap", emb, f(case, NATIVE),
            target=("faster", None))
    if emb is not None:
        ms = emb.median * 1e3
        c = absolute(res, f"open + 3 key lookups, fresh process ({rows:,} keys)", emb,
                     at_most=0.3)
        if c is not None:
            c.embstore = f"{ms:.0f} ms ({EMB}, {rows:,} keys)"
            c.target = "<= 300 ms"
    compare(res, "open: peak RSS, embstore vs gensim native mmap", f(case, EMB + " [peak RSS]"),
            f(case, NATIVE + " [peak RSS]"))

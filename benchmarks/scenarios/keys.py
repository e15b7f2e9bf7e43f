"""keys: key -> row lookups per second for a batch of 100,000 keys.

embstore ``ids_of`` on the on-disk keyed table against gensim's
``key_to_index`` dict (a Python loop over the batch, the way gensim users map
words to rows), on the same keys.  Keys are drawn uniformly from the vocabulary.

First touch: a fresh process (page cache warm) looks up the rows of a batch of keys it
has not touched yet: embstore ``open`` + ``lookup_keys`` against a dict of every key to
its row (built before timing) and a gather from ``np.load(mmap_mode="r")``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import embstore

from .. import data
from ..children import child_method_runs, run_child
from ..common import Measurement, Method, Skip, Warmer, absolute, compare, interleave

NAME = "keys"
TITLE = "Key lookups per second"

EMB = "embstore ids_of"
GENSIM = "gensim key_to_index (dict)"
EMB_FIRST = "embstore open + lookup_keys"
DICT_FIRST = "dict over np.load(mmap_mode='r') (dict built untimed)"


def run(ctx, res) -> None:
    cfg = ctx.cfg["keys"]
    rows, dim, n, reps = cfg["rows"], cfg["dim"], cfg["n"], cfg["reps"]
    res.params = {"vocabulary": rows, "batch": n, "reps": reps, "batch_type": "list of str"}
    txt, npy = data.w2v_text(ctx.data_dir, rows, dim)
    want = np.random.default_rng([rows, n, 3]).integers(0, rows, n)
    batch = data.keys(rows)[want].tolist()

    def check(out):
        if not np.array_equal(np.asarray(out, dtype=np.int64).reshape(-1), want):
            raise AssertionError("row ids differ from the keys' rows")

    methods, paths, opened = [], [], []
    store = data.store(ctx.data_dir, npy, with_keys=True)
    t = embstore.open(store, mode="r")
    opened.append(t)
    paths.append(store)
    methods.append(Method(EMB, "embstore", lambda: t.ids_of(batch), check=check))
    try:
        native = data.gensim_native(ctx.data_dir, rows, dim)
        from gensim.models import KeyedVectors

        k2i = KeyedVectors.load(str(native), mmap="r").key_to_index
        methods.append(Method(GENSIM, "peer", lambda: [k2i[k] for k in batch], check=check))
    except (Skip, ImportError) as exc:
        res.notes.append(f"{GENSIM}: skipped: {exc if isinstance(exc, Skip) else 'gensim not installed'}")
    case = f"{n:,} keys of {rows:,}"
    try:
        warmer = Warmer(paths)
        warmer.warm()
        found = interleave(res, case, methods, reps=reps, warmer=warmer)
    finally:
        for t in opened:
            t.close()
    rates = {}
    for name, m in found.items():  # ms per batch -> keys per second
        rates[name] = Measurement(case, name + " [keys/s]", m.kind, "keys/s",
                                  [n / (v / 1e3) for v in m.values])
        res.measurements.append(rates[name])
    compare(res, "keys/s: embstore vs gensim dict", rates.get(EMB), rates.get(GENSIM))
    absolute(res, "key lookups per second", rates.get(EMB), at_least=500_000)
    _first_touch(ctx, res, store, npy, rows, batch, cfg.get("fresh_reps", 5))


def _first_touch(ctx, res, store, npy, rows, batch, reps) -> None:
    d = Path(ctx.data_dir)
    keys_npy, batch_npy = d / f"keys-{rows}.npy", d / f"keys-batch-{rows}-{len(batch)}.npy"
    np.save(keys_npy, data.keys(rows).astype(object).astype(str))
    np.save(batch_npy, np.array(batch))
    case = f"first touch: rows of {len(batch):,} keys of {rows:,}, fresh process"
    runs = {EMB_FIRST: ("embstore", lambda: run_child("fresh-keys", "embstore", store, keys_npy,
                                                      batch_npy)),
            DICT_FIRST: ("peer", lambda: run_child("fresh-keys", "dict", npy, keys_npy,
                                                   batch_npy))}

    def check(name, got):
        if got["rows"] != len(batch):
            raise AssertionError(f"{name}: {got['rows']} rows")
    done = child_method_runs(res, case, runs, reps=reps, warmer=Warmer([store, npy]),
                             check=check)
    sums = {n: v[0]["checksum"] for n, v in done.items() if v}
    if len(set(sums.values())) > 1:
        raise AssertionError(f"first-touch rows differ: {sums}")
    compare(res, "first touch: embstore open + lookup_keys vs dict over a memmap",
            res.find(case, EMB_FIRST), res.find(case, DICT_FIRST), target=("within", 1.5))

"""keys: key -> row lookups per second for a batch of 100,000 keys.

embstore ``ids_of`` on the on-disk keyed table against gensim's
``key_to_index`` dict (a Python loop over the batch, the way gensim users map
words to rows), on the same keys.  Keys are drawn uniformly from the vocabulary.
"""

from __future__ import annotations

import numpy as np

import embstore

from .. import data
from ..common import Measurement, Method, Skip, Warmer, absolute, compare, interleave

NAME = "keys"
TITLE = "Key lookups per second"

EMB = "embstore ids_of"
GENSIM = "gensim key_to_index (dict)"


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

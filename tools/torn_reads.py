"""Torn reads at scale: a writer process commits whole-table rewrites, random updates and
appends with keys (one commit each) while reader processes read the whole table again and
again (every other read refreshing its handle, the others opening afresh; gathers and
``to_numpy`` in turn), each read compared with a NumPy replay of the commit it shows (the
largest value in it names the commit), the last key included.  Prints the reads, the torn
ones and the errors.  ``tests/test_versions.py`` runs the same on a smaller scale.

    python tools/torn_reads.py --commits 2000 --readers 4   # about 100,000 reads, 4-5 min
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--commits", type=int, default=2000)
ap.add_argument("--readers", type=int, default=4)
ap.add_argument("--dir", default=None, help="where the table goes (default: a temporary folder)")
args = ap.parse_args()
ROWS, COLS, COMMITS = 2048, 8, args.commits
base = args.dir or tempfile.mkdtemp(prefix="embstore-torn-")
P = os.path.join(base, "t")
WRITER = f"""
import sys, numpy as np, embstore
t = embstore.open(sys.argv[1], mode="r+")
for k in range(1, {COMMITS} + 1):
    kind = k % 3
    if kind == 0:
        t.write(np.arange(t.vocab_size), np.full((t.vocab_size, {COLS}), k, np.float32))
    elif kind == 1:
        ids = np.random.default_rng(k).choice(t.vocab_size, 64, replace=False)
        t.write(ids, np.full((64, {COLS}), k, np.float32))
    else:
        t.append(np.full((32, {COLS}), k, np.float32), keys=[f"a{{k}}-{{i}}" for i in range(32)])
t.close()
"""
READER = f"""
import os, sys, numpy as np, embstore
ROWS, COLS, COMMITS = {ROWS}, {COLS}, {COMMITS}
def models():
    E, nkeys = np.zeros((ROWS, COLS), np.float32), ROWS
    last = [f"r{{ROWS-1}}"]
    out = {{0: (E.copy(), last[0])}}
    for k in range(1, COMMITS + 1):
        kind = k % 3
        if kind == 0: E[:] = k
        elif kind == 1: E[np.random.default_rng(k).choice(len(E), 64, replace=False)] = k
        else:
            E = np.concatenate([E, np.full((32, COLS), k, np.float32)]); last[0] = f"a{{k}}-31"
        out[k] = (E.copy(), last[0])
    return out
M = models()
path, done = sys.argv[1], sys.argv[2]
t = embstore.open(path)
i = torn = errs = 0
rng = np.random.default_rng(int(sys.argv[3]))
seen = set()
while not os.path.exists(done) or i < 10:
    try:
        if i % 2: t.close(); t = embstore.open(path)
        else: t.refresh()
        n = t.vocab_size
        ids = rng.permutation(n)
        rows = t[ids] if i % 3 else t.to_numpy()
        sel = ids if i % 3 else np.arange(n)
        c = int(rows.max())
        want, last = M[c]
        if rows.shape[0] != len(sel) or n != len(want) or not np.array_equal(rows, want[sel]) or t.keys[n - 1] != last:
            torn += 1
        seen.add(c)
    except Exception as e:
        errs += 1; print("ERR", type(e).__name__, e, file=sys.stderr)
    i += 1
print(i, torn, errs, len(seen))
"""
shutil.rmtree(P, ignore_errors=True)
import embstore  # noqa: E402

embstore.save(P, np.zeros((ROWS, COLS), np.float32), keys=[f"r{i}" for i in range(ROWS)], format_version=2).close()
done = P + ".done"
if os.path.exists(done): os.remove(done)
rs = [subprocess.Popen([sys.executable, "-c", READER, P, done, str(s)], stdout=subprocess.PIPE,
                       text=True) for s in range(args.readers)]
t0=time.time()
w = subprocess.run([sys.executable, "-c", WRITER, P], timeout=1800)
open(done, "w").close()
outs = [r.communicate()[0].split() for r in rs]
print("writer", w.returncode, "%.0f s" % (time.time()-t0))
tot = [sum(int(o[j]) for o in outs) for j in range(3)]
print("reads", tot[0], "torn", tot[1], "errors", tot[2], "versions seen per reader",
      [o[3] for o in outs])
if args.dir is None:
    shutil.rmtree(base, ignore_errors=True)
sys.exit(1 if tot[1] or tot[2] or w.returncode else 0)

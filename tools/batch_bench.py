"""Measure batch lookup jobs: peak RSS, throughput against the in-RAM baseline, Dask scaling.

    python tools/batch_bench.py [--vocab 1000000] [--dim 64] [--sizes 200000,4000000]
                                [--workdir DIR] [--dask 1,2] [--repeat 3] [--json FILE]

Each measurement runs in a fresh process under ``/usr/bin/time -v`` (peak RSS as
it reports it; ``resource.getrusage`` when that tool is missing).  The table
is an embstore store when the on-disk backend exists (else a 2-D ``.npy``);
ids are uniform.  The baseline loads the table and the ids into RAM, then
times ``np.take`` plus ``np.save`` of the same output.  Throughputs are ids per
second of the timed part; the job's time includes opening the table and
validating the input.  Dask runs use a LocalCluster started beforehand, so its
start-up is not timed.  Each configuration runs ``--repeat`` times,
interleaved with the others; the best time and the highest RSS are kept (the
machine is shared: compare ratios within one run, and put ``--workdir`` on a
tmpfs such as /dev/shm to leave disk write-back out of the comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASELINE = """
import sys, time, numpy as np
table, ids_path, out = sys.argv[1:4]
E = np.load(table) if table.endswith('.npy') else __import__('embstore').open(table).to_numpy()
ids = np.load(ids_path)
t0 = time.perf_counter()
np.save(out, np.take(E, ids, axis=0))
print('SECONDS', time.perf_counter() - t0)
"""

JOB = """
import sys, time
from embstore.batch import lookup_file
table, ids_path, out, threads, sched, workers = sys.argv[1:7]
s = lookup_file(table, ids_path, out, overwrite=True, threads=threads == '1',
                scheduler=None if sched == '-' else sched, n_workers=int(workers))
print('SECONDS', s['seconds'])
"""

DASK = """
import sys, time, subprocess
from dask.distributed import LocalCluster
from embstore.batch import lookup_file
if __name__ == '__main__':
    table, ids_path, out, workers = sys.argv[1:5]
    with LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                      dashboard_address='127.0.0.1:0', host='127.0.0.1') as cluster:
        lookup_file(table, ids_path, out, overwrite=True, scheduler=cluster.scheduler_address)
        s = lookup_file(table, ids_path, out, overwrite=True, scheduler=cluster.scheduler_address)
    print('SECONDS', s['seconds'])
"""


def run(code: str, *args: str) -> tuple[float, float]:
    """(seconds printed by the child, peak RSS in MB)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        cmd = [sys.executable, f.name, *args]
        if os.path.exists("/usr/bin/time"):
            proc = subprocess.run(["/usr/bin/time", "-v", *cmd], env=env, capture_output=True,
                                  text=True, check=True)
            rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                                   proc.stderr).group(1))
        else:  # pragma: no cover
            import resource

            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    finally:
        os.unlink(f.name)
    seconds = float(re.search(r"SECONDS (\S+)", proc.stdout).group(1))
    return seconds, rss_kb / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--sizes", default="200000,4000000")
    ap.add_argument("--dask", default="1,2", help="worker counts to time ('' to skip)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import embstore

    work = Path(a.workdir or tempfile.mkdtemp(prefix="embstore-batch-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    E = rng.standard_normal((a.vocab, a.dim), dtype=np.float32)
    if hasattr(embstore, "save"):
        table = str(work / "table")
        embstore.save(table, E, overwrite=True).close()
    else:
        table = str(work / "table.npy")
        np.save(table, E)
    del E
    results = {"vocab": a.vocab, "dim": a.dim, "table": os.path.basename(table), "runs": []}
    for n in (int(s) for s in a.sizes.split(",")):
        ids_path = str(work / f"ids{n}.npy")
        np.save(ids_path, rng.integers(0, a.vocab, size=n))
        configs = {"baseline": (BASELINE, table, ids_path, str(work / "base.npy"))}
        for label, out, threads in [("npy", "out.npy", "1"), ("npy_nothreads", "out.npy", "0"),
                                    ("zarr", "out.zarr", "1")]:
            configs[label] = (JOB, table, ids_path, str(work / out), threads, "-", "2")
        for w in (int(x) for x in a.dask.split(",") if x):
            configs[f"dask{w}"] = (DASK, table, ids_path, str(work / "dask.npy"), str(w))
        best: dict = {}
        for _ in range(a.repeat):
            for label, args in configs.items():
                s, rss = run(*args)
                t, r = best.get(label, (float("inf"), 0.0))
                best[label] = (min(t, s), max(r, rss))
        row = {"ids": n}
        for label, (s, rss) in best.items():
            row[f"{label}_s"], row[f"{label}_rss_mb"] = round(s, 4), round(rss, 1)
            if label != "baseline":
                row[f"{label}_vs_baseline"] = round(best["baseline"][0] / s, 3)
        results["runs"].append(row)
        print(json.dumps(row), flush=True)
    first, last = results["runs"][0], results["runs"][-1]
    for label in ("npy", "zarr"):
        results[f"{label}_rss_growth"] = last[f"{label}_rss_mb"] / first[f"{label}_rss_mb"]
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    if not a.workdir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

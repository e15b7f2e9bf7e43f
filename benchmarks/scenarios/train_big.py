"""Training a table larger than memory, paired and interleaved (issue 40).

``python -m benchmarks.scenarios.train --larger-than-ram`` (or ``-m
benchmarks.scenarios.train_big``): a table 3x the memory a memory cgroup (v1,
/sys/fs/cgroup/memory; root) lets the process use, its pages evicted first
(posix_fadvise DONTNEED) so that the group is charged for what it reads; Zipf 1.05 ids; a
row cache of 20% of the rows.  Against the in-RAM baseline, nn.Embedding(sparse=True) +
optim.Adagrad, the same ids, without the cgroup (where the table fits).

The two sides are two long-lived child processes (embstore inside the cgroup, PyTorch
outside it), each warmed up first (embstore until its row cache is full, PyTorch a few
steps).  Then they alternate: one runs a block of ``block`` steps while the other waits
(blocked on its pipe, idle), ``rounds`` rounds, the order swapped every round (ABBA), the
same ids on both sides.  Each round gives a ratio of the two sides' median step; the
result is the median over rounds.  embstore's steps are broken down (the row cache's
miss reads, evictions and their write-backs, waits for a prefetch, forward/backward).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # (run as a file: the repository on the path)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import data  # noqa: E402

BIG = {"rows": 6_291_456, "dim": 128, "ids": 8192, "limit": 1 << 30, "cache_fraction": 0.2,
       "fill_steps": 1500, "block": 50, "rounds": 8, "torch_warmup": 20}
CGROUP = Path("/sys/fs/cgroup/memory")
MIB = 1 << 20


def _status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) << 10
    return out


def _io() -> dict:
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v)
    return out


def _own_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctl, rel = line.split(":", 2)
        if "memory" in ctl.split(",") and rel not in ("", "/"):
            return CGROUP / rel.lstrip("/")
    return None


class _Sampler:
    """Peak RSS (anonymous, file) and the memory cgroup's usage sampled every 0.2 s."""

    def __init__(self, every: float = 0.2):
        self.peak: dict = {}
        self._stop = threading.Event()
        self._grp = _own_cgroup()
        self._t = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._t.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            got = _status()
            if self._grp is not None:
                got["cg_usage"] = int((self._grp / "memory.usage_in_bytes").read_text())
            for k, v in got.items():  # a loop per figure (a handful)
                self.peak[k] = max(self.peak.get(k, 0), v)

    def reset(self) -> None:
        self.peak = {}

    def stop(self) -> dict:
        self._stop.set()
        self._t.join()
        return self.peak


class _Timed:
    """Wraps ``obj.name`` to add the seconds its calls take to ``acc[key]``."""

    def __init__(self, acc: dict, key: str, obj, name: str):
        fn = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
        setattr(obj, name, timed)


def _serve(step, ready: dict, extra=None) -> None:
    """The child's loop: ``ready`` printed, then one JSON line per command read from stdin
    (``{"run": [start, k]}``: steps start..start+k-1, their times; ``{"end": 1}``)."""
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:  # a loop per command
        cmd = json.loads(line)
        if "run" in cmd:
            a, k = cmd["run"]
            print(json.dumps(step(a, k)), flush=True)
        else:
            print(json.dumps(extra() if extra is not None else {}), flush=True)
            return


def _child_torch(ids_path: str, rows: int, dim: int, warm: int) -> None:
    import torch
    torch.manual_seed(0)
    ids = np.load(ids_path, mmap_mode="r")
    ref = torch.nn.Embedding(rows, dim, sparse=True)
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.01)

    def one(b) -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        ref(torch.from_numpy(np.ascontiguousarray(b))).pow(2).sum().backward()
        opt.step()
        return time.perf_counter() - t0

    for i in range(warm):  # a loop per warm-up step
        one(ids[i % len(ids)])

    def block(a: int, k: int) -> dict:
        return {"step_s": [one(ids[i]) for i in range(a, a + k)], "rss": _status()}
    _serve(block, {"ready": True, "rss": _status()})


def _child_embstore(table: str, ids_path: str, fill: int, cache_fraction: float) -> None:
    import torch

    import embstore
    import embstore.torch as et
    ids = np.load(ids_path, mmap_mode="r")  # (the page cache's: not the process's memory)
    t = embstore.open(table, mode="r+", cache_bytes=0)
    rows, dim = t.shape
    cache_bytes = int(cache_fraction * rows) * (4 * (dim + 1) + 17)
    emb = et.Embedding(t, optimizer="rowwise_adagrad", lr=0.01, row_cache_bytes=cache_bytes)
    tr = emb.trainer
    cache = tr.cache
    acc: dict = {}
    _Timed(acc, "evict_s", cache, "_evict")  # (its write-back included)
    _Timed(acc, "write_back_s", cache, "_write")
    _Timed(acc, "miss_load_s", cache, "_load")  # (rows from the staging buffer or the table)
    _Timed(acc, "prefetch_wait_s", tr.prefetcher, "wait")
    _Timed(acc, "prefetch_start_s", tr.prefetcher, "start")
    _Timed(acc, "prefetch_read_s", tr.prefetcher, "_read")  # (in its thread: overlapped)
    _Timed(acc, "apply_s", tr, "apply")  # (in the backward: the optimizer on the rows)

    def one(i: int, nxt: int | None) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        out = emb(torch.from_numpy(np.ascontiguousarray(ids[i])))
        t1 = time.perf_counter()
        if nxt is not None:
            emb.prefetch(torch.from_numpy(np.ascontiguousarray(ids[nxt])))
        t2 = time.perf_counter()
        out.pow(2).sum().backward()
        del out
        t3 = time.perf_counter()
        return t3 - t0, t1 - t0, t3 - t2

    filled_at = fill
    for i in range(fill):  # a loop per warm-up step: the row cache fills
        one(i, i + 1)
        if len(cache) >= cache.capacity * 0.99:
            filled_at = i + 1
            break
        if i % 200 == 0:
            print(f"fill step {i}: {len(cache)} rows cached", file=sys.stderr, flush=True)
    for i in range(filled_at, filled_at + 50):  # a loop per step: evictions under way
        one(i, i + 1)
    mem = _Sampler()

    def block(a: int, k: int) -> dict:
        acc.clear()
        mem.reset()
        s0, io0, ru0 = dict(cache.stats), _io(), resource.getrusage(resource.RUSAGE_SELF)
        grp = _own_cgroup()
        fail0 = int((grp / "memory.failcnt").read_text()) if grp else 0
        steps, fwd, bwd = [], [], []
        for i in range(a, a + k):  # a loop per step
            s, f, b = one(i, i + 1 if i + 1 < a + k else None)
            steps.append(s)
            fwd.append(f)
            bwd.append(b)
        io1, ru1 = _io(), resource.getrusage(resource.RUSAGE_SELF)
        acc["cpu_user_s"] = ru1.ru_utime - ru0.ru_utime
        acc["cpu_sys_s"] = ru1.ru_stime - ru0.ru_stime
        return {"minflt": (ru1.ru_minflt - ru0.ru_minflt) / k,
                "majflt": (ru1.ru_majflt - ru0.ru_majflt) / k,"step_s": steps, "forward_s": fwd, "backward_s": bwd,
                "parts_s": {key: v / k for key, v in acc.items()},
                "stats": {key: (cache.stats[key] - s0[key]) / k for key in s0},
                "read_bytes": (io1["read_bytes"] - io0["read_bytes"]) / k,
                "write_bytes": (io1["write_bytes"] - io0["write_bytes"]) / k,
                "failcnt": (int((grp / "memory.failcnt").read_text()) - fail0) if grp else 0,
                "peak": dict(mem.peak), "rss": _status()}

    def end() -> dict:
        peak = mem.stop()
        t0 = time.perf_counter()
        version = emb.checkpoint()
        ck = time.perf_counter() - t0
        got = {"filled_at": filled_at, "cache_bytes": cache_bytes, "cache_nbytes": cache.nbytes,
               "version": version, "checkpoint_s": ck, "peak": peak, "final": _status(),
               "stats": dict(cache.stats)}
        emb.close()
        t.close()
        return got
    _serve(block, {"ready": True, "filled_at": filled_at, "rss": _status()}, end)


class _Child:
    def __init__(self, args: list[str], group: Path | None, log_path: Path):
        cmd = [sys.executable, "-m", "benchmarks.scenarios.train_big", "--child", *args]
        pre = None
        if group is not None:
            procs = str(group / "cgroup.procs")

            def pre():  # in the child, before exec: torch's memory is charged to the group
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
        self.err = open(log_path, "w")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, preexec_fn=pre,
                                  cwd=str(Path(__file__).resolve().parents[2]))
        self.log_path = log_path

    def reply(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            self.p.wait()
            raise RuntimeError(f"child failed ({self.p.returncode}): "
                               f"{self.log_path.read_text()[-3000:]}")
        return json.loads(line)

    def ask(self, cmd: dict) -> dict:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self.reply()

    def close(self) -> None:
        try:
            self.p.stdin.close()
        except OSError:
            pass
        self.p.wait(timeout=600)
        self.err.close()


def _evict(path: Path) -> None:
    for f in path.rglob("*"):  # a loop per file of the table
        if f.is_file() and not f.is_symlink():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _base(work: Path, rows: int, dim: int) -> Path:
    import embstore
    base = work / f"base-{rows}x{dim}.embstore"
    if not base.exists():  # rows stored (create(init=) writes none: they would be generated)
        lazy = work / "lazy.embstore"
        embstore.create(lazy, shape=(rows, dim), init={"kind": "normal", "seed": 1},
                        overwrite=True).close()
        with embstore.open(lazy, cache_bytes=0) as src:
            embstore.save(base, src, cache_bytes=0).close()
        shutil.rmtree(lazy)
    return base


def larger_than_ram(work: Path, out: Path, cfg: dict) -> dict:
    import embstore
    rows, dim = cfg["rows"], cfg["dim"]
    base = _base(work, rows, dim)
    table = work / "train.embstore"
    if table.exists():
        shutil.rmtree(table)
    # hard links: a commit writes new files and renames them in; no file changes in place
    subprocess.run(["cp", "-al", str(base), str(table)], check=True)
    timed = cfg["block"] * cfg["rounds"]
    n_steps = cfg["fill_steps"] + 50 + timed + 1
    ids = data.ids(rows, (n_steps, cfg["ids"]), "zipf1.05", seed=5)
    np.save(work / "ids.npy", ids)
    files = {(st.st_ino, st.st_size) for st in (f.lstat() for f in base.rglob("*"))
             if stat.S_ISREG(st.st_mode)}  # (each file once: versions are hard links)
    table_bytes = sum(size for _, size in files)
    group = CGROUP / f"embstore-train-{os.getpid()}"
    group.mkdir()
    load = [os.getloadavg()]
    kids: list[_Child] = []
    try:
        (group / "memory.limit_in_bytes").write_text(str(cfg["limit"]))
        _evict(table)
        ours = _Child(["embstore", str(table), str(work / "ids.npy"), str(cfg["fill_steps"]),
                       str(cfg["cache_fraction"])], group, work / "embstore.err")
        kids.append(ours)
        ready = ours.reply()
        theirs = _Child(["torch", str(work / "ids.npy"), str(rows), str(dim),
                         str(cfg["torch_warmup"])], None, work / "torch.err")
        kids.append(theirs)
        theirs.reply()
        start = ready["filled_at"] + 50  # (the steps the embstore child ran before timing)
        load.append(os.getloadavg())
        rounds = []
        for r in range(cfg["rounds"]):  # a loop per round, the two sides alternated
            a = start + r * cfg["block"]
            cmd = {"run": [a, cfg["block"]]}
            if r % 2 == 0:
                e, p = ours.ask(cmd), theirs.ask(cmd)
            else:
                p, e = theirs.ask(cmd), ours.ask(cmd)
            rounds.append({"embstore": e, "torch": p, "load": os.getloadavg()})
            print(f"round {r}: embstore {1 / np.median(e['step_s']):.1f} steps/s, torch "
                  f"{1 / np.median(p['step_s']):.1f} steps/s; parts {e['parts_s']}",
                  file=sys.stderr, flush=True)
        theirs.ask({"end": 1})
        final = ours.ask({"end": 1})
        cg = {"peak": int((group / "memory.max_usage_in_bytes").read_text()),
              "failcnt": int((group / "memory.failcnt").read_text())}
        load.append(os.getloadavg())
    finally:
        for k in kids:  # a loop per child (two)
            if k.p.poll() is None:
                k.p.kill()
            k.close()
        group.rmdir()
    ok = embstore.verify(table).ok
    return _report(cfg, rounds, ready, final, cg, table_bytes, ok, load, out)


def _pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, float), q))


def _report(cfg, rounds, ready, final, cg, table_bytes, verified, load, out: Path) -> dict:
    per = []
    for r in rounds:  # a loop per round
        e, p = r["embstore"], r["torch"]
        per.append({"embstore_steps_s": 1 / np.median(e["step_s"]),
                    "torch_steps_s": 1 / np.median(p["step_s"]),
                    "embstore_mean_steps_s": len(e["step_s"]) / sum(e["step_s"]),
                    "torch_mean_steps_s": len(p["step_s"]) / sum(p["step_s"]),
                    "load1": r["load"][0]})
        per[-1]["ratio"] = per[-1]["embstore_steps_s"] / per[-1]["torch_steps_s"]
        per[-1]["ratio_mean"] = per[-1]["embstore_mean_steps_s"] / per[-1]["torch_mean_steps_s"]
    es = [s for r in rounds for s in r["embstore"]["step_s"]]
    ts = [s for r in rounds for s in r["torch"]["step_s"]]
    keys = sorted({k for r in rounds for k in r["embstore"]["parts_s"]})
    parts = {k: float(np.mean([r["embstore"]["parts_s"].get(k, 0.0) for r in rounds]))
             for k in keys}
    parts["forward_s"] = float(np.mean([np.mean(r["embstore"]["forward_s"]) for r in rounds]))
    parts["backward_s"] = float(np.mean([np.mean(r["embstore"]["backward_s"])
                                         for r in rounds]))
    stats = {k: float(np.mean([r["embstore"]["stats"][k] for r in rounds]))
             for k in rounds[0]["embstore"]["stats"]}
    anon = max(r["embstore"]["peak"].get("RssAnon", 0) for r in rounds)
    vmrss = max(r["embstore"]["peak"].get("VmRSS", 0) for r in rounds)
    res = {"config": cfg, "table_bytes": table_bytes, "verified": verified,
           "rounds": per, "ratio_median": float(np.median([x["ratio"] for x in per])),
           "ratio_mean_median": float(np.median([x["ratio_mean"] for x in per])),
           "embstore_step_ms": [_pct(es, q) * 1e3 for q in (50, 90, 99, 100)],
           "torch_step_ms": [_pct(ts, q) * 1e3 for q in (50, 90, 99, 100)],
           "embstore_parts_ms": {k: v * 1e3 for k, v in parts.items()},
           "cache_per_step": stats,
           "read_mib_per_step": float(np.mean([r["embstore"]["read_bytes"] for r in rounds]))
           / MIB,
           "write_mib_per_step": float(np.mean([r["embstore"]["write_bytes"] for r in rounds]))
           / MIB,
           "failcnt_per_step": float(np.mean([r["embstore"]["failcnt"] for r in rounds]))
           / cfg["block"],
           "faults_per_step": {k: float(np.mean([r["embstore"][k] for r in rounds]))
                               for k in ("minflt", "majflt")},
           "peak_rss_anon": anon, "peak_vmrss": vmrss, "cgroup": cg, "ready": ready,
           "final": final, "torch_rss": rounds[-1]["torch"]["rss"], "load": load}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    lines = [
        f"# Training larger than memory, interleaved ({_dt.date.today().isoformat()})", "",
        f"`python -m benchmarks.scenarios.train --larger-than-ram`: {cfg['rows']:,} x "
        f"{cfg['dim']} float32 ({table_bytes / MIB:,.0f} MiB on disk) in a memory cgroup of "
        f"{cfg['limit'] / MIB:,.0f} MiB ({table_bytes / cfg['limit']:.1f}x), pages evicted "
        f"first; {cfg['ids']:,} Zipf 1.05 ids a step; row cache {cfg['cache_fraction']:.0%} "
        f"of the rows ({final['cache_nbytes'] / MIB:,.0f} MiB with the state), full at step "
        f"{ready['filled_at']}.  Two long-lived children (embstore in the cgroup, "
        f"nn.Embedding(sparse) + optim.Adagrad in RAM outside it), {cfg['rounds']} rounds of "
        f"{cfg['block']} steps each, alternated (ABBA), the same ids on both sides.", "",
        "| round | embstore steps/s | torch steps/s | ratio (median step) | ratio (mean) | "
        "load |", "|---|---|---|---|---|---|"]
    for i, x in enumerate(per):  # a loop per round
        lines.append(f"| {i} | {x['embstore_steps_s']:.1f} | {x['torch_steps_s']:.1f} | "
                     f"{x['ratio']:.2f} | {x['ratio_mean']:.2f} | {x['load1']:.1f} |")
    pm = res["embstore_parts_ms"]
    lines += [
        "", f"**Ratio {res['ratio_median']:.2f}x** (median over rounds of the median-step "
        f"ratio; {res['ratio_mean_median']:.2f}x on mean steps, write-backs included); bar "
        "0.5x.", "",
        "embstore step p50/p90/p99/max " + "/".join(f"{x:.1f}" for x in res["embstore_step_ms"])
        + " ms; torch " + "/".join(f"{x:.1f}" for x in res["torch_step_ms"]) + " ms.",
        "embstore's mean step, in parts (ms; nested: the miss loads and evictions are in "
        "the forward, the write-backs in the evictions): " +
        ", ".join(f"{k[:-2]} {v:.2f}" for k, v in pm.items()) + ".",
        "Per step: " + ", ".join(f"{k} {v:,.0f}" for k, v in stats.items()) +
        f"; read {res['read_mib_per_step']:.2f} MiB, wrote {res['write_mib_per_step']:.2f} MiB;"
        f" cgroup limit hits {res['failcnt_per_step']:,.0f}; page faults "
        f"{res['faults_per_step']['minflt']:,.0f} minor, "
        f"{res['faults_per_step']['majflt']:,.0f} major.",
        f"Memory: embstore peak RSS {vmrss / MIB:,.0f} MiB ({anon / MIB:,.0f} MiB anonymous; "
        f"row cache {final['cache_nbytes'] / MIB:,.0f} MiB); cgroup peak "
        f"{cg['peak'] / MIB:,.0f} MiB (page cache included); torch VmHWM "
        f"{res['torch_rss']['VmHWM'] / MIB:,.0f} MiB.  The final checkpoint "
        f"{final['checkpoint_s']:.1f} s (version {final['version']}); verified: {verified}.",
        "Load average (1, 5, 15 min): start " + "; ".join(", ".join(f"{x:.1f}" for x in la)
                                                         for la in load) + " (2 cores)."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="training a table larger than memory")
    p.add_argument("--work", type=Path, default=Path("/tmp/embstore-train-big"))
    p.add_argument("--out", type=Path, default=None, help="results file stem")
    p.add_argument("--rows", type=int, default=BIG["rows"])
    p.add_argument("--limit-mib", type=int, default=BIG["limit"] >> 20)
    p.add_argument("--fill-steps", type=int, default=BIG["fill_steps"])
    p.add_argument("--block", type=int, default=BIG["block"])
    p.add_argument("--rounds", type=int, default=BIG["rounds"])
    p.add_argument("--child", nargs="+")
    a = p.parse_args(argv)
    if a.child:
        kind, *rest = a.child
        if kind == "torch":
            _child_torch(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        else:
            _child_embstore(rest[0], rest[1], int(rest[2]), float(rest[3]))
        return
    cfg = {**BIG, "rows": a.rows, "limit": a.limit_mib << 20, "fill_steps": a.fill_steps,
           "block": a.block, "rounds": a.rounds}
    a.work.mkdir(parents=True, exist_ok=True)
    out = a.out or (Path(__file__).resolve().parents[1] / "results" /
                    f"{_dt.date.today().isoformat()}-train-larger-than-ram")
    larger_than_ram(a.work, out, cfg)
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()

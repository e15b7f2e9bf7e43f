"""Work measured in fresh child processes (``child.py``): open times, imports, batch jobs.

A new interpreter for every run, so that open times are a cold process's and
peak RSS is the process's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .common import (BENCH, ROOT, Measurement, ScenarioResult, Skip, Warmer, fmt, log,
                     spread)


class ChildError(RuntimeError):
    pass


def run_child(kind: str, *args, timeout: float = 3600.0) -> dict:
    """Run ``child.py KIND ARGS`` in a fresh interpreter; returns its result dict.

    The dict holds what the child measured itself (``seconds``: the work, after
    its imports) plus ``wall_s`` (the whole process) and ``peak_rss_mb``: the
    child's peak resident set size as it reads it itself (``VmHWM``; the
    ``wait4`` figure would include the parent's pages at fork time), plus the
    peaks of worker processes it reports (``worker_peak_rss_mb``), summed.
    """
    with tempfile.TemporaryDirectory(prefix="embstore-bench-child-") as d:
        result = Path(d) / "result.json"
        cmd = [sys.executable, str(BENCH / "child.py"), kind, str(result), *map(str, args)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        with open(Path(d) / "stdout", "wb") as out, open(Path(d) / "stderr", "wb") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=d)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise ChildError(f"{kind}: timed out after {timeout:.0f} s") from None
            wall = time.perf_counter() - t0
        if proc.returncode != 0 or not result.exists():
            tail = (Path(d) / "stderr").read_text(errors="replace").strip().splitlines()[-5:]
            raise ChildError(f"{kind} exited with {proc.returncode}: " + " | ".join(tail))
        data = json.loads(result.read_text())
    if data.get("skip"):
        raise Skip(data["skip"])
    data["wall_s"] = wall
    data["peak_rss_mb"] = data.pop("self_peak_rss_mb") + sum(data.get("worker_peak_rss_mb", ()))
    return data


def child_method_runs(res: ScenarioResult, case: str, runs: dict[str, tuple[str, Callable[[], dict]]],
                      *, reps: int, warmer: Warmer | None = None, before: Callable[[], Any] | None = None,
                      check: Callable[[str, dict], None] | None = None,
                      max_reps: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """Interleaved repetitions of child-process runs ``name -> (kind, call)``.

    ``max_reps`` caps slow methods (their runs spread over the repetitions).
    Every call returns a ``run_child`` dict.  Adds three Measurements per method:
    the work's time (``s``), the whole process (``wall s``) and peak RSS (``MB``).
    """
    done: dict[str, list[dict]] = {name: [] for name in runs}
    failed: set[str] = set()
    names = list(runs)
    when = {n: spread(reps, (max_reps or {}).get(n, reps)) for n in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if name in failed or r not in when[name]:
                continue
            if warmer is not None:
                warmer.warm()
            if before is not None:
                before()
            try:
                data = runs[name][1]()
                if check is not None and not done[name]:
                    check(name, data)
            except Skip as exc:
                failed.add(name)
                res.notes.append(f"{case}: {name}: skipped: {exc}")
                log(f"  {case}: {name}: skipped: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001
                failed.add(name)
                res.notes.append(f"{case}: {name}: ERROR {type(exc).__name__}: {exc}")
                log(f"  {case}: {name}: ERROR {type(exc).__name__}: {exc}")
                continue
            done[name].append(data)
    for name, datas in done.items():
        if not datas:
            continue
        kind = runs[name][0]
        extra = {k: v for k, v in datas[-1].items()
                 if k not in ("seconds", "wall_s", "peak_rss_mb", "checksum", "rows", "ids",
                              "cpu_seconds")}
        for suffix, key, unit in (("", "seconds", "s"), (" [whole process]", "wall_s", "s"),
                                  (" [peak RSS]", "peak_rss_mb", "MB")):
            meas = Measurement(case, name + suffix, kind, unit, [float(d[key]) for d in datas],
                               extra if not suffix else {})
            res.measurements.append(meas)
        m = res.find(case, name)
        log(f"  {case}: {name}: {fmt(m.median, 's')}, peak RSS "
            f"{fmt(res.find(case, name + ' [peak RSS]').median, 'MB')} (n={len(datas)})")
    return done

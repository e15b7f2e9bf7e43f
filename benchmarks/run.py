"""Benchmark embstore side by side with its peers, in one run, on the same data.

    python benchmarks/run.py                    # full run (about half an hour on 2 cores)
    python benchmarks/run.py --quick            # smaller tables, fewer repetitions (~2 min)
    python benchmarks/run.py --only lookup,keys --data-dir /tmp/bench-data

Synthetic data is generated deterministically under ``--data-dir`` (default: a
temporary folder, removed at the end) and reused by later runs that name the
same folder.  Writes ``<out>/<date>.json`` and ``<out>/<date>.md`` plus
``<out>/latest.md`` (``-quick``/``-smoke`` in the names for the smaller modes);
``<out>`` defaults to ``benchmarks/results``.  Exit status 1 if any scenario or
method failed (a missing module or peer is a skip, not a failure).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `embstore` importable
    _root = str(Path(__file__).resolve().parent.parent)
    if _root not in sys.path:
        sys.path.insert(0, _root)
    __package__ = "benchmarks"  # noqa: A001

from .common import ROOT, ScenarioResult, Skip, log  # noqa: E402
from .report import render  # noqa: E402

IDS = [32, 512]

CONFIGS = {
    "full": {
        "lookup": {"rows": 1_000_000, "dim": 256, "ids": IDS, "reps": 15, "slow_reps": 3,
                   "ts_reps": 5, "batches": 4},
        "scale": {"rows": [100_000, 1_000_000, 10_000_000], "dim": 64, "ids": IDS, "reps": 11,
                  "batches": 4, "note": "dim 64, not 256, so that the 10,000,000-row table "
                  "(2.6 GB) fits in RAM for the np.take reference and in the page cache"},
        "open": {"rows": 1_000_000, "dim": 100, "reps": 5, "slow_reps": 2},
        "keys": {"rows": 1_000_000, "dim": 100, "n": 100_000, "reps": 11},
        "import": {"rows": 1_000_000, "dim": 100, "reps": 2, "gensim_text_export_reps": 1},
        "import-compressed": {"rows": 1_000_000, "dim": 100, "reps": 2},
        "batch": {"rows": 1_000_000, "dim": 64, "ids": 8192 * 512, "reps": 2, "workers": [1, 2]},
        "parquet": {"rows": 1_000_000, "dim": 64, "ids": 20_000_000, "reps": 2, "workers": [2],
                    "encode_ids": 2_000_000, "encode_reps": 3},
        "limits": {"copy_bytes": 1 << 30, "file_rows": 1_000_000, "file_dim": 256, "reps": 5},
        "compact": {"rows": 1_000_000, "dim": 256, "ids": IDS, "reps": 15, "batches": 4,
                    "cold_batches": 3},
        "ooc": {"tables": [(8_388_608, 64), (2_097_152, 256), (100_000, 64), (1_000_000, 64),
                           (33_554_432, 64), (131_072, 4096)], "ids": 16384, "batches": 4,
                "warm_reps": 7, "zstd_table": (1_000_000, 256)},
        # issue 33's table is 90M x 64 with a 2 GiB cache; scaled to 20M x 64 (5.1 GB) and
        # the same cached fraction of the table (2 GiB x 20 / 90 = 455 MiB)
        "ooc-zipf": {"rows": 20_000_000, "dim": 64, "ids": 16384, "cache_bytes": 477_218_588,
                     "warmup": 6, "batches": 8, "steady": 30},
        "remote": {"rows": [100_000, 1_000_000], "dim": 256, "ids": IDS, "reps": 7,
                   "slow_reps": 3, "sparse_ids": 256},
        "waits": {"rows": 1_000_000, "dim": 256, "reps": 5, "startup_reps": 7, "warm_reps": 7,
                  "w2v_rows": 300_000},
        "format2": {"rows": 1_000_000, "dim": 256, "reps": 5, "slow_reps": 1,
                    "big_rows": 100_000_000},
        "changes": {"rows": 1_000_000, "dim": 256, "reps": 3, "update_rows": 10_000,
                    "append_rows": 100_000},
        "train": {"rows": 2_000_000, "dim": 128, "ids": 8192, "steps": 10, "reps": 5},
        "save": {"rows": 1_000_000, "dim": 256, "reps": 3},
        "scans": {"rows": 1_000_000, "dim": 256, "reps": 7, "cold_reps": 3},
        "search": {"rows": 1_000_000, "dim": 256, "reps": 5, "batch": 32, "ann_rows": 1_000_000,
                   "ann_dim": 256, "clusters": 1000, "queries": 200, "ef": None,
                   "connectivity": 16, "expansion_add": 64, "peer_rows": 50_000,
                   "minilm": True},
    },
    "quick": {
        "lookup": {"rows": 100_000, "dim": 256, "ids": IDS, "reps": 5, "slow_reps": 1,
                   "ts_reps": 2, "batches": 2},
        "scale": {"rows": [10_000, 100_000, 1_000_000], "dim": 32, "ids": IDS, "reps": 5,
                  "batches": 2},
        "open": {"rows": 50_000, "dim": 100, "reps": 3, "slow_reps": 1},
        "keys": {"rows": 50_000, "dim": 100, "n": 100_000, "reps": 5},
        "import": {"rows": 50_000, "dim": 100, "reps": 1},
        "import-compressed": {"rows": 50_000, "dim": 100, "reps": 1},
        "batch": {"rows": 100_000, "dim": 64, "ids": 1024 * 512, "reps": 1, "workers": [1, 2]},
        "parquet": {"rows": 100_000, "dim": 64, "ids": 1_000_000, "reps": 1, "workers": [],
                    "encode_ids": 500_000, "encode_reps": 3},
        "limits": {"copy_bytes": 256 << 20, "file_rows": 100_000, "file_dim": 256, "reps": 3},
        "compact": {"rows": 100_000, "dim": 256, "ids": IDS, "reps": 5, "batches": 2,
                    "cold_batches": 2},
        "ooc": {"tables": [(262_144, 64)], "ids": 4096, "batches": 2, "warm_reps": 5,
                "zarr": False, "zstd_table": (65_536, 256)},
        "ooc-zipf": {"rows": 1_000_000, "dim": 64, "ids": 16384, "cache_bytes": 23_860_929,
                     "warmup": 3, "batches": 4, "steady": 5},
        "remote": {"rows": 100_000, "dim": 256, "ids": [32, 128], "reps": 3, "slow_reps": 1,
                   "sparse_ids": 64},
        "waits": {"rows": 100_000, "dim": 256, "reps": 3, "startup_reps": 3, "warm_reps": 4,
                  "w2v_rows": 50_000},
        "format2": {"rows": 100_000, "dim": 256, "reps": 3, "slow_reps": 1,
                    "big_rows": 10_000_000},
        "train": {"rows": 200_000, "dim": 128, "ids": 8192, "steps": 5, "reps": 3},
        "changes": {"rows": 100_000, "dim": 256, "reps": 2, "update_rows": 1_000,
                    "append_rows": 10_000},
        "save": {"rows": 100_000, "dim": 256, "reps": 2},
        "scans": {"rows": 100_000, "dim": 256, "reps": 3, "cold_reps": 2},
        "search": {"rows": 50_000, "dim": 256, "reps": 3, "batch": 32, "ann_rows": 10_000,
                   "ann_dim": 32, "clusters": 50, "queries": 50, "ef": None, "connectivity": 16,
                   "expansion_add": 64, "peer_rows": 2_000, "minilm": False},
    },
    "smoke": {  # the test suite's run: every code path, tiny sizes, not a measurement
        "lookup": {"rows": 5_000, "dim": 16, "ids": [4, 64], "reps": 2, "slow_reps": 1,
                   "ts_reps": 1, "batches": 2},
        "scale": {"rows": [1_000, 10_000], "dim": 8, "ids": [4, 64], "reps": 2, "batches": 2},
        "open": {"rows": 2_000, "dim": 16, "reps": 1},
        "keys": {"rows": 2_000, "dim": 16, "n": 1_000, "reps": 2},
        "import": {"rows": 2_000, "dim": 16, "reps": 1},
        "import-compressed": {"rows": 2_000, "dim": 16, "reps": 1},
        "batch": {"rows": 5_000, "dim": 16, "ids": 16 * 512, "reps": 1, "workers": [1]},
        "parquet": {"rows": 5_000, "dim": 16, "ids": 20_000, "reps": 1, "workers": [],
                    "encode_ids": 5_000, "encode_reps": 1},
        "limits": {"copy_bytes": 16 << 20, "file_rows": 5_000, "file_dim": 16, "reps": 2},
        "compact": {"rows": 5_000, "dim": 16, "ids": [4, 64], "reps": 2, "batches": 2,
                    "cold_batches": 2},
        "ooc": {"tables": [(20_000, 16)], "ids": 256, "batches": 1, "warm_reps": 1,
                "zstd_table": (4_000, 16)},
        "ooc-zipf": {"rows": 20_000, "dim": 16, "ids": 256, "cache_bytes": 200_000,
                     "warmup": 1, "batches": 1, "steady": 1},
        "remote": {"rows": 5_000, "dim": 16, "ids": [4, 64], "reps": 2, "slow_reps": 1,
                   "sparse_ids": 8},
        "waits": {"rows": 5_000, "dim": 16, "reps": 1, "startup_reps": 1, "warm_reps": 2,
                  "w2v_rows": 2_000},
        "format2": {"rows": 5_000, "dim": 16, "reps": 2, "slow_reps": 1, "big_rows": 100_000},
        "train": {"rows": 5_000, "dim": 16, "ids": 256, "steps": 2, "reps": 1},
        "changes": {"rows": 5_000, "dim": 16, "reps": 2, "update_rows": 200,
                    "append_rows": 500},
        "save": {"rows": 2_000, "dim": 16, "reps": 1},
        "scans": {"rows": 5_000, "dim": 16, "reps": 2, "cold_reps": 1},
        "search": {"rows": 5_000, "dim": 16, "reps": 2, "batch": 4, "ann_rows": 2_000,
                   "ann_dim": 16, "clusters": 20, "queries": 10, "ef": None, "connectivity": 8,
                   "expansion_add": 32, "peer_rows": 500, "minilm": False},
    },
}


@dataclasses.dataclass
class Ctx:
    mode: str
    cfg: dict
    data_dir: Path
    scratch: Path


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"cpu_count": os.cpu_count(), "cpu_model": model, "memory_gb": mem / 1e9,
            "platform": platform.platform(), "python": platform.python_version()}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for d in ("numpy", "zarr", "numcodecs", "tensorstore", "gensim", "dask", "distributed",
              "psutil", "pyarrow"):
        out[d] = _version(d)
    return out


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "embstore"], cwd=ROOT,
                               text=True, capture_output=True, check=True).stdout.strip()
        return head + ("+local changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse(argv=None) -> argparse.Namespace:
    from .scenarios import SCENARIOS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller tables, fewer repetitions")
    size.add_argument("--smoke", action="store_true", help="tiny sizes: checks the code runs")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help=f"run only these scenarios (repeatable or comma list): {', '.join(SCENARIOS)}")
    p.add_argument("--data-dir", type=Path, help="where synthetic data is built and reused "
                   "(default: a temporary folder, removed at the end)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                   help="folder for the JSON and Markdown results")
    args = p.parse_args(argv)
    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    args.names = [n for n in SCENARIOS if n in names] if names else list(SCENARIOS)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    return args


def main(argv=None) -> int:
    from .scenarios import SCENARIOS

    args = parse(argv)
    own_data = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="embstore-bench-")) if own_data else args.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=data_dir))
    ctx = Ctx(args.mode, CONFIGS[args.mode], data_dir, scratch)
    date = _dt.date.today().isoformat()
    run = {"date": date, "mode": args.mode,
           "command": " ".join(["python benchmarks/run.py",
                                *(sys.argv[1:] if argv is None else argv)]),
           "machine": machine(), "versions": versions(), "commit": commit(),
           "config": {n: ctx.cfg[n] for n in args.names}, "scenarios": []}
    failed = False
    t_run = time.perf_counter()
    try:
        for name in args.names:
            mod = SCENARIOS[name]
            res = ScenarioResult(name, mod.TITLE)
            log(f"{name}: {mod.TITLE}")
            t0 = time.perf_counter()
            try:
                mod.run(ctx, res)
            except Skip as exc:
                res.status = "skipped"
                res.notes.append(f"skipped: {exc}")
                log(f"{name}: skipped: {exc}")
            except Exception as exc:  # noqa: BLE001 - report it and go on with the others
                res.status = "error"
                res.notes.append(f"ERROR {type(exc).__name__}: {exc}")
                traceback.print_exc()
            res.seconds = time.perf_counter() - t0
            failed |= res.status == "error" or any("ERROR" in n for n in res.notes)
            run["scenarios"].append(res.to_json())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if own_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    run["seconds"] = round(time.perf_counter() - t_run, 1)
    suffix = "" if args.mode == "full" else f"-{args.mode}"
    args.out.mkdir(parents=True, exist_ok=True)
    js, md = args.out / f"{date}{suffix}.json", args.out / f"{date}{suffix}.md"
    js.write_text(json.dumps(run, indent=1) + "\n")
    text = render(run)
    md.write_text(text)
    (args.out / f"latest{suffix}.md").write_text(text)
    log(f"wrote {js} and {md} ({run['seconds']:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU seconds per test, per file and for collection (issue 43: test times measured honestly).

On a loaded machine wall time is noise; the CPU seconds of the process plus its waited children
are not.  With ``EMBSTORE_TEST_CPU=DIR`` set, tests/conftest.py loads these hooks and every
pytest process (each xdist worker too) writes ``DIR/cpu-<worker>-<pid>.json``: the CPU seconds
of its start-up and collection, and of each test's setup, call and teardown (a module or
session fixture is paid by the first test that needs it, so sum per file).  Then

    python tests/cputimes.py DIR [--top N]

prints the totals, the files by CPU and the N costliest tests.  Children count once waited
(``RUSAGE_CHILDREN``): a subprocess a test kills and reaps is charged to that test; so is
a child forked from tests/forked.py's fork server (the server's CPU, its waited children's
included, is read from ``/proc``).
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_STATE: dict = {"tests": {}}


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + _fork_server_cpu()


def _fork_server_cpu() -> float:
    """The CPU seconds of tests/forked.py's fork server while it runs, its children's
    included (it waits for each as it exits): /proc/PID/stat's utime, stime, cutime and
    cstime.  (Once the server is stopped and waited for, at exit, it counts in
    RUSAGE_CHILDREN instead.)"""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _phase(item, name: str):
    c0, w0 = _cpu(), time.perf_counter()
    yield
    row = _STATE["tests"].setdefault(
        item.nodeid, {"cpu": {}, "wall": 0.0, "slow": item.get_closest_marker("slow") is not None})
    row["cpu"][name] = round(_cpu() - c0, 4)
    row["wall"] = round(row["wall"] + time.perf_counter() - w0, 4)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _phase(item, "teardown")


def pytest_collection(session):
    _STATE["collect_start"] = _cpu()


def pytest_collection_finish(session):
    _STATE["collect"] = round(_cpu() - _STATE.get("collect_start", 0.0), 4)
    _STATE["startup_and_collect"] = round(_cpu(), 4)  # process CPU from exec to here


def pytest_sessionfinish(session):
    out = Path(os.environ["EMBSTORE_TEST_CPU"])
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _STATE["total"] = round(_cpu(), 4)
    (out / f"cpu-{worker}-{os.getpid()}.json").write_text(json.dumps(_STATE))


def summarise(folder: Path, top: int = 40) -> str:
    tests: dict[str, float] = {}
    slow: set[str] = set()
    collect = startup = total = 0.0
    workers = 0
    for f in sorted(folder.glob("cpu-*.json")):
        data = json.loads(f.read_text())
        if f.name.startswith("cpu-main-") and not data["tests"]:
            continue  # the xdist controller: it runs no tests
        workers += 1
        collect += data.get("collect", 0.0)
        startup += data.get("startup_and_collect", 0.0)
        total += data.get("total", 0.0)
        for nodeid, row in data["tests"].items():
            tests[nodeid] = tests.get(nodeid, 0.0) + sum(row["cpu"].values())
            if row.get("slow"):
                slow.add(nodeid)
    per_file: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for nodeid, cpu in tests.items():
        name = nodeid.split("::")[0]
        per_file[name] += cpu
        count[name] += 1
    lines = [f"{workers} processes, {len(tests)} tests: total CPU {total:.1f} s, in tests "
             f"{sum(tests.values()):.1f} s, start-up + collection {startup:.1f} s "
             f"(collection alone {collect:.1f} s); slow-marked {len(slow)} tests "
             f"{sum(tests[n] for n in slow):.1f} s", "", "CPU-s  fast-s  tests  file"]
    fast_file: dict[str, float] = defaultdict(float)
    for nodeid, cpu in tests.items():
        if nodeid not in slow:
            fast_file[nodeid.split("::")[0]] += cpu
    for name, cpu in sorted(per_file.items(), key=lambda kv: -kv[1]):
        lines.append(f"{cpu:6.1f} {fast_file[name]:6.1f} {count[name]:6d}  {name}")
    lines += ["", f"the {top} costliest tests (CPU-s, setup + call + teardown)"]
    for nodeid, cpu in sorted(tests.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{cpu:6.2f}{' slow' if nodeid in slow else '     '}  {nodeid}")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    n = 40
    if "--top" in args:
        i = args.index("--top")
        n = int(args[i + 1])
        del args[i:i + 2]
    print(summarise(Path(args[0]), n))

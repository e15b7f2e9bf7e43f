"""Helpers of the reliability suite: hostile inputs, damaged stores, killed writers.

``EMBSTORE_FUZZ_EXAMPLES`` sets hypothesis' ``max_examples`` per test (default 25, which
keeps the default run fast on 2 cores); ``EMBSTORE_KILL_POINTS`` the number of random kill
points per killed-writer test (default 4).  Every test that tries malformed inputs or kill
points records how many it tried in :data:`TRIED`; the counts are printed at the end of
the run (and written as JSON to ``$EMBSTORE_RELIABILITY_REPORT`` when set).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, settings

from embstore.cli import cli

REPO = Path(__file__).resolve().parents[2]
FUZZ_EXAMPLES = int(os.environ.get("EMBSTORE_FUZZ_EXAMPLES", "25"))
KILL_POINTS = int(os.environ.get("EMBSTORE_KILL_POINTS", "4"))
TRIED: collections.Counter = collections.Counter()

FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def table_dirs(path: Path) -> list[Path]:
    """The table at ``path`` and its newest version's snapshot directory, if it has one
    (readers read the snapshot; Zarr readers and copies made file by file, the live tree):
    a damage test damages both."""
    versions = Path(path) / "vectors" / ".embstore" / "versions"
    found = sorted((int(p.name), p) for p in versions.glob("*") if p.name.isdigit()) \
        if versions.is_dir() else []
    return [Path(path)] + ([found[-1][1]] if found else [])


@contextmanager
def time_limit(seconds: float, what: str):
    """Fail (instead of hanging) when the block runs longer than ``seconds``."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"{what} took longer than {seconds} s (a hang?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def tmpfs(mnt: Path, size: int):
    """A tmpfs of ``size`` bytes mounted at the new directory ``mnt`` for the block (needs
    root: the test is skipped otherwise), unmounted after it."""
    import pytest

    mnt.mkdir()
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                             capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def invoke(args: list[str], *, seconds: float = 30):
    """Run the ``embstore`` CLI in-process (click's CliRunner) under a time limit."""
    with time_limit(seconds, "embstore " + " ".join(args[:1])):
        return CliRunner().invoke(cli, [str(a) for a in args])


def assert_clean_error(result, *, context: str = "") -> str:
    """Exit 1 with one ``Error: ...`` line and no traceback; returns the message."""
    exc = result.exception
    crashed = exc is not None and not isinstance(exc, SystemExit)
    assert not crashed, f"{context}: crashed with {exc!r}\n{result.output}"
    assert result.exit_code == 1, f"{context}: exit {result.exit_code}\n{result.output}"
    assert "Traceback" not in result.output, f"{context}:\n{result.output}"
    lines = [ln for ln in result.output.splitlines() if ln.startswith("Error: ")]
    assert lines, f"{context}: no 'Error:' line in\n{result.output}"
    return lines[0]


def assert_nothing_left(directory: Path, *, keep: set[str], dest_name: str = "dest") -> None:
    """Only ``keep`` remains in ``directory``: no DEST, no ``DEST.tmp-*``/``.old-*`` leftovers."""
    left = set(os.listdir(directory)) - set(keep)
    assert not left, f"left behind next to {dest_name}: {sorted(left)}"


class Scratch:
    """Fresh directories under one session directory (usable inside hypothesis tests)."""

    def __init__(self, root: Path):
        self.root = root

    def new(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.root))

    def drop(self, d: Path) -> None:
        shutil.rmtree(d, ignore_errors=True)


def run_cli_subprocess(args: list[str], *, timeout: float = 60, address_space: int | None = None,
                       env: dict | None = None) -> subprocess.CompletedProcess:
    """``embstore ARGS`` in a fresh interpreter, optionally with RLIMIT_AS = ``address_space``."""
    limit = ""
    if address_space is not None:
        limit = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, "
                 f"({address_space}, {address_space})); ")
    code = limit + "import sys; from embstore.cli import cli; cli(sys.argv[1:], prog_name='embstore')"
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=str(REPO))

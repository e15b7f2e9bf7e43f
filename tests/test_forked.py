"""tests/forked.py, the fork server the crash, race and reader tests start their processes
from: a child is a process of its own (pid, SIGKILL), runs with the caller's environment,
working directory and arguments, and reports what ``python -c`` would."""

from __future__ import annotations

import os
import signal
import time

import forked


def test_a_child_is_a_process_of_its_own_with_the_callers_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBSTORE_FORKED_PROBE", "yes")
    monkeypatch.chdir(tmp_path)
    got = forked.run("import os, sys, embstore; print(os.getpid(), os.getppid(), "
                     "os.environ.get('EMBSTORE_FORKED_PROBE'), os.getcwd(), *sys.argv[1:])",
                     "a b", 3, timeout=60)
    assert got.returncode == 0, got.stderr
    pid, ppid, probe, cwd, *argv = got.stdout.split(" ")
    assert int(pid) != os.getpid() and int(ppid) != os.getpid()  # (the server's child)
    assert (probe, cwd, " ".join(argv)) == ("yes", str(tmp_path), "a b 3\n")


def test_exit_status_error_output_and_sigkill_as_a_subprocess_has_them():
    failed = forked.run("import sys; print('out'); raise ValueError('boom')", timeout=60)
    assert (failed.returncode, failed.stdout) == (1, "out\n")
    assert failed.stderr.rstrip().endswith("ValueError: boom")
    assert forked.run("import sys; sys.exit(3)", timeout=60).returncode == 3
    child = forked.start("import time; time.sleep(60)")
    time.sleep(0.1)
    assert child.poll() is None
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert forked.run("import os; os.kill(os.getpid(), 9)", timeout=60).returncode == -9

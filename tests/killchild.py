"""Child processes that make one change to a table and SIGKILL themselves at the N-th file
system call that makes a change durable or visible (``os.replace``, ``os.rename``,
``os.fsync``, ``os.mkdir``, ``os.link``); N = 0 runs to the end and prints how many calls it made.

An ``os.fsync`` is counted as a step but not sent to the device: what these tests kill is
the process, and a killed process's writes stay in the page cache whether or not they
were flushed (the flushes cost most of a child's time on this disk: 0.5 s of the 0.55 s a
kill point took).  The order of the flushes against the renames is what the step count
covers."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_HEADER = r"""
import os, signal, sys
import numpy as np
path, op, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
calls = [0]
def wrap(fn):
    def inner(*a, **k):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*a, **k)
    return inner
def flushed(fd):  # counted as a step, not sent to the device (see the module's doc)
    os.fstat(fd)
import embstore
with embstore.open(path, mode="r+") as t:
    os.fsync = flushed
    for name in ("replace", "rename", "fsync", "mkdir", "link"):
        setattr(os, name, wrap(getattr(os, name)))
"""


def child_script(change: str) -> str:
    """The child's code: ``change`` (lines indented by 4, using ``t``, ``op`` and ``np``)
    runs on the table opened ``r+`` with the kill wrapper in place."""
    return _HEADER + change.strip("\n") + "\nprint(calls[0])\n"


def child_args(script: str, path, op: str, kill_at: int) -> tuple[list[str], dict]:
    """The command line and environment that run ``script`` on ``path``."""
    return ([sys.executable, "-c", script, str(path), op, str(kill_at)],
            {**os.environ, "PYTHONPATH": str(REPO)})


# A fork server: one process imports numpy and embstore once, then forks a child per kill
# point (a child that starts Python and imports them costs ~1 s; a fork ~10 ms: the
# kill-at-every-step tests start a few hundred).  Requests and replies are JSON lines on
# its stdin/stdout; a child's output goes to files the server reads after waiting for it.
_SERVER = r"""
import json, os, sys, tempfile, traceback
import numpy as np
import embstore
with tempfile.TemporaryDirectory() as d:  # what the children use, imported here once
    for dtype in ("float32", "int8"):
        w = os.path.join(d, dtype)
        embstore.save(w, np.arange(8, dtype=np.float32).reshape(4, 2), keys=list("abcd"),
                      dtype=dtype).close()
        with embstore.open(w, mode="r+") as t:
            t.append(np.ones((2, 2), np.float32), keys=["e", "f"])
            t.write([0], np.ones((1, 2), np.float32))
reply = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    req = json.loads(line)
    with tempfile.TemporaryDirectory() as d:
        names = os.path.join(d, "out"), os.path.join(d, "err")
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for fd, name in zip((1, 2), names):
                    os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT, 0o600), fd)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                sys.argv = req["argv"]
                exec(compile(req["script"], "<child>", "exec"), {"__name__": "__main__"})
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        out, err = (open(n, errors="replace").read() for n in names)
    reply.write(json.dumps({"rc": rc, "out": out, "err": err}) + "\n")
    reply.flush()
"""
_server: subprocess.Popen | None = None


def _fork_server() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _SERVER], text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO))
        atexit.register(_server.kill)
    return _server


def run_child(script: str, path, op: str, kill_at: int) -> subprocess.CompletedProcess:
    """Run the child (forked from the server) to its end or its kill."""
    argv, _ = child_args(script, path, op, kill_at)
    server = _fork_server()
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(json.dumps({"argv": argv[2:], "script": script}) + "\n")
    server.stdin.flush()
    line = server.stdout.readline()
    if not line:
        raise RuntimeError(f"the fork server died (exit {server.wait()})")
    got = json.loads(line)
    return subprocess.CompletedProcess(argv, got["rc"], got["out"], got["err"])

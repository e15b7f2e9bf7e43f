"""Child processes of the tests started from a fork server that has imported numpy, pytest
and embstore already (and made a small table, so the modules a save, an open, a write and
an append load lazily are loaded too): a child that starts Python afresh and imports them
costs 0.5-1 CPU-s, a fork from the server a few ms.  They are still real processes of
their own (their own pid, file descriptors, locks; SIGKILL kills them), started clean:
the server is multiprocessing's ``forkserver``, a single-threaded process started once per
test process, so a child inherits no thread, lock or object-store client of the test
(obstore's clients hang in a forked child of a process that used them).

:func:`start` runs a script (the text a ``python -c`` child would run, with ``sys.argv``)
and returns a :class:`Child` that behaves as a :class:`subprocess.Popen` for what the tests
use; :func:`run` waits for it as :func:`subprocess.run` does; :func:`context` is the
``multiprocessing`` context for tests that start functions.  The environment of the call
(``os.environ`` or ``env``) is the child's, as for a subprocess; so is the working directory.

When the test process exits the server is stopped and waited for, so the CPU time of every
child counts in the run's (``time``, ``tests/cputimes.py`` at session end)."""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import tempfile
import traceback

#: imported once by the server (a module that fails to import is skipped by multiprocessing)
PRELOAD = ["numpy", "pytest", "click", "embstore", "embstore.cli", "forkwarm"]

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(PRELOAD)


def context():
    """The ``multiprocessing`` context whose processes fork from the preloaded server."""
    _ensure_server()
    return _CTX


def _ensure_server() -> None:
    """Start the server if it is not running: Python 3.11's forkserver does not take the
    caller's ``sys.path`` before it imports PRELOAD, so this folder (forkwarm) and the
    repository go on its ``PYTHONPATH`` while it starts."""
    saved = os.environ.get("PYTHONPATH")
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [here, os.path.dirname(here)] + ([saved] if saved else []))
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def _stop_server() -> None:
    """Close the server's line and wait for it (its children's CPU then counts in ours)."""
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


atexit.register(_stop_server)


def _child(script: str, argv: list[str], env: dict, cwd: str, out: str, err: str) -> None:
    """In the forked child: the script as ``python -c script argv...`` would run it."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, name in ((1, out), (2, err)):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), fd)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = ["-c", *argv]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        exec(compile(script, "<child>", "exec"), {"__name__": "__main__"})  # noqa: S102
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as an interpreter would, exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what the script registered (an interpreter runs them at exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Child:
    """A started child: ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``,
    ``communicate`` and ``returncode`` as :class:`subprocess.Popen` has them (a child
    killed by signal N returns -N); ``stdout``/``stderr`` read what it wrote."""

    def __init__(self, script: str, args, env: dict | None, cwd: str | None):
        self._dir = tempfile.mkdtemp(prefix="forked-")
        self._out, self._err = (os.path.join(self._dir, n) for n in ("out", "err"))
        for name in (self._out, self._err):
            open(name, "wb").close()
        self.args = ["-c", script, *map(str, args)]
        _ensure_server()
        self._proc = _CTX.Process(target=_child, daemon=False, args=(
            script, [str(a) for a in args], dict(os.environ if env is None else env),
            os.getcwd() if cwd is None else str(cwd), self._out, self._err))
        self._proc.start()
        self.pid = self._proc.pid
        self.stdout = open(self._out, errors="replace")
        self.stderr = open(self._err, errors="replace")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self._proc.exitcode is not None:
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._proc.join(timeout)
            if self._proc.exitcode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()

    def _reap(self) -> None:
        self.returncode = self._proc.exitcode
        self._proc.close()
        for name in (self._out, self._err):  # (the open files keep what the child wrote)
            os.remove(name)
        os.rmdir(self._dir)

    def __del__(self):
        for f in (getattr(self, "stdout", None), getattr(self, "stderr", None)):
            if f is not None:
                f.close()


def start(script: str, *args, env: dict | None = None, cwd=None) -> Child:
    """``python -c script args...`` as a child forked from the server."""
    return Child(script, args, env, cwd)


def run(script: str, *args, env: dict | None = None, cwd=None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """:func:`start`, then wait: a :class:`subprocess.CompletedProcess` with the text it
    wrote (``stdout``, ``stderr``) and its exit status."""
    child = start(script, *args, env=env, cwd=cwd)
    try:
        out, err = child.communicate(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)

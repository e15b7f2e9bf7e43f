"""Object storage in a forked child: its requests made by a helper process.

obstore runs every request on one tokio runtime per process, started by the first request
and never replaced.  A child forked afterwards has a copy of that runtime without its
threads: a request there (through this process's clients or new ones) waits forever, and
no timeout fires, since the threads that drive the timers are gone.  So a forked child of
a process that made requests does not call obstore itself: on its first request each
client starts a helper (a new interpreter running :func:`serve`: a fresh process, so a
fresh runtime), hands it the client's configuration on its stdin (credentials travel by
pipe, never by argument) and sends it requests, one JSON line each; the helper answers
with a JSON line and the bytes of the answer.  Nothing read from the pipe is executed or
unpickled.  Requests through one helper go one at a time (a lock): a child reads with one
request in flight instead of 32.  The helper ends when the child closes the pipe (or dies).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import timedelta
from typing import Any

__all__ = ["Proxy", "serve"]


def _plain(v: Any) -> Any:
    """``v`` as JSON (timedeltas as ``{"seconds": s}``, other objects as text)."""
    if isinstance(v, timedelta):
        return {"__seconds__": v.total_seconds()}
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _typed(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"__seconds__"}:
            return timedelta(seconds=v["__seconds__"])
        return {k: _typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_typed(x) for x in v]
    return v


class _Got:
    """What ``obstore.get`` returns, as far as :class:`ObjectClient` uses it."""

    def __init__(self, data: bytes, meta: dict):
        self._data, self.meta = data, meta

    def bytes(self) -> bytes:
        return self._data


class Proxy:
    """A helper process making the requests of one client (see the module docstring)."""

    def __init__(self, base: str, read_kwargs: dict, write_kwargs: dict):
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(  # noqa: S603 - this interpreter, a module of ours
            [sys.executable, "-c", "from embstore.store.place.proxy import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in sys.path if p)})
        self._send({"base": base, "read": _plain(read_kwargs), "write": _plain(write_kwargs)})

    def _send(self, doc: dict, payload: bytes = b"") -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(doc).encode() + b"\n" + payload)
        self._proc.stdin.flush()

    def call(self, op: str, key, payload: bytes = b"", **kwargs) -> tuple[dict, bytes]:
        """``(header, bytes)`` of one request; the helper's exceptions raised again here
        (``FileNotFoundError`` as such, the others with their type's name)."""
        with self._lock:
            try:
                self._send({"op": op, "key": key, "n": len(payload), "kw": _plain(kwargs)},
                           payload)
                assert self._proc.stdout is not None
                head = json.loads(self._proc.stdout.readline() or b"null")
                if head is None:
                    raise ConnectionError("the object storage helper process ended")
                data = self._proc.stdout.read(int(head.get("n", 0)))
            except (OSError, ValueError) as exc:
                raise ConnectionError(f"the object storage helper process failed ({exc})") \
                    from None
        if not head.get("ok"):
            text = str(head.get("text", ""))
            if head.get("kind") == "FileNotFoundError":
                raise FileNotFoundError(text)
            raise type(str(head.get("kind", "Error")), (Exception,), {})(text)
        return head, data

    def get(self, key: str, options: dict | None = None) -> _Got:
        head, data = self.call("get", key, options=options or {})
        return _Got(data, head["meta"])

    def close(self) -> None:
        if self.pid == os.getpid() and self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()


def _answer(ob, stores: dict, req: dict, payload: bytes) -> tuple[dict, bytes]:
    op, key, kw = req["op"], req["key"], _typed(req.get("kw") or {})
    store = stores["write" if op in ("put", "delete") else "read"]
    if op == "get":
        res = ob.get(store, key, options=kw.get("options") or None)
        meta = res.meta
        return {"meta": {"size": int(meta["size"]), "e_tag": meta.get("e_tag")}}, \
            bytes(res.bytes())
    if op == "get_range":
        return {}, bytes(ob.get_range(store, key, start=kw["start"], end=kw["end"]))
    if op == "head":
        return {"meta": _plain(dict(ob.head(store, key)))}, b""
    if op == "put":
        ob.put(store, key, kw["path"] if "path" in kw else payload, max_concurrency=4)
        return {}, b""
    if op == "delete":
        ob.delete(store, key)
        return {}, b""
    if op == "list":  # (offset: names after it only; with each object's modification time)
        found = [[m["path"], int(m["size"]), m["last_modified"].timestamp()]
                 for batch in ob.list(store, key, chunk_size=1000, offset=kw.get("offset"))
                 for m in batch]
        return {"found": found}, b""
    raise ValueError(f"unknown request {op!r}")


def serve() -> None:
    """The helper: a configuration line, then requests until the pipe closes."""
    import obstore
    from obstore.store import from_url

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    cfg = json.loads(inp.readline())
    stores = {k: from_url(cfg["base"], **_typed(cfg[k])) for k in ("read", "write")}
    while True:
        line = inp.readline()
        if not line:
            return
        req = json.loads(line)
        payload = inp.read(int(req.get("n", 0)))
        try:
            head, data = _answer(obstore, stores, req, payload)
            head["ok"] = True
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the child
            kind = "FileNotFoundError" if isinstance(exc, FileNotFoundError) else \
                type(exc).__name__
            head, data = {"ok": False, "kind": kind, "text": str(exc)}, b""
        head["n"] = len(data)
        out.write(json.dumps(head).encode() + b"\n" + data)
        out.flush()


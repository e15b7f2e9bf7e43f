"""A real S3-compatible server on loopback for the tests and the remote benchmark.

moto's server mode (``pip install 'moto[server]'``, in the ``test`` and ``benchmarks``
extras) on 127.0.0.1 and a free port, in a thread of this process.  Adjustments:

- moto answers a ranged GET by copying the whole object and slicing it (a 16 KiB range
  of a 128 MiB shard takes ~260 ms); :func:`start` keeps one ``bytes`` per stored object so
  a ranged GET costs what it costs on S3: the bytes of the range.  Every client (embstore,
  tensorstore, zarr-python) profits alike.
- conditional PUTs (``If-None-Match``, ``If-Match``) check and write under one lock, as S3
  does (moto checks, then writes: two racing creations of one name could both succeed);
- the server sets TCP_NODELAY (werkzeug writes headers and body apart; Nagle's algorithm
  and delayed ACKs otherwise add ~20 ms to each response) and lists moto's modules once;
- every request is counted (``server.requests``, by HTTP method), and the bytes of the
  bodies of GET responses (``server.sent()``), so tests and the benchmark report requests and
  bytes per batch as the server saw them.
"""

from __future__ import annotations

import collections
import threading
from contextlib import contextmanager

__all__ = ["S3Server", "start", "running"]

REGION = "us-east-1"
ACCESS_KEY = "embstore-test-key"
SECRET_KEY = "embstore-test-secret"


class S3Server:
    """A running moto server: ``endpoint``, ``requests`` counter, ``make_bucket``, ``stop``."""

    def __init__(self, server, endpoint: str):
        self._server = server
        self.endpoint = endpoint
        self.requests: collections.Counter = collections.Counter()
        self.calls: list[tuple[str, str]] = []  # (method, path) of each request since reset
        self._sent = 0  # bytes of GET response bodies
        self._lock = threading.Lock()

    def count(self, method: str, nbytes: int = 0, path: str = "") -> None:
        with self._lock:
            self.requests[method] += 1
            self.calls.append((method, path))
            self._sent += nbytes

    def total(self) -> int:
        with self._lock:
            return sum(self.requests.values())

    def sent(self) -> int:
        """Bytes of GET response bodies since the last reset."""
        with self._lock:
            return self._sent

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.calls = []
            self._sent = 0

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def env(self) -> dict[str, str]:
        """The standard AWS variables pointing a client at this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def stop(self) -> None:
        self._server.stop()


_patched = False
_current: S3Server | None = None


def _patch_moto() -> None:
    """Whole-object bytes kept per key (ranged GETs slice them); requests counted."""
    global _patched
    if _patched:
        return
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    prop = FakeKey.value

    def get_value(self):
        cached = self.__dict__.get("_embstore_bytes")
        if cached is None:
            cached = prop.fget(self)
            self.__dict__["_embstore_bytes"] = cached
        return cached

    def set_value(self, new):
        self.__dict__.pop("_embstore_bytes", None)
        prop.fset(self, new)

    FakeKey.value = property(get_value, set_value)
    # werkzeug writes headers and body separately: without TCP_NODELAY, Nagle's algorithm
    # and the client's delayed ACK add ~20 ms to every response on loopback
    import socket

    from werkzeug.serving import WSGIRequestHandler
    setup = WSGIRequestHandler.setup

    def setup_nodelay(self):
        setup(self)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    WSGIRequestHandler.setup = setup_nodelay
    # moto lists its own package directory (~180 stat calls) on every request
    from moto import backends
    from moto.moto_server import werkzeug_app
    modules = tuple(backends.list_of_moto_modules())
    werkzeug_app.backends.list_of_moto_modules = lambda: modules

    def counted(inner):
        def wrapper(self, request, *args, **kwargs):
            out = inner(self, request, *args, **kwargs)
            if _current is not None:
                body = out[2] if isinstance(out, tuple) and len(out) == 3 else b""
                sent = len(body) if request.method == "GET" and isinstance(
                    body, (bytes, bytearray, memoryview)) else 0
                _current.count(request.method, sent, getattr(request, "path", ""))
            return out
        return wrapper

    # moto checks If-None-Match / If-Match and then stores the object, with no lock between:
    # two racing conditional PUTs of one name may both succeed, the second replacing the
    # first (seen: 16 writer processes x 40 commits, version 565 created twice). S3 makes
    # the check and the write one step; so does this lock, held by conditional PUTs only
    conditional = threading.Lock()
    put_object = S3Response.put_object

    def atomic_put(self):
        if self.headers.get("If-None-Match") is None and self.headers.get("If-Match") is None:
            return put_object(self)
        with conditional:
            return put_object(self)

    S3Response.put_object = atomic_put
    S3Response.key_response = counted(S3Response.key_response)
    S3Response.bucket_response = counted(S3Response.bucket_response)
    _patched = True


def start() -> S3Server:
    """Start moto's server on 127.0.0.1 (a free port); the caller stops it."""
    global _current
    import logging

    from moto.server import ThreadedMotoServer

    _patch_moto()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    _current = S3Server(server, f"http://{host}:{port}")
    return _current


@contextmanager
def running():
    srv = start()
    try:
        yield srv
    finally:
        srv.stop()


class ServerProcess:
    """The server in a child process (so that it does not share the GIL with the clients
    being measured): ``endpoint``, ``env()``, ``make_bucket``, ``total()``, ``counts()``,
    ``reset()``, ``stop()``; requests counted in the child, read over a pipe."""

    def __init__(self):
        import subprocess
        import sys
        from pathlib import Path

        root = str(Path(__file__).resolve().parent.parent)
        self._proc = subprocess.Popen([sys.executable, "-m", "benchmarks.s3server"], cwd=root,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoint = self._proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://"):
            raise RuntimeError(f"the S3 server did not start (said {self.endpoint!r})")

    def _ask(self, command: str) -> str:
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._proc.stdout.readline().strip()

    def counts(self) -> dict:
        import json
        return json.loads(self._ask("count"))

    def total(self) -> int:
        return sum(self.counts().values())

    def sent(self) -> int:
        """Bytes of GET response bodies since the last reset."""
        return int(self._ask("sent"))

    def reset(self) -> None:
        self._ask("reset")

    def make_bucket(self, name: str) -> None:
        self._ask(f"bucket {name}")

    env = S3Server.env

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._ask("quit")
            self._proc.wait(timeout=30)


def _serve() -> None:
    import json
    import sys

    srv = start()
    print(srv.endpoint, flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "count":
            print(json.dumps(dict(srv.requests)), flush=True)
        elif cmd == "sent":
            print(srv.sent(), flush=True)
        elif cmd == "reset":
            srv.reset()
            print("ok", flush=True)
        elif cmd == "bucket":
            srv.make_bucket(arg)
            print("ok", flush=True)
        else:
            print("bye", flush=True)
            break
    srv.stop()


if __name__ == "__main__":
    _serve()

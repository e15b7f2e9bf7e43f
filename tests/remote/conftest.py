"""Fixtures for tables on object storage: a real S3 server (moto) on loopback.

The server (benchmarks/s3server.py) runs in this process for the whole session; every test
gets a fresh bucket and the standard AWS environment variables pointing at the server
(set for that test only).
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("moto")
pytest.importorskip("obstore")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from s3faults import s3, s3_server  # noqa: E402,F401 - one definition of the fixtures


class _FakeEndpoint:
    """A loopback TCP server standing in for a broken object store: ``deny`` answers every
    request 403 InvalidAccessKeyId (refused credentials), ``hang`` accepts connections and
    never answers, ``dead`` is a port nobody listens on."""

    _BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidAccessKeyId</Code>'
             b"<Message>The AWS Access Key Id you provided does not exist in our records."
             b"</Message></Error>")

    def __init__(self, kind: str):
        self.kind = kind
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        if kind == "dead":
            self.sock.close()
            return
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.kind == "deny":
                threading.Thread(target=self._deny, args=(conn,), daemon=True).start()

    def _deny(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while f.readline():  # a request line, headers, maybe a body: answer 403
                size = 0
                while (h := f.readline()) not in (b"\r\n", b"\n", b""):
                    if h.lower().startswith(b"content-length:"):
                        size = int(h.split(b":")[1])
                f.read(size)
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(self._BODY) + self._BODY)
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture(params=["deny", "hang", "dead"])
def broken_endpoint(request, s3, monkeypatch):
    """AWS_ENDPOINT_URL pointing at a broken object store (timeouts lowered to a second)."""
    from datetime import timedelta

    from embstore.store.place import objstore

    monkeypatch.setattr(objstore, "REQUEST_TIMEOUT", timedelta(seconds=1))
    monkeypatch.setattr(objstore, "RETRY_TIMEOUT", timedelta(milliseconds=500))
    monkeypatch.setattr(objstore, "CONNECT_TIMEOUT", timedelta(seconds=1))
    monkeypatch.setattr(objstore, "WRITE_TIMEOUT", timedelta(seconds=1))
    fake = _FakeEndpoint(request.param)
    monkeypatch.setenv("AWS_ENDPOINT_URL", fake.url)
    yield fake
    fake.close()

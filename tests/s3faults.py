"""Helpers of the tests of commits on object storage (tests/test_s3_*.py): the moto server
fixtures and a fault proxy; racing writer processes (:data:`WRITER`, :func:`race`) and the replay of
their commits (:func:`replay`).

:class:`FaultProxy` relays HTTP requests on loopback to the S3 server and, for the requests
a rule picks, answers 503 without forwarding, resets the connection before forwarding, or
forwards the request and then closes the connection without its response (the server
applied the write; the client never hears of it: the lost response a conditional PUT must
survive).
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import socket
import socketserver
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import forked  # noqa: E402
from benchmarks import s3server  # noqa: E402

_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on loopback (benchmarks/s3server.py), in this process for the session
    (the fixtures of tests/remote too)."""
    srv = s3server.start()
    yield srv
    srv.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The server, with a fresh bucket ``s3.bucket`` and the AWS variables set for it."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT", "AWS_SKIP_SIGNATURE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"embstore-commits-{next(_buckets)}"
    s3_server.make_bucket(bucket)
    s3_server.bucket = bucket
    s3_server.reset()
    return s3_server


class FaultProxy:
    """An HTTP proxy to ``upstream``; ``rule(method, path)`` returns None (relay), ``"503"``,
    ``"reset"`` or ``"drop"`` (forward, then close without the response).  ``faults``
    counts what was done."""

    def __init__(self, upstream: str, rule):
        host, port = upstream.replace("http://", "").split(":")
        self.rule, self.faults = rule, {"503": 0, "reset": 0, "drop": 0}
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _relay(self):
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else None
                fault = proxy.rule(self.command, self.path)
                if fault is not None:
                    with proxy._lock:
                        proxy.faults[fault] += 1
                if fault == "503":
                    msg = b"<Error><Code>SlowDown</Code><Message>Slow down</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if fault == "reset":
                    self.close_connection = True
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                headers = {k: v for k, v in self.headers.items()}
                conn.request(self.command, self.path, body=body, headers=headers)
                res = conn.getresponse()
                data = res.read()
                conn.close()
                if fault == "drop":  # applied by the server; the response never arrives
                    self.close_connection = True
                    return
                self.send_response(res.status, res.reason)
                for k, v in res.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # (a HEAD's length is the object's, as the server said: it has no body)
                self.send_header("Content-Length", res.getheader("Content-Length", "0")
                                 if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def random_faults(seed: int, *, drop: float, reset: float, slow: float):
    """A rule: manifests' PUTs dropped after the server applied them (``drop``), any PUT
    reset before it reaches the server (``reset``) or answered 503 (``slow``)."""
    rng = random.Random(seed)
    lock = threading.Lock()

    def rule(method: str, path: str):
        if method != "PUT":
            return None
        with lock:
            x = rng.random()
        if "/commits/v" in path and x < drop:
            return "drop"
        if x < drop + reset:
            return "reset"
        if x < drop + reset + slow:
            return "503"
        return None
    return rule


WRITER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import embstore
    url, w, nw, commits, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
        int(sys.argv[4]), sys.argv[5]
    hot_every, keyed = int(sys.argv[6]), sys.argv[7] == "keyed"
    rng = np.random.default_rng(w)
    log = []
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        for c in range(commits):
            value = float(w * 1000 + c + 1)
            if c % 4 == 3:
                n = int(rng.integers(1, 4))
                keys = [f"a{w}-{c}-{j}" for j in range(n)] if keyed else None
                first = t.append(np.full((n, 4), value, np.float32), keys=keys)
                log.append({"v": t.version, "kind": "append", "first": int(first[0]), "n": n,
                            "value": value})
                continue
            own = np.arange(w, 199, nw)  # this writer's rows: disjoint from the others' and 199
            ids = np.unique(rng.choice(own, size=3, replace=False))
            hot = c % hot_every == hot_every - 1  # row 199 (everyone's): may overlap
            if hot:
                ids = np.unique(np.r_[ids, 199])
            try:
                t.write(ids, np.full((ids.size, 4), value, np.float32))
            except embstore.ConflictError as exc:
                log.append({"v": None, "kind": "conflict", "rows": exc.rows.tolist(),
                            "hot": hot})
                t.refresh()
                continue
            log.append({"v": t.version, "kind": "write", "ids": ids.tolist(), "value": value})
    json.dump(log, open(out, "w"))
""")


def replay(E0: np.ndarray, logs: list[list[dict]]) -> dict[int, np.ndarray]:
    done = sorted((e for log in logs for e in log if e["v"] is not None), key=lambda e: e["v"])
    assert [e["v"] for e in done] == list(range(1, len(done) + 1))  # no lost or doubled commit
    E, out = E0.copy(), {}
    for e in done:
        if e["kind"] == "append":
            assert e["first"] == len(E)  # appended rows follow the winners'
            E = np.vstack([E, np.full((e["n"], E.shape[1]), e["value"], np.float32)])
        else:
            E[e["ids"]] = e["value"]
        out[e["v"]] = E.copy()
    return out


def appended_keys(logs: list[list[dict]]) -> dict[str, int]:
    """The row of each key the racing writers appended (keyed races: ``a<w>-<c>-<j>``)."""
    return {f"a{w}-{int(e['value']) - w * 1000 - 1}-{j}": e["first"] + j
            for w, log in enumerate(logs) for e in log if e["kind"] == "append"
            for j in range(e["n"])}


def race(url: str, tmp_path, writers: int, commits: int, *, hot_every: int = 5,
         timeout: float = 600, keyed: bool = False) -> list[list[dict]]:
    """``writers`` processes (forked from tests/forked.py's server: no start-up each) commit
    ``commits`` times each (appends with keys when ``keyed``); their logs."""
    procs = [forked.start(WRITER, url, w, writers, commits, tmp_path / f"w{w}.json", hot_every,
                          "keyed" if keyed else "-")
             for w in range(writers)]
    for p in procs:
        assert p.wait(timeout=timeout) == 0, p.stderr.read()[-3000:]
    return [json.loads((tmp_path / f"w{w}.json").read_text()) for w in range(writers)]

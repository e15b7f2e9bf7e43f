"""A TCP proxy on loopback that makes a local S3 server (moto) cost what S3 costs.

Every connection is relayed to the upstream server with two costs added:

- latency: the first bytes of each request (a client sends a request only after the whole
  previous response, HTTP/1.1 keep-alive) reach the server ``latency_s`` later, so every
  request waits that much longer for its first byte (S3: 20-30 ms);
- bandwidth: each response is relayed at most ``bandwidth_Bps`` bytes per second per
  connection (S3: about 100 MB/s per connection).

Connections are not limited in number (S3 serves thousands).  The proxy runs in a child
process of its own (``python -m benchmarks.latencyproxy UPSTREAM LATENCY_S BANDWIDTH``,
which prints its endpoint), so that relaying does not share a GIL with the server or the
clients measured; :class:`ProxyProcess` starts and stops it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["LatencyProxy", "ProxyProcess"]

_BUF = 256 << 10
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
RELAYS = ("splice", "copy")  # splice where the system has it (Linux)


class _Conn:
    """One relayed connection: whether a request is waiting for its response."""

    def __init__(self) -> None:
        self.pending = False


class LatencyProxy:
    """Listen on 127.0.0.1 (a free port) and relay to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str, latency_s: float = 0.025, bandwidth_Bps: float = 100e6,
                 relay: str = "splice"):
        if relay not in RELAYS:
            raise ValueError(f"relay must be one of {RELAYS}, got {relay!r}")
        if relay == "splice" and not hasattr(os, "splice"):
            relay = "copy"
        self.relay = relay
        u = urlparse(upstream)
        self.upstream = (u.hostname or "127.0.0.1", int(u.port or 80))
        self.latency_s, self.bandwidth_Bps = float(latency_s), float(bandwidth_Bps)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            st = _Conn()
            threading.Thread(target=self._requests, args=(client, server, st), daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client, st),
                             daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket, st: _Conn) -> None:
        buf = memoryview(bytearray(_BUF))
        try:
            while (n := src.recv_into(buf)) > 0:
                if not st.pending:  # a new request: it reaches the server latency_s later
                    st.pending = True
                    time.sleep(self.latency_s)
                dst.sendall(buf[:n])
        except OSError:
            pass
        _close(src, dst)

    def _responses(self, src: socket.socket, dst: socket.socket, st: _Conn) -> None:
        if self.relay == "splice":
            return self._spliced(src, dst, st)
        buf = memoryview(bytearray(_BUF))
        t0, sent = time.monotonic(), 0
        try:
            while (n := src.recv_into(buf)) > 0:
                if st.pending:  # a response begins
                    st.pending = False
                    t0, sent = time.monotonic(), 0
                dst.sendall(buf[:n])
                sent += n
                self._pace(t0, sent)
        except OSError:
            pass
        _close(src, dst)

    def _spliced(self, src: socket.socket, dst: socket.socket, st: _Conn) -> None:
        """As the copying relay, the bytes moved socket to pipe to socket in the kernel
        (``splice``: no copy through this process)."""
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, _F_SETPIPE_SZ, _BUF)
        except OSError:
            pass  # (the default 64 KiB pipe: more calls, same bytes)
        # own descriptors: the request thread closes the sockets when a side hangs up, and a
        # new connection may then get the same numbers (bytes of one connection would be
        # relayed into another); a duplicate stays this connection's until closed here
        s_fd, d_fd = os.dup(src.fileno()), os.dup(dst.fileno())
        t0, sent = time.monotonic(), 0
        try:
            while (n := os.splice(s_fd, w, _BUF)) > 0:
                if st.pending:  # a response begins
                    st.pending = False
                    t0, sent = time.monotonic(), 0
                left = n
                while left:
                    left -= os.splice(r, d_fd, left)
                sent += n
                self._pace(t0, sent)
        except OSError:
            pass
        finally:
            for fd in (r, w, s_fd, d_fd):
                os.close(fd)
        _close(src, dst)

    def _pace(self, t0: float, sent: int) -> None:
        """Sleep until ``sent`` bytes of a response begun at ``t0`` are due at the rate."""
        ahead = t0 + sent / self.bandwidth_Bps - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)

    def close(self) -> None:
        self.sock.close()


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


class ProxyProcess:
    """:class:`LatencyProxy` in a child process: ``endpoint``, ``stop()``."""

    def __init__(self, upstream: str, latency_s: float = 0.025, bandwidth_Bps: float = 100e6,
                 relay: str = "splice"):
        root = str(Path(__file__).resolve().parent.parent)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.latencyproxy", upstream, str(latency_s),
             str(bandwidth_Bps), relay], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        assert self._proc.stdout is not None
        self.endpoint = self._proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://"):
            raise RuntimeError(f"the latency proxy did not start (said {self.endpoint!r})")
        self.latency_s, self.bandwidth_Bps, self.relay = latency_s, bandwidth_Bps, relay
        self.pid = self._proc.pid

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the proxy process has used so far (Linux ``/proc``)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the child exits when its stdin closes
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _serve() -> None:
    proxy = LatencyProxy(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]),
                         sys.argv[4] if len(sys.argv) > 4 else "splice")
    print(proxy.endpoint, flush=True)
    sys.stdin.read()  # until the parent closes it (or exits)
    proxy.close()


if __name__ == "__main__":
    _serve()

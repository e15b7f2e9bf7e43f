"""Object storage (S3 and what else obstore speaks): URLs, one client per table, errors.

The client is `obstore <https://developmental-seed.github.io/obstore/>`_, the Python binding of
Rust's ``object_store`` crate (zarr-python's ``ObjectStore`` uses it too).  Against the
loopback S3 server it served the remote read pattern (2,000 ranged GETs of 16 KiB, 32 in
flight) 3.7x faster than fsspec/s3fs (aiobotocore) with a quarter of the CPU
(``benchmarks/s3clients.py``; README, "Object storage"), its sync calls release the GIL, and
it has no botocore pin to fight the rest of an environment.

Every call goes through :meth:`ObjectClient._call`, which turns the client's exceptions
into one-line :class:`RemoteError` s (a missing bucket, refused credentials, an endpoint
that does not answer) and counts requests (``client.requests``).  Timeouts and retries are
bounded, so nothing hangs.

obstore runs every request on one tokio runtime per process, started by the first request
and never replaced; its threads do not exist in a child forked afterwards, so a request
made there waited forever (no timeout fires either: the timers are driven by those
threads), with this process's clients and with new ones alike.  In a forked child of a
process that made requests, each client therefore makes its requests through a helper
process (:mod:`embstore.store.place.proxy`): the child reconnects, one request at a time.
zarr-python's store over the table (``prefixed_store``, used by ``verify`` for the keys)
cannot go that way: it is refused there with a :class:`RemoteError` saying so.
"""

from __future__ import annotations

import builtins

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from ...errors import CorruptStoreError, EmbstoreError
from ...fs.files import MAX_JSON_BYTES
from ...fs.forksafe import renew_after_fork
from ...optional import require
from .proxy import Proxy

__all__ = ["is_url", "ObjectClient", "RemoteError", "connect", "CONCURRENCY"]

LIST_PAGE = 1000  # names per LIST request (S3's most)
CONCURRENCY = 32  # requests in flight per table (S3 serves thousands per prefix)
# A request (8 MiB at most; uploads go by multipart parts) that has not finished in
# REQUEST_TIMEOUT fails; failed requests are retried while RETRY_TIMEOUT has not passed
# since the first attempt, so one call gives up after at most about REQUEST_TIMEOUT +
# RETRY_TIMEOUT (an endpoint that accepts connections and never answers: an error, not a
# hang).  storage_options ``timeout``, ``connect_timeout`` override them per table.
CONNECT_TIMEOUT = timedelta(seconds=5)
REQUEST_TIMEOUT = timedelta(seconds=20)
RETRY_TIMEOUT = timedelta(seconds=10)
# uploads: a part of a multipart upload shares the link with many others (longer)
WRITE_TIMEOUT = timedelta(seconds=120)
_URL = re.compile(r"^(s3|s3a|gs|gcs|az|azure|abfs|abfss|http|https)://([^/]+)/?(.*)$")
_ALIASES = {"endpoint_url": "endpoint", "key": "access_key_id", "secret": "secret_access_key",
            "token": "session_token", "region_name": "region", "anon": "skip_signature"}
_CLIENT_KEYS = ("allow_http", "timeout", "connect_timeout", "read_timeout",
                "allow_invalid_certificates", "proxy_url", "user_agent")
_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SKIP_SIGNATURE")


_started_in: int | None = None  # the process whose requests started obstore's runtime


def _forked() -> bool:
    """Whether this is a forked child of the process that started obstore's runtime (its
    requests then go through a helper process)."""
    global _started_in
    pid = os.getpid()
    if _started_in is None:
        _started_in = pid
    return _started_in != pid


def _check_fork(url: str) -> None:
    """Refuse obstore itself in a forked child of the process that started its runtime."""
    if _forked():
        raise RemoteError(
            f"{url}: object storage cannot be used in a process forked from one that used "
            "it (obstore's runtime does not survive fork(): its requests would wait "
            "forever); start workers with the 'spawn' or 'forkserver' start method (e.g. "
            "DataLoader(..., multiprocessing_context='spawn')), or open tables only in the "
            "children (no object-storage request in the parent before it forks)", url=url)


class RemoteError(EmbstoreError, OSError):
    """Object storage refused or failed a request (bucket, credentials, network)."""

    def __init__(self, message: str, *, url=None):
        super().__init__(message)
        self.url = url

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def is_url(path) -> bool:
    """True for ``s3://bucket/...`` and the other object-store URLs (not ``file://``)."""
    return isinstance(path, str) and _URL.match(path) is not None


def _split(url: str) -> tuple[str, str, str]:
    m = _URL.match(url)
    if m is None:
        raise RemoteError(f"{url}: not an object-store URL (expected s3://bucket/path, gs://, "
                          "az://, http(s)://)", url=url)
    scheme, bucket, prefix = m.groups()
    return scheme, bucket, prefix.strip("/")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    code = re.search(r"<Code>([^<]+)</Code>", text)
    msg = re.search(r"<Message>([^<]+)</Message>", text)
    if code:
        return f"{code.group(1)}: {msg.group(1)}" if msg else code.group(1)
    line = text.splitlines()[0]
    return line[:300]


class ObjectClient:
    """The objects under one URL prefix (a table), read and written through obstore."""

    def __init__(self, url: str, storage_options: dict | None = None, *,
                 concurrency: int = CONCURRENCY):
        self._ob = require("obstore", extra="s3", feature=f"{url}: object storage")
        from_url = require("obstore.store", extra="s3", feature="object storage").from_url
        self.url = url.rstrip("/")
        self.scheme, self.bucket, self.prefix = _split(self.url)
        opts: dict[str, Any] = {str(_ALIASES.get(k, k)): v
                                for k, v in dict(storage_options or {}).items()}
        client = {k: opts.pop(k) for k in _CLIENT_KEYS if k in opts}
        endpoint = opts.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL", "")
        if endpoint.startswith("http://") or self.scheme == "http":
            client.setdefault("allow_http", True)
        client.setdefault("connect_timeout", CONNECT_TIMEOUT)
        self._timeout_given = "timeout" in client
        client.setdefault("timeout", REQUEST_TIMEOUT)
        instance = bool(opts.pop("instance_credentials", False))
        if self.scheme in ("s3", "s3a") and not instance and not opts.get(
                "access_key_id") and not opts.get("skip_signature") and not any(
                os.environ.get(v) for v in _CREDENTIAL_VARS):
            # no credentials anywhere: the client would ask the EC2 metadata service, which
            # off EC2 answers only after retries; say so at once instead
            raise RemoteError(f"{url}: no credentials (set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, pass access_key_id/secret_access_key "
                              "in storage_options, anon=True for a public bucket, or "
                              "instance_credentials=True on EC2)", url=url)
        retry: dict[str, Any] = {"max_retries": 2, "retry_timeout": RETRY_TIMEOUT,
                 "backoff": {"init_backoff": timedelta(milliseconds=50),
                             "max_backoff": timedelta(seconds=2), "base": 2}}
        base = f"{self.scheme}://{self.bucket}"
        self._config = (from_url, {"client_options": client, "retry_config": retry, **opts})
        self._writer: Any = None
        self._base = base
        try:
            self.store = from_url(base, client_options=client, retry_config=retry, **opts)
        except Exception as exc:  # noqa: BLE001 - obstore's config errors vary
            raise RemoteError(f"{url}: cannot configure the object store client "
                              f"({_first_line(exc)})", url=url) from None
        self.concurrency = max(1, int(concurrency))
        self.requests = 0
        self.received = 0  # bytes of object data received (ranged reads, whole objects)
        self._count_lock = threading.Lock()
        renew_after_fork(self, "_count_lock")  # (a thread of the parent may hold it)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = os.getpid()
        self._proxy: Proxy | None = None  # requests in a forked child (proxy.py)

    def prefixed_store(self):
        """An obstore store rooted at the table (for zarr-python's ``ObjectStore``)."""
        _check_fork(self.url)
        from_url, kwargs = self._config
        return from_url(self.url, **kwargs)

    # -- names --------------------------------------------------------------------------------
    def key(self, rel: str) -> str:
        """The object key of ``rel`` (``""``: the URL's own object)."""
        if not rel:
            return self.prefix
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def where(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    # -- calls --------------------------------------------------------------------------------
    def _write_kwargs(self) -> dict:
        """The store options of uploads: as :attr:`store`'s, with ``WRITE_TIMEOUT`` per
        request unless the options set a timeout."""
        kwargs = self._config[1]
        client = dict(kwargs["client_options"])
        if not self._timeout_given:
            client["timeout"] = WRITE_TIMEOUT
        return {**kwargs, "client_options": client}

    def _write_store(self):
        """The store uploads go through (see :meth:`_write_kwargs`)."""
        if self._writer is None:
            self._writer = self._config[0](self._base, **self._write_kwargs())
        return self._writer

    def _helper(self) -> Proxy:
        """This process's helper (a forked child's: see the module docstring)."""
        if self._proxy is None or self._proxy.pid != os.getpid():
            self._proxy = Proxy(self._base, self._config[1], self._write_kwargs())
        return self._proxy

    def _proxied(self, op: str, rel: str, args: tuple, kwargs: dict):
        """``_call``'s request made by the helper (a forked child)."""
        helper, key = self._helper(), self.key(rel)
        if op == "get":
            return helper.get(key, kwargs.get("options"))
        if op == "get_range":
            return helper.call(op, key, start=kwargs["start"], end=kwargs["end"])[1]
        if op == "head":
            return helper.call(op, key)[0]["meta"]
        if op == "put":
            data = args[0]
            if isinstance(data, (str, os.PathLike)):
                return helper.call(op, key, path=os.fspath(data)) and None
            return helper.call(op, key, bytes(data)) and None
        raise ValueError(f"no helper request for {op!r}")

    def _call(self, rel: str, fn, *args, missing_ok: bool = False, write: bool = False,
              **kwargs):
        with self._count_lock:
            self.requests += 1
        try:
            if _forked():
                return self._proxied(fn.__name__, rel, args, kwargs)
            store = self._write_store() if write else self.store
            return fn(store, self.key(rel), *args, **kwargs)
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise RemoteError(f"{self.url}: bucket {self.bucket!r} does not exist",
                                  url=self.url) from None
            if write:  # (an upload whose multipart upload the server dropped)
                raise self._translate(exc, rel) from None
            if missing_ok:
                return None
            raise RemoteError(f"{self.where(rel)}: no such object", url=self.url) from None
        except EmbstoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - obstore's error types, all made one line
            raise self._translate(exc, rel) from None

    def _translate(self, exc: BaseException, rel: str) -> RemoteError:
        text = str(exc)
        name = type(exc).__name__
        where = self.where(rel)
        if "NoSuchBucket" in text:  # (a listing reports it as a generic error)
            return RemoteError(f"{self.url}: bucket {self.bucket!r} does not exist",
                               url=self.url)
        if name in ("PermissionDeniedError", "UnauthenticatedError") or re.search(
                r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|403 Forbidden", text):
            return RemoteError(f"{where}: access denied, check the credentials "
                               f"({_first_line(exc)})", url=self.url)
        if re.search(r"(?i)connect|timed out|timeout|dns|refused", text):
            return RemoteError(f"{where}: cannot reach the object store ({_first_line(exc)})",
                               url=self.url)
        return RemoteError(f"{where}: request failed ({name}: {_first_line(exc)})",
                           url=self.url)

    def get(self, rel: str) -> bytes | None:
        """The whole object (None if there is none).  Metadata (``zarr.json``, the commit
        area's JSON) larger than ``MAX_JSON_BYTES`` is refused from the response's size,
        before its body is read (as local metadata files are)."""
        res = self._call(rel, self._ob.get, missing_ok=True)
        if res is None:
            return None
        size = int(res.meta["size"])
        if rel.endswith(("zarr.json", ".json", "/last")) and size > MAX_JSON_BYTES:
            raise CorruptStoreError(f"{self.where(rel)}: {size} bytes, more than the "
                                    f"{MAX_JSON_BYTES} a metadata file may have",
                                    path=self.where(rel))
        data = bytes(res.bytes())
        self._got(len(data))
        return data

    def _got(self, n: int) -> None:
        with self._count_lock:
            self.received += n

    def get_tail(self, rel: str, n: int):
        """``(last n bytes, object size, etag)`` in one request, or None if there is no object."""
        res = self._call(rel, self._ob.get, options={"range": {"suffix": n}}, missing_ok=True)
        if res is None:
            return None
        meta = res.meta
        data = res.bytes()
        self._got(len(data))
        return data, int(meta["size"]), str(meta.get("e_tag") or "")

    def get_range(self, rel: str, start: int, end: int):
        """Bytes ``start..end-1`` of an object (a buffer)."""
        data = self._call(rel, self._ob.get_range, start=start, end=end)
        self._got(len(data))
        return data

    def head(self, rel: str) -> dict | None:
        return self._call(rel, self._ob.head, missing_ok=True)

    def put(self, rel: str, data) -> None:
        """Store ``data`` (bytes or a local file path) at ``rel`` (multipart when large)."""
        self._call(rel, self._ob.put, data, max_concurrency=4, write=True)

    def put_new(self, rel: str, data: bytes, write_id: str) -> str:
        """Create ``rel`` only if no object has that name (``If-None-Match: *``), with
        ``write_id`` in its ``write-id`` metadata: ``"created"``, ``"exists"`` (412: another
        object, or this one whose first response was lost: read it back) or ``"retry"``
        (409, 503, a transport error: it may or may not exist)."""
        return self._conditional(rel, data, "create", write_id)

    def put_if_match(self, rel: str, data: bytes, etag: str, write_id: str) -> str:
        """Replace ``rel`` only if its ETag is ``etag`` (``If-Match``): as :meth:`put_new`,
        ``"exists"`` meaning the ETag no longer matches."""
        return self._conditional(rel, data, {"e_tag": etag}, write_id)

    def _conditional(self, rel: str, data: bytes, mode, write_id: str) -> str:
        if _forked():
            raise RemoteError(f"{self.where(rel)}: commits on object storage need conditional "
                              "writes, which a forked child cannot make (start writer processes "
                              "with the 'spawn' or 'forkserver' method)", url=self.url)
        with self._count_lock:
            self.requests += 1
        try:
            self._ob.put(self._write_store(), self.key(rel), bytes(data), mode=mode,
                         attributes={"write-id": write_id})
            return "created"
        except Exception as exc:  # noqa: BLE001 - obstore's error types, sorted below
            name = type(exc).__name__
            if name in ("AlreadyExistsError", "PreconditionError"):
                return "exists"
            if name in ("PermissionDeniedError", "UnauthenticatedError", "NotSupportedError"):
                raise self._translate(exc, rel) from None
            return "retry"  # 409 ConditionalRequestConflict, 503 SlowDown, lost responses

    def list_after(self, rel: str, after: str | None = None, *,
                   pages: int | None = None) -> list[tuple[str, int, float]]:
        """``(path relative to the table, size, last-modified epoch seconds)`` of every
        object under the folder ``rel`` whose name sorts after ``after`` (both relative to
        the table), in name order: one request per 1,000 (``pages``: at most that many)."""
        prefix = self.key(rel.rstrip("/")) + "/"
        cut = len(self.prefix) + 1 if self.prefix else 0
        out: list[tuple[str, int, float]] = []
        offset = None if after is None else self.key(after)
        if _forked():  # (a forked child: through the helper process, one request)
            with self._count_lock:
                self.requests += 1
            try:
                found = self._helper().call("list", prefix, offset=offset)[0]["found"]
            except FileNotFoundError:
                return out
            except EmbstoreError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise self._translate(exc, rel) from None
            return sorted((p[cut:], int(n), float(t)) for p, n, t in found)
        try:
            for i, batch in enumerate(self._ob.list(
                    self.store, prefix, chunk_size=LIST_PAGE, offset=offset)):
                with self._count_lock:
                    self.requests += 1
                out += [(m["path"][cut:], int(m["size"]), m["last_modified"].timestamp())
                        for m in batch]
                if pages is not None and i + 1 >= pages:
                    break
        except FileNotFoundError:
            return out
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc, rel) from None
        return sorted(out)

    def delete(self, rels: list[str]) -> None:
        for part in range(0, len(rels), 1000):
            keys = [self.key(r) for r in rels[part: part + 1000]]
            with self._count_lock:
                self.requests += 1
            try:
                if _forked():
                    self._helper().call("delete", keys)
                else:
                    self._ob.delete(self.store, keys)
            except FileNotFoundError:
                pass
            except Exception as exc:  # noqa: BLE001
                raise self._translate(exc, "") from None

    def list(self, rel: str = "") -> list[tuple[str, int]]:
        """``(path relative to the table, size)`` of every object under ``rel``."""
        prefix = self.key(rel) if rel else self.prefix
        out = []
        cut = len(self.prefix) + 1 if self.prefix else 0
        try:
            batches: Any = ([[{"path": p, "size": n} for p, n, _ in self._helper().call(
                "list", prefix + "/" if prefix else None)[0]["found"]]] if _forked() else
                self._ob.list(self.store, prefix + "/" if prefix else None, chunk_size=1000))
            for batch in batches:
                with self._count_lock:
                    self.requests += 1
                out += [(m["path"][cut:], int(m["size"])) for m in batch]
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise RemoteError(f"{self.url}: bucket {self.bucket!r} does not exist",
                                  url=self.url) from None
        except EmbstoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._translate(exc, rel) from None
        return out

    # -- concurrency --------------------------------------------------------------------------
    def pool(self) -> ThreadPoolExecutor:
        """Threads issuing requests (obstore's sync calls release the GIL while waiting)."""
        if self._pool is None or self._pool_pid != os.getpid():  # a pool does not survive fork
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency,
                                            thread_name_prefix="embstore-remote")
            self._pool_pid = os.getpid()
        return self._pool

    def map(self, fn, items) -> builtins.list[Any]:  # (list: the method above)
        """``[fn(item) for item in items]`` with up to ``concurrency`` in flight; after the
        first exception the calls not started yet are cancelled (an endpoint that times out
        costs one round of timeouts, not one per item), and it is raised once the running
        ones have finished."""
        items = list(items)
        if len(items) <= 1:
            return [fn(it) for it in items]
        futures = [self.pool().submit(fn, it) for it in items]
        results, error = [], None
        for f in futures:
            if error is not None:
                f.cancel()
            try:
                results.append(f.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below (or cancelled)
                if error is None:
                    error = exc
                    for g in futures:
                        g.cancel()
                results.append(None)
        if error is not None:
            raise error
        return results

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None


def connect(url: str, storage_options: dict | None = None, **kwargs) -> ObjectClient:
    return ObjectClient(url, storage_options, **kwargs)

"""Source files named by URL, for :func:`embstore.import_file`: read once, in order, as a pipe.

- ``s3://bucket/key`` (and the other schemes obstore speaks: ``gs://``, ``az://``...)
  through the project's object-store client (:mod:`embstore.store.place.objstore`: its
  credentials, endpoint and error messages), read in 8 MiB requests;
- ``http://`` and ``https://`` through ``urllib``, streamed from the response.

Anything else with ``://`` is refused naming the schemes.  A format that needs random
access (safetensors, PyTorch, a zip archive) is first copied to a file beside the
destination, as for standard input.
"""

from __future__ import annotations

import io
import os
import re
import urllib.error
import urllib.request
from typing import IO

from ...errors import FormatError
from ...optional import require
from ..place.objstore import RemoteError, connect, is_url

__all__ = ["is_source_url", "open_url", "url_name", "READ_BYTES"]

READ_BYTES = 8 << 20  # bytes per object-store request
HTTP_TIMEOUT = 30     # seconds without data before an HTTP read fails
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_source_url(src) -> bool:
    """Whether ``src`` is a string with a scheme (``s3://``, ``https://``, ``ftp://``...)."""
    return isinstance(src, str) and _SCHEME.match(src) is not None


def url_name(url: str) -> str:
    """The file name a URL ends in (query string left out)."""
    return os.path.basename(url.split("?", 1)[0].rstrip("/")) or url


class _Raw(io.RawIOBase):
    """A readable raw stream over ``read(n) -> bytes-like`` (obstore's reader)."""

    def __init__(self, read, close):
        self._read, self._close = read, close

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._read(len(b))
        n = len(data)
        memoryview(b).cast("B")[:n] = memoryview(data).cast("B")
        return n

    def close(self) -> None:
        if not self.closed:
            self._close()
        super().close()


def open_url(url: str, *, storage_options: dict | None = None) -> tuple[IO[bytes], int | None]:
    """``(binary stream, size in bytes or None)`` of the object or file at ``url``."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return _open_http(url)
    if not is_url(url):
        raise FormatError(f"cannot read a source from a {scheme}:// URL; expected a local path, "
                          "s3:// (gs://, az://: object storage) or http(s)://", path=url)
    parent, _, name = url.rstrip("/").rpartition("/")
    if "://" not in parent or parent.endswith(":/") or not name:
        raise FormatError("expected the URL of an object (s3://bucket/path/file.vec), got a "
                          "bucket", path=url)
    client = connect(parent, storage_options)
    meta = client.head(name)
    if meta is None:
        client.close()
        raise RemoteError(f"{url}: no such object", url=url)
    obstore = require("obstore", extra="s3", feature=f"{url}: object storage")
    reader = obstore.open_reader(client.store, client.key(name), buffer_size=READ_BYTES)

    def close() -> None:
        reader.close()
        client.close()
    return io.BufferedReader(_Raw(reader.read, close), READ_BYTES), int(meta["size"])


def _open_http(url: str) -> tuple[IO[bytes], int | None]:
    request = urllib.request.Request(url, headers={"User-Agent": "embstore"})
    try:
        response = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)  # noqa: S310 - http(s)
    except urllib.error.HTTPError as exc:
        raise RemoteError(f"{url}: HTTP {exc.code} {exc.reason}", url=url) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RemoteError(f"{url}: cannot reach the server ({reason})", url=url) from None
    length = response.headers.get("Content-Length")
    return response, int(length) if length and length.isdigit() else None

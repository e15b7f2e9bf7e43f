"""Opening and mapping the files of a store without trusting them.

- :func:`open_regular` opens a file for reading with ``O_NONBLOCK`` (a FIFO would block
  ``open`` until a writer appears) and refuses anything that is not a regular file, or
  (given the table's directory) a path with a symbolic link below it: a shard linked to
  another table's shard, or to another shard of the same table, whose rows it would give
  (:func:`link_below`; the table's own path may be a link).
- :func:`map_file` maps a whole file read-only and keeps no descriptor: ``np.memmap`` and
  ``mmap.mmap`` each keep a duplicated descriptor per mapping, so a table of more than
  ~1,000 shards ran out of descriptors under ``ulimit -n 1024``.  Here the mapping is
  made with ``mmap(2)`` through ctypes (Linux, macOS) and unmapped when the last array
  viewing it is gone; the caller closes its descriptor right away.
- :func:`real_dir` walks a path inside a table with ``lstat``: every part must be a
  directory itself, never a symbolic link (the commit area ``vectors/.embstore/``, the
  approximate index's ``ann/``, the directory a commit moves a file into), so a writer
  never writes or deletes outside the table's directory; ``open_regular(...,
  nofollow=True)`` and :func:`create_new` open the files there without following a link.
- :func:`resource_error` turns ``EMFILE``/``ENFILE``/``ENOMEM`` into a
  :class:`~embstore.errors.ResourceLimitError` naming the limit, never a corrupt store.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
import sys
from pathlib import Path

import numpy as np

from ..errors import CorruptStoreError, ResourceLimitError

__all__ = ["open_regular", "map_file", "read_small", "resource_error", "within",
           "real_dir", "create_new", "link_below", "RESOURCE_ERRNOS", "MAX_JSON_BYTES"]

#: The largest metadata file read (a ``zarr.json``): metadata is small, a huge one is hostile.
MAX_JSON_BYTES = 16 << 20

RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_LINK = "refused: nothing inside a table follows a symbolic link"
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def resource_error(exc: OSError, path) -> ResourceLimitError:
    """``EMFILE``/``ENFILE``/``ENOMEM`` as a :class:`ResourceLimitError` naming the limit."""
    if exc.errno == errno.EMFILE:
        try:
            import resource

            limit = f" (the limit is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
        except (ImportError, OSError, ValueError):
            limit = " ("
        hint = f"too many open files{limit}; raise it with ulimit -n)"
    elif exc.errno == errno.ENFILE:
        hint = "the system's table of open files is full (fs.file-max)"
    else:
        hint = ("out of memory or of memory maps (the limit of maps per process is "
                "vm.max_map_count)")
    return ResourceLimitError(f"{path}: cannot open or map: {hint}", errno=exc.errno, path=path)


def within(path, root) -> bool:
    """Whether the real path of ``path`` lies inside the real path of ``root``."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def link_below(path, root) -> str | None:
    """None when no part of ``path`` below ``root`` is a symbolic link (``root`` itself may
    be one); else the message refusing it."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if os.path.realpath(path) == os.path.normpath(os.path.join(os.path.realpath(root), rel)):
        return None
    if not within(path, root):
        return (f"{path}: a symbolic link out of the table's directory {root} (refused: "
                "tables do not share files)")
    return (f"{path}: a symbolic link inside the table ({_LINK}: a shard linked to another "
            "shard would give that shard's rows)")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def real_dir(root, parts, *, create: bool = False) -> Path:
    """``root / parts...`` where every part is a directory itself (``lstat``), never a
    symbolic link, a FIFO or a file; missing parts are made with ``create``, else the path
    is returned as is (opening in it then finds nothing).  Raises :class:`CorruptStoreError`
    naming the part."""
    path = Path(root)
    for part in parts:  # a loop per path component
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if not create:
                return Path(root).joinpath(*parts)
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
            mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise CorruptStoreError(f"{path}: expected a directory of the table, got "
                                    f"{_kind(mode)} ({_LINK} and a writer never writes or "
                                    "deletes outside the table's directory)", path=str(path))
    return path


def create_new(path) -> int:
    """A write-only descriptor of the new file ``path`` (``O_EXCL``: never an existing
    file, a link or a FIFO)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                   0o644)


def open_regular(path, *, root=None, dir_fd: int | None = None, shown=None,
                 nofollow: bool = False) -> int:
    """A read-only descriptor of the regular file ``path`` (relative to ``dir_fd`` if given).

    Never blocks.  Raises :class:`CorruptStoreError` for a FIFO, socket, device or
    directory, or (with ``root``) a file whose real path leaves ``root``, or (with
    ``nofollow``: the table's private files) a symbolic link;
    :class:`ResourceLimitError` when out of descriptors; ``FileNotFoundError`` as is.
    ``shown`` is the path named in messages (default ``path``).
    """
    shown = path if shown is None else shown
    flags = os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC | (_O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in RESOURCE_ERRNOS:
            raise resource_error(exc, shown) from None
        if nofollow and exc.errno == errno.ELOOP:
            raise CorruptStoreError(f"{shown}: expected a regular file, got a symbolic link "
                                    f"({_LINK})", path=str(shown)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CorruptStoreError(f"{shown}: expected a regular file, got {_kind(mode)}",
                                    path=str(shown))
        refused = None if root is None else link_below(shown, root)
        if refused is not None:
            raise CorruptStoreError(refused, path=str(shown))
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Mapping:
    """Owns one ``mmap(2)`` region; NumPy arrays over it keep it alive (``base``)."""

    def __init__(self, addr: int, size: int):
        self.addr, self.size = addr, size
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "version": 3,
                                    "data": (addr, True)}

    def __del__(self) -> None:
        if self.addr and _libc is not None:
            _libc.munmap(ctypes.c_void_p(self.addr), ctypes.c_size_t(self.size))
            self.addr = 0


_libc: ctypes.CDLL | None = None
if sys.platform.startswith(("linux", "darwin")) and ctypes.sizeof(ctypes.c_void_p) == 8:
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        _libc = None
_PROT_READ = getattr(mmap, "PROT_READ", 1)
_MAP_SHARED = getattr(mmap, "MAP_SHARED", 1)


def map_file(fd: int, size: int, path) -> np.ndarray:
    """The first ``size`` bytes of the open file ``fd`` as a read-only uint8 array.

    The mapping keeps no descriptor (close ``fd`` afterwards).  ``ENOMEM`` (too many maps)
    raises :class:`ResourceLimitError`.
    """
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    if _libc is None:  # elsewhere: mmap.mmap, which keeps a duplicated descriptor
        try:
            return np.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_READ), dtype=np.uint8)
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:
                raise resource_error(exc, path) from None
            raise
    addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        if err in RESOURCE_ERRNOS:
            raise resource_error(OSError(err, os.strerror(err)), path)
        raise CorruptStoreError(f"{path}: cannot map ({os.strerror(err)})", path=str(path))
    return np.asarray(_Mapping(int(addr), size))


def read_small(fd: int, shown, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole content of the open file ``fd``, refused beyond ``limit`` bytes."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise CorruptStoreError(f"{shown}: {size} bytes, more than the {limit} a metadata file "
                                "may have", path=str(shown))
    chunks, got = [], 0
    while got <= limit:
        b = os.read(fd, min(1 << 20, limit + 1 - got))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    if got > limit:
        raise CorruptStoreError(f"{shown}: more than the {limit} bytes a metadata file may have",
                                path=str(shown))
    return b"".join(chunks)

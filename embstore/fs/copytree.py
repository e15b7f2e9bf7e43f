"""Copy a table's folder to another local folder as ``cp -a`` does, and count the bytes a
folder takes as ``du`` does.

Copying as ``cp -a`` does, with no tool needed:
files that are hard links of each other in the source (the live files and the version
folders of docs/FORMAT.md §6) stay hard links of each other in the copy, and the holes of
sparse files (a format-2 chunk's zero padding) stay holes, so the copy takes the space on
disk the source takes, not twice it.  Written beside ``dest`` and renamed into place.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable

from .atomic import write_beside

__all__ = ["copy_folder", "disk_usage"]

_STEP = 8 << 20  # bytes copied at a time


def _data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of the data of the file ``fd`` (its holes left out); the whole
    file where the system cannot say."""
    out: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            stop = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, min(stop, size)))
            pos = stop
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: no data past pos (a hole to the end)
            return [(0, size)]  # SEEK_DATA unsupported here: copy every byte
    return out


def _copy_file(src: str, dest: str, progress: Callable[[int], None]) -> None:
    """Copy the bytes of ``src`` to a new file ``dest``, skipping its holes."""
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        for start, stop in _data_ranges(fi.fileno(), size):
            fi.seek(start)
            fo.seek(start)
            for a in range(start, stop, _STEP):  # a loop per 8 MiB
                fo.write(fi.read(min(_STEP, stop - a)))
                progress(min(_STEP, stop - a))
        fo.truncate(size)  # a hole at the end
        fo.flush()
        os.fsync(fo.fileno())
    shutil.copystat(src, dest)


def copy_folder(src: str | os.PathLike, dest: str | os.PathLike, *, overwrite: bool = False,
                on_progress: Callable[[int, int | None], None] | None = None) -> None:
    """Copy the folder ``src`` to ``dest`` (refused if it exists, unless ``overwrite``):
    hard links kept as hard links, holes kept as holes, symbolic links copied as links.
    ``on_progress(done, None)`` is called with the bytes of data copied so far."""
    src = os.fspath(src)
    done = [0]

    def progress(n: int) -> None:
        done[0] += n
        if on_progress is not None:
            on_progress(done[0], None)

    with write_beside(dest, overwrite=overwrite, directory=True) as tmp:
        first: dict[tuple[int, int], str] = {}  # (device, inode) -> its copy
        for d, dirs, files in os.walk(src):  # a loop per folder and per file
            rel = os.path.relpath(d, src)
            here = tmp if rel == "." else os.path.join(tmp, rel)
            for name in dirs:
                os.makedirs(os.path.join(here, name), exist_ok=True)
            for name in files:
                s, t = os.path.join(d, name), os.path.join(here, name)
                st = os.lstat(s)
                if os.path.islink(s):
                    os.symlink(os.readlink(s), t)
                elif (st.st_dev, st.st_ino) in first:
                    os.link(first[(st.st_dev, st.st_ino)], t)
                else:
                    _copy_file(s, t, progress)
                    first[(st.st_dev, st.st_ino)] = t
        shutil.copystat(src, tmp)


def disk_usage(path: str | os.PathLike, *, skip: tuple[str, ...] = ()) -> int:
    """The bytes ``path`` takes on disk as ``du -s -B1`` counts them: the allocated blocks of
    every file and folder under it, each once (hard links counted once; a hole allocates
    nothing); folders named in ``skip`` left out."""
    seen: dict[tuple[int, int], int] = {}
    for d, dirs, files in os.walk(os.fspath(path)):  # a loop per folder and per file
        dirs[:] = [x for x in dirs if x not in skip]
        for p in [d, *(os.path.join(d, f) for f in files)]:
            st = os.lstat(p)
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())

"""The seam between a table's layouts and where its bytes live: :class:`Place`.

A place holds the objects of one table under names relative to its root (``zarr.json``,
``vectors/c/0/0``, ``page_crc/c/0/0``, ...) and answers what the layouts ask of it: whole
small objects, byte ranges, the tail of an object, many requests at once.  The layouts
(:mod:`embstore.store.rows`, :mod:`embstore.store.shard`) are written once over it; what
differs between media lives in one file each:

- :class:`~embstore.store.place.local.LocalDir`: a directory.  Files are also *mapped*
  (:attr:`Place.maps_files`): the layouts then gather rows straight from the page cache;
  the writer lock, recovery and leases of the commit protocol are local too.
- :class:`~embstore.store.place.objects.ObjectStore`: object storage (S3 and compatible):
  ranged GETs issued concurrently, coalesced by the place's cost model
  (:mod:`embstore.store.place.costs`), an on-disk chunk cache shared by processes, a helper
  process after ``fork``.

A new medium is one more file here.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Iterable

from .costs import CostModel

__all__ = ["Place"]


class Place(abc.ABC):
    """The bytes of one table (read side; commits are the versions' business)."""

    #: names the table in messages (a folder, or a URL)
    url: str
    #: the cost of a request and of a byte: ranges are coalesced by it
    costs: CostModel
    #: files can be memory-mapped (:meth:`path` gives them); else every read is a request
    maps_files = False
    #: an on-disk cache of fetched bytes (object storage), or None
    cache: Any = None

    @abc.abstractmethod
    def where(self, rel: str = "") -> str:
        """The full name of object ``rel`` (for messages)."""

    @abc.abstractmethod
    def get(self, rel: str, limit: int | None = None) -> bytes | None:
        """The whole object ``rel`` (small ones: metadata, checksums), None if absent;
        one larger than ``limit`` bytes is damage (:class:`CorruptStoreError`)."""

    @abc.abstractmethod
    def exists(self, rel: str) -> bool:
        """Whether object ``rel`` is there."""

    def present(self, rel: str) -> bool | None:
        """Whether object ``rel`` is there where knowing costs nothing (a local ``stat``),
        else None (a request: the first read of a missing object finds it missing)."""
        return None

    @abc.abstractmethod
    def get_json(self, rel: str, what: str) -> dict:
        """Metadata object ``rel`` as a JSON object (``what`` names it in errors): missing,
        broken or larger than metadata may be is refused."""

    @abc.abstractmethod
    def get_range(self, rel: str, start: int, stop: int) -> Any:
        """Bytes ``start..stop-1`` of object ``rel`` (a buffer; shorter if the object is)."""

    @abc.abstractmethod
    def get_tail(self, rel: str, n: int) -> tuple[Any, int] | None:
        """``(last n bytes, object size)`` of ``rel``, None if absent."""

    def cached(self, obj: str, name: str, load: Callable[[], Any],
               check: Callable[[Any], Any]) -> Any:
        """``check(load())``: the bytes ``load`` fetches of object ``obj``, checked (a place
        with an on-disk cache looks entry ``name`` of ``obj`` up first, and keeps what it
        loads)."""
        return check(load())

    def peek(self, obj: str, name: str, check: Callable[[Any], Any]) -> Any:
        """``check(bytes)`` of entry ``name`` of object ``obj`` in the place's on-disk cache,
        None if it has none (or the entry fails its check: then it is dropped).  Local:
        answered without a request, so callers try it before issuing requests."""
        return None

    @abc.abstractmethod
    def size(self, rel: str) -> int | None:
        """The size of object ``rel`` in bytes, None if absent."""

    def read_into(self, rel: str, at: int, buf) -> int:
        """Read bytes from offset ``at`` of ``rel`` into the uint8 array ``buf``; the bytes
        read (fewer: the object ends there)."""
        data = memoryview(self.get_range(rel, at, at + len(buf))).cast("B")
        buf[: len(data)] = data
        return len(data)

    def will_read(self, rel: str, start: int, stop: int) -> None:
        """A hint: bytes ``start..stop-1`` of ``rel`` are read next (a whole-table pass)."""

    #: threads a whole-table pass (``verify``) reads with
    readers = 2

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        """``[fn(item) for item in items]``, concurrently where requests wait on a network."""
        return [fn(it) for it in items]

    #: past how many objects a whole-table pass lists a folder instead of asking for each
    #: (object storage: one listing request per 1,000 names)
    list_past = 1000

    @abc.abstractmethod
    def names(self, rel: str) -> list[str]:
        """The names of every object under the folder ``rel``, relative to it (``c/0/0``),
        in no particular order; [] if there is none."""

    def path(self, rel: str) -> str:
        """The local file of object ``rel`` (places that :attr:`maps_files`)."""
        raise NotImplementedError(f"{self.url}: objects here are not local files")

    def settle(self) -> None:
        """Wait until no commit is half applied (places whose commits roll forward)."""

    def refresh(self) -> None:
        """Forget what was read (another process may have committed)."""

    def close(self) -> None:
        """Release connections and helpers."""

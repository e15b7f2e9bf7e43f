"""What a read from object storage costs, and the requests that follow from it.

A request costs its latency (``latency_s``: time to first byte, and a price) whatever its size;
its bytes cost ``1 / bandwidth_Bps`` seconds each on one connection.  So two byte ranges of
one object are worth reading in one request when the gap between them costs less to read
than another request: ``gap < latency_s * bandwidth_Bps`` (:attr:`CostModel.gap_bytes`;
S3's defaults, 25 ms and 100 MB/s per connection, give 2.5 MB).  The rule is the same per
connection with any number of connections in flight, and each gap is decided on its own (the
cost is additive), so merging by it minimises :meth:`CostModel.cost`: the bytes it reads are
what the model calls ideal.  Requests are then cut to at most ``max_request_bytes`` (a long
region read as several requests in parallel costs a latency more each, and no byte more) and
issued concurrently.

Both remote layouts use it: format 1 (:mod:`.source`, chunks inside shards) and format 2
(:mod:`.rows`, pages of fixed-stride chunk files).  ``embstore.open(url, request_latency=,
request_bandwidth=, max_request_bytes=)`` set it per table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InvalidOptionError
from ...ids import parse_bytes

__all__ = ["CostModel", "merge_ranges", "split_regions", "split_units", "DEFAULT"]


@dataclass(frozen=True)
class CostModel:
    """Seconds per request and per byte on one connection; the largest request."""

    latency_s: float = 0.025
    bandwidth_Bps: float = 100e6
    # (1 GiB read from moto: 8 MiB requests 1.2-1.4 s, 16 MiB 1.9 s, 32 MiB 2.5 s)
    max_request_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth_Bps > 0 and self.max_request_bytes > 0):
            raise InvalidOptionError(
                f"request costs: latency must be >= 0 s, bandwidth and max_request_bytes > 0 "
                f"(got {self.latency_s}, {self.bandwidth_Bps}, {self.max_request_bytes})")

    @property
    def gap_bytes(self) -> int:
        """The longest gap read through rather than paying another request."""
        return int(self.latency_s * self.bandwidth_Bps)

    def cost(self, requests: int, nbytes: int) -> float:
        """Seconds on one connection for ``requests`` requests moving ``nbytes`` bytes."""
        return requests * self.latency_s + nbytes / self.bandwidth_Bps

    @classmethod
    def from_options(cls, request_latency=None, request_bandwidth=None,
                     max_request_bytes=None) -> CostModel:
        """The model of ``embstore.open``'s options (None: the default); the bandwidth and
        the request size as ints or strings like ``"100MB"``, ``"16MiB"``."""
        d = DEFAULT
        try:
            return cls(latency_s=d.latency_s if request_latency is None else float(request_latency),
                       bandwidth_Bps=d.bandwidth_Bps if request_bandwidth is None else _bytes(
                           request_bandwidth),
                       max_request_bytes=d.max_request_bytes if max_request_bytes is None else
                       int(_bytes(max_request_bytes)))
        except (TypeError, ValueError) as exc:
            raise InvalidOptionError(f"request costs: {exc}") from None


DEFAULT = CostModel()


def _bytes(value) -> float:
    """A byte count (per second, for a bandwidth): a number, or a string like ``"100MB"``."""
    if isinstance(value, float) and not isinstance(value, bool):
        return value
    return float(parse_bytes(value))


def merge_ranges(group: np.ndarray, start: np.ndarray, stop: np.ndarray,
                 gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranges ``[start, stop)`` of objects ``group`` (sorted by group, then start; not
    overlapping) merged where the gap between neighbours of one object is at most ``gap``:
    ``(region of each range, region starts, region stops)``."""
    if start.size == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e
    new = np.ones(start.size, dtype=bool)
    new[1:] = (group[1:] != group[:-1]) | (start[1:] - stop[:-1] > gap)
    region = np.cumsum(new) - 1
    heads = np.flatnonzero(new)
    ends = np.r_[heads[1:], start.size] - 1
    return region, start[heads].astype(np.int64), stop[ends].astype(np.int64)


def split_regions(start: np.ndarray, stop: np.ndarray, cap: int,
                  step: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Regions cut into requests of at most ``cap`` bytes (at least ``step``), cut only at
    multiples of ``step`` (offsets within the object): ``(part starts, part stops, region of
    each part)``.  Vectorised: no loop per region."""
    unit = max(step, cap // step * step)
    first = start // unit + 1  # the first cut strictly after a region's start
    last = (stop - 1) // unit  # the last cut strictly before its stop
    cuts = np.maximum(last - first + 1, 0)
    n = cuts + 1
    region = np.repeat(np.arange(start.size), n)
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # part number in its region
    lo = np.where(k == 0, start[region], (first[region] + k - 1) * unit)
    hi = np.where(k == n[region] - 1, stop[region], (first[region] + k) * unit)
    return lo.astype(np.int64), hi.astype(np.int64), region


def split_units(region: np.ndarray, at: np.ndarray, cap: int) -> np.ndarray:
    """Requests for units (chunks) that must not be cut, sorted by region then offset, ``at``
    their offsets from their region's start: units of a region starting in the same
    ``cap``-byte window share a request (so a request is at most ``cap`` plus one unit).
    Returns the request number of each unit."""
    window = at // max(1, cap)
    new = np.ones(region.size, dtype=bool)
    new[1:] = (region[1:] != region[:-1]) | (window[1:] != window[:-1])
    return np.cumsum(new) - 1

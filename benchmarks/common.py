"""Shared machinery of the benchmark runner.

Timing with interleaved repetitions (each repetition runs every method once, in
a rotating order, so drift of the machine hits all of them alike), page-cache
warming right before timing, fresh child processes measured for peak RSS, and
the result records that ``report.py`` renders.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


class Skip(Exception):
    """A scenario or one of its methods cannot run here (a module or a peer is missing)."""


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- results

@dataclasses.dataclass
class Measurement:
    case: str                 # "uniform", "zipf", "10,000,000 rows", ...
    method: str               # "embstore on-disk, cold row cache", "np.take in RAM", ...
    kind: str                 # "embstore" | "peer" | "limit"
    unit: str                 # "ms", "s", "GB/s", "keys/s", "MB", ...
    values: list[float]
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def min(self) -> float:
        return float(min(self.values))

    @property
    def max(self) -> float:
        return float(max(self.values))

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(median=self.median, min=self.min, max=self.max, reps=len(self.values))
        return d


@dataclasses.dataclass
class Comparison:
    label: str
    embstore: str             # formatted value with unit
    peer: str                 # formatted value with unit ("" for an absolute target)
    ratio: float | None
    ratio_text: str
    target: str
    met: bool | None          # None: no target, reported only

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ScenarioResult:
    name: str
    title: str
    status: str = "ok"        # "ok" | "skipped" | "error"
    params: dict = dataclasses.field(default_factory=dict)
    measurements: list[Measurement] = dataclasses.field(default_factory=list)
    comparisons: list[Comparison] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def find(self, case: str, method: str) -> Measurement | None:
        for m in self.measurements:
            if m.case == case and m.method == method:
                return m
        return None

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "status": self.status,
                "params": self.params, "seconds": round(self.seconds, 2), "notes": self.notes,
                "measurements": [m.to_json() for m in self.measurements],
                "comparisons": [c.to_json() for c in self.comparisons]}




def fmt(value: float, unit: str) -> str:
    if unit in ("keys/s", "ids/s", "rows/s"):
        return f"{value / 1e6:.2f} M{unit}" if value >= 1e6 else f"{value:,.0f} {unit}"
    if value >= 100:
        return f"{value:,.0f} {unit}"
    if value >= 10:
        return f"{value:.1f} {unit}"
    return f"{value:.2f} {unit}"


def _ratio_text(r: float) -> str:
    return f"{r:,.0f}x" if r >= 100 else (f"{r:.1f}x" if r >= 10 else f"{r:.2f}x")


def compare(res: ScenarioResult, label: str, emb: Measurement | None, peer: Measurement | None,
            *, target: tuple[str, float] | None = None) -> Comparison | None:
    """Add a row ``embstore vs peer`` to ``res``; ``target`` is one of

    ``("within", b)``: time ratio embstore/peer at most ``b``;
    ``("faster", f)``: embstore at least ``f`` times faster (peer/embstore >= f);
    ``("atleast", b)``: throughput ratio embstore/peer at least ``b``.
    Without a target the ratio is reported only.  Missing measurements add nothing.
    """
    if emb is None or peer is None:
        return None
    e, p = emb.median, peer.median
    if target is not None and target[0] == "faster":
        ratio = p / e if e > 0 else float("inf")
        text = f"{_ratio_text(ratio)} faster" if ratio >= 1 else f"{_ratio_text(1 / ratio)} slower"
        if target[1] is None:  # reported as a speed-up, no target
            tgt, met = "", None
        else:
            tgt, met = f">= {target[1]:g}x faster", ratio >= target[1]
    else:
        ratio = e / p if p > 0 else float("inf")
        text = _ratio_text(ratio)
        if target is None:
            tgt, met = "", None
        elif target[0] == "within":
            tgt, met = f"<= {target[1]:g}x", ratio <= target[1]
        elif target[0] == "atleast":
            tgt, met = f">= {target[1]:g}x", ratio >= target[1]
        else:
            raise ValueError(f"unknown target {target!r}")
    c = Comparison(label, f"{fmt(e, emb.unit)} ({emb.method})", f"{fmt(p, peer.unit)} ({peer.method})",
                   ratio, text, tgt, met)
    res.comparisons.append(c)
    return c


def absolute(res: ScenarioResult, label: str, emb: Measurement | None, *, at_most: float | None = None,
             at_least: float | None = None, value: float | None = None) -> Comparison | None:
    """Add a row for an absolute target on one embstore figure (its median, or ``value``)."""
    if emb is None:
        return None
    v = emb.median if value is None else value
    if at_most is not None:
        tgt, met = f"<= {fmt(at_most, emb.unit)}", v <= at_most
    elif at_least is not None:
        tgt, met = f">= {fmt(at_least, emb.unit)}", v >= at_least
    else:
        tgt, met = "", None
    c = Comparison(label, f"{fmt(v, emb.unit)} ({emb.method})", "", None, "", tgt, met)
    res.comparisons.append(c)
    return c


# ---------------------------------------------------------------- page cache

def _files(paths) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file()))
        elif p.is_file():
            out.append(p)
    return out


def read_through(paths, *, block: int = 16 << 20) -> int:
    """Read files (or every file under directories) sequentially; returns the bytes read."""
    buf = bytearray(block)
    view = memoryview(buf)
    total = 0
    for f in _files(paths):
        with open(f, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
    return total


def drop_page_cache(paths) -> None:
    """Ask the kernel to drop these files' clean pages (``posix_fadvise DONTNEED``)."""
    for f in _files(paths):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def evict(paths) -> None:
    """Take these files' pages out of memory, as a page cache too small for them would.

    ``posix_fadvise(DONTNEED)`` keeps pages that a live process maps, so this process's
    own mappings of the files (embstore's shard maps, ``np.memmap``) are first unmapped
    page by page with ``madvise(MADV_DONTNEED)`` (the mappings stay; the next access
    faults the page in again, from disk).  Linux only; elsewhere only the advice is given.
    """
    names = {os.path.realpath(f) for f in _files(paths)}
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].strip() in names:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    libc.madvise(lo, hi - lo, 4)  # MADV_DONTNEED
    except (OSError, AttributeError):
        pass
    drop_page_cache(paths)


def read_bytes(field: str = "read_bytes") -> int | None:
    """Bytes this process has caused to be read from storage (``/proc/self/io``; ``field``
    ``write_bytes``: written)."""
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def written_bytes() -> int:
    """Bytes this process has caused to be written to storage (0 where not readable)."""
    return read_bytes("write_bytes") or 0


class Warmer:
    """Keeps files in the page cache during a timing loop.

    This machine pages out page-cache pages idle for about a minute, so the
    files are read through right before timing and again whenever ``every``
    seconds have passed since (between repetitions, never inside a timed call).
    """

    def __init__(self, paths, *, every: float = 20.0):
        self.paths = [p for p in paths if p is not None]
        self.every = every
        self.last = -1e18

    def warm(self) -> None:
        read_through(self.paths)
        self.last = time.monotonic()

    def maybe(self) -> None:
        if time.monotonic() - self.last > self.every:
            self.warm()


# ---------------------------------------------------------------- interleaved timing

@dataclasses.dataclass
class Method:
    name: str
    kind: str                               # "embstore" | "peer"
    fn: Callable[[], Any]                   # the timed call
    before: Callable[[], Any] | None = None  # untimed, before every call (e.g. cache_clear)
    reps: int | None = None                 # at most this many timed calls (slow peers)
    warmup: Callable[[], Any] | None = None  # untimed first call (default: fn)
    check: Callable[[Any], None] | None = None  # validates the first result
    extra: Callable[[], dict] | None = None  # figures to record after timing
    unit: str = "ms"


def spread(reps: int, k: int) -> set[int]:
    k = max(1, min(k, reps))
    return {round(i * reps / k) for i in range(k)}


def interleave(res: ScenarioResult, case: str, methods: list[Method], *, reps: int,
               warmer: Warmer | None = None,
               on_rep: Callable[[int], Any] | None = None) -> dict[str, Measurement]:
    """Time ``methods`` in interleaved repetitions; add a Measurement per method to ``res``.

    ``on_rep(r)`` runs (untimed) before repetition ``r``, for example to pick
    the batch of ids every method looks up in that repetition.

    A method whose warm-up or check fails is reported in ``res.notes`` and dropped.
    Returns the measurements by method name.
    """
    live: list[Method] = []
    if on_rep is not None:
        on_rep(0)
    for m in methods:
        try:
            out = (m.warmup or m.fn)()
            if m.check is not None and m.warmup is None:
                m.check(out)
            del out
            live.append(m)
        except Skip as exc:
            res.notes.append(f"{case}: {m.name}: skipped: {exc}")
            log(f"  {case}: {m.name}: skipped: {exc}")
        except Exception as exc:  # noqa: BLE001 - a broken method must not sink the run
            res.notes.append(f"{case}: {m.name}: ERROR {type(exc).__name__}: {exc}")
            log(f"  {case}: {m.name}: ERROR {type(exc).__name__}: {exc}")
    times: dict[str, list[float]] = {m.name: [] for m in live}
    when = {m.name: spread(reps, m.reps) if m.reps else set(range(reps)) for m in live}
    checked = {m.name: m.check is None or m.warmup is None for m in live}
    failed: set[str] = set()
    for r in range(reps):
        if warmer is not None:
            warmer.maybe()
        if on_rep is not None:
            on_rep(r)
        k = r % len(live) if live else 0
        for m in live[k:] + live[:k]:
            if r not in when[m.name] or m.name in failed:
                continue
            if m.before is not None:
                m.before()
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                out = m.fn()
                dt = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001
                failed.add(m.name)
                res.notes.append(f"{case}: {m.name}: ERROR {type(exc).__name__}: {exc}")
                continue
            finally:
                gc.enable()
            if not checked[m.name]:
                checked[m.name] = True
                try:
                    m.check(out)
                except Exception as exc:  # noqa: BLE001
                    failed.add(m.name)
                    res.notes.append(f"{case}: {m.name}: ERROR {type(exc).__name__}: {exc}")
            del out
            times[m.name].append(dt * 1e3 if m.unit == "ms" else dt)
    found: dict[str, Measurement] = {}
    for m in live:
        if m.name in failed or not times[m.name]:
            continue
        extra = m.extra() if m.extra is not None else {}
        meas = Measurement(case, m.name, m.kind, m.unit, times[m.name], extra)
        res.measurements.append(meas)
        found[m.name] = meas
        log(f"  {case}: {m.name}: {fmt(meas.median, meas.unit)} "
            f"(min {fmt(meas.min, meas.unit)}, max {fmt(meas.max, meas.unit)}, n={len(meas.values)})")
    return found

"""Deterministic initial rows of a new table (``embstore.create(..., init=...)``).

Row ``i``'s values depend only on ``(seed, i)`` and the spec, never on which rows are
made together or in what order: each value is a counter-based draw, a splitmix64 hash of
``(seed, i * dim + column)`` turned into a uniform (53 bits) or, by Box-Muller over two
such draws, a normal.  Vectorised over blocks of rows.

``init``: ``"uniform"`` / ``"normal"`` / ``"zeros"``, or a dict ``{"kind": ..., "seed":
0, "scale": s}`` (uniform in ``[-s, s)``, default ``1 / sqrt(dim)``) or ``{"kind":
"normal", "seed": 0, "std": s, "mean": 0.0}`` (default std ``1 / sqrt(dim)``).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CorruptStoreError, InvalidOptionError

__all__ = ["check_init", "init_rows", "init_at", "check_stored_init", "array_init", "norms_init",
           "ATTR"]

#: the attribute of a row array's zarr.json naming its initialisation (docs/FORMAT.md §3e)
ATTR = "embstore_init"

_KEYS = {"uniform": {"kind", "seed", "scale"}, "normal": {"kind", "seed", "std", "mean"},
         "zeros": {"kind"}}
_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def check_init(init, dim: int) -> dict | None:
    """The spec, complete (None: zeros)."""
    if init is None:
        return None
    spec: dict | None = {"kind": init} if isinstance(init, str) else dict(init) \
        if isinstance(init, dict) else None
    if spec is None or spec.get("kind") not in _KEYS:
        raise InvalidOptionError(f"init must be 'uniform', 'normal', 'zeros' or a dict with "
                                 f"'kind' one of them, got {init!r}")
    extra = set(spec) - _KEYS[spec["kind"]]
    if extra:
        raise InvalidOptionError(f"init {spec['kind']!r} takes {sorted(_KEYS[spec['kind']])}, "
                                 f"got {sorted(extra)}")
    if spec["kind"] == "zeros":
        return None
    seed = spec.setdefault("seed", 0)
    if type(seed) is not int or seed < 0:
        raise InvalidOptionError(f"init seed must be an int >= 0, got {seed!r}")
    width = "scale" if spec["kind"] == "uniform" else "std"
    spec.setdefault(width, 1.0 / math.sqrt(max(1, dim)))
    spec.setdefault("mean", 0.0) if spec["kind"] == "normal" else None
    for k in (width, "mean"):
        v = spec.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InvalidOptionError(f"init {k} must be a finite number, got {v!r}")
    return spec


def check_stored_init(spec, dim: int, where: str) -> dict:
    """An initialisation read from a table (``zarr.json``): complete, as :func:`check_init`
    writes it, a seed below 2**64; anything else is damage."""
    try:
        kind = spec.get("kind") if isinstance(spec, dict) else None
        full = check_init(spec, dim) if kind in ("uniform", "normal") else None
    except InvalidOptionError as exc:
        raise CorruptStoreError(f"{where}: {exc}", path=where) from None
    if full is None or set(spec) != set(full) or full["seed"] >= 1 << 64:
        raise CorruptStoreError(f"{where}: expected a complete initialisation (kind "
                                f"'uniform' or 'normal', its seed and width), got {spec!r}",
                                path=where)
    return full


def norms_init(spec: dict, dim: int, storage: str) -> dict:
    """The ``embstore_init`` of the ``norms`` of rows initialised by ``spec``."""
    return {"norms_of": dict(spec), "dim": int(dim), "dtype": storage}


def array_init(meta: dict, where: str) -> dict | None:
    """The initialisation a row array's ``zarr.json`` (``meta``) names, checked (None: it
    names none, every chunk is stored); a malformed one is damage."""
    attrs = meta.get("attributes")
    spec = attrs.get(ATTR) if isinstance(attrs, dict) else None
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise CorruptStoreError(f"{where}: attributes.{ATTR} must be a JSON object, got "
                                f"{type(spec).__name__}", path=where)
    cols = int(meta["shape"][1])
    if "norms_of" in spec:
        dim, storage = spec.get("dim"), spec.get("dtype")
        if set(spec) != {"norms_of", "dim", "dtype"} or type(dim) is not int or \
                not 1 <= dim <= 1 << 28 or storage not in ("float16", "float32", "float64",
                                                           "bfloat16") or cols != 1:
            raise CorruptStoreError(f"{where}: attributes.{ATTR}: expected the norms of rows "
                                    f"({{norms_of, dim, dtype}}, one column), got {spec!r}",
                                    path=where)
        return {**spec, "norms_of": check_stored_init(spec["norms_of"], dim, where)}
    return check_stored_init(spec, cols, where)


def _uniform(seed: int, counter: np.ndarray, stream: int) -> np.ndarray:
    """Uniform float64 in [0, 1) from a splitmix64 hash of (seed, stream, counter)
    (``counter`` uint64, left as it was; the arithmetic in place on one copy)."""
    with np.errstate(over="ignore"):
        x = counter * np.uint64(2)
        x += np.uint64(stream)
        x += np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & int(_M))
        for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x ^= x >> np.uint64(shift)
            x *= np.uint64(mul)
        x ^= x >> np.uint64(31)
        x >>= np.uint64(11)
    out = x.astype(np.float64)
    out *= 1.0 / (1 << 53)
    return out


def _values(spec: dict, counter: np.ndarray) -> np.ndarray:
    """The float32 values of the counters ``counter`` (uint64, any shape)."""
    u = _uniform(spec["seed"], counter, 0)
    if spec["kind"] == "uniform":
        out = (2.0 * u - 1.0) * spec["scale"]
    else:
        v = _uniform(spec["seed"], counter, 1)
        out = np.sqrt(-2.0 * np.log1p(-u)) * np.cos(2.0 * math.pi * v) * spec["std"] \
            + spec["mean"]
    return out.astype(np.float32)


def init_rows(spec: dict, start: int, stop: int, dim: int) -> np.ndarray:
    """Rows ``start..stop-1`` (float32) of the initialisation ``spec``."""
    counter = (np.arange(start, stop, dtype=np.uint64)[:, None] * np.uint64(dim)
               + np.arange(dim, dtype=np.uint64)[None, :])
    return _values(spec, counter)


_BLOCK_VALUES = 1 << 20  # values made at a time (a few float64 temporaries of 8 MiB)


def init_at(spec: dict, ids: np.ndarray, dim: int, out: np.ndarray | None = None
            ) -> np.ndarray:
    """Rows ``ids`` (any int64 ids, any order, repeats allowed) of ``spec``, float32
    ``(n, dim)`` (into ``out`` when given): the same values as :func:`init_rows`, made a
    block of rows at a time so that memory stays bounded for any ``n``."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if out is None:
        out = np.empty((ids.size, dim), dtype=np.float32)
    cols = np.arange(dim, dtype=np.uint64)[None, :]
    step = max(1, _BLOCK_VALUES // max(1, dim))
    for a in range(0, ids.size, step):  # a loop per block of rows (a million values)
        part = ids[a: a + step].astype(np.uint64)[:, None] * np.uint64(dim) + cols
        out[a: a + step] = _values(spec, part)
    return out

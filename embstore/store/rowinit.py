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

from ..errors import InvalidOptionError

__all__ = ["check_init", "init_rows"]

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


def _uniform(seed: int, counter: np.ndarray, stream: int) -> np.ndarray:
    """Uniform float64 in [0, 1) from a splitmix64 hash of (seed, stream, counter)."""
    with np.errstate(over="ignore"):
        x = counter.astype(np.uint64) * np.uint64(2) + np.uint64(stream)
        x = x + np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & int(_M))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def init_rows(spec: dict, start: int, stop: int, dim: int) -> np.ndarray:
    """Rows ``start..stop-1`` (float32) of the initialisation ``spec``."""
    counter = (np.arange(start, stop, dtype=np.uint64)[:, None] * np.uint64(dim)
               + np.arange(dim, dtype=np.uint64)[None, :])
    u = _uniform(spec["seed"], counter, 0)
    if spec["kind"] == "uniform":
        out = (2.0 * u - 1.0) * spec["scale"]
    else:
        v = _uniform(spec["seed"], counter, 1)
        out = np.sqrt(-2.0 * np.log1p(-u)) * np.cos(2.0 * math.pi * v) * spec["std"] \
            + spec["mean"]
    return out.astype(np.float32)

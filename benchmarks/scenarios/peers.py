"""The lookup peers: NumPy in RAM and memory-mapped, zarr-python, tensorstore, and embstore's
own tables, each as a callable ``ids -> rows`` that the lookup and scale scenarios time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..common import Skip
from ..data import vectors_path


def np_take(E):
    return lambda ids: np.take(E, ids, axis=0)


def fancy(E):
    return lambda ids: E[ids]


def memmap(npy: Path):
    M = np.load(npy, mmap_mode="r", allow_pickle=False)
    return lambda ids: np.asarray(M[ids])


def zarr_python(store: Path):
    try:
        import zarr
    except ImportError:
        raise Skip("zarr not installed") from None
    za = zarr.open_array(vectors_path(store), mode="r")
    dim = za.shape[1]
    return lambda ids: za.oindex[ids.reshape(-1)].reshape(ids.shape + (dim,))


def tensorstore(store: Path, cache_bytes: int = 0):
    """tensorstore reading ``vectors``; ``cache_bytes``: its ``cache_pool`` (decoded chunks
    kept between reads; 0, its default, keeps none)."""
    try:
        import tensorstore as ts
    except ImportError:
        raise Skip("tensorstore not installed") from None
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(vectors_path(store))}}
    if cache_bytes:
        spec["context"] = {"cache_pool": {"total_bytes_limit": int(cache_bytes)}}
        spec["recheck_cached_data"] = False  # as a read-only reader: no stat per chunk
    ta = ts.open(spec, read=True).result()
    dim = ta.shape[1]
    return lambda ids: ta[ids.reshape(-1)].read().result().reshape(ids.shape + (dim,))

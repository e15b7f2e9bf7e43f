"""crc32c, the checksum of every stored chunk and index (Zarr's ``crc32c`` codec), through
``google-crc32c``: the library zarr-python itself requires (Apache-2.0), so embstore adds no
second one (it used ``crc32c``, LGPL, until 2026-12).

Measured on this machine (2 cores, shared), one call over 100 MB of a memory map: google-crc32c
6.6-10.0 ms, crc32c 5.7-10.1 ms; 102,400 calls over 1 KiB pieces of it: google-crc32c 0.41-0.51
us a call, crc32c 0.58-0.86 us (its ``gil_release_mode=1``); 1 KiB ``bytes``: 0.10-0.12 us
both.  google-crc32c lets the GIL go during each call (two threads over 200 MB each: the time
of one), as the cold chunk checks need.

``google_crc32c.value`` takes ``bytes`` and NumPy arrays but refuses ``memoryview``,
``bytearray`` and ``mmap`` (its ``y#`` argument): :func:`crc32c` views those as a uint8 array
first (no copy); hot loops slice one such view (:func:`as_bytes_array`) instead.
"""

from __future__ import annotations

import google_crc32c
import numpy as np

__all__ = ["crc32c", "as_bytes_array", "value"]

value = google_crc32c.value  # crc32c of bytes or a C-contiguous ndarray


def as_bytes_array(data) -> np.ndarray:
    """``data`` (bytes, memoryview, bytearray, mmap, ndarray) as a flat uint8 array, no copy."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def crc32c(data, value: int = 0) -> int:
    """The crc32c of ``data`` (any contiguous buffer), continuing from ``value``."""
    if type(data) is not bytes and type(data) is not np.ndarray:
        data = as_bytes_array(data)
    elif type(data) is np.ndarray and (data.dtype != np.uint8 or data.ndim != 1):
        data = as_bytes_array(data)
    return google_crc32c.extend(value, data) if value else google_crc32c.value(data)

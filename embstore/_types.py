"""Type aliases of the public API (for annotations; nothing here runs)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, Union

import numpy as np

from numpy.typing import ArrayLike, DTypeLike

__all__ = ["ArrayLike", "DTypeLike", "PathLike", "Bytes", "OpenMode", "KeysLike"]

PathLike = Union[str, "os.PathLike[str]"]   # a path: str or pathlib.Path
Bytes = Union[int, str]                      # a byte size: 268435456 or "256MiB"
OpenMode = Literal["r", "r+"]
KeysLike = Union[Sequence[str], "np.ndarray"]  # one str key per row

"""Similarity: logits and exact top-k streamed over any table (``stream``, ``exact``,
``topk``), the approximate index (``ann``, its FAISS IVF lists ``ivf``, their checks
``integrity``) and unknown words' neighbours through their subwords (``subword``)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


def __getattr__(name: str) -> Any:
    """A module of the package (``embstore.search.stream``), imported the first time it is
    asked for: ``import embstore`` stays complete while loading only what a program uses."""
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f".{name}", __name__)

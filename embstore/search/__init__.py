"""Similarity: logits and exact top-k streamed over any table (``stream``, ``exact``,
``topk``), the approximate index (``ann``, its FAISS IVF lists ``ivf``, their checks
``integrity``) and unknown words' neighbours through their subwords (``subword``)."""

from __future__ import annotations

from ..optional import lazy_attributes

# a module of the package (``embstore.search.stream``), imported the first time it is asked
# for: ``import embstore`` stays complete while loading only what a program uses
__getattr__, _ = lazy_attributes(__name__, {})

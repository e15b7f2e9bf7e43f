"""Similarity: logits and exact top-k streamed over any table (``stream``, ``exact``,
``topk``), the approximate index (``ann``, its FAISS IVF lists ``ivf``, their checks
``integrity``) and unknown words' neighbours through their subwords (``subword``)."""

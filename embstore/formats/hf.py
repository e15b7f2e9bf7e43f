"""Hugging Face model folders: the input embedding matrix of a checkpoint, keyed by its tokenizer.

``read(folder)`` finds, in order:

- the checkpoint: ``model.safetensors.index.json`` (a sharded checkpoint: its
  ``weight_map`` names the shard holding each tensor, and only that shard is opened),
  ``model.safetensors``, ``pytorch_model.bin.index.json``, ``pytorch_model.bin`` (the
  PyTorch reader's restricted loader, ``weights_only=True``);
- the tensor: ``tensor=`` if given; else the names known for the config's ``model_type``
  (``config.json``), then any 2-D tensor whose name ends in a usual input-embedding name
  (``embed_tokens``, ``word_embeddings``, ``wte``, ``shared``, ``embed_in``,
  ``tok_embeddings``, then ``.weight``), the shallowest first (T5's ``shared.weight``
  before ``encoder.embed_tokens.weight``, which is the same matrix);
- the keys: ``tokenizer.json``, else ``vocab.json``, else ``vocab.txt`` (or ``vocab=``),
  through :class:`~.tokens.TokenKeys` (padding rows and repeated tokens: see there).

The stored dtype is kept (bfloat16 included).  Nothing is executed: JSON is parsed
with :mod:`json`, safetensors by embstore's own reader.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from . import DEFAULT_BLOCK_ROWS, Reader
from . import safetensors as st_format
from . import torch as torch_format
from .safetensors import EMBEDDING_SUFFIXES, embedding_by_name, read_header
from .tokens import TOKEN_FILES, TokenKeys, _read_json, load_tokens
from ..errors import FormatError

__all__ = ["read", "find_checkpoint", "choose_embedding", "is_model_folder", "KeyedReader"]

CHECKPOINTS = ("model.safetensors.index.json", "model.safetensors",
               "pytorch_model.bin.index.json", "pytorch_model.bin")
SUFFIXES = EMBEDDING_SUFFIXES
BY_MODEL_TYPE = {  # config.json model_type -> the input embedding's usual names
    "bert": ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"),
    "roberta": ("embeddings.word_embeddings.weight",
                "roberta.embeddings.word_embeddings.weight"),
    "gpt2": ("wte.weight", "transformer.wte.weight"),
    "llama": ("model.embed_tokens.weight",), "mistral": ("model.embed_tokens.weight",),
    "qwen2": ("model.embed_tokens.weight",), "gemma": ("model.embed_tokens.weight",),
    "t5": ("shared.weight",), "bart": ("model.shared.weight",),
    "gpt_neox": ("gpt_neox.embed_in.weight",), "bloom": ("transformer.word_embeddings.weight",),
}


def is_model_folder(path) -> bool:
    """A directory holding a checkpoint file a model folder has."""
    path = os.fspath(path)
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, c)) for c in CHECKPOINTS)


def find_checkpoint(folder: str) -> tuple[str, dict[str, str] | None]:
    """``(checkpoint file, weight_map)``: the first of :data:`CHECKPOINTS` present; for an
    index, ``weight_map`` maps tensor names to shard files (else None)."""
    for name in CHECKPOINTS:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if not name.endswith(".index.json"):
            return path, None
        doc = _read_json(path)
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in wmap.items()):
            raise FormatError("expected a weight_map object of tensor name: shard file",
                              path=path)
        return path, wmap
    raise FormatError(f"expected a model folder with one of {', '.join(CHECKPOINTS)}; none found",
                      path=folder)


def choose_embedding(names, model_type: str | None) -> str | None:
    """The input embedding's name among ``names`` (see the module docstring), or None."""
    names = list(names)
    have = set(names)
    for name in BY_MODEL_TYPE.get(model_type or "", ()):
        if name in have:
            return name
    return embedding_by_name(names)


def _shard(folder: str, index: str, wmap: dict[str, str], name: str) -> str:
    """The shard file holding ``name``, which must be a plain file name inside ``folder``."""
    shard = wmap[name]
    if os.path.basename(shard) != shard or shard in ("", ".", ".."):
        raise FormatError(f"weight_map[{name!r}]: expected a file name in the folder, got "
                          f"{shard!r}", path=index)
    return os.path.join(folder, shard)


class KeyedReader(Reader):
    """A keyless reader's blocks with keys from a :class:`~.tokens.TokenKeys`."""

    def __init__(self, inner: Reader, keys: TokenKeys | None, *, format: str, path: str):
        super().__init__(path, block_rows=inner.block_rows, limit=inner.limit)
        self._inner, self._keys = inner, keys
        self.format = format
        for attr in ("dim", "count", "dtype", "native_dtype", "tensor", "progress_unit",
                     "progress_total"):
            setattr(self, attr, getattr(inner, attr))
        self.has_keys = keys is not None
        self.notes: list[str] = []

    def size_hint(self) -> int | None:
        return self._inner.size_hint()

    def blocks(self) -> Iterator[tuple[np.ndarray, list[str] | None]]:
        for block, _ in self._inner:
            self.progress_done = self._inner.progress_done
            yield block, None if self._keys is None else self._keys.take(len(block))
        if self._keys is not None:
            self.notes += self._keys.notes

    def close(self) -> None:
        self._inner.close()


def _tensor_names(folder: str, ckpt: str, wmap: dict[str, str] | None) -> list[str]:
    if wmap is not None:
        return list(wmap)
    if ckpt.endswith(".safetensors"):
        header, _ = read_header(ckpt)
        return [k for k, v in header.items() if len(v["shape"]) == 2]
    return [k for k, t in torch_format.load_tensors(ckpt).items() if t.ndim == 2]


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None,
         vocab=None) -> Reader:
    """Stream the input embedding matrix of the model folder ``path``, keyed by its tokenizer
    (``vocab``: a tokenizer.json, vocab.json or vocab.txt to use instead)."""
    folder = os.fspath(path)
    config_path = os.path.join(folder, "config.json")
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    model_type = config.get("model_type") if isinstance(config, dict) else None
    ckpt, wmap = find_checkpoint(folder)
    names = _tensor_names(folder, ckpt, wmap)
    name = tensor if tensor is not None else choose_embedding(names, model_type)
    if name is None or name not in names:
        listing = ", ".join(sorted(names)[:20]) + (", ..." if len(names) > 20 else "")
        what = f"a tensor named {tensor!r}" if tensor is not None else \
            f"an input embedding tensor (a name ending in {', '.join(SUFFIXES)})"
        raise FormatError(f"expected {what}, got: {listing or 'no 2-D tensors'}; choose one with "
                          "tensor=", path=ckpt)
    file = ckpt if wmap is None else _shard(folder, ckpt, wmap, name)
    module = st_format if file.endswith(".safetensors") else torch_format
    inner = module.read(file, block_rows=block_rows, limit=limit, tensor=name, dtype=dtype)
    vocab_file = os.fspath(vocab) if vocab is not None else next(
        (p for p in (os.path.join(folder, t) for t in TOKEN_FILES) if os.path.isfile(p)), None)
    try:
        keys = None if vocab_file is None else TokenKeys(
            load_tokens(vocab_file, rows=inner.count), path=vocab_file)
    except BaseException:
        inner.close()
        raise
    reader = KeyedReader(inner, keys, format="hf", path=folder)
    stored = inner.native_dtype or np.dtype(inner.dtype).name
    reader.notes.append(f"tensor {name} ({inner.count} x {inner.dim} {stored}) "
                        f"from {os.path.relpath(file, folder)}"
                        + (f", keys from {os.path.basename(vocab_file)}" if vocab_file else
                           ", no tokenizer or vocabulary found: no keys"))
    vocab_size = config.get("vocab_size") if isinstance(config, dict) else None
    if type(vocab_size) is int and vocab_size != inner.count and limit is None:
        reader.notes.append(f"config.json says vocab_size {vocab_size}; the tensor has "
                            f"{inner.count} rows")
    return reader

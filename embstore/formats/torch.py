"""PyTorch files: a state dict (nested dicts allowed, names joined with ``.``) or a bare
tensor, loaded only with ``torch.load(weights_only=True)`` (the restricted loader:
nothing is executed) and memory-mapped where the file allows it.

``tensor=None`` picks the only 2-D float tensor, else the error lists them;
bfloat16 arrives as float32, float16/32/64 as is.

Write: a state dict ``{tensor: rows}`` (default name ``weight``, as ``nn.Embedding``'s
``state_dict()``) saved with ``torch.save``, which ``torch.load(weights_only=True)`` reads.
``torch.save`` needs the whole tensor: the rows are streamed block by block into a
memory-mapped scratch file beside the output (removed as soon as it is made), so memory
holds one block, not the table.  A table stored in bfloat16 is written as bfloat16.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings

import numpy as np

from . import DEFAULT_BLOCK_ROWS, _safetensors_header
from ._array import ArrayReader
from .safetensors import TENSOR_NAME, _bf16_bits, choose_tensor
from ..dtypes import FLOAT_DTYPES
from ..errors import FormatError
from ..optional import require

__all__ = ["read", "write", "load_tensors"]

_FLOATS = FLOAT_DTYPES + ("bfloat16",)


def _torch():
    return require("torch", extra="torch", feature="reading PyTorch files")


def _flatten(obj, prefix: str, out: dict) -> None:
    torch = _torch()

    if isinstance(obj, torch.Tensor):
        out[prefix or "tensor"] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}.{i}" if prefix else str(i), out)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torch's message is in bold in places


def _load_failure(exc: BaseException) -> str:
    """What ``torch.load(weights_only=True)`` refused, whole: torch's own message is a
    paragraph offering to unpickle (which embstore never does) before it names the object,
    so keep the unpickler's reason, and say how to make a file embstore reads."""
    text = _ANSI.sub("", str(exc)).strip()
    at = text.find("WeightsUnpickler error:")
    if at < 0:
        return " ".join(text.split()) or type(exc).__name__
    why = text[at + len("WeightsUnpickler error:"):].split("Check the documentation")[0]
    why = " ".join(why.split(" Please use ")[0].split())
    return (f"{why or 'refused'} (not a file of tensors alone: save just the tensors, "
            "torch.save(model.state_dict(), path), or as safetensors)")


def load_tensors(path) -> dict:
    """``{dotted name: tensor}`` of every tensor in a PyTorch file (restricted loader)."""
    torch = _torch()

    path = os.fspath(path)
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols: not ours
            warnings.simplefilter("ignore")
            try:
                obj = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
            except RuntimeError as exc:  # legacy (non-zip) files cannot be memory-mapped
                if "mmap" not in str(exc):
                    raise
                obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - the restricted unpickler of a hostile file
        # raises many types (UnpicklingError, RuntimeError, EOFError, IndexError, KeyError...)
        raise FormatError(f"expected a PyTorch state dict readable with weights_only=True, "
                          f"got: {_load_failure(exc)}", path=path) from None
    out: dict = {}
    _flatten(obj, "", out)
    return out


def _refuse_safetensors(path: str) -> None:
    """A safetensors file asked to be read as PyTorch's format (``torch.load`` reads some):
    refused, naming the format it is, so the table records what the file really was."""
    with open(path, "rb") as f:
        head = f.read(16)
    if _safetensors_header(head, "", os.path.getsize(path)):
        raise FormatError("expected a PyTorch file (torch.save), got a safetensors file: "
                          "import it with format 'safetensors' (or let the format be "
                          "detected)", path=path)


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None) -> ArrayReader:
    """Stream the rows of one 2-D float tensor of a PyTorch file."""
    torch = _torch()

    path = os.fspath(path)
    _refuse_safetensors(path)
    tensors = load_tensors(path)
    listing = {k: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in tensors.items()}
    name = choose_tensor(listing, tensor, path=path, floats=_FLOATS)
    t = tensors[name]
    del tensors

    if t.dtype == torch.bfloat16:
        def to_numpy(block):
            return block.float().numpy()
        source_dtype = "float32"
    else:
        def to_numpy(block):
            return block.contiguous().numpy()
        source_dtype = str(t.dtype).removeprefix("torch.")
    reader = ArrayReader(path, t.detach(), format="torch", shape=tuple(t.shape),
                         source_dtype=source_dtype, to_numpy=to_numpy, block_rows=block_rows,
                         limit=limit, dtype=dtype)
    reader.tensor = name
    if t.dtype == torch.bfloat16 and dtype is None:
        reader.native_dtype = "bfloat16"  # a table can keep it: blocks widen it exactly
    return reader


def write(path, table, *, limit: int | None = None, block_rows: int = DEFAULT_BLOCK_ROWS,
          progress=None, tensor: str | None = None) -> int:
    """Write ``table`` as a PyTorch state dict ``{tensor: rows}`` (see the module doc)."""
    torch = _torch()
    name = TENSOR_NAME if tensor is None else tensor
    if not isinstance(name, str) or not name:
        raise FormatError(f"tensor name must be a non-empty string, got {name!r}")
    n = table.vocab_size if limit is None else min(limit, table.vocab_size)
    bf16 = table.storage_dtype == "bfloat16" and table.dtype == np.float32
    dtype = np.dtype(np.uint16 if bf16 else table.dtype)
    where = os.path.dirname(os.path.abspath(path if isinstance(path, (str, os.PathLike))
                                            else getattr(path, "name", "") or "."))
    with tempfile.TemporaryFile(dir=where if os.path.isdir(where) else None) as scratch:
        rows: np.ndarray
        if n and table.dim:
            rows = np.memmap(scratch, dtype=dtype, mode="w+", shape=(n, table.dim))
        else:
            rows = np.zeros((n, table.dim), dtype=dtype)
        for start in range(0, n, block_rows):
            stop = min(n, start + block_rows)
            block = np.asarray(table[start:stop])
            rows[start:stop] = _bf16_bits(block) if bf16 else block
            if progress is not None:
                progress(stop - start)
        weight = torch.from_numpy(rows)
        if bf16:
            weight = weight.view(torch.bfloat16)
        torch.save({name: weight}, path)
        del weight, rows
    return n

"""safetensors: an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``),
then the raw little-endian tensor bytes.

Read: the header is parsed here (its length is bounded by the file size, so a
header bomb fails before anything is allocated), the chosen tensor is
memory-mapped and streamed by rows; bfloat16 arrives as float32 (exact) with
``native_dtype = "bfloat16"``, so an import can store it natively.  ``tensor=None``
picks the only 2-D float tensor, else the error lists them.  Write: header,
then the rows block by block, one tensor named ``weight``; a table stored in
bfloat16 (``table.storage_dtype``) is written as BF16, bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from . import DEFAULT_BLOCK_ROWS, open_output
from ._array import ArrayReader, write_rows
from ..errors import FormatError
from ._json import parse_json

__all__ = ["read", "write", "read_header", "choose_tensor", "embedding_by_name", "TENSOR_NAME"]

TENSOR_NAME = "weight"
MAX_HEADER_BYTES = 100 << 20
_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "BF16": "<u2"}
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def read_header(path) -> tuple[dict, int]:
    """``({name: info}, data_start)``, every entry checked against the file size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(f"expected an 8-byte header length, got {len(head)} bytes", path=path)
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > MAX_HEADER_BYTES:
            raise FormatError(f"header length {n} exceeds the file ({size} bytes) or "
                              f"{MAX_HEADER_BYTES} bytes; not a safetensors file", path=path)
        raw = f.read(n)
    header = parse_json(raw, os.fspath(path), "a JSON header")
    if not isinstance(header, dict):
        raise FormatError(f"expected a JSON object header, got {type(header).__name__}", path=path)
    header.pop("__metadata__", None)
    data_start = 8 + n
    for name, info in header.items():
        try:
            dtype, shape = info["dtype"], list(info["shape"])
            begin, end = info["data_offsets"]
            if not isinstance(dtype, str) or not all(
                    type(x) is int and x >= 0 for x in shape + [begin, end]):  # JSON integers
                raise ValueError(dtype)
        except (TypeError, KeyError, ValueError):
            raise FormatError(f"tensor {name!r}: expected dtype, shape and data_offsets, "
                              f"got {info!r}", path=path) from None
        nbytes = _ITEMSIZE.get(dtype, 0) * math.prod(shape)  # Python ints: no overflow
        if not 0 <= begin <= end <= size - data_start or end - begin != nbytes:
            raise FormatError(f"tensor {name!r}: expected {nbytes} bytes for {dtype} {shape} "
                              f"inside the file, got offsets [{begin}, {end}] of "
                              f"{size - data_start} data bytes", path=path)
        info["shape"], info["data_offsets"] = shape, [begin, end]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    for (_, end0, a), (begin1, _, b) in zip(spans, spans[1:]):
        if begin1 < end0:
            raise FormatError(f"tensors {a!r} and {b!r} overlap (bytes {begin1}..{end0 - 1}); "
                              "expected disjoint data_offsets", path=path)
    return header, data_start


def choose_tensor(tensors: dict[str, tuple[tuple[int, ...], str]], tensor: str | None, *,
                  path, floats: tuple[str, ...]) -> str:
    """The name of the tensor to import: ``tensor``, or the only 2-D float one, or among
    several the one named as an input embedding (:func:`embedding_by_name`), as a model
    folder's import finds it."""
    listing = ", ".join(f"{k} {list(s)} {d}" for k, (s, d) in tensors.items()) or "none"
    if tensor is not None:
        if tensor not in tensors:
            raise FormatError(f"expected a tensor named {tensor!r}, got only: {listing}", path=path)
        shape, dtype = tensors[tensor]
        if len(shape) != 2 or dtype not in floats:
            raise FormatError(f"tensor {tensor!r}: expected a 2-D float tensor, got "
                              f"{dtype} {list(shape)}", path=path)
        return tensor
    two_d = [k for k, (s, d) in tensors.items() if len(s) == 2 and d in floats]
    named = embedding_by_name(two_d) if len(two_d) > 1 else None
    if len(two_d) != 1 and named is None:
        cands = ", ".join(f"{k} {list(tensors[k][0])}" for k in two_d) or "none"
        raise FormatError(f"expected exactly one 2-D float tensor, or one named as an input "
                          f"embedding (a name ending in {', '.join(EMBEDDING_SUFFIXES)}), got "
                          f"{len(two_d)} ({cands}); choose one with tensor=", path=path)
    return two_d[0] if named is None else named


# the usual names of a model's input embedding matrix (Hugging Face checkpoints and others)
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "word_embeddings.weight", "wte.weight",
                      "shared.weight", "embed_in.weight", "tok_embeddings.weight")


def embedding_by_name(names) -> str | None:
    """The input embedding among tensor ``names``: the shallowest name ending in one of
    :data:`EMBEDDING_SUFFIXES` (earlier suffixes first at one depth; T5's ``shared.weight``
    before ``encoder.embed_tokens.weight``, the same matrix), or None."""
    found = [(n.count("."), i, n) for n in names for i, s in enumerate(EMBEDDING_SUFFIXES)
             if n == s or n.endswith("." + s)]
    return min(found)[2] if found else None


def read(path, *, block_rows: int = DEFAULT_BLOCK_ROWS, limit: int | None = None,
         unicode_errors: str = "strict", tensor: str | None = None, dtype=None) -> ArrayReader:
    """Stream the rows of one 2-D tensor of a safetensors file."""
    path = os.fspath(path)
    header, data_start = read_header(path)
    tensors = {k: (tuple(v["shape"]), v["dtype"]) for k, v in header.items()}
    name = choose_tensor(tensors, tensor, path=path, floats=tuple(_DTYPES))
    info = header[name]
    shape = tuple(info["shape"])
    begin = info["data_offsets"][0]
    if shape[0] == 0:
        arr = np.zeros(shape, dtype=_DTYPES[info["dtype"]])
    else:
        arr = np.memmap(path, dtype=_DTYPES[info["dtype"]], mode="r", offset=data_start + begin,
                        shape=shape)
    if info["dtype"] == "BF16":
        def to_numpy(block):  # bfloat16 = the high half of a float32
            return (np.asarray(block).astype(np.uint32) << 16).view(np.float32)
        source_dtype: np.dtype = np.dtype(np.float32)
    else:
        to_numpy = np.asarray
        source_dtype = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("=")
    reader = ArrayReader(path, arr, format="safetensors", shape=shape, source_dtype=source_dtype,
                         to_numpy=to_numpy, block_rows=block_rows, limit=limit, dtype=dtype)
    reader.tensor = name
    if info["dtype"] == "BF16" and dtype is None:
        reader.native_dtype = "bfloat16"
    return reader


def write(path, table, *, limit: int | None = None, block_rows: int = DEFAULT_BLOCK_ROWS,
          progress=None, tensor: str | None = None) -> int:
    """Write ``table`` as one tensor named ``tensor`` (default ``weight``).

    The metadata says ``format: pt``, as PyTorch checkpoints do, so Hugging Face's
    checkpoint loaders accept the file; ``safetensors.numpy.load_file`` reads it too.
    """
    name = TENSOR_NAME if tensor is None else tensor
    if not isinstance(name, str) or not name or name == "__metadata__":
        raise FormatError(f"tensor name must be a non-empty string other than '__metadata__', "
                          f"got {name!r}")
    n = table.vocab_size if limit is None else min(limit, table.vocab_size)
    dtype = np.dtype(table.dtype).newbyteorder("<")
    code = {"f2": "F16", "f4": "F32", "f8": "F64"}[dtype.str[1:]]
    encode = None
    if table.storage_dtype == "bfloat16" and dtype.str == "<f4":
        # the rows are bfloat16 widened to float32: their high halves are the stored bits
        code, dtype = "BF16", np.dtype("<u2")
        encode = _bf16_bits
    nbytes = n * table.dim * dtype.itemsize
    meta = {"__metadata__": {"format": "pt"},
            name: {"dtype": code, "shape": [n, table.dim], "data_offsets": [0, nbytes]}}
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data to 8 bytes, as the reference writer does
    with open_output(path) as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        write_rows(f, table, n, dtype, block_rows=block_rows, progress=progress, encode=encode)
    return n


def _bf16_bits(rows: np.ndarray) -> np.ndarray:
    """The bfloat16 bits of float32 ``rows`` that hold bfloat16 values (exact)."""
    return (np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
